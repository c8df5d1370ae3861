package kvindex

import (
	"math/rand/v2"
	"testing"
)

// The tables against Go maps under random adds and removes, over key
// spaces that force collisions, wrap-around, zero keys, growth and shrink.
func TestTablesAgainstMaps(t *testing.T) {
	tests := []struct {
		name  string
		keys  uint64 // keys drawn from [0, keys) times mul
		mul   uint64
		ops   int
		addPc int // share of adds, percent
	}{
		{"small dense with zero", 20, 1, 5000, 55},
		{"sparse hashes", 1 << 62, 3, 20000, 60},
		{"grow then drain", 4000, 1, 40000, 30},
		{"same home (multiples of 2^61)", 8, 1 << 61, 2000, 50},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(len(tc.name))))
			var s hashSet
			var bt blockTable
			bt.init(minCap)
			model := map[uint64]bool{}
			// Fill first for "grow then drain", then mostly remove.
			for i := range tc.ops {
				k := rng.Uint64N(tc.keys) * tc.mul
				add := rng.IntN(100) < tc.addPc
				if tc.name == "grow then drain" && i < tc.ops/4 {
					add = true
				}
				if add {
					if got, want := s.add(k), !model[k]; got != want {
						t.Fatalf("op %d: add(%x) = %v, want %v", i, k, got, want)
					}
					if k != 0 {
						sl := bt.slot(k)
						sl.n, sl.ids[0] = 1, uint16(k)
					}
					model[k] = true
				} else {
					if got, want := s.remove(k), model[k]; got != want {
						t.Fatalf("op %d: remove(%x) = %v, want %v", i, k, got, want)
					}
					if at := bt.find(k); (at >= 0) != (model[k] && k != 0) {
						t.Fatalf("op %d: blockTable find(%x) = %d, model %v", i, k, at, model[k])
					} else if at >= 0 {
						bt.del(at)
					}
					delete(model, k)
				}
			}
			if s.Len() != len(model) {
				t.Fatalf("set holds %d, model %d", s.Len(), len(model))
			}
			seen := 0
			s.each(func(k uint64) {
				seen++
				if !model[k] || !s.has(k) {
					t.Fatalf("set lists %x, model %v", k, model[k])
				}
			})
			if seen != len(model) {
				t.Fatalf("each listed %d, model %d", seen, len(model))
			}
			n := 0
			for k := range model {
				if k == 0 {
					continue
				}
				n++
				if h := bt.get(k); h.n != 1 || h.ids[0] != uint16(k) {
					t.Fatalf("blockTable lost %x: %+v", k, h)
				}
			}
			if bt.n != n {
				t.Fatalf("blockTable counts %d, model %d", bt.n, n)
			}
			for i, sl := range bt.slots {
				if sl.n != 0 && bt.find(sl.key) != i {
					t.Fatalf("slot %d (%x) not reachable from its home", i, sl.key)
				}
			}
			if len(model) == 0 && len(s.keys) > minCap {
				t.Errorf("an empty set kept %d slots", len(s.keys))
			}
		})
	}
}
