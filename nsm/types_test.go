package nsm

import (
	"bytes"
	"errors"
	"testing"

	"github.com/nsmd/nsmd/oncrpc"
)

// wireType is a pointer to an NSM wire type.
type wireType[T any] interface {
	*T
	oncrpc.Marshaler
	oncrpc.Unmarshaler
}

// fuzzRoundTrip checks that decoding never panics and that whatever decodes
// encodes back to exactly the bytes it was decoded from (XDR is canonical:
// padding is zero and every enum value is declared).
func fuzzRoundTrip[T any, P wireType[T]](f *testing.F, seeds ...P) {
	for _, s := range seeds {
		w := oncrpc.NewWriter(nil)
		s.MarshalXDR(w)
		f.Add(bytes.Clone(w.Bytes()))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var v T
		r := oncrpc.NewReader(b)
		if err := P(&v).UnmarshalXDR(r); err != nil {
			if r.Err() == nil {
				t.Fatalf("error %v but reader not failed", err)
			}
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

func FuzzSMName(f *testing.F) {
	fuzzRoundTrip(f, &SMName{"client.example.test"}, &SMName{})
}

func FuzzMyID(f *testing.F) { fuzzRoundTrip(f, &lockd, &ganesha) }

func FuzzMonID(f *testing.F) { fuzzRoundTrip(f, &MonID{"10.0.0.1", lockd}) }

func FuzzMon(f *testing.F) { fuzzRoundTrip(f, mon("10.0.0.1", lockd), mon("c", ganesha)) }

func FuzzSMStatRes(f *testing.F) {
	fuzzRoundTrip(f, &SMStatRes{StatSucc, 3}, &SMStatRes{StatFail, -1})
}

func FuzzSMStat(f *testing.F) { fuzzRoundTrip(f, &SMStat{7}) }

func FuzzStatChge(f *testing.F) { fuzzRoundTrip(f, &StatChge{"nfs.example.test", 5}) }

// Byte vectors annotated field by field (sm_inter.x).
func TestMonWireFormat(t *testing.T) {
	m := Mon{ID: MonID{MonName: "abcde", My: MyID{MyName: "srv", Prog: 100021, Vers: 3, Proc: 16}}}
	m.Priv[15] = 0x42
	want := []byte{
		0, 0, 0, 5, 'a', 'b', 'c', 'd', 'e', 0, 0, 0, // mon_name<1024>
		0, 0, 0, 3, 's', 'r', 'v', 0, // my_name<1024>
		0, 1, 0x86, 0xb5, // my_prog 100021
		0, 0, 0, 3, // my_vers
		0, 0, 0, 16, // my_proc
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x42, // priv[16]
	}
	w := oncrpc.NewWriter(nil)
	m.MarshalXDR(w)
	if !bytes.Equal(w.Bytes(), want) {
		t.Fatalf("encoded %x\nwant    %x", w.Bytes(), want)
	}
	var got Mon
	r := oncrpc.NewReader(want)
	if err := got.UnmarshalXDR(r); err != nil || r.Done() != nil || got != m {
		t.Fatalf("decoded %+v, %v", got, err)
	}
}

func TestDecodersEnforceMaxima(t *testing.T) {
	w := oncrpc.NewWriter(nil)
	w.String(long)
	w.Int32(1)
	var sc StatChge
	if err := sc.UnmarshalXDR(oncrpc.NewReader(w.Bytes())); !errors.Is(err, oncrpc.ErrTooLong) {
		t.Errorf("stat_chge 1025: %v", err)
	}
	var res SMStatRes
	if err := res.UnmarshalXDR(oncrpc.NewReader([]byte{0, 0, 0, 2, 0, 0, 0, 1})); !errors.Is(err, ErrBadEnum) {
		t.Errorf("res 2: %v", err)
	}
	var m Mon
	if err := m.UnmarshalXDR(oncrpc.NewReader([]byte{0, 0, 0, 1, 'a', 0, 0, 0})); !errors.Is(err, oncrpc.ErrShort) {
		t.Errorf("short mon: %v", err)
	}
}

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"host": true, "10.0.0.1": true, "::1": true, "a.b": true,
		"": false, ".a": false, "a/b": false, "/": false, long: false,
	} {
		if ValidName(name) != want {
			t.Errorf("ValidName(%.20q) = %v", name, !want)
		}
	}
}
