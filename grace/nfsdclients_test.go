package grace

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The info files as Linux 6.1 and 6.12 write them (fs/nfsd/nfs4state.c
// client_info_show; "seconds from last renew" since 5.19), and one of an
// older kernel without it; the real directory is read in the QEMU tier.
const (
	info40 = "clientid: 0x6543a1b200000001\naddress: \"10.77.0.23:833\"\nstatus: confirmed\nseconds from last renew: 3\nname: \"Linux NFSv4.0 c40/10.77.0.12 tcp\"\nminor version: 0\n"
	info42 = "clientid: 0x6543a1b200000002\naddress: \"10.77.0.24:0\"\nstatus: courtesy\nseconds from last renew: 86400\nname: \"Linux NFSv4.2 c\\x22q\\x5c\\xff\"\nminor version: 2\nImplementation domain: \"kernel.org\"\n"
	info41 = "clientid: 0x6543a1b200000003\naddress: \"10.77.0.25:0\"\nstatus: confirmed\nname: \"Linux NFSv4.1 old\"\nminor version: 1\n"
)

func writeClients(t *testing.T, infos map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for id, info := range infos {
		d := filepath.Join(root, "fs", "nfsd", "clients", id)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "info"), []byte(info), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestNFSdClientsParsesTheKernelFiles(t *testing.T) {
	root := writeClients(t, map[string]string{"3": info42, "2": info40, "4": info41})
	got, err := NFSdClients(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []V4Client{
		{Name: "Linux NFSv4.0 c40/10.77.0.12 tcp", Minor: 0, Status: "confirmed", Address: "10.77.0.23:833", SinceRenew: 3 * time.Second},
		{Name: "Linux NFSv4.1 old", Minor: 1, Status: "confirmed", Address: "10.77.0.25:0", SinceRenew: -1},
		{Name: "Linux NFSv4.2 c\"q\\\xff", Minor: 2, Status: "courtesy", Address: "10.77.0.24:0", SinceRenew: 24 * time.Hour},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("client %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if !got[0].Confirmed() || got[2].Confirmed() {
		t.Error("Confirmed() wrong")
	}
}

func TestNFSdClientsRefusesWhatItCannotRead(t *testing.T) {
	if _, err := NFSdClients(t.TempDir()); !errors.Is(err, ErrNoManager) {
		t.Fatalf("no nfsd: %v, want ErrNoManager", err)
	}
	for name, info := range map[string]string{
		"unquoted name": "name: Linux\nminor version: 0\n",
		"bad escape":    "name: \"a\\q\"\nminor version: 0\n",
		"short escape":  "name: \"a\\x4\"\nminor version: 0\n",
		"no minor":      "name: \"a\"\n",
		"minor 7":       "name: \"a\"\nminor version: 7\n",
		"renew -1":      "name: \"a\"\nminor version: 0\nseconds from last renew: -1\n",
		"renew text":    "name: \"a\"\nminor version: 0\nseconds from last renew: soon\n",
	} {
		if _, err := NFSdClients(writeClients(t, map[string]string{"1": info})); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzParseClientInfo(f *testing.F) {
	f.Add([]byte(info40))
	f.Add([]byte(info42))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseClientInfo(b)
		if err == nil && (c.Minor < 0 || c.Minor > 2) {
			t.Fatalf("accepted minor %d", c.Minor)
		}
	})
}
