package vip

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Loopback is vip_mode loopback (the dev cluster, tests): the leader
// answers NSM on a loopback address with a server of its own. The address
// is always configured (all of 127.0.0.0/8 is local), so holding it means
// listening on it; the sockets die with the process, so it has no
// lifetime to wait out.
type Loopback struct {
	addr  string
	serve func(addr string) (Server, error)
	log   *slog.Logger

	mu  sync.Mutex
	srv Server // nil while not held
}

// Server is what a Loopback runs on its address while it holds it.
type Server interface {
	Shutdown(ctx context.Context) error
}

// LoopbackConfig configures a Loopback.
type LoopbackConfig struct {
	// Addr is host:port, the loopback VIP and the NSM port.
	Addr string
	// Serve listens on addr and serves NSM there until the Server it
	// returns is shut down (the agent's NSM programs; this package knows
	// nothing of them).
	Serve func(addr string) (Server, error)
	// Logger gets "VIP taken" and "VIP released" (default slog.Default()).
	Logger *slog.Logger
}

// NewLoopback returns a Loopback that does not hold its address yet.
func NewLoopback(cfg LoopbackConfig) *Loopback {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Loopback{addr: cfg.Addr, serve: cfg.Serve, log: log}
}

// Acquire starts serving on the address; holding it already is no error.
func (v *Loopback) Acquire(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.srv != nil {
		return nil
	}
	srv, err := v.serve(v.addr)
	if err != nil {
		return fmt.Errorf("listen on the VIP %s: %w", v.addr, err)
	}
	v.srv = srv
	v.log.Info("VIP taken (loopback mode)", "addr", v.addr)
	return nil
}

// Release stops serving on the address (waiting at most 200 ms for the
// server's calls in flight); not holding it is no error.
func (v *Loopback) Release() error {
	v.mu.Lock()
	srv := v.srv
	v.srv = nil
	v.mu.Unlock()
	if srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	srv.Shutdown(ctx)
	v.log.Info("VIP released (loopback mode)")
	return nil
}

// Held reports whether this process serves on the address.
func (v *Loopback) Held() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.srv != nil
}

// Lifetime is 0: the sockets go with the process, so a new leader has
// nothing to wait out.
func (v *Loopback) Lifetime() time.Duration { return 0 }
