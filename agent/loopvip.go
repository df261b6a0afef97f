package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nsmd/nsmd/oncrpc"
)

// loopbackVIP is vip_mode loopback: the leader answers NSM on a loopback
// address with its own server. The address is always configured (all of
// 127.0.0.0/8 is local), so holding it means listening on it; the sockets
// die with the process, so it has no lifetime to wait out.
type loopbackVIP struct {
	a    *Agent
	addr string
	mu   sync.Mutex
	srv  *oncrpc.Server
}

func (v *loopbackVIP) Acquire(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.srv != nil {
		return nil
	}
	ln, pc, err := listenBoth(v.addr)
	if err != nil {
		return fmt.Errorf("listen on the VIP %s: %w", v.addr, err)
	}
	v.srv = oncrpc.NewServer(v.a.progs, v.a.serverConfig())
	v.a.serve(v.srv, ln, pc)
	v.a.log.Info("VIP taken (loopback mode)", "addr", v.addr)
	return nil
}

func (v *loopbackVIP) Release() error {
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
	v.a.log.Info("VIP released (loopback mode)")
	return nil
}

func (v *loopbackVIP) Held() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.srv != nil
}

func (v *loopbackVIP) Lifetime() time.Duration { return 0 }
