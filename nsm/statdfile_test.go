package nsm

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

// A record as rpc.statd writes it on x86 (little-endian): 0100007f is
// 127.0.0.1's network-order bytes read as a host-order integer.
const statdLine = "0100007f 000186b5 00000003 00000010 00112233445566778899aabbccddeeff 10.77.0.21 nfs-server-1"

func TestParseStatdRecord(t *testing.T) {
	r, err := ParseStatdRecord(statdLine)
	if err != nil {
		t.Fatal(err)
	}
	if r.Callback != netip.MustParseAddr("127.0.0.1") || r.My.Prog != 100021 || r.My.Vers != 3 || r.My.Proc != 16 ||
		r.MonName != "10.77.0.21" || r.My.MyName != "nfs-server-1" || r.Priv[0] != 0x00 || r.Priv[15] != 0xff {
		t.Fatalf("parsed %+v", r)
	}
	if got := r.String(); got != statdLine {
		t.Errorf("String() = %q, want %q", got, statdLine)
	}
}

func TestParseStatdRecordRejectsMalformed(t *testing.T) {
	for name, line := range map[string]string{
		"fields":    "0100007f 000186b5 00000003 00000010 00 host",
		"hex":       "0100007g 000186b5 00000003 00000010 00112233445566778899aabbccddeeff h s",
		"priv":      "0100007f 000186b5 00000003 00000010 0011 h s",
		"slash":     "0100007f 000186b5 00000003 00000010 00112233445566778899aabbccddeeff a/b s",
		"short num": "7f 000186b5 00000003 00000010 00112233445566778899aabbccddeeff h s",
	} {
		if _, err := ParseStatdRecord(line); !errors.Is(err, ErrStatdRecord) {
			t.Errorf("%s: err = %v, want ErrStatdRecord", name, err)
		}
	}
}

func TestStatdDirRoundTrip(t *testing.T) {
	dir := t.TempDir()
	r1, _ := ParseStatdRecord(statdLine)
	r2 := r1
	r2.My.MyName = "nfs-server-2"
	r3 := r1
	r3.MonName = "client.example"
	in := StatdDir{State: 17, Records: []StatdRecord{r1, r2, r3}}
	if err := WriteStatdDir(dir, in); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "sm", "10.77.0.21"))
	if want := r1.String() + "\n" + r2.String() + "\n"; string(b) != want {
		t.Errorf("sm/10.77.0.21 = %q, want %q", b, want)
	}
	// sm.bak duplicates (a reboot in progress) are read once.
	os.MkdirAll(filepath.Join(dir, "sm.bak"), 0o700)
	os.WriteFile(filepath.Join(dir, "sm.bak", "client.example"), []byte(r3.String()+"\n"), 0o600)
	out, err := ReadStatdDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if out.State != 17 || len(out.Records) != 3 {
		t.Fatalf("read back state %d, %d records: %+v", out.State, len(out.Records), out.Records)
	}
}

func TestReadStatdDirWithoutStateFile(t *testing.T) {
	out, err := ReadStatdDir(t.TempDir())
	if err != nil || out.State != 0 || len(out.Records) != 0 {
		t.Fatalf("empty dir: %+v %v", out, err)
	}
}
