package nsmtest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// ServeNSM serves h as the NSM program over TCP on a free 127.0.0.1 port
// (a real ONC RPC server standing in for an NSM server that misbehaves in
// a chosen way) and returns its address; it shuts down when the test ends.
func ServeNSM(t testing.TB, h oncrpc.Handler) string {
	t.Helper()
	srv := oncrpc.NewServer(oncrpc.Programs{nsm.Program: h}, oncrpc.ServerConfig{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeTCP(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return ln.Addr().String()
}
