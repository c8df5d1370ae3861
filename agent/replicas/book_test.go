package replicas

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestBook(t *testing.T) {
	b := newBook()
	st := func(id string, p llmgwv1.ReplicaPhase) *llmgwv1.ReplicaStatus {
		return &llmgwv1.ReplicaStatus{ReplicaId: id, Phase: p}
	}
	b.put(st("a", llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING))
	b.put(st("b", llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING))
	full, v := b.Snapshot()
	if len(full) != 2 {
		t.Fatalf("snapshot has %d statuses", len(full))
	}
	b.put(st("a", llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
	b.remove("b")
	b.remove("never-there")
	ups, rm, v2 := b.Since(v)
	if len(ups) != 1 || !proto.Equal(ups[0], st("a", llmgwv1.ReplicaPhase_REPLICA_PHASE_READY)) || !slices.Equal(rm, []string{"b"}) {
		t.Fatalf("since: %v removed %v", ups, rm)
	}
	if ups, rm, _ := b.Since(v2); len(ups)+len(rm) != 0 {
		t.Fatalf("nothing changed, yet since returned %v %v", ups, rm)
	}
}
