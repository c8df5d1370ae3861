package ephemeral

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/llmgw/llmgw/chunking"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// An assembled update must apply as the whole one does: a replica's block
// set split over chunks is one reset, not several.
func TestAssembledFullCopyAppliesWhole(t *testing.T) {
	u := bigKV(2, 50_000)
	a := chunking.NewAssembler(0)
	var got *llmgwv1.EphemeralUpdate
	for _, c := range chunking.Split(u, 32<<10) {
		out, err := a.Add(c)
		if err != nil {
			t.Fatal(err)
		}
		if out != nil {
			got = out
		}
	}
	s := NewStore()
	if v := s.Apply(got); v != Accepted {
		t.Fatalf("verdict %v", v)
	}
	held, _ := s.FullCopy("n1")
	for _, k := range held.Kv {
		if len(k.Stored) != 50_000 {
			t.Fatalf("replica %s holds %d blocks, want 50000", k.ReplicaId, len(k.Stored))
		}
	}
}

// bigKV is a full copy of node n1: replicas ready replicas, each with a
// block set of blocks random hashes.
func bigKV(replicas, blocks int) *llmgwv1.EphemeralUpdate {
	r := rand.New(rand.NewPCG(1, 2))
	u := &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 1, Seq: 1, Full: true}
	for i := range replicas {
		id, uid := fmt.Sprintf("m-%d", i), uint64(i+1)
		u.Statuses = append(u.Statuses, &llmgwv1.ReplicaStatus{ReplicaId: id, Uid: uid, Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY})
		stored := make([]uint64, blocks)
		for j := range stored {
			stored[j] = r.Uint64()
		}
		u.Kv = append(u.Kv, &llmgwv1.KVBlocks{ReplicaId: id, Uid: uid, Reset_: true, BlockSize: 16, Stored: stored})
	}
	return u
}
