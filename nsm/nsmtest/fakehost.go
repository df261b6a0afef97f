// Package nsmtest has test doubles for the peers of an NSM server. They are
// fakes because a real client host needs a network namespace of its own
// (rpc.statd and rpcbind want port 111 and a private /run); the e2e tier
// uses the real programs.
package nsmtest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/nsmd/nsmd/nlm"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// Notification is one SM_NOTIFY a fake host's statd received.
type Notification struct {
	From netip.AddrPort
	Arg  nsm.StatChge
}

// Host stands in for an NFS client host at one loopback address: a
// portmapper on PmapPort and a statd (UDP) that records every SM_NOTIFY.
type Host struct {
	Addr     netip.Addr
	PmapPort int
	Notified chan Notification
}

// StartHost starts a fake host on ip (a 127.0.0.0/8 address); its servers
// stop when the test ends.
func StartHost(t testing.TB, ip string, pmapPort int) *Host {
	t.Helper()
	h := &Host{Addr: netip.MustParseAddr(ip), PmapPort: pmapPort, Notified: make(chan Notification, 1024)}
	statd := oncrpc.HandlerFunc(func(ctx context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
		switch c.Proc {
		case nsm.ProcNull:
			return nil
		case nsm.ProcNotify:
			var a nsm.StatChge
			if err := a.UnmarshalXDR(c.Args); err != nil {
				return fmt.Errorf("%w: %v", oncrpc.ErrGarbageArgs, err)
			}
			select {
			case h.Notified <- Notification{From: c.Remote, Arg: a}:
			default:
			}
			return nil
		}
		return oncrpc.ErrProcUnavail
	})
	serve(t, ip, pmapPort, nsm.Program, statd)
	return h
}

// WaitState waits for an SM_NOTIFY carrying state (skipping older ones)
// and returns it, or fails the test after timeout.
func (h *Host) WaitState(t testing.TB, state int32, timeout time.Duration) Notification {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case n := <-h.Notified:
			if n.Arg.State == state {
				return n
			}
		case <-deadline:
			t.Fatalf("host %s: no SM_NOTIFY with state %d within %v", h.Addr, state, timeout)
			return Notification{}
		}
	}
}

// Callback is one lock-manager callback a fake lock manager received.
type Callback struct {
	From   netip.AddrPort
	Status nlm.Status
}

// LockManager stands in for a host's lock manager (Linux lockd's NSM
// callback, NLM v3 procedure 16): a portmapper on PmapPort mapping 100021/3
// UDP, and an NLM server that records every callback.
type LockManager struct {
	Addr      netip.Addr
	Callbacks chan Callback
}

// StartLockManager starts a fake lock manager on ip (127.0.0.0/8).
func StartLockManager(t testing.TB, ip string, pmapPort int) *LockManager {
	t.Helper()
	lm := &LockManager{Addr: netip.MustParseAddr(ip), Callbacks: make(chan Callback, 1024)}
	serve(t, ip, pmapPort, oncrpc.ProgVers{Prog: nlm.Program, Vers: 3}, LockManagerHandler(lm.Callbacks))
	return lm
}

// LockManagerHandler serves NLM NULL and the NSM callback (procedure 16),
// sending every callback to out (it blocks when out is full).
func LockManagerHandler(out chan<- Callback) oncrpc.Handler {
	return oncrpc.HandlerFunc(func(ctx context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
		switch c.Proc {
		case 0:
			return nil
		case nlm.ProcSMNotify:
			var st nlm.Status
			if err := st.UnmarshalXDR(c.Args); err != nil {
				return fmt.Errorf("%w: %v", oncrpc.ErrGarbageArgs, err)
			}
			out <- Callback{From: c.Remote, Status: st}
			return nil
		}
		return oncrpc.ErrProcUnavail
	})
}

// serve runs handler for prog/vers over UDP on ip (any port) and a
// portmapper on ip:pmapPort that maps it; both stop when the test ends.
func serve(t testing.TB, ip string, pmapPort int, pv oncrpc.ProgVers, handler oncrpc.Handler) {
	t.Helper()
	conn, err := net.ListenPacket("udp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatalf("fake %d/%d on %s: %v", pv.Prog, pv.Vers, ip, err)
	}
	srv := oncrpc.NewServer(oncrpc.Programs{pv: handler}, oncrpc.ServerConfig{})
	go srv.ServeUDP(conn)
	pm := oncrpc.NewPortmapper()
	pm.Register(oncrpc.Mapping{Prog: pv.Prog, Vers: pv.Vers, Prot: oncrpc.IPProtoUDP, Port: uint32(conn.LocalAddr().(*net.UDPAddr).Port)})
	pmConn, err := net.ListenPacket("udp", net.JoinHostPort(ip, strconv.Itoa(pmapPort)))
	if err != nil {
		t.Fatalf("fake portmapper on %s:%d: %v", ip, pmapPort, err)
	}
	pmSrv := oncrpc.NewServer(oncrpc.Programs{{Prog: oncrpc.PmapProg, Vers: oncrpc.PmapVers}: pm}, oncrpc.ServerConfig{})
	go pmSrv.ServeUDP(pmConn)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		pmSrv.Shutdown(ctx)
	})
}
