package cluster

import (
	"bytes"
	"testing"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// FuzzForwardArgs: the APPLY arguments a leader decodes from any caller
// never panic the decoder, caps hold, and what decodes re-encodes to the
// same bytes.
func FuzzForwardArgs(f *testing.F) {
	cmd, _ := fsm.Encode(fsm.Register{Reg: testReg("10.77.0.1", "n1", 1)})
	w := oncrpc.NewWriter(nil)
	(&fwdArgs{SentNS: 1700000000000000000, Cmd: cmd, MAC: fwdMAC([]byte("k"), 1, cmd)}).MarshalXDR(w)
	f.Add(append([]byte(nil), w.Bytes()...))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		var a fwdArgs
		if err := a.UnmarshalXDR(oncrpc.NewReader(b)); err != nil {
			return
		}
		if len(a.Cmd) > fwdMaxCmd || len(a.MAC) > 32 {
			t.Fatalf("caps not enforced: cmd %d mac %d", len(a.Cmd), len(a.MAC))
		}
		w := oncrpc.NewWriter(nil)
		a.MarshalXDR(w)
		if !bytes.Equal(w.Bytes(), b) {
			t.Fatalf("round trip differs")
		}
		fsm.Decode(a.Cmd) // must not panic either
	})
}
