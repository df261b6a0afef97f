package nsm

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/nsmd/nsmd/fsm"
)

// rpc.statd's state directory (nfs-utils): one file per monitored host in
// sm/ (sm.bak/ holds hosts still to be notified after a reboot), named
// after the host, each line one registration:
//
//	%08x %08x %08x %08x %s %s %s
//	callback address (IPv4, hex of the network-order bytes), my_prog,
//	my_vers, my_proc, priv as 32 hex digits, mon_name, my_name
//
// and a file `state` holding sm_state as a 4-byte native-endian integer.
// These functions read and write that layout so nsmd can import a
// running statd's monitor list and export its own for sm-notify.

// ErrStatdRecord means a monitor record line is malformed.
var ErrStatdRecord = errors.New("nsm: malformed rpc.statd monitor record")

// StatdRecord is one line of an rpc.statd monitor file.
type StatdRecord struct {
	Callback netip.Addr
	My       fsm.MyID
	Priv     [PrivLen]byte
	MonName  string
}

// ParseStatdRecord parses one monitor record line.
func ParseStatdRecord(line string) (StatdRecord, error) {
	f := strings.Fields(line)
	if len(f) != 7 {
		return StatdRecord{}, fmt.Errorf("%w: %d fields, want 7: %q", ErrStatdRecord, len(f), line)
	}
	var nums [4]uint32
	for i := range nums {
		v, err := strconv.ParseUint(f[i], 16, 32)
		if err != nil || len(f[i]) != 8 {
			return StatdRecord{}, fmt.Errorf("%w: field %d %q is not 8 hex digits", ErrStatdRecord, i+1, f[i])
		}
		nums[i] = uint32(v)
	}
	var r StatdRecord
	// The address is printed from the in-memory (network-order) s_addr
	// read as a host-order integer: on little-endian machines the hex
	// digits come out byte-reversed, and statd reads them back the same way.
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], nums[0])
	r.Callback = netip.AddrFrom4(b)
	r.My.Prog, r.My.Vers, r.My.Proc = nums[1], nums[2], nums[3]
	priv, err := hex.DecodeString(f[4])
	if err != nil || len(priv) != PrivLen {
		return StatdRecord{}, fmt.Errorf("%w: priv %q is not %d hex bytes", ErrStatdRecord, f[4], PrivLen)
	}
	copy(r.Priv[:], priv)
	r.MonName, r.My.MyName = f[5], f[6]
	if !ValidName(r.MonName) || !ValidName(r.My.MyName) {
		return StatdRecord{}, fmt.Errorf("%w: bad mon_name %q or my_name %q", ErrStatdRecord, r.MonName, r.My.MyName)
	}
	return r, nil
}

// String formats the record as rpc.statd writes it (without newline).
func (r StatdRecord) String() string {
	a := r.Callback.Unmap()
	if !a.Is4() {
		a = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	b := a.As4()
	return fmt.Sprintf("%08x %08x %08x %08x %s %s %s", binary.NativeEndian.Uint32(b[:]),
		r.My.Prog, r.My.Vers, r.My.Proc, hex.EncodeToString(r.Priv[:]), r.MonName, r.My.MyName)
}

// StatdDir is the monitor list and state read from an rpc.statd directory.
type StatdDir struct {
	State   int32
	Records []StatdRecord
}

// ReadStatdDir reads dir/state (absent → 0) and every record in dir/sm and
// dir/sm.bak (a host in both appears once per distinct record).
func ReadStatdDir(dir string) (StatdDir, error) {
	var out StatdDir
	b, err := os.ReadFile(filepath.Join(dir, "state"))
	switch {
	case err == nil && len(b) == 4:
		out.State = int32(binary.NativeEndian.Uint32(b))
	case err == nil:
		return out, fmt.Errorf("nsm: %s/state has %d bytes, want 4", dir, len(b))
	case !errors.Is(err, os.ErrNotExist):
		return out, fmt.Errorf("nsm: read statd state: %w", err)
	}
	seen := map[string]bool{}
	for _, sub := range []string{"sm", "sm.bak"} {
		entries, err := os.ReadDir(filepath.Join(dir, sub))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("nsm: read %s/%s: %w", dir, sub, err)
		}
		for _, e := range entries {
			if !e.Type().IsRegular() {
				continue
			}
			data, err := os.ReadFile(filepath.Join(dir, sub, e.Name()))
			if err != nil {
				return out, fmt.Errorf("nsm: read monitor file: %w", err)
			}
			for n, line := range strings.Split(string(data), "\n") {
				if strings.TrimSpace(line) == "" {
					continue
				}
				r, err := ParseStatdRecord(line)
				if err != nil {
					return out, fmt.Errorf("%s/%s line %d: %w", sub, e.Name(), n+1, err)
				}
				if key := r.String(); !seen[key] {
					seen[key] = true
					out.Records = append(out.Records, r)
				}
			}
		}
	}
	return out, nil
}

// WriteStatdDir writes records as rpc.statd would (dir/sm/<mon_name>, one
// line per registration) and dir/state, so that the real sm-notify can
// notify those hosts from this directory.
func WriteStatdDir(dir string, d StatdDir) error {
	sm := filepath.Join(dir, "sm")
	// sm-notify moves each record to sm.bak/ before notifying and gives up
	// on a host whose record it cannot move: both must exist.
	for _, sub := range []string{sm, filepath.Join(dir, "sm.bak")} {
		if err := os.MkdirAll(sub, 0o700); err != nil {
			return fmt.Errorf("nsm: create %s: %w", sub, err)
		}
	}
	byHost := map[string][]string{}
	for _, r := range d.Records {
		byHost[r.MonName] = append(byHost[r.MonName], r.String())
	}
	hosts := make([]string, 0, len(byHost))
	for h := range byHost {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		if err := os.WriteFile(filepath.Join(sm, h), []byte(strings.Join(byHost[h], "\n")+"\n"), 0o600); err != nil {
			return fmt.Errorf("nsm: write monitor file: %w", err)
		}
	}
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], uint32(d.State))
	if err := os.WriteFile(filepath.Join(dir, "state"), b[:], 0o644); err != nil {
		return fmt.Errorf("nsm: write state: %w", err)
	}
	return nil
}
