package agent

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// rejoin is the receivers' assembly (controlplane/ephemeral.Assembler), in
// short: lists concatenated, a continued entry appended to the one before.
func rejoin(t *testing.T, chunks []*llmgwv1.EphemeralUpdate) *llmgwv1.EphemeralUpdate {
	t.Helper()
	f := chunks[0]
	out := &llmgwv1.EphemeralUpdate{Node: f.Node, Epoch: f.Epoch, Seq: f.Seq, Full: f.Full}
	for i, c := range chunks {
		if c.Chunk != uint32(i) || c.Chunks != uint32(len(chunks)) || c.Node != f.Node || c.Seq != f.Seq || c.Full != f.Full {
			t.Fatalf("chunk %d is numbered %d of %d for %s seq %d", i, c.Chunk, c.Chunks, c.Node, c.Seq)
		}
		out.Statuses = append(out.Statuses, c.Statuses...)
		out.Adapters = append(out.Adapters, c.Adapters...)
		for j, b := range c.Kv {
			if !b.Continued {
				out.Kv = append(out.Kv, proto.Clone(b).(*llmgwv1.KVBlocks))
				continue
			}
			last := out.Kv[len(out.Kv)-1]
			if j != 0 || last.ReplicaId != b.ReplicaId {
				t.Fatalf("chunk %d entry %d continues nothing", i, j)
			}
			last.Stored = append(last.Stored, b.Stored...)
			last.Removed = append(last.Removed, b.Removed...)
		}
	}
	return out
}

func TestSplitUpdate(t *testing.T) {
	full := &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 3, Seq: 1, Full: true}
	for r := range 8 {
		id := fmt.Sprintf("m-%d", r)
		full.Statuses = append(full.Statuses, &llmgwv1.ReplicaStatus{ReplicaId: id, Uid: 1, Address: "127.0.0.1:9000"})
		b := &llmgwv1.KVBlocks{ReplicaId: id, Uid: 1, Incarnation: 1, Reset_: true, BlockSize: 16}
		for i := range 30_000 {
			b.Stored = append(b.Stored, uint64(r)<<40|uint64(i)*7919)
		}
		full.Kv = append(full.Kv, b)
	}
	for _, tc := range []struct {
		name   string
		budget int
		want   int // chunks; 0 for several
	}{
		{"no budget: whole", 0, 1},
		{"fits: whole", 4 << 20, 1},
		{"1 MiB", 1 << 20, 0},
		{"64 KiB", 64 << 10, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chunks := splitUpdate(full, tc.budget)
			if tc.want == 1 {
				if len(chunks) != 1 || chunks[0] != full {
					t.Fatalf("got %d chunks, want the update itself", len(chunks))
				}
				return
			}
			if len(chunks) < 2 {
				t.Fatalf("got %d chunks of a %d-byte update, budget %d", len(chunks), proto.Size(full), tc.budget)
			}
			for i, c := range chunks {
				if n := proto.Size(c); n > tc.budget {
					t.Errorf("chunk %d is %d bytes, above %d", i, n, tc.budget)
				}
			}
			if got := rejoin(t, chunks); !proto.Equal(got, full) {
				t.Fatal("the chunks do not make the update again")
			}
		})
	}
}
