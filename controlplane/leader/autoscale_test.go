package leader

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/fsm"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func elasticModel(name string, a *llmgwv1.Autoscale) *llmgwv1.Model {
	m := model(name, 1, 1)
	m.Revision, m.Autoscale, m.ExtraArgs = 7, a, []string{"--max-num-seqs", "16"}
	return m
}

func scaleTo(model string, n uint32, reason string) proposal {
	return proposal{llmgwv1.CommandType_COMMAND_TYPE_SET_MODEL_SCALE,
		&llmgwv1.SetModelScaleCommand{Model: model, Replicas: n, Reason: reason, ModelRevision: 7}}
}

// TestAutoscaleRound: a queue steps the count up through SET_MODEL_SCALE on
// the model's revision; a step held by the pending guard is one event
// however many rounds it lasts; held requests with no replica step from
// zero at once; ScaleStatus shows the decisions newest first.
func TestAutoscaleRound(t *testing.T) {
	m := elasticModel("chat", &llmgwv1.Autoscale{Min: 0, Max: 8, TargetWaiting: 2})
	r := newRig(t, testConfig(), &llmgwv1.State{Models: []*llmgwv1.Model{m}, Nodes: []*llmgwv1.Node{active("n1", 8)},
		Replicas: []*llmgwv1.Replica{replica("chat-0", 1, "chat", "n1", 0)}})
	r.reports.setPhase("chat-0", 1, llmgwv1.ReplicaPhase_REPLICA_PHASE_READY)
	r.l.scaler = &scaler{models: map[string]*scaled{}}
	ctx := context.Background()
	queue := map[string]*llmgwv1.ModelDemand{"chat": {Model: "chat", Waiting: 100, Running: 16, Replicas: 1, Requests: 100}}

	// A queue must last UpAfter (15 s) before a step up.
	r.l.autoscaleOnce(ctx, queue)
	if got := r.prop.proposed(); len(got) != 0 {
		t.Fatalf("proposed %s on the queue's first round", list(got))
	}
	r.clock.Add(16 * time.Second)
	r.l.autoscaleOnce(ctx, queue)
	got := r.prop.proposed()
	if len(got) != 1 || got[0].msg.(*llmgwv1.SetModelScaleCommand).Replicas != 5 {
		t.Fatalf("proposed %s, want one SET_MODEL_SCALE to 5 (1 + 4)", list(got))
	}
	if c := got[0].msg.(*llmgwv1.SetModelScaleCommand); c.ModelRevision != 7 || !strings.Contains(c.Reason, "waiting 100.0") {
		t.Fatalf("command %v: want model revision 7 and the figures in its reason", c)
	}
	// The four new replicas are placed but not ready: three rounds later,
	// still one held event, and nothing proposed.
	r.prop.reset()
	r.desired.update(func(st *llmgwv1.State) {
		for i := uint64(2); i <= 5; i++ {
			st.Replicas = append(st.Replicas, replica("chat-"+string(rune('0'+i-1)), i, "chat", "n1", uint32(i-1)))
		}
	})
	for range 3 {
		r.clock.Add(time.Minute) // past the cooldown
		r.l.autoscaleOnce(ctx, map[string]*llmgwv1.ModelDemand{"chat": {Model: "chat", Waiting: 80, Running: 16, Requests: 100}})
	}
	wantProposals(t, r.prop.proposed(), nil)
	events, demand := r.l.ScaleStatus("chat")
	if len(events) != 3 || !events[0].Blocked || !strings.Contains(events[0].Reason, "waiting for 4 starting replicas") || events[1].To != 5 ||
		!strings.Contains(events[2].Reason, "a step up waits for 15s") {
		t.Fatalf("events %v, want the step held by the starting replicas (newest), the step to 5, the step held by the up window", events)
	}
	if demand.GetWaiting() != 80 {
		t.Fatalf("demand %v, want the last round's", demand)
	}
	for _, c := range []struct {
		name   string
		labels testkit.Labels
		want   float64
	}{
		{"llmgw_control_autoscale_steps_total", testkit.Labels{"model": "chat", "direction": "up"}, 1},
		{"llmgw_control_autoscale_held", testkit.Labels{"model": "chat"}, 1},
		{"llmgw_control_autoscale_replicas", testkit.Labels{"model": "chat"}, 5},
	} {
		if got := testkit.Metric(t, r.reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}

	// From zero: another model with no replica and requests held.
	z := elasticModel("cold", &llmgwv1.Autoscale{Min: 0, Max: 2, TargetWaiting: 2})
	z.Replicas = 0
	r.desired.update(func(st *llmgwv1.State) {
		st.Models = append(st.Models, z)
		st.Scales = append(st.Scales, &llmgwv1.ModelScale{Model: "cold", Replicas: 0})
	})
	r.prop.reset()
	// A round with nothing held sees it at zero; held requests then call
	// a round at once, without waiting for the tick.
	r.l.autoscaleOnce(ctx, map[string]*llmgwv1.ModelDemand{"cold": {Model: "cold"}, "chat": {Model: "chat", Waiting: 80, Running: 16, Requests: 100}})
	if !r.l.heldAtZero(map[string]*llmgwv1.ModelDemand{"cold": {Model: "cold", Held: 1}}) || r.l.heldAtZero(map[string]*llmgwv1.ModelDemand{"chat": {Model: "chat", Held: 1}}) {
		t.Fatal("heldAtZero: want true for cold (at zero, a request held), false for chat (at 5)")
	}
	r.prop.reset()
	r.l.autoscaleOnce(ctx, map[string]*llmgwv1.ModelDemand{"cold": {Model: "cold", Held: 3}, "chat": {Model: "chat", Waiting: 80, Running: 16, Requests: 100}})
	wantProposals(t, r.prop.proposed(), []proposal{scaleTo("cold", 1, "scale from zero: 3 requests held")})
}

func TestEffectiveCountAndCapacity(t *testing.T) {
	m := elasticModel("chat", &llmgwv1.Autoscale{Min: 1, Max: 4, TargetWaiting: 2})
	m.Replicas = 2
	st := &llmgwv1.State{Models: []*llmgwv1.Model{m}}
	for _, tc := range []struct {
		name   string
		scales []*llmgwv1.ModelScale
		want   uint32
	}{
		{"no decision: the spec's replicas", nil, 2},
		{"the autoscaler's", []*llmgwv1.ModelScale{{Model: "chat", Replicas: 3}}, 3},
		{"clamped to max", []*llmgwv1.ModelScale{{Model: "chat", Replicas: 9}}, 4},
		{"clamped to min", []*llmgwv1.ModelScale{{Model: "chat", Replicas: 0}}, 1},
	} {
		st.Scales = tc.scales
		if got := fsm.EffectiveReplicas(st, m); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	if got := BatchCapacity(m); got != 16 {
		t.Errorf("capacity %d, want --max-num-seqs 16", got)
	}
	m.ExtraArgs = []string{"--max-num-seqs=32"}
	if got := BatchCapacity(m); got != 32 {
		t.Errorf("capacity %d, want 32 from --max-num-seqs=32", got)
	}
	m.Autoscale.WarmConcurrency = 8
	if got := BatchCapacity(m); got != 8 {
		t.Errorf("capacity %d, want warm_concurrency 8", got)
	}
	if got := BatchCapacity(model("plain", 1, 1)); got != 256 {
		t.Errorf("capacity %d, want vLLM's default 256", got)
	}
}
