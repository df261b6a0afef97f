package tickle

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// testdata/tcp and tcp6 are the kernel's tables as an x86 host prints
// them (addresses as host-order words).
func skipBigEndian(t *testing.T) {
	t.Helper()
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], 1)
	if b[0] != 1 {
		t.Skip("the fixtures are a little-endian host's tables")
	}
}

// fixtureRoot is a procfs root whose net/ holds the fixture tables.
func fixtureRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "net", name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func conn(local, remote string) Conn {
	return Conn{Local: netip.MustParseAddrPort(local), Remote: netip.MustParseAddrPort(remote)}
}

func TestReadFindsEstablishedConnectionsOnTheVIPsPorts(t *testing.T) {
	skipBigEndian(t)
	root := fixtureRoot(t)
	for _, tc := range []struct {
		name   string
		filter Filter
		want   []Conn
		total  int
	}{
		{"IPv4 VIP, nfsd and lockd; an IPv4 client of an IPv6 socket included", Filter{VIP: netip.MustParseAddr("192.168.0.100"), Ports: []uint16{2049, 36718}}, []Conn{
			conn("192.168.0.100:2049", "192.168.0.10:1023"),
			conn("192.168.0.100:2049", "192.168.0.11:792"),
			conn("192.168.0.100:36718", "192.168.0.10:795"),
			conn("192.168.0.100:2049", "192.168.0.14:800"),
		}, 4},
		{"nfsd only", Filter{VIP: netip.MustParseAddr("192.168.0.100"), Ports: []uint16{2049}}, []Conn{
			conn("192.168.0.100:2049", "192.168.0.10:1023"),
			conn("192.168.0.100:2049", "192.168.0.11:792"),
			conn("192.168.0.100:2049", "192.168.0.14:800"),
		}, 3},
		{"bounded: the first two, all counted", Filter{VIP: netip.MustParseAddr("192.168.0.100"), Ports: []uint16{2049}, Max: 2}, []Conn{
			conn("192.168.0.100:2049", "192.168.0.10:1023"),
			conn("192.168.0.100:2049", "192.168.0.11:792"),
		}, 3},
		{"IPv6 VIP", Filter{VIP: netip.MustParseAddr("fd00::100"), Ports: []uint16{2049}}, []Conn{
			conn("[fd00::100]:2049", "[fd00::10]:767"),
		}, 1},
		{"an address that is not the VIP", Filter{VIP: netip.MustParseAddr("192.168.0.99"), Ports: []uint16{2049}}, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, total, err := Read(root, tc.filter)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) || total != tc.total {
				t.Fatalf("got %v (total %d), want %v (total %d)", got, total, tc.want, tc.total)
			}
		})
	}
}

func TestReadWithoutIPv6TableReadsIPv4(t *testing.T) {
	skipBigEndian(t)
	root := fixtureRoot(t)
	os.Remove(filepath.Join(root, "net", "tcp6"))
	got, _, err := Read(root, Filter{VIP: netip.MustParseAddr("192.168.0.100"), Ports: []uint16{2049}})
	if err != nil || len(got) != 2 {
		t.Fatalf("got %v, %v; want the two IPv4 connections", got, err)
	}
}

func TestParseTableRejectsMalformedLines(t *testing.T) {
	const header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	const good = "   1: 6400A8C0:0801 0A00A8C0:03FF 01 00000000:00000000 02:000AFC5A 00000000     0        0 0 2\n"
	for _, tc := range []struct{ name, line, want string }{
		{"too few fields", "   2: 6400A8C0:0801 0A00A8C0:03FF\n", "line 3: 3 fields"},
		{"slot without colon", "   2 6400A8C0:0801 0A00A8C0:03FF 01\n", "line 3: slot"},
		{"slot not a number", "   x: 6400A8C0:0801 0A00A8C0:03FF 01\n", "line 3: slot"},
		{"address without port", "   2: 6400A8C0 0A00A8C0:03FF 01\n", "line 3: local address"},
		{"address of 7 digits", "   2: 400A8C0:0801 0A00A8C0:03FF 01\n", "line 3: local address \"400A8C0:0801\": address: 7 hex digits"},
		{"address not hex", "   2: 6400A8CZ:0801 0A00A8C0:03FF 01\n", "line 3: local address"},
		{"port of 5 digits", "   2: 6400A8C0:00801 0A00A8C0:03FF 01\n", "line 3: local address"},
		{"remote port not hex", "   2: 6400A8C0:0801 0A00A8C0:03GF 01\n", "line 3: remote address"},
		{"mixed families", "   2: 6400A8C0:0801 000000FD000000000000000010000000:02FF 01\n", "line 3: local and remote"},
		{"state of one digit", "   2: 6400A8C0:0801 0A00A8C0:03FF 1\n", "line 3: state"},
		{"state not hex", "   2: 6400A8C0:0801 0A00A8C0:03FF 0Z\n", "line 3: state"},
		{"a line too long", "   2: " + strings.Repeat("0", maxLine) + "\n", "after line 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			err := ParseTable(strings.NewReader(header+good+tc.line), func(Conn) { n++ })
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrMalformed with %q", err, tc.want)
			}
		})
	}
	t.Run("Read names the file", func(t *testing.T) {
		root := t.TempDir()
		os.Mkdir(filepath.Join(root, "net"), 0o755)
		os.WriteFile(filepath.Join(root, "net", "tcp"), []byte(header+good+"   2: nonsense\n"), 0o644)
		_, _, err := Read(root, Filter{VIP: netip.MustParseAddr("192.168.0.100"), Ports: []uint16{2049}})
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), filepath.Join(root, "net", "tcp")+": ") {
			t.Fatalf("err %v, want ErrMalformed naming the file", err)
		}
	})
}

// The parser reads this kernel's own table: a loopback connection is
// found on the server's side, and only there.
func TestReadFindsALiveLoopbackConnection(t *testing.T) {
	for _, tc := range []struct{ network, addr string }{{"tcp4", "127.0.0.1"}, {"tcp6", "::1"}} {
		t.Run(tc.network, func(t *testing.T) {
			ln, err := net.Listen(tc.network, net.JoinHostPort(tc.addr, "0"))
			if err != nil {
				t.Skipf("no %s loopback: %v", tc.network, err)
			}
			defer ln.Close()
			c, err := net.Dial(tc.network, ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			port := uint16(ln.Addr().(*net.TCPAddr).Port)
			got, total, err := Read("/proc/thread-self", Filter{VIP: netip.MustParseAddr(tc.addr), Ports: []uint16{port}})
			if err != nil {
				t.Fatal(err)
			}
			want := Conn{Local: s.LocalAddr().(*net.TCPAddr).AddrPort(), Remote: s.RemoteAddr().(*net.TCPAddr).AddrPort()}.unmap()
			if total != 1 || len(got) != 1 || got[0] != want {
				t.Fatalf("got %v (total %d), want [%v]", got, total, want)
			}
		})
	}
}

func TestLockdPort(t *testing.T) {
	root := t.TempDir()
	if p, err := LockdPort(root); p != 0 || err != nil {
		t.Fatalf("without lockd: %d, %v; want 0, nil", p, err)
	}
	dir := filepath.Join(root, "sys", "fs", "nfs")
	os.MkdirAll(dir, 0o755)
	for _, tc := range []struct {
		content string
		want    uint16
		bad     bool
	}{{"0\n", 0, false}, {"32803\n", 32803, false}, {"70000\n", 0, true}, {"x\n", 0, true}} {
		os.WriteFile(filepath.Join(dir, "nlm_tcpport"), []byte(tc.content), 0o644)
		p, err := LockdPort(root)
		if p != tc.want || (err != nil) != tc.bad {
			t.Errorf("%q: %d, %v; want %d, error %v", tc.content, p, err, tc.want, tc.bad)
		}
	}
}

// FuzzParseTable: any input is parsed or refused with ErrMalformed, never
// a panic; every connection it yields prints back to a line it parses
// the same way.
func FuzzParseTable(f *testing.F) {
	for _, name := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("   1: 6400A8C0:0801 0A00A8C0:03FF 01\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var got []Conn
		err := ParseTable(strings.NewReader(string(b)), func(c Conn) { got = append(got, c) })
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		for _, c := range got {
			if c.Local.Addr().Is4() != c.Remote.Addr().Is4() {
				// One end IPv4-mapped, the other not: unmapped they differ
				// in family, and such a connection is not Valid (not sent).
				if c.Valid() {
					t.Fatalf("%v of mixed families is Valid", c)
				}
				continue
			}
			line := "0: " + kernelAddr(c.Local) + " " + kernelAddr(c.Remote) + " 01\n"
			var again []Conn
			if err := ParseTable(strings.NewReader(line), func(c Conn) { again = append(again, c) }); err != nil || len(again) != 1 || again[0] != c {
				t.Fatalf("%v printed as %q parses as %v, %v", c, line, again, err)
			}
		}
	})
}

// kernelAddr prints ap as the kernel does in /proc/net/tcp (IPv4 as 8
// digits, else 32: 32-bit words in the host's byte order).
func kernelAddr(ap netip.AddrPort) string {
	raw := ap.Addr().AsSlice()
	var sb strings.Builder
	for i := 0; i < len(raw); i += 4 {
		fmt.Fprintf(&sb, "%08X", binary.NativeEndian.Uint32(raw[i:]))
	}
	fmt.Fprintf(&sb, ":%04X", ap.Port())
	return sb.String()
}
