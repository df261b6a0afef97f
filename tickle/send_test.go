package tickle

import (
	"context"
	"encoding/binary"
	"testing"
	"time"
)

func TestSegmentIsABareACKWithAValidChecksum(t *testing.T) {
	for _, c := range []Conn{
		conn("192.168.0.100:2049", "192.168.0.10:1023"),
		conn("[fd00::100]:2049", "[fd00::10]:767"),
		conn("[::ffff:192.168.0.100]:2049", "[::ffff:192.168.0.14]:800"),
	} {
		t.Run(c.String(), func(t *testing.T) {
			seg := Segment(c)
			if len(seg) != 20 {
				t.Fatalf("%d bytes, want a 20-byte header", len(seg))
			}
			if got := binary.BigEndian.Uint16(seg[0:]); got != c.Local.Port() {
				t.Errorf("source port %d, want %d", got, c.Local.Port())
			}
			if got := binary.BigEndian.Uint16(seg[2:]); got != c.Remote.Port() {
				t.Errorf("destination port %d, want %d", got, c.Remote.Port())
			}
			if seg[12] != 0x50 || seg[13] != 0x10 {
				t.Errorf("offset/flags %#x %#x, want 0x50 (5 words) and 0x10 (ACK only)", seg[12], seg[13])
			}
			// RFC 1071: a segment with its checksum in place sums to all ones.
			if got := Checksum(c.Local.Addr(), c.Remote.Addr(), seg); got != 0 {
				t.Errorf("checksum does not verify: %#04x", got)
			}
			// The pseudo-header is part of it: another destination does not verify.
			other := c.Remote.Addr().Next()
			if Checksum(c.Local.Addr(), other, seg) == 0 {
				t.Error("checksum verifies for another destination too")
			}
		})
	}
}

// A worked example: 10.0.0.1:2049 → 10.0.0.2:1000, ACK, window 1024.
// Pseudo-header 0x0a00+0x0001+0x0a00+0x0002+0x0006+0x0014 = 0x141d;
// header 0x0801+0x03e8+0x5010+0x0400 = 0x5ff9; sum 0x7416, checksum 0x8be9.
func TestChecksumWorkedExample(t *testing.T) {
	seg := Segment(conn("10.0.0.1:2049", "10.0.0.2:1000"))
	if got := binary.BigEndian.Uint16(seg[16:]); got != 0x8be9 {
		t.Fatalf("checksum %#04x, want 0x8be9", got)
	}
}

func TestConnValid(t *testing.T) {
	for _, tc := range []struct {
		c    Conn
		want bool
	}{
		{conn("10.0.0.1:2049", "10.0.0.2:1000"), true},
		{conn("[fd00::1]:2049", "[fd00::2]:1000"), true},
		{conn("[::ffff:10.0.0.1]:2049", "10.0.0.2:1000"), true},
		{conn("10.0.0.1:2049", "[fd00::2]:1000"), false},
		{conn("10.0.0.1:2049", "0.0.0.0:1000"), false},
		{conn("10.0.0.1:2049", "224.0.0.1:1000"), false},
		{conn("10.0.0.1:2049", "255.255.255.255:1000"), false},
		{conn("10.0.0.1:0", "10.0.0.2:1000"), false},
		{conn("10.0.0.1:2049", "10.0.0.2:0"), false},
		{Conn{}, false},
	} {
		if got := tc.c.Valid(); got != tc.want {
			t.Errorf("%v: Valid %v, want %v", tc.c, got, tc.want)
		}
	}
}

func TestSendSkipsInvalidAndOwnConnections(t *testing.T) {
	c := conn("10.0.0.1:2049", "10.0.0.2:1000")
	sent, err := Send(context.Background(), []Conn{c, conn("10.0.0.1:2049", "0.0.0.0:9")}, SendConfig{Skip: []Conn{c}})
	if sent != 0 || err != nil {
		t.Fatalf("sent %d, %v; want nothing sent and no socket opened", sent, err)
	}
}

func TestPacerBoundsTheRate(t *testing.T) {
	p := pacer{rate: 1000, start: time.Now()}
	for range 101 {
		if !p.wait(context.Background()) {
			t.Fatal("wait ended early")
		}
	}
	if el := time.Since(p.start); el < 95*time.Millisecond {
		t.Fatalf("101 packets at 1000/s took %v, want at least ~100ms", el)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if p.wait(ctx) {
		t.Fatal("wait went on after its context ended")
	}
}

func TestSendWithoutTheAddressFailsClearly(t *testing.T) {
	// 192.0.2.1 (TEST-NET-1) is not an address of this host: binding a raw
	// socket to it fails (or, without CAP_NET_RAW, opening one does).
	sent, err := Send(context.Background(), []Conn{conn("192.0.2.1:2049", "192.0.2.2:1000")}, SendConfig{Rounds: 1})
	if sent != 0 || err == nil {
		t.Fatalf("sent %d, %v; want an error", sent, err)
	}
	t.Log(err)
}
