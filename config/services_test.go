package config

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/service"
)

const twoServices = `node_id: nfs1
grace_period: 60s
services:
  - id: home
    address: 10.0.0.50/24
    interface: eth0
    device: /dev/disk/by-id/wwn-0x5000c500a1b2c3d4
    mount: /srv/nfs/home
    export_clients: [10.0.0.0/24, "@admins"]
    export_options: rw,sync,no_subtree_check,root_squash,fsid=11
    grace: 90s
    lease: 10s
    prefer: [nfs1, nfs2]
  - id: scratch
    address: 10.0.0.51/24
    interface: eth0
    device: /dev/disk/by-id/wwn-0x5000c500a1b2c3d5
    mount: /srv/nfs/scratch
    export_clients: "*"
    prefer: nfs2
    namespace: tenant-scratch
`

func writeFile(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nsmd.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestServicesFromTheFile(t *testing.T) {
	c := Default()
	if err := c.LoadFile(writeFile(t, twoServices)); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := []service.Spec{{
		ID: "home", Address: netip.MustParsePrefix("10.0.0.50/24"), Interface: "eth0",
		Device: "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4", Mount: "/srv/nfs/home",
		ExportClients: []string{"10.0.0.0/24", "@admins"}, ExportOptions: "rw,sync,no_subtree_check,root_squash,fsid=11",
		Grace: 90 * time.Second, Lease: 10 * time.Second, Prefer: []string{"nfs1", "nfs2"},
	}, {
		ID: "scratch", Address: netip.MustParsePrefix("10.0.0.51/24"), Interface: "eth0",
		Device: "/dev/disk/by-id/wwn-0x5000c500a1b2c3d5", Mount: "/srv/nfs/scratch",
		ExportClients: []string{"*"}, Prefer: []string{"nfs2"}, Namespace: "tenant-scratch",
	}}
	if !reflect.DeepEqual(c.Services, want) {
		t.Fatalf("services:\n%+v\nwant\n%+v", c.Services, want)
	}
	if c.NodeID != "nfs1" || c.GracePeriod != 60*time.Second {
		t.Fatalf("the other keys: %q %v", c.NodeID, c.GracePeriod)
	}
}

// Without services: nothing changes (no service is made up) and the
// single-service keys work as before.
func TestNoServicesIsTodaysConfig(t *testing.T) {
	c := Default()
	if err := c.LoadFile(writeFile(t, "node_id: n1\nvip_mode: loopback\nvip: 127.0.0.100/8\n")); err != nil {
		t.Fatal(err)
	}
	if c.Services != nil {
		t.Fatalf("services made up: %+v", c.Services)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// The fingerprint of a service read from the file is the golden one of
// package service for the same spec (so every server agrees), and does
// not depend on the order of the keys in the file.
func TestServiceFingerprintFromTheFileIgnoresKeyOrder(t *testing.T) {
	const golden = "832063574c84a0fe" // service's goldenFingerprint: the same spec
	a := `services:
  - id: home
    address: 10.0.0.50/24
    interface: eth0
    device: /dev/disk/by-id/wwn-0x5000c500a1b2c3d4
    mount: /srv/nfs/home
    export_clients: [10.0.0.0/24, "@admins"]
    export_options: rw,sync,no_subtree_check,root_squash,fsid=11
    grace: 90s
    lease: 10s
    prefer: [nfs1, nfs2]
`
	b := `services:
  - prefer: nfs1,nfs2
    lease: 10s
    grace: 1m30s
    export_options: "rw,sync,no_subtree_check,root_squash,fsid=11"
    export_clients:
      - 10.0.0.0/24
      - "@admins"
    mount: /srv/nfs/home
    device: /dev/disk/by-id/wwn-0x5000c500a1b2c3d4
    interface: eth0
    address: "10.0.0.50/24"
    id: home
    namespace: nsmd-home
`
	for name, text := range map[string]string{"a": a, "b": b} {
		c := Default()
		if err := c.LoadFile(writeFile(t, text)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := c.Services[0].Fingerprint(); got != golden {
			t.Errorf("%s: fingerprint %s, want %s", name, got, golden)
		}
	}
	// The control: a real difference shows.
	c := Default()
	if err := c.LoadFile(writeFile(t, strings.Replace(a, "lease: 10s", "lease: 20s", 1))); err != nil {
		t.Fatal(err)
	}
	if c.Services[0].Fingerprint() == golden {
		t.Fatal("another lease gives the same fingerprint")
	}
}

// Every problem of the list is refused naming the file, the line and the
// field, and a file with one changes nothing.
func TestServicesErrorsNameFileLineAndField(t *testing.T) {
	svc := func(id, addr, extra string) string {
		return "  - id: " + id + "\n    address: " + addr + "\n    interface: eth0\n" + extra
	}
	for _, c := range []struct {
		name, text string
		want       []string
	}{
		{"unknown key", "services:\n" + svc("a", "10.0.0.50/24", "    mountpoint: /srv\n"),
			[]string{"line 6", `service "a"`, `"mountpoint": unknown setting`}},
		{"repeated key", "services:\n" + svc("a", "10.0.0.50/24", "    interface: eth1\n"),
			[]string{"line 6", "interface: given again (first on line 5)"}},
		{"duplicate id", "services:\n" + svc("a", "10.0.0.50/24", "") + svc("a", "10.0.0.51/24", ""),
			[]string{"line 6", `service "a": id: "a" is also the id of services item 1`}},
		{"duplicate address", "services:\n" + svc("a", "10.0.0.50/24", "") + svc("b", "10.0.0.50/16", ""),
			[]string{"line 7", `service "b": address: "10.0.0.50" is also the address of services item 1`}},
		{"duplicate device", "services:\n" + svc("a", "10.0.0.50/24", "    device: /dev/sdb\n") + svc("b", "10.0.0.51/24", "    device: /dev/sdb\n"),
			[]string{"line 10", `service "b": device: "/dev/sdb" is also the device of services item 1`}},
		{"duplicate mount", "services:\n" + svc("a", "10.0.0.50/24", "    mount: /srv/x\n") + svc("b", "10.0.0.51/24", "    mount: /srv/x\n"),
			[]string{"line 10", `mount: "/srv/x" is also the mount of services item 1`}},
		{"duplicate namespace", "services:\n" + svc("a", "10.0.0.50/24", "") + svc("b", "10.0.0.51/24", "    namespace: nsmd-a\n"),
			[]string{"line 9", `namespace: "nsmd-a" is also the namespace of services item 1`}},
		{"bad address", "services:\n" + svc("a", "10.0.0.50", ""),
			[]string{"line 4", `service "a": address: "10.0.0.50" is not an address with its prefix length`}},
		{"missing address", "services:\n  - id: a\n    interface: eth0\n",
			[]string{"line 3", `service "a": address: missing`}},
		{"bad id", "services:\n" + svc("A_1", "10.0.0.50/24", ""),
			[]string{"line 3", "services item 1: id:"}},
		{"bad grace", "services:\n" + svc("a", "10.0.0.50/24", "    grace: 5s\n"),
			[]string{"line 6", `service "a": grace: 5s must be whole seconds`}},
		{"not a duration", "services:\n" + svc("a", "10.0.0.50/24", "    lease: ten\n"),
			[]string{"line 6", `lease: not a duration`}},
		{"list where a string goes", "services:\n" + svc("a", "10.0.0.50/24", "    device: [a, b]\n"),
			[]string{"line 6", "device: wrong type: want a string, got a list"}},
		{"mapping in a list", "services:\n" + svc("a", "10.0.0.50/24", "    prefer: [{x: 1}]\n"),
			[]string{"line 6", "prefer: wrong type: list item on line 6 is not a plain value"}},
		{"not a list", "services:\n  id: a\n", []string{"line 3", "services: want a list of services"}},
		{"empty list", "services: []\n", []string{"line 2", "services: the list is empty"}},
		{"item not a mapping", "services:\n  - home\n", []string{"line 3", "services item 1: want a mapping"}},
		{"given twice", "services:\n" + svc("a", "10.0.0.50/24", "") + "services:\n" + svc("b", "10.0.0.51/24", ""),
			[]string{"line 6", "services: given again (first on line 2)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			// node_id first: applied before the error, unless a refused file changes nothing.
			path := writeFile(t, "node_id: from-file\n"+c.text)
			cfg := Default()
			before := cfg
			err := cfg.LoadFile(path)
			if err == nil {
				t.Fatalf("accepted:\n%s", c.text)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
			if !strings.Contains(err.Error(), "config file "+path) {
				t.Errorf("error does not name the file:\n%v", err)
			}
			if cfg.NodeID != before.NodeID || cfg.Services != nil {
				t.Errorf("a refused file was applied: node_id %q, services %v", cfg.NodeID, cfg.Services)
			}
		})
	}
}

// With services, the services carry the floating addresses: vip and
// vip_interface are refused, and so is a service on the vip's or the
// node's own address; vip_mode applies to each service's address.
func TestValidateServicesAgainstTheNodesKeys(t *testing.T) {
	load := func(t *testing.T, text string) Config {
		t.Helper()
		c := Default()
		if err := c.LoadFile(writeFile(t, text)); err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, c := range []struct {
		name, extra string
		want        []string
	}{
		{"vip set", "vip: 10.0.0.60/24\n", []string{`vip: "10.0.0.60/24" is set beside services`}},
		{"vip is a service's address", "vip: 10.0.0.51/24\n", []string{"line 15", `service "scratch": address: 10.0.0.51 is the vip's address`, "vip: "}},
		{"vip_interface set", "vip_interface: eth0\n", []string{"vip_interface: \"eth0\" is set beside services"}},
		{"bind is a service's address", "bind: 10.0.0.50\ninsecure: true\n", []string{"line 5", `service "home": address: 10.0.0.50 is this node's bind address`}},
		{"loopback mode", "vip_mode: loopback\n", []string{`10.0.0.50 is not a loopback address`, `10.0.0.51 is not a loopback address`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := load(t, twoServices+c.extra)
			err := cfg.Validate()
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
	// netlink mode needs no vip with services; a witness may carry the list.
	cfg := load(t, twoServices+"vip_mode: netlink\nwitness: true\n")
	if err := cfg.Validate(); err != nil {
		t.Fatalf("netlink services on a witness: %v", err)
	}
	// A list set in code is checked too (no file, no line).
	cfg = Default()
	cfg.Services = []service.Spec{{ID: "a", Address: netip.MustParsePrefix("10.0.0.50/24"), Interface: "eth0"},
		{ID: "a", Address: netip.MustParsePrefix("10.0.0.51/24")}}
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), `services: service "a": interface: missing`) ||
		!strings.Contains(err.Error(), `service "a": id: "a" is also the id of services item 1`) || strings.Contains(err.Error(), "config file") {
		t.Fatalf("services set in code: %v", err)
	}
	cfg.Services = []service.Spec{}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "services: services: the list is empty") {
		t.Fatalf("empty list set in code: %v", err)
	}
}

// The list cannot come from the environment: NSMD_SERVICES is refused
// (not silently ignored), saying where to set it.
func TestServicesAreFileOnly(t *testing.T) {
	c := Default()
	err := c.ApplyEnv(func(k string) (string, bool) {
		if k == "NSMD_SERVICES" {
			return "home=10.0.0.50/24", true
		}
		return "", false
	})
	if err == nil || !strings.Contains(err.Error(), "NSMD_SERVICES") || !strings.Contains(err.Error(), "--config file only") {
		t.Fatalf("NSMD_SERVICES: %v", err)
	}
	if err := c.Set("services", "x"); err == nil {
		t.Fatal("services set as a flag")
	}
	for _, f := range Fields() {
		if f.Key == ServicesKey {
			t.Fatal("services is listed as a flag/env key")
		}
	}
}
