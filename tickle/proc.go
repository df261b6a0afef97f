package tickle

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// tcpEstablished is TCP_ESTABLISHED in the st column of /proc/net/tcp.
const tcpEstablished = 0x01

// maxLine bounds one line of /proc/net/tcp (the kernel pads IPv4 lines to
// 149 characters; IPv6 ones are about 180).
const maxLine = 4096

// ErrMalformed means a line of /proc/net/tcp or tcp6 is not in the
// kernel's format.
var ErrMalformed = errors.New("tickle: malformed connection table")

// Filter says which connections Read returns.
type Filter struct {
	// VIP is the floating address: only connections whose local address it
	// is (IPv4-mapped forms included).
	VIP netip.Addr
	// Ports are the local ports of interest (nfsd's, lockd's).
	Ports []uint16
	// Max is how many connections Read returns at most (0: no bound).
	Max int
}

func (f Filter) match(c Conn) bool {
	return c.Local.Addr() == f.VIP.Unmap() && slices.Contains(f.Ports, c.Local.Port())
}

// Read returns the established TCP connections on the VIP's ports, from
// <procRoot>/net/tcp and <procRoot>/net/tcp6 (procRoot is normally /proc;
// a table that does not exist — no IPv6 — holds none). It returns at most
// f.Max of them and, in total, how many matched. A line that is not in the
// kernel's format fails the whole read, naming the file and line.
func Read(procRoot string, f Filter) (conns []Conn, total int, err error) {
	for _, name := range []string{"tcp", "tcp6"} {
		path := filepath.Join(procRoot, "net", name)
		fh, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, 0, fmt.Errorf("tickle: %w", err)
		}
		err = ParseTable(fh, func(c Conn) {
			if !f.match(c) {
				return
			}
			total++
			if f.Max <= 0 || len(conns) < f.Max {
				conns = append(conns, c)
			}
		})
		fh.Close()
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", path, err)
		}
	}
	return conns, total, nil
}

// ParseTable reads a connection table in the format of /proc/net/tcp or
// /proc/net/tcp6 (the header line, then one socket a line: slot, local
// and remote address:port in hex, state, …) and calls fn with every
// established connection, addresses unmapped. A malformed line is an
// ErrMalformed naming its line number.
func ParseTable(r io.Reader, fn func(Conn)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 512), maxLine)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		fields := strings.Fields(text)
		if line == 1 && len(fields) > 0 && fields[0] == "sl" {
			continue
		}
		if len(fields) == 0 {
			continue
		}
		c, state, err := parseLine(fields)
		if err != nil {
			return fmt.Errorf("%w: line %d: %v", ErrMalformed, line, err)
		}
		if state == tcpEstablished {
			fn(c.unmap())
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%w: after line %d: %v", ErrMalformed, line, err)
	}
	return nil
}

// parseLine parses one socket's fields: "N:", local, remote, state, ….
func parseLine(fields []string) (Conn, int, error) {
	if len(fields) < 4 {
		return Conn{}, 0, fmt.Errorf("%d fields, want at least 4", len(fields))
	}
	if !strings.HasSuffix(fields[0], ":") {
		return Conn{}, 0, fmt.Errorf("slot %q does not end in ':'", fields[0])
	}
	if _, err := strconv.ParseUint(strings.TrimSuffix(fields[0], ":"), 10, 32); err != nil {
		return Conn{}, 0, fmt.Errorf("slot %q is not a number", fields[0])
	}
	local, err := parseAddrPort(fields[1])
	if err != nil {
		return Conn{}, 0, fmt.Errorf("local address %q: %v", fields[1], err)
	}
	remote, err := parseAddrPort(fields[2])
	if err != nil {
		return Conn{}, 0, fmt.Errorf("remote address %q: %v", fields[2], err)
	}
	if local.Addr().Is4() != remote.Addr().Is4() {
		return Conn{}, 0, errors.New("local and remote addresses of different families")
	}
	if len(fields[3]) != 2 {
		return Conn{}, 0, fmt.Errorf("state %q: want two hex digits", fields[3])
	}
	st, err := strconv.ParseUint(fields[3], 16, 8)
	if err != nil {
		return Conn{}, 0, fmt.Errorf("state %q: not hex", fields[3])
	}
	return Conn{Local: local, Remote: remote}, int(st), nil
}

// parseAddrPort parses the kernel's "ADDR:PORT": ADDR is the address as
// 32-bit words, each printed as a number in the host's byte order (8 hex
// digits for IPv4, 32 for IPv6), PORT the port as 4 hex digits.
func parseAddrPort(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, errors.New("no ':' between address and port")
	}
	if len(p) != 4 {
		return netip.AddrPort{}, errors.New("port: want four hex digits")
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, errors.New("port: not hex")
	}
	if len(a) != 8 && len(a) != 32 {
		return netip.AddrPort{}, fmt.Errorf("address: %d hex digits, want 8 or 32", len(a))
	}
	raw, err := hex.DecodeString(a)
	if err != nil {
		return netip.AddrPort{}, errors.New("address: not hex")
	}
	var b [16]byte
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	var addr netip.Addr
	if len(raw) == 4 {
		addr = netip.AddrFrom4([4]byte(b[:4]))
	} else {
		addr = netip.AddrFrom16(b)
	}
	return netip.AddrPortFrom(addr, uint16(port)), nil
}

// LockdPort is lockd's TCP port when it is fixed
// (<procRoot>/sys/fs/nfs/nlm_tcpport, the kernel's nlm_tcpport parameter,
// usually set for a firewall); 0 when lockd picks one at each start or the
// kernel has no lockd.
func LockdPort(procRoot string) (uint16, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, "sys", "fs", "nfs", "nlm_tcpport"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("tickle: lockd's port: %w", err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 16)
	if err != nil {
		return 0, fmt.Errorf("tickle: lockd's port %q: not a port number", strings.TrimSpace(string(b)))
	}
	return uint16(v), nil
}
