package ephemeral

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/chunking"
)

// BenchmarkFullCopy2M is a warm node's full copy (8 replicas × 250 k
// blocks) applied, copied for a watcher and split into 1 MiB chunks: the
// server's share of a full copy's time (docs/benchmarks.md "Large KV
// caches").
func BenchmarkFullCopy2M(b *testing.B) {
	u := bigKV(8, 250_000)
	b.Run("apply", func(b *testing.B) {
		for b.Loop() {
			s := NewStore()
			if v := s.Apply(u); v != Accepted {
				b.Fatal(v)
			}
		}
	})
	b.Run("fullcopy", func(b *testing.B) {
		s := NewStore()
		s.Apply(u)
		for b.Loop() {
			s.FullCopy("n1")
		}
	})
	// The part of a copy done under the store's lock, which every
	// agent's updates wait on; sorting comes after.
	b.Run("fullcopy-locked", func(b *testing.B) {
		s := NewStore()
		s.Apply(u)
		for b.Loop() {
			s.mu.Lock()
			s.nodes["n1"].fullCopy("n1")
			s.mu.Unlock()
		}
	})
	b.Run("clone", func(b *testing.B) {
		for b.Loop() {
			proto.Clone(u)
		}
	})
	b.Run("split", func(b *testing.B) {
		for b.Loop() {
			chunking.Split(u, 1<<20)
		}
	})
	b.Run("marshal", func(b *testing.B) {
		for b.Loop() {
			for _, c := range chunking.Split(u, 1<<20) {
				if _, err := proto.Marshal(c); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("assemble", func(b *testing.B) {
		chunks := chunking.Split(u, 1<<20)
		for b.Loop() {
			a := chunking.NewAssembler(0)
			for _, c := range chunks {
				if _, err := a.Add(c); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
