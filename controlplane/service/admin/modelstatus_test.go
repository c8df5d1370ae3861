package admin

import (
	"context"
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// phases reports each replica's phase by id.
type phases map[string]llmgwv1.ReplicaPhase

func (p phases) StatusOf(r *llmgwv1.Replica) *llmgwv1.ReplicaStatus {
	return &llmgwv1.ReplicaStatus{ReplicaId: r.Id, Phase: p[r.Id]}
}
func (phases) AdaptersOf(*llmgwv1.Replica) map[string]*llmgwv1.AdapterStatus { return nil }
func (phases) KVOf(*llmgwv1.Replica) *llmgwv1.ReplicaKV                      { return nil }

// scaling is a leader's memory with one answer.
type scaling struct {
	why    string
	events []*llmgwv1.ScaleEvent
	demand *llmgwv1.ModelDemand
}

func (s scaling) Unplaced(string) string { return s.why }
func (s scaling) ScaleStatus(string) ([]*llmgwv1.ScaleEvent, *llmgwv1.ModelDemand) {
	return s.events, s.demand
}

// TestModelStatus: the count placement works to is the autoscaler's within
// the spec; placed counts every replica not draining, ready and sleeping
// apart; the leader's reasons and decisions come through; an unknown model
// is NOT_FOUND and a follower refuses naming the leader.
func TestModelStatus(t *testing.T) {
	m := &llmgwv1.Model{Name: "chat", Replicas: 1, Autoscale: &llmgwv1.Autoscale{Min: 0, Max: 3, TargetWaiting: 2, Sleep: true}}
	st := &llmgwv1.State{
		Models: []*llmgwv1.Model{m},
		Scales: []*llmgwv1.ModelScale{{Model: "chat", Replicas: 5, Reason: "up"}},
		Replicas: []*llmgwv1.Replica{
			{Id: "chat-0", Model: "chat"}, {Id: "chat-1", Model: "chat"}, {Id: "chat-2", Model: "chat", Sleeping: true},
			{Id: "chat-3", Model: "chat", Draining: true}, {Id: "other-0", Model: "other"},
		},
	}
	mem := scaling{why: "1 of 3 replicas cannot be placed", events: []*llmgwv1.ScaleEvent{{From: 1, To: 5, Reason: "up"}},
		demand: &llmgwv1.ModelDemand{Model: "chat", Held: 2}}
	raft := &leaderRaft{leader: true}
	a := New("c1", Deps{Raft: raft, State: fakeState{st}, Reports: phases{"chat-0": llmgwv1.ReplicaPhase_REPLICA_PHASE_READY,
		"chat-1": llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING, "chat-3": llmgwv1.ReplicaPhase_REPLICA_PHASE_READY}, Scaling: mem}, slog.New(slog.DiscardHandler))
	got, err := a.ModelStatus(context.Background(), &llmgwv1.ModelStatusRequest{Name: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	want := &llmgwv1.ModelStatusResponse{Model: m, Desired: 3, Placed: 3, Ready: 1, Sleeping: 1, UnplacedReason: mem.why,
		Scale: st.Scales[0], Events: mem.events, Demand: mem.demand}
	if !proto.Equal(got, want) {
		t.Fatalf("status\n%v\nwant\n%v", got, want)
	}
	if _, err := a.ModelStatus(context.Background(), &llmgwv1.ModelStatusRequest{Name: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown model: %v, want NOT_FOUND", err)
	}
	raft.leader = false
	if _, err := a.ModelStatus(context.Background(), &llmgwv1.ModelStatusRequest{Name: "chat"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("on a follower: %v, want UNAVAILABLE naming the leader", err)
	}
}
