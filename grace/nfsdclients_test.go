package grace

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// The info files as Linux 6.1 writes them (fs/nfsd/nfs4state.c
// client_info_show); the real directory is read in the QEMU tier.
const (
	info40 = "clientid: 0x6543a1b200000001\naddress: \"10.77.0.23:833\"\nstatus: confirmed\nname: \"Linux NFSv4.0 c40/10.77.0.12 tcp\"\nminor version: 0\n"
	info42 = "clientid: 0x6543a1b200000002\naddress: \"10.77.0.24:0\"\nstatus: courtesy\nname: \"Linux NFSv4.2 c\\x22q\\x5c\\xff\"\nminor version: 2\nImplementation domain: \"kernel.org\"\n"
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
	root := writeClients(t, map[string]string{"3": info42, "2": info40})
	got, err := NFSdClients(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []V4Client{
		{Name: "Linux NFSv4.0 c40/10.77.0.12 tcp", Minor: 0, Status: "confirmed", Address: "10.77.0.23:833"},
		{Name: "Linux NFSv4.2 c\"q\\\xff", Minor: 2, Status: "courtesy", Address: "10.77.0.24:0"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("client %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if !got[0].Confirmed() || got[1].Confirmed() {
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
