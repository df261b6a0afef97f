// Package service describes one NFS service of a cluster: its name, its
// floating address, what its hook mounts and exports, its grace and lease,
// the servers it prefers and the network namespace its hook is given.
//
// A Spec is data only. Validate says what is wrong with one, naming the
// field; Fingerprint is a short digest that is equal on two servers exactly
// when their specs of the service agree; Env is what a hook script is told
// about the service. The package imports nothing of nsmd: config builds
// specs from the YAML file, and the parts that place and serve services
// read them.
package service

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"time"
)

// Spec is one NFS service.
type Spec struct {
	// ID names the service: 1 to 32 lower-case letters, digits and '-',
	// starting with a letter or digit and not ending with '-' (a DNS
	// label's alphabet, so it fits a namespace, a metric label and a
	// file name).
	ID string
	// Address is the floating address clients mount, with its prefix
	// length (10.0.0.50/24): the server that serves the service adds it to
	// Interface.
	Address   netip.Prefix
	Interface string
	// Device and Mount are what the service's hook mounts (a block device
	// or whatever the hook understands, and where); ExportClients (each in
	// exportfs syntax: a host, a network, @netgroup, *) and ExportOptions
	// (exportfs -o) what it exports. Empty: the hook's own defaults.
	Device        string
	Mount         string
	ExportClients []string
	ExportOptions string
	// Grace and Lease are the service's lockd/nfsd grace period and nfsd
	// lease, whole seconds from 10 s to 1 h (what nfsd accepts); 0: the
	// node's defaults.
	Grace time.Duration
	Lease time.Duration
	// Prefer lists node ids in order of preference: the servers the
	// service should run on when they are healthy.
	Prefer []string
	// Namespace is the network namespace the service's hook is given
	// (NSMD_SERVICE_NAMESPACE); empty means DefaultNamespace(ID).
	Namespace string
}

// Limits of a Spec's fields.
const (
	MaxIDLen        = 32
	MaxNamespaceLen = 64
	MaxNodeIDLen    = 128 // as config's node_id
	MaxPathLen      = 4096
	MinTime         = 10 * time.Second // nfsd refuses a shorter lease or grace
	MaxTime         = time.Hour        // and a longer one
)

// DefaultNamespace is the network namespace of service id when its spec
// names none: "nsmd-<id>".
func DefaultNamespace(id string) string { return "nsmd-" + id }

// EffectiveNamespace is s.Namespace, or DefaultNamespace(s.ID) when empty.
func (s Spec) EffectiveNamespace() string {
	if s.Namespace != "" {
		return s.Namespace
	}
	return DefaultNamespace(s.ID)
}

// Field names, as the YAML file spells them; FieldError.Field is one of them.
const (
	FieldID            = "id"
	FieldAddress       = "address"
	FieldInterface     = "interface"
	FieldDevice        = "device"
	FieldMount         = "mount"
	FieldExportClients = "export_clients"
	FieldExportOptions = "export_options"
	FieldGrace         = "grace"
	FieldLease         = "lease"
	FieldPrefer        = "prefer"
	FieldNamespace     = "namespace"
)

// Fields lists every field's name in the Spec's order.
func Fields() []string {
	return []string{FieldID, FieldAddress, FieldInterface, FieldDevice, FieldMount, FieldExportClients,
		FieldExportOptions, FieldGrace, FieldLease, FieldPrefer, FieldNamespace}
}

// FieldError is a problem with one field of a spec.
type FieldError struct {
	Field string // one of the Field* names
	Err   error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }

func (e *FieldError) Unwrap() error { return e.Err }

// ErrInvalid is wrapped by every FieldError's Err.
var ErrInvalid = errors.New("invalid")

func invalid(field, format string, a ...any) *FieldError {
	return &FieldError{field, invalidError(fmt.Sprintf(format, a...))}
}

// invalidError is a problem's text; it is ErrInvalid (errors.Is) without
// saying so in the text.
type invalidError string

func (e invalidError) Error() string { return string(e) }

func (e invalidError) Is(target error) bool { return target == ErrInvalid }

// Problems lists what is wrong with s, one FieldError per problem, in the
// order of the fields; none for a valid spec.
func (s Spec) Problems() []*FieldError {
	var out []*FieldError
	bad := func(field, format string, a ...any) { out = append(out, invalid(field, format, a...)) }
	if !ValidID(s.ID) {
		bad(FieldID, "%q must be 1 to %d lower-case letters, digits and '-', starting with a letter or digit and not ending with '-'", s.ID, MaxIDLen)
	}
	if err := checkAddress(s.Address); err != nil {
		bad(FieldAddress, "%v", err)
	}
	if err := checkInterface(s.Interface); err != nil {
		bad(FieldInterface, "%v", err)
	}
	if err := checkWord(s.Device, MaxPathLen); err != nil {
		bad(FieldDevice, "%v", err)
	}
	if s.Mount != "" {
		if err := checkWord(s.Mount, MaxPathLen); err != nil {
			bad(FieldMount, "%v", err)
		} else if !path.IsAbs(s.Mount) || path.Clean(s.Mount) != s.Mount || s.Mount == "/" {
			bad(FieldMount, "%q must be a clean absolute path other than / (like /srv/nfs/a)", s.Mount)
		}
	}
	for i, c := range s.ExportClients {
		if err := checkWord(c, 1024); err != nil || c == "" || strings.ContainsAny(c, ",()") {
			bad(FieldExportClients, "item %d %q is not one client in exportfs syntax (a host, a network, @netgroup or *; no spaces, commas or parentheses)", i+1, c)
		}
	}
	if err := checkWord(s.ExportOptions, 1024); err != nil || strings.ContainsAny(s.ExportOptions, "()") {
		bad(FieldExportOptions, "%q must be exportfs -o options (like rw,sync,no_subtree_check; no spaces or parentheses)", s.ExportOptions)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{FieldGrace, s.Grace}, {FieldLease, s.Lease}} {
		if d.v != 0 && (d.v < MinTime || d.v > MaxTime || d.v%time.Second != 0) {
			bad(d.field, "%v must be whole seconds from %v to %v (what nfsd accepts), or 0 for the node's default", d.v, MinTime, MaxTime)
		}
	}
	seen := map[string]bool{}
	for i, n := range s.Prefer {
		switch {
		case n == "" || len(n) > MaxNodeIDLen || strings.ContainsAny(n, " \t\n/"):
			bad(FieldPrefer, "item %d %q is not a node id (at most %d characters without spaces or '/')", i+1, n, MaxNodeIDLen)
		case seen[n]:
			bad(FieldPrefer, "node %q is listed twice", n)
		}
		seen[n] = true
	}
	if s.Namespace != "" && !ValidNamespace(s.Namespace) {
		bad(FieldNamespace, "%q must be 1 to %d letters, digits, '_', '.' or '-', starting with a letter or digit", s.Namespace, MaxNamespaceLen)
	}
	return out
}

// Validate returns every problem of s joined (each a *FieldError naming
// its field), or nil.
func (s Spec) Validate() error {
	var errs []error
	for _, p := range s.Problems() {
		errs = append(errs, p)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("service %q: %w", s.ID, errors.Join(errs...))
}

// ValidID reports whether id may name a service.
func ValidID(id string) bool {
	if id == "" || len(id) > MaxIDLen || id[0] == '-' || id[len(id)-1] == '-' {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// ValidNamespace reports whether ns may name a network namespace (a file
// in /run/netns): 1 to MaxNamespaceLen letters, digits, '_', '.' or '-',
// starting with a letter or digit.
func ValidNamespace(ns string) bool {
	if ns == "" || len(ns) > MaxNamespaceLen || ns == "." || ns == ".." {
		return false
	}
	for i, r := range ns {
		alnum := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if !alnum && (i == 0 || r != '_' && r != '.' && r != '-') {
			return false
		}
	}
	return true
}

// checkAddress: a unicast host address with its prefix length, written
// one way only (no IPv4-mapped IPv6).
func checkAddress(p netip.Prefix) error {
	a := p.Addr()
	switch {
	case !p.IsValid():
		return errors.New("missing: the floating address with its prefix length (like 10.0.0.50/24)")
	case a.Is4In6():
		return fmt.Errorf("%s is an IPv4-mapped IPv6 address: write it as IPv4 (%s/%d)", p, a.Unmap(), p.Bits()-96)
	case a.IsUnspecified(), a.IsMulticast(), a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return fmt.Errorf("%s is not an address clients can mount (unspecified, multicast or link-local)", p)
	case a.Is4() && p.Bits() < 31 && a == p.Masked().Addr():
		return fmt.Errorf("%s is its network's own address, not a host's", p)
	}
	return nil
}

// checkInterface: a Linux interface name (the kernel's dev_valid_name:
// at most 15 bytes, not . or .., no '/', ':' or white space).
func checkInterface(name string) error {
	if name == "" {
		return errors.New("missing: the interface the address goes on (like eth0)")
	}
	if !ValidInterface(name) {
		return fmt.Errorf("%q is not an interface name (at most 15 bytes, no '/', ':' or spaces)", name)
	}
	return nil
}

// ValidInterface reports whether name may name a Linux interface (the
// kernel's dev_valid_name: 1 to 15 bytes, not . or .., no '/', ':' or
// white space).
func ValidInterface(name string) bool {
	return name != "" && len(name) <= 15 && name != "." && name != ".." && !strings.ContainsAny(name, "/: \t\n\r\v\f")
}

// checkWord: at most max bytes of printable UTF-8 without white space.
func checkWord(s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("longer than %d bytes", max)
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f || r == '\uFFFD' {
			return fmt.Errorf("%q has a space, a control character or invalid UTF-8", s)
		}
	}
	return nil
}

// fingerprintVersion starts the encoding Fingerprint hashes; a change of
// the encoding changes it, so old and new fingerprints never match by
// accident.
const fingerprintVersion = "nsmd-service-spec-v1"

// Fingerprint is a short digest (16 hex digits: the first 8 bytes of a
// SHA-256) of every field of s, equal on every machine and Go version
// for the same spec. Every field counts, because a server that takes the
// service over must serve exactly what the one before did:
//   - ID: which service this is.
//   - Address and Interface: where clients reach it; a different one is
//     another service to them (their mounts and their NSM state name the
//     address).
//   - Device and Mount: what is served; two servers with different ideas
//     could mount one disk twice or serve another filesystem under the
//     same name.
//   - ExportClients and ExportOptions: who may mount it and how; a move
//     must not change access.
//   - Grace and Lease: the clients' reclaim window and lease must not
//     depend on which server took over.
//   - Prefer: placement follows it, and the leader that places may change:
//     differing lists would move services back and forth.
//   - Namespace: the kernel state (nfsd, lockd, grace) the hook starts the
//     service in.
//
// Values are encoded as the hook would see them: the namespace as
// EffectiveNamespace (empty and the default are the same), durations in
// nanoseconds, lists in their order (order of preference; the order the
// hook exports in). The encoding is a fixed sequence of length-prefixed
// fields, never Go's formatting of the struct.
func (s Spec) Fingerprint() string {
	var b strings.Builder
	put := func(v string) {
		b.WriteString(strconv.Itoa(len(v)))
		b.WriteByte(':')
		b.WriteString(v)
		b.WriteByte(',')
	}
	field := func(name string, values ...string) {
		put(name)
		put(strconv.Itoa(len(values)))
		for _, v := range values {
			put(v)
		}
	}
	addr := ""
	if s.Address.IsValid() {
		addr = s.Address.String()
	}
	put(fingerprintVersion)
	field(FieldID, s.ID)
	field(FieldAddress, addr)
	field(FieldInterface, s.Interface)
	field(FieldDevice, s.Device)
	field(FieldMount, s.Mount)
	field(FieldExportClients, s.ExportClients...)
	field(FieldExportOptions, s.ExportOptions)
	field(FieldGrace, strconv.FormatInt(int64(s.Grace), 10))
	field(FieldLease, strconv.FormatInt(int64(s.Lease), 10))
	field(FieldPrefer, s.Prefer...)
	field(FieldNamespace, s.EffectiveNamespace())
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:8])
}

// Env is what a hook script is told about s, as NAME=value lines:
//
//	NSMD_SERVICE                 the id
//	NSMD_SERVICE_ADDRESS         the floating address (10.0.0.50)
//	NSMD_SERVICE_PREFIX          its prefix length (24)
//	NSMD_SERVICE_INTERFACE       where the address goes
//	NSMD_SERVICE_DEVICE          what to mount ("": the hook's default)
//	NSMD_SERVICE_MOUNT           where to mount it ("": the hook's default)
//	NSMD_SERVICE_EXPORT_CLIENTS  the clients, comma-separated
//	NSMD_SERVICE_EXPORT_OPTIONS  exportfs -o options ("": the hook's default)
//	NSMD_SERVICE_NAMESPACE       the network namespace (EffectiveNamespace)
//	NSMD_SERVICE_GRACE_SECONDS   grace in seconds ("": NSMD_GRACE_SECONDS)
//	NSMD_SERVICE_LEASE_SECONDS   nfsd lease in seconds ("": the hook's default)
//
// Every variable is always set, empty when the spec leaves it to a default.
func (s Spec) Env() []string {
	addr, bits := "", ""
	if s.Address.IsValid() {
		addr, bits = s.Address.Addr().String(), strconv.Itoa(s.Address.Bits())
	}
	secs := func(d time.Duration) string {
		if d == 0 {
			return ""
		}
		return strconv.FormatInt(int64(d/time.Second), 10)
	}
	return []string{
		"NSMD_SERVICE=" + s.ID,
		"NSMD_SERVICE_ADDRESS=" + addr,
		"NSMD_SERVICE_PREFIX=" + bits,
		"NSMD_SERVICE_INTERFACE=" + s.Interface,
		"NSMD_SERVICE_DEVICE=" + s.Device,
		"NSMD_SERVICE_MOUNT=" + s.Mount,
		"NSMD_SERVICE_EXPORT_CLIENTS=" + strings.Join(s.ExportClients, ","),
		"NSMD_SERVICE_EXPORT_OPTIONS=" + s.ExportOptions,
		"NSMD_SERVICE_NAMESPACE=" + s.EffectiveNamespace(),
		"NSMD_SERVICE_GRACE_SECONDS=" + secs(s.Grace),
		"NSMD_SERVICE_LEASE_SECONDS=" + secs(s.Lease),
	}
}
