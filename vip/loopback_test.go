package vip

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// tcpServer is the smallest Server: a TCP listener that accepts and
// closes, shut down by closing the listener.
type tcpServer struct{ ln net.Listener }

func (s *tcpServer) Shutdown(context.Context) error { return s.ln.Close() }

func TestLoopbackHoldsWhileServing(t *testing.T) {
	var bound string // where the last Serve listens
	serves := 0
	v := NewLoopback(LoopbackConfig{Addr: "127.0.0.1:0", Logger: quiet, Serve: func(addr string) (Server, error) {
		serves++
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, err
		}
		bound = ln.Addr().String()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		return &tcpServer{ln: ln}, nil
	}})
	if v.Held() || v.Lifetime() != 0 {
		t.Fatalf("new Loopback: held %v, lifetime %v; want false, 0", v.Held(), v.Lifetime())
	}
	ctx := context.Background()
	if err := v.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if !v.Held() {
		t.Fatal("not held after Acquire")
	}
	c, err := net.Dial("tcp", bound)
	if err != nil {
		t.Fatalf("held, but nothing listens on %s: %v", bound, err)
	}
	c.Close()
	if err := v.Acquire(ctx); err != nil || serves != 1 {
		t.Fatalf("second Acquire: err %v, serves %d; want nil, 1", err, serves)
	}
	if err := v.Release(); err != nil {
		t.Fatal(err)
	}
	if v.Held() {
		t.Fatal("held after Release")
	}
	if c, err := net.Dial("tcp", bound); err == nil {
		c.Close()
		t.Fatalf("released, but %s still accepts", bound)
	}
	if err := v.Release(); err != nil {
		t.Fatalf("second Release: %v", err)
	}
}

func TestLoopbackAcquireFails(t *testing.T) {
	cause := errors.New("address in use")
	v := NewLoopback(LoopbackConfig{Addr: "127.0.0.9:662", Logger: quiet, Serve: func(string) (Server, error) { return nil, cause }})
	err := v.Acquire(context.Background())
	if !errors.Is(err, cause) || !strings.Contains(err.Error(), "listen on the VIP 127.0.0.9:662") {
		t.Fatalf("Acquire: %v; want the cause, wrapped with the address", err)
	}
	if v.Held() {
		t.Fatal("held after a failed Acquire")
	}
}
