package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// servingCommand draws a kind 15–17 command over three nodes, for the
// replica and restore determinism tests.
func servingCommand(r *rand.Rand) Command {
	node := fmt.Sprintf("s%d", r.IntN(3))
	at := time.Unix(1_800_000_000+int64(r.IntN(1000)), 0).UTC()
	switch r.IntN(3) {
	case 0:
		return ServingBegin{Node: node, NSMAddr: "127.0.0.1:1", At: at,
			Promise: Promise{Mode: FenceMode(1 + r.IntN(3)), WatchdogTimeout: time.Duration(r.IntN(20)) * time.Second, Lease: time.Second}}
	case 1:
		return ServingEnd{Node: node, At: at}
	}
	return FenceConfirm{Node: node, By: "op", At: at}
}

var watchdog8s = Promise{Mode: FenceWatchdog, WatchdogTimeout: 8 * time.Second, Lease: 2 * time.Second, HookTimeout: 30 * time.Second, Margin: 2 * time.Second}

func TestServingRecordLivesFromBeginUntilEndOrConfirm(t *testing.T) {
	f := New(Options{})
	at := time.Unix(100, 0).UTC()
	applyOK(t, f, 1, ServingBegin{Node: "s1", NSMAddr: "10.0.0.1:1011", Promise: watchdog8s, At: at})
	applyOK(t, f, 2, ServingBegin{Node: "s2", Promise: Promise{Mode: FenceOff}, At: at})
	recs := f.ServingRecords()
	if len(recs) != 2 || recs[0].Node != "s1" || recs[0].Promise != watchdog8s || recs[0].NSMAddr != "10.0.0.1:1011" || !recs[0].Since.Equal(at) {
		t.Fatalf("records %+v", recs)
	}
	if b, ok := recs[0].Promise.Bound(); !ok || b != 12*time.Second {
		t.Fatalf("bound %v %v, want 12s (lease 2 + timeout 8 + margin 2)", b, ok)
	}
	if _, ok := recs[1].Promise.Bound(); ok {
		t.Fatal("a promise of off has a bound")
	}
	applyOK(t, f, 3, ServingEnd{Node: "s1", At: at})
	if _, ok := f.ServingRecordOf("s1"); ok {
		t.Fatal("s1 still recorded after its ServingEnd")
	}
	applyOK(t, f, 4, ServingEnd{Node: "nobody", At: at}) // no record: nothing happens
	applyOK(t, f, 5, FenceConfirm{Node: "s2", By: "alice", At: at})
	if _, ok := f.ServingRecordOf("s2"); ok {
		t.Fatal("s2 still recorded after the operator confirmed it off")
	}
	if c, ok := f.Confirmed("s2"); !ok || c.By != "alice" || !c.At.Equal(at) {
		t.Fatalf("confirmation %+v %v", c, ok)
	}
}

// A confirmation says the node is off now; once it takes over or serves
// again, the operator's word no longer holds (else a confirmation from
// last week would let a successor serve beside it today).
func TestConfirmationEndsWhenTheNodeTakesOverOrServesAgain(t *testing.T) {
	for _, again := range []Command{
		Takeover{Node: "s2", Reason: "leader_elected"},
		ServingBegin{Node: "s2", Promise: Promise{Mode: FenceOff}},
	} {
		t.Run(fmt.Sprintf("%T", again), func(t *testing.T) {
			f := New(Options{})
			applyOK(t, f, 1, FenceConfirm{Node: "s2", By: "alice"}, FenceConfirm{Node: "s3", By: "bob"})
			applyOK(t, f, 2, again)
			if _, ok := f.Confirmed("s2"); ok {
				t.Fatalf("s2's confirmation survived its %T", again)
			}
			if _, ok := f.Confirmed("s3"); !ok {
				t.Fatal("another node's confirmation was dropped")
			}
		})
	}
}

func TestConfirmationsAreBoundedDroppingTheOldest(t *testing.T) {
	f := New(Options{})
	for i := range maxConfirmations + 5 {
		applyOK(t, f, uint64(i+1), FenceConfirm{Node: fmt.Sprintf("n%03d", i), By: "op", At: time.Unix(int64(1000+i), 0)})
	}
	cs := f.Confirmations()
	if len(cs) != maxConfirmations {
		t.Fatalf("%d confirmations kept, want %d", len(cs), maxConfirmations)
	}
	if _, ok := f.Confirmed("n000"); ok {
		t.Fatal("the oldest confirmation was kept")
	}
	if _, ok := f.Confirmed(fmt.Sprintf("n%03d", maxConfirmations+4)); !ok {
		t.Fatal("the newest confirmation was dropped")
	}
}

func TestServingCommandsRefuseBadInput(t *testing.T) {
	for name, c := range map[string]Command{
		"empty node":        ServingBegin{Promise: watchdog8s},
		"unknown mode":      ServingBegin{Node: "s", Promise: Promise{}},
		"mode 4":            ServingBegin{Node: "s", Promise: Promise{Mode: 4}},
		"negative duration": ServingBegin{Node: "s", Promise: Promise{Mode: FenceWatchdog, Lease: -1}},
		"too long":          ServingBegin{Node: "s", Promise: Promise{Mode: FenceWatchdog, WatchdogTimeout: MaxPromiseDuration + 1}},
		"long address":      ServingBegin{Node: "s", NSMAddr: strings.Repeat("a", maxAddrLen+1), Promise: watchdog8s},
		"end without node":  ServingEnd{},
		"confirm no node":   FenceConfirm{By: "x"},
		"long by":           FenceConfirm{Node: "s", By: strings.Repeat("b", maxByLen+1)},
	} {
		if _, err := Encode(c); !errors.Is(err, ErrBadCommand) {
			t.Errorf("%s: Encode error %v, want ErrBadCommand", name, err)
		}
	}
	// And the decoder refuses the same on the wire, changing nothing.
	good, _ := Encode(ServingBegin{Node: "s", Promise: watchdog8s})
	for name, mutate := range map[string]func([]byte) []byte{
		"mode 0":   func(b []byte) []byte { b[6] = 0; return b }, // version, count, kind, len 1, 's', len 0, mode
		"mode 9":   func(b []byte) []byte { b[6] = 9; return b },
		"trailing": func(b []byte) []byte { return append(b, 0) },
	} {
		b := mutate(bytes.Clone(good))
		if _, err := Decode(b); !errors.Is(err, ErrBadCommand) {
			t.Errorf("%s: Decode error %v, want ErrBadCommand", name, err)
		}
	}
	if good[2] != kindServingBegin || good[6] != byte(FenceWatchdog) { // guard the offsets above
		t.Fatalf("offsets moved: %x", good)
	}
}

// A state without serving records keeps the version-3 snapshot, byte for
// byte what the previous release writes and reads; with records it is
// version 4, which an older release refuses rather than misapplies.
func TestSnapshotKeepsVersion3UntilAServingRecordExists(t *testing.T) {
	f := New(Options{})
	applyOK(t, f, 1, Register{Reg: mkReg("c1", lockd, "s1", "10.0.0.9")}, Takeover{Node: "s1"})
	b := persist(t, f)
	if b[len(snapMagic)] != snapVersion {
		t.Fatalf("snapshot version %d without records, want %d", b[len(snapMagic)], snapVersion)
	}
	applyOK(t, f, 2, ServingBegin{Node: "s1", NSMAddr: "10.0.0.1:1", Promise: watchdog8s, At: time.Unix(7, 0)})
	applyOK(t, f, 3, FenceConfirm{Node: "s3", By: "carol", At: time.Unix(8, 0)})
	b = persist(t, f)
	if b[len(snapMagic)] != snapVersion4 {
		t.Fatalf("snapshot version %d with records, want %d", b[len(snapMagic)], snapVersion4)
	}
	g := New(Options{})
	if err := restoreFrom(g, b); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if g.Digest() != f.Digest() {
		t.Fatal("restored state differs")
	}
	if r, ok := g.ServingRecordOf("s1"); !ok || r.Promise != watchdog8s {
		t.Fatalf("restored record %+v %v", r, ok)
	}
	if c, ok := g.Confirmed("s3"); !ok || c.By != "carol" {
		t.Fatalf("restored confirmation %+v %v", c, ok)
	}
	// The record ends: back to version 3 (the confirmation ends too).
	applyOK(t, f, 4, ServingEnd{Node: "s1"}, Takeover{Node: "s3"})
	b = persist(t, f)
	if b[len(snapMagic)] != snapVersion {
		t.Fatalf("snapshot version %d once records are gone, want %d", b[len(snapMagic)], snapVersion)
	}
	// A corrupted version-4 stream changes nothing.
	bad := bytes.Clone(b)
	bad[len(snapMagic)] = snapVersion4 // claims sections it lacks: trailer counts missing
	if err := restoreFrom(g, bad); !errors.Is(err, ErrCorruptSnapshot) {
		t.Fatalf("Restore of a bad version-4 stream: %v", err)
	}
	if _, ok := g.ServingRecordOf("s1"); !ok {
		t.Fatal("a refused restore changed the state")
	}
}
