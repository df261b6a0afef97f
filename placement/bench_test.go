package placement

import (
	"fmt"
	"testing"
)

// BenchmarkDecide: 256 services (every one declared by every server,
// half with two preferred servers) on 16 servers, from scratch and once
// placed (the common case: nothing moves).
func BenchmarkDecide(b *testing.B) {
	in := Input{Declared: map[string]map[string]Decl{}, Placements: map[string]Placement{}}
	for i := range 16 {
		id := fmt.Sprintf("n%02d", i)
		in.Servers = append(in.Servers, Server{ID: id, Healthy: true})
		in.Declared[id] = map[string]Decl{}
		for j := range 256 {
			d := Decl{Fingerprint: "fp"}
			if j%2 == 0 {
				d.Prefer = []string{fmt.Sprintf("n%02d", j%16), fmt.Sprintf("n%02d", (j+1)%16)}
			}
			in.Declared[id][fmt.Sprintf("s%03d", j)] = d
		}
	}
	b.Run("from scratch", func(b *testing.B) {
		for b.Loop() {
			if len(Decide(in).Moves) != 256 {
				b.Fatal("not every service placed")
			}
		}
	})
	apply(in, Decide(in).Moves)
	b.Run("placed", func(b *testing.B) {
		for b.Loop() {
			if len(Decide(in).Moves) != 0 {
				b.Fatal("moves in a settled cluster")
			}
		}
	})
}
