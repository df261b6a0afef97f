package nlm

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/nsmd/nsmd/oncrpc"
)

// Byte vector for the NSM callback argument (sm_inter.x "status").
func TestStatusWireFormat(t *testing.T) {
	s := Status{MonName: "cli", State: 5, Priv: [16]byte{15: 9}}
	want := []byte{
		0, 0, 0, 3, 'c', 'l', 'i', 0, // mon_name
		0, 0, 0, 5, // state
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, // priv
	}
	w := oncrpc.NewWriter(nil)
	s.MarshalXDR(w)
	if !bytes.Equal(w.Bytes(), want) {
		t.Fatalf("encoded %x", w.Bytes())
	}
	w.Reset()
	(&Status{MonName: strings.Repeat("x", SMMaxStrLen+1)}).MarshalXDR(w)
	var got Status
	if err := got.UnmarshalXDR(oncrpc.NewReader(w.Bytes())); !errors.Is(err, oncrpc.ErrTooLong) {
		t.Errorf("1025-byte mon_name: %v", err)
	}
}

func TestStatString(t *testing.T) {
	if DeniedGracePeriod.String() != "denied_grace_period" || DeniedGracePeriod != 4 || Stat(77).String() != "nlm4_stat(77)" {
		t.Error(DeniedGracePeriod.String())
	}
}

func roundTrip[T any, P interface {
	*T
	oncrpc.Marshaler
	oncrpc.Unmarshaler
}](f *testing.F, seeds ...P) {
	for _, s := range seeds {
		w := oncrpc.NewWriter(nil)
		s.MarshalXDR(w)
		f.Add(bytes.Clone(w.Bytes()))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var v T
		r := oncrpc.NewReader(b)
		if P(&v).UnmarshalXDR(r) != nil {
			return
		}
		used := len(b) - r.Remaining()
		w := oncrpc.NewWriter(nil)
		P(&v).MarshalXDR(w)
		if !bytes.Equal(w.Bytes(), b[:used]) {
			t.Fatalf("round trip:\n in  %x\n out %x", b[:used], w.Bytes())
		}
	})
}

func FuzzStatus(f *testing.F) {
	roundTrip(f, &Status{MonName: "10.0.0.1", State: 3, Priv: [16]byte{1, 2, 3}})
}

func FuzzNotify(f *testing.F) { roundTrip(f, &Notify{Name: "client", State: 7}) }
