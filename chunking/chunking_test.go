package chunking

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func hashes(r *rand.Rand, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = r.Uint64()
	}
	return out
}

// bigUpdate is a node's update with replicas × blocks hashes in the GPU
// tier (and more in the offload tiers), some statuses, adapters and
// removals.
func bigUpdate(full bool, replicas, blocks int) *llmgwv1.EphemeralUpdate {
	r := rand.New(rand.NewPCG(1, 2))
	u := &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 7, Seq: 3, Full: full}
	for i := range replicas {
		id := fmt.Sprintf("m-%d", i)
		u.Statuses = append(u.Statuses, &llmgwv1.ReplicaStatus{ReplicaId: id, Uid: uint64(i + 1), Address: "127.0.0.1:8000", Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY})
		u.Adapters = append(u.Adapters, &llmgwv1.AdapterStatus{ReplicaId: id, Uid: uint64(i + 1), Adapter: "a"})
		b := &llmgwv1.KVBlocks{ReplicaId: id, Uid: uint64(i + 1), Incarnation: 2, Reset_: full, BlockSize: 16, Stored: hashes(r, blocks),
			StoredCpu: hashes(r, 2*blocks), StoredStorage: hashes(r, blocks/2)}
		if !full {
			b.Removed = hashes(r, blocks/3)
			b.RemovedCpu = hashes(r, blocks/4)
			b.RemovedStorage = hashes(r, blocks/5)
		}
		u.Kv = append(u.Kv, b)
	}
	if !full {
		u.RemovedReplicas = []string{"gone-1", "gone-2"}
	}
	return u
}

func TestSplitAssembleRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name             string
		full             bool
		replicas, blocks int
		maxBytes         int
		wantChunks       int // 0: more than one
	}{
		{"fits", true, 2, 100, 1 << 20, 1},
		{"no budget", true, 2, 100_000, 0, 1},
		{"full copy, one replica over many chunks", true, 1, 200_000, 64 << 10, 0},
		{"full copy, many replicas", true, 8, 20_000, 64 << 10, 0},
		{"delta with removals", false, 3, 30_000, 16 << 10, 0},
		{"budget below the minimum", true, 1, 5_000, 100, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := bigUpdate(tc.full, tc.replicas, tc.blocks)
			want := proto.Clone(u)
			chunks := Split(u, tc.maxBytes)
			if !proto.Equal(u, want) {
				t.Fatal("Split modified its input")
			}
			if tc.wantChunks == 1 && (len(chunks) != 1 || chunks[0] != u) {
				t.Fatalf("got %d chunks, want the update itself", len(chunks))
			}
			if tc.wantChunks == 0 && len(chunks) < 2 {
				t.Fatalf("got %d chunks, want several", len(chunks))
			}
			limit := max(tc.maxBytes, MinChunkBytes)
			a := NewAssembler(0)
			// Reversed: the plane's separate connections may reorder.
			var got *llmgwv1.EphemeralUpdate
			for i := len(chunks) - 1; i >= 0; i-- {
				c := chunks[i]
				if n := proto.Size(c); tc.maxBytes > 0 && len(chunks) > 1 && n > limit {
					t.Errorf("chunk %d is %d bytes, above the budget %d", i, n, limit)
				}
				out, err := a.Add(c)
				if err != nil {
					t.Fatalf("chunk %d: %v", i, err)
				}
				if out != nil && i != 0 {
					t.Fatalf("update complete at chunk %d of %d", i, len(chunks))
				}
				got = out
			}
			if got == nil {
				t.Fatal("no update assembled from all the chunks")
			}
			if !proto.Equal(got, want) {
				t.Fatalf("assembled update differs from the original (%d vs %d bytes)", proto.Size(got), proto.Size(want))
			}
			if a.Pending() != 0 {
				t.Fatalf("%d updates still pending", a.Pending())
			}
		})
	}
}

func TestAssemblerRefuses(t *testing.T) {
	chunks := Split(bigUpdate(true, 1, 20_000), 16<<10)
	if len(chunks) < 3 {
		t.Fatalf("want at least 3 chunks, got %d", len(chunks))
	}
	cl := func(u *llmgwv1.EphemeralUpdate, f func(*llmgwv1.EphemeralUpdate)) *llmgwv1.EphemeralUpdate {
		c := proto.Clone(u).(*llmgwv1.EphemeralUpdate)
		f(c)
		return c
	}
	for _, tc := range []struct {
		name string
		max  int
		in   []*llmgwv1.EphemeralUpdate
	}{
		{"chunk beyond chunks", 0, []*llmgwv1.EphemeralUpdate{cl(chunks[0], func(u *llmgwv1.EphemeralUpdate) { u.Chunk = u.Chunks })}},
		{"too many chunks", 0, []*llmgwv1.EphemeralUpdate{cl(chunks[0], func(u *llmgwv1.EphemeralUpdate) { u.Chunks = MaxChunks + 1 })}},
		{"chunk of a whole update", 0, []*llmgwv1.EphemeralUpdate{cl(chunks[0], func(u *llmgwv1.EphemeralUpdate) { u.Chunks, u.Chunk = 1, 1 })}},
		{"over the byte bound", 20 << 10, chunks[:2]},
		{"continuation that continues nothing", 0, append([]*llmgwv1.EphemeralUpdate{
			cl(chunks[0], func(u *llmgwv1.EphemeralUpdate) { u.Kv = nil })}, chunks[1:]...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAssembler(tc.max)
			var err error
			for _, c := range tc.in {
				if _, err = a.Add(c); err != nil {
					break
				}
			}
			if !errors.Is(err, ErrChunk) {
				t.Fatalf("err = %v, want ErrChunk", err)
			}
			if a.Pending() != 0 || a.held != 0 {
				t.Fatalf("after a refusal %d pending, %d bytes held; want none", a.Pending(), a.held)
			}
		})
	}
}

// A chunk of a newer update replaces the one in progress.
func TestAssemblerNewerReplaces(t *testing.T) {
	old := Split(bigUpdate(true, 1, 20_000), 16<<10)
	nu := bigUpdate(true, 1, 20_000)
	nu.Seq = 9
	newer := Split(nu, 16<<10)
	a := NewAssembler(0)
	if _, err := a.Add(old[0]); err != nil {
		t.Fatal(err)
	}
	var got *llmgwv1.EphemeralUpdate
	for _, c := range newer {
		out, err := a.Add(c)
		if err != nil {
			t.Fatal(err)
		}
		got = out
	}
	if got == nil || got.Seq != 9 || a.Pending() != 0 {
		t.Fatalf("got %v, %d pending; want seq 9 and none pending", got.GetSeq(), a.Pending())
	}
}

// FuzzAssembler feeds an assembler messages from outside (an agent's
// session): a sequence of length-delimited EphemeralUpdates. Whatever they
// are, it neither panics nor holds more than its bound, and what it
// assembles applies.
func FuzzAssembler(f *testing.F) {
	seed := func(chunks []*llmgwv1.EphemeralUpdate) []byte {
		var b []byte
		for _, c := range chunks {
			m, _ := proto.Marshal(c)
			b = protowire.AppendBytes(b, m)
		}
		return b
	}
	// Small seeds (a fuzzer mutates small inputs fast): an update split
	// by hand as Split does, three chunks with continued entries.
	head := func(i uint32) *llmgwv1.EphemeralUpdate {
		return &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 4, Seq: 2, Full: true, Chunk: i, Chunks: 3}
	}
	c0, c1, c2 := head(0), head(1), head(2)
	c0.Statuses = []*llmgwv1.ReplicaStatus{{ReplicaId: "m-0", Uid: 1}}
	c0.Kv = []*llmgwv1.KVBlocks{{ReplicaId: "m-0", Uid: 1, Reset_: true, Stored: []uint64{1, 2}}}
	c1.Kv = []*llmgwv1.KVBlocks{{ReplicaId: "m-0", Uid: 1, Reset_: true, Continued: true, Stored: []uint64{3}},
		{ReplicaId: "m-1", Uid: 2, Reset_: true, Stored: []uint64{10}}}
	c2.Kv = []*llmgwv1.KVBlocks{{ReplicaId: "m-1", Uid: 2, Reset_: true, Continued: true, Removed: []uint64{11}}}
	f.Add(seed([]*llmgwv1.EphemeralUpdate{c0, c1, c2}))
	f.Add(seed([]*llmgwv1.EphemeralUpdate{c2, c0, c1}))
	f.Add(seed([]*llmgwv1.EphemeralUpdate{{Node: "n1", Epoch: 1, Seq: 1, Full: true}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		const bound = 1 << 20
		a := NewAssembler(bound)
		for len(b) > 0 {
			m, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return
			}
			b = b[n:]
			u := &llmgwv1.EphemeralUpdate{}
			if proto.Unmarshal(m, u) != nil {
				continue
			}
			out, err := a.Add(u)
			if a.held < 0 || a.held > bound {
				t.Fatalf("assembler holds %d bytes, bound %d", a.held, bound)
			}
			if err == nil && out != nil {
				if out.GetChunks() > 1 {
					t.Fatal("an assembled update still says it is chunked")
				}
				if _, err := proto.Marshal(out); err != nil {
					t.Fatalf("an assembled update does not marshal: %v", err)
				}
			}
		}
	})
}

// Ids longer than the budget still split, into oversized chunks, and end.
func TestSplitTerminatesOnHugeIds(t *testing.T) {
	long := strings.Repeat("x", 2*MinChunkBytes)
	u := &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 1, Seq: 1, Full: true,
		Kv: []*llmgwv1.KVBlocks{{ReplicaId: long, Stored: make([]uint64, 3000)}}}
	chunks := Split(u, MinChunkBytes)
	a := NewAssembler(0)
	var got *llmgwv1.EphemeralUpdate
	for _, c := range chunks {
		out, err := a.Add(c)
		if err != nil {
			t.Fatal(err)
		}
		got = out
	}
	if !proto.Equal(got, u) {
		t.Fatalf("%d chunks do not make the update", len(chunks))
	}
}
