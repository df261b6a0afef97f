package service

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func example() Spec {
	return Spec{
		ID:            "home",
		Address:       netip.MustParsePrefix("10.0.0.50/24"),
		Interface:     "eth0",
		Device:        "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4",
		Mount:         "/srv/nfs/home",
		ExportClients: []string{"10.0.0.0/24", "@admins"},
		ExportOptions: "rw,sync,no_subtree_check,root_squash,fsid=11",
		Grace:         90 * time.Second,
		Lease:         10 * time.Second,
		Prefer:        []string{"nfs1", "nfs2"},
	}
}

// goldenFingerprint is example()'s fingerprint. It must never change: two
// servers of different releases (or built by different Go versions)
// compare fingerprints, and a change would show every service as a
// conflict during a rolling upgrade. Change it only with the encoding's
// version (fingerprintVersion). The value was also computed outside Go,
// from the encoding documented at Fingerprint (a few lines of Python).
const goldenFingerprint = "832063574c84a0fe"

func TestFingerprintIsTheGoldenOne(t *testing.T) {
	if got := example().Fingerprint(); got != goldenFingerprint {
		t.Fatalf("fingerprint %s, want %s: the canonical encoding changed", got, goldenFingerprint)
	}
}

// Every field takes part: changing any one changes the fingerprint. A
// field added to Spec and forgotten in the encoding fails here (the
// test changes every field by reflection).
func TestFingerprintCoversEveryField(t *testing.T) {
	base := example()
	want := base.Fingerprint()
	v := reflect.ValueOf(&base).Elem()
	if v.NumField() != len(Fields()) {
		t.Fatalf("Spec has %d fields, Fields() names %d", v.NumField(), len(Fields()))
	}
	for i := range v.NumField() {
		s := example()
		f := reflect.ValueOf(&s).Elem().Field(i)
		switch x := f.Addr().Interface().(type) {
		case *string:
			*x += "x"
		case *netip.Prefix:
			*x = netip.MustParsePrefix("10.0.0.50/25")
		case *time.Duration:
			*x += time.Second
		case *[]string:
			*x = append(slices.Clone(*x), "x")
		default:
			t.Fatalf("field %s: type %T not covered by this test", v.Type().Field(i).Name, x)
		}
		if s.Fingerprint() == want {
			t.Errorf("changing %s does not change the fingerprint", v.Type().Field(i).Name)
		}
	}
	// Lists: order counts (preference), and items are not run together.
	s := example()
	s.Prefer = []string{"nfs2", "nfs1"}
	if s.Fingerprint() == want {
		t.Error("the order of prefer does not change the fingerprint")
	}
	a, b := example(), example()
	a.ExportClients, a.ExportOptions = []string{"x", "y"}, ""
	b.ExportClients, b.ExportOptions = []string{"x"}, "y"
	if a.Fingerprint() == b.Fingerprint() {
		t.Error("values of neighbouring fields run together in the encoding")
	}
}

// The same meaning gives the same fingerprint: an empty namespace is the
// default one.
func TestFingerprintOfTheDefaultNamespace(t *testing.T) {
	a, b := example(), example()
	b.Namespace = "nsmd-home"
	if a.Fingerprint() != b.Fingerprint() {
		t.Fatal("namespace \"\" and its default differ")
	}
	b.Namespace = "nsmd-other"
	if a.Fingerprint() == b.Fingerprint() {
		t.Fatal("another namespace gives the same fingerprint")
	}
}

func TestValidateNamesTheField(t *testing.T) {
	if err := example().Validate(); err != nil {
		t.Fatalf("example: %v", err)
	}
	for _, c := range []struct {
		field  string
		change func(*Spec)
	}{
		{FieldID, func(s *Spec) { s.ID = "" }},
		{FieldID, func(s *Spec) { s.ID = "Home" }},
		{FieldID, func(s *Spec) { s.ID = "home-" }},
		{FieldID, func(s *Spec) { s.ID = "-home" }},
		{FieldID, func(s *Spec) { s.ID = strings.Repeat("a", 33) }},
		{FieldAddress, func(s *Spec) { s.Address = netip.Prefix{} }},
		{FieldAddress, func(s *Spec) { s.Address = netip.MustParsePrefix("0.0.0.0/24") }},
		{FieldAddress, func(s *Spec) { s.Address = netip.MustParsePrefix("224.0.0.5/24") }},
		{FieldAddress, func(s *Spec) { s.Address = netip.MustParsePrefix("10.0.0.0/24") }},
		{FieldAddress, func(s *Spec) { s.Address = netip.MustParsePrefix("::ffff:10.0.0.50/120") }},
		{FieldAddress, func(s *Spec) { s.Address = netip.MustParsePrefix("fe80::1/64") }},
		{FieldInterface, func(s *Spec) { s.Interface = "" }},
		{FieldInterface, func(s *Spec) { s.Interface = "eth0:1" }},
		{FieldInterface, func(s *Spec) { s.Interface = "a-very-long-name0" }},
		{FieldDevice, func(s *Spec) { s.Device = "/dev/sd a" }},
		{FieldMount, func(s *Spec) { s.Mount = "srv/nfs" }},
		{FieldMount, func(s *Spec) { s.Mount = "/srv/nfs/" }},
		{FieldMount, func(s *Spec) { s.Mount = "/srv/../etc" }},
		{FieldMount, func(s *Spec) { s.Mount = "/" }},
		{FieldExportClients, func(s *Spec) { s.ExportClients = []string{"a,b"} }},
		{FieldExportClients, func(s *Spec) { s.ExportClients = []string{""} }},
		{FieldExportClients, func(s *Spec) { s.ExportClients = []string{"host(rw)"} }},
		{FieldExportOptions, func(s *Spec) { s.ExportOptions = "rw, sync" }},
		{FieldGrace, func(s *Spec) { s.Grace = 5 * time.Second }},
		{FieldGrace, func(s *Spec) { s.Grace = 90*time.Second + time.Millisecond }},
		{FieldLease, func(s *Spec) { s.Lease = 2 * time.Hour }},
		{FieldLease, func(s *Spec) { s.Lease = -time.Second }},
		{FieldPrefer, func(s *Spec) { s.Prefer = []string{"nfs1", "nfs1"} }},
		{FieldPrefer, func(s *Spec) { s.Prefer = []string{"a b"} }},
		{FieldNamespace, func(s *Spec) { s.Namespace = "a/b" }},
		{FieldNamespace, func(s *Spec) { s.Namespace = "-x" }},
	} {
		s := example()
		c.change(&s)
		ps := s.Problems()
		if len(ps) != 1 || ps[0].Field != c.field || !errors.Is(ps[0], ErrInvalid) {
			t.Errorf("%+v: problems %v, want one naming %s", s, ps, c.field)
			continue
		}
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), c.field+": ") {
			t.Errorf("Validate: %v, want it to name %s", err, c.field)
		}
	}
	// The optional fields may be empty.
	min := Spec{ID: "a", Address: netip.MustParsePrefix("fd00::50/64"), Interface: "lo"}
	if err := min.Validate(); err != nil {
		t.Fatalf("minimal spec: %v", err)
	}
}

func TestEnvNamesEveryValue(t *testing.T) {
	got := example().Env()
	want := []string{
		"NSMD_SERVICE=home",
		"NSMD_SERVICE_ADDRESS=10.0.0.50",
		"NSMD_SERVICE_PREFIX=24",
		"NSMD_SERVICE_INTERFACE=eth0",
		"NSMD_SERVICE_DEVICE=/dev/disk/by-id/wwn-0x5000c500a1b2c3d4",
		"NSMD_SERVICE_MOUNT=/srv/nfs/home",
		"NSMD_SERVICE_EXPORT_CLIENTS=10.0.0.0/24,@admins",
		"NSMD_SERVICE_EXPORT_OPTIONS=rw,sync,no_subtree_check,root_squash,fsid=11",
		"NSMD_SERVICE_NAMESPACE=nsmd-home",
		"NSMD_SERVICE_GRACE_SECONDS=90",
		"NSMD_SERVICE_LEASE_SECONDS=10",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("env:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Defaults are empty values, never missing variables.
	min := Spec{ID: "b", Address: netip.MustParsePrefix("10.0.0.51/24"), Interface: "eth0", Namespace: "tenant-b"}
	env := min.Env()
	if len(env) != len(want) || !slices.Contains(env, "NSMD_SERVICE_GRACE_SECONDS=") || !slices.Contains(env, "NSMD_SERVICE_NAMESPACE=tenant-b") {
		t.Fatalf("env of a minimal spec: %q", env)
	}
}
