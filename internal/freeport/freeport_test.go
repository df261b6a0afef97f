package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestPickerHandsOutDistinctPortsFreeForTCPAndUDPBelowTheEphemeralRange(t *testing.T) {
	var p Picker
	lo, hi := drawRange()
	seen := map[int]bool{}
	for range 20 {
		ports, err := p.Ports([]string{"127.0.0.1", "127.0.0.2"}, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(ports) != 3 {
			t.Fatalf("ports %v, want 3", ports)
		}
		for _, port := range ports {
			if seen[port] {
				t.Fatalf("port %d handed out twice", port)
			}
			seen[port] = true
			if hi-lo >= 1000 && (port < lo || port >= hi) {
				t.Fatalf("port %d outside [%d, %d)", port, lo, hi)
			}
		}
	}
	for port := range seen {
		for _, ip := range []string{"127.0.0.1", "127.0.0.2"} {
			addr := net.JoinHostPort(ip, strconv.Itoa(port))
			l, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatalf("port %d not free for TCP: %v", port, err)
			}
			l.Close()
			pc, err := net.ListenPacket("udp", addr)
			if err != nil {
				t.Fatalf("port %d not free for UDP: %v", port, err)
			}
			pc.Close()
		}
	}
}

func TestAPortTakenForTCPOrUDPOnAnyAddressIsNotFree(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tcp := ln.Addr().(*net.TCPAddr).Port
	pc, err := net.ListenPacket("udp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	udp := pc.LocalAddr().(*net.UDPAddr).Port
	for _, port := range []int{tcp, udp} {
		if free([]string{"127.0.0.1", "127.0.0.2"}, port) {
			t.Errorf("port %d in use on 127.0.0.2 counted free", port)
		}
	}
}

func TestPortsWithoutAnAddressIsAnError(t *testing.T) {
	if _, err := Ports(nil, 1); err == nil {
		t.Fatal("no error without an address")
	}
}
