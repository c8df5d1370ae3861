package endpoint

import (
	"log/slog"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestAdapters checks name resolution and what each replica holds: on
// demand, only what is placed there and reported LOADED by the same
// incarnation; with max_loaded_adapters 0 or llama.cpp, everything.
func TestAdapters(t *testing.T) {
	const ready = llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
	loaded := llmgwv1.AdapterState_ADAPTER_STATE_LOADED
	adapters := []*llmgwv1.Adapter{{Name: "sql", Path: "/a/sql"}, {Name: "legal", Path: "/a/legal"}, {Name: "chem", Path: "/a/chem"}}
	type holdCase struct {
		replica, adapter string
		want             bool
	}
	tests := []struct {
		name   string
		model  *llmgwv1.Model
		place  map[string][]string                // adapter -> replicas
		status map[string]map[string]statusOfLoRA // replica -> adapter -> status
		holds  []holdCase
	}{
		{
			name:  "on demand: placed and loaded",
			model: &llmgwv1.Model{Name: "base", Engine: "sim", MaxLoadedAdapters: 2, Adapters: adapters},
			place: map[string][]string{"sql": {"r0"}, "legal": {"r0", "r1"}, "chem": {"r1"}},
			status: map[string]map[string]statusOfLoRA{
				"r0": {"sql": {loaded, 1, 1}, "legal": {loaded, 1, 1}},
				"r1": {"legal": {llmgwv1.AdapterState_ADAPTER_STATE_LOADING, 1, 1}, "chem": {loaded, 1, 0}},
			},
			holds: []holdCase{
				{"r0", "sql", true}, {"r0", "legal", true}, {"r0", "chem", false},
				{"r1", "legal", false}, // placed, still loading
				{"r1", "chem", false},  // loaded by an earlier incarnation
				{"r1", "sql", false},
			},
		},
		{
			name:  "on demand: loaded but no longer placed (being evicted)",
			model: &llmgwv1.Model{Name: "base", Engine: "vllm", MaxLoadedAdapters: 1, Adapters: adapters},
			place: map[string][]string{"sql": {"r1"}},
			status: map[string]map[string]statusOfLoRA{
				"r0": {"sql": {loaded, 1, 1}},
			},
			holds: []holdCase{{"r0", "sql", false}},
		},
		{
			name:  "max_loaded_adapters 0: every replica holds every adapter",
			model: &llmgwv1.Model{Name: "base", Engine: "sim", Adapters: adapters},
			holds: []holdCase{{"r0", "sql", true}, {"r1", "chem", true}, {"r0", "nope", false}},
		},
		{
			name:  "llama.cpp loads every adapter at start",
			model: &llmgwv1.Model{Name: "base", Engine: "llamacpp", MaxLoadedAdapters: 2, Adapters: adapters},
			holds: []holdCase{{"r0", "legal", true}, {"r1", "chem", true}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := stateOf(nil,
				rep{id: "r0", model: "base", uid: 1, sUID: 1, phase: ready, addr: "127.0.0.1:1", inc: 1},
				rep{id: "r1", model: "base", uid: 1, sUID: 1, phase: ready, addr: "127.0.0.1:2", inc: 1})
			st.Models = map[string]*llmgwv1.Model{"base": tt.model, "other": {Name: "other"}}
			st.Placements = map[string]*llmgwv1.AdapterPlacement{}
			for a, reps := range tt.place {
				st.Placements[a] = &llmgwv1.AdapterPlacement{Model: "base", Adapter: a, Replicas: reps}
			}
			st.Ephemeral["n1"].Adapters = map[string]map[string]*llmgwv1.AdapterStatus{}
			for r, as := range tt.status {
				st.Ephemeral["n1"].Adapters[r] = map[string]*llmgwv1.AdapterStatus{}
				for a, s := range as {
					st.Ephemeral["n1"].Adapters[r][a] = &llmgwv1.AdapterStatus{ReplicaId: r, Adapter: a, State: s.state, Uid: s.uid, Incarnation: s.inc}
				}
			}
			reg, err := New(DefaultConfig(), newFakeSource(st), slog.New(slog.DiscardHandler), nil)
			if err != nil {
				t.Fatal(err)
			}
			if ref, ok := reg.Adapter("legal"); !ok || ref != (AdapterRef{Model: "base", Index: 1}) {
				t.Errorf("Adapter(legal) = %+v, %v", ref, ok)
			}
			if _, ok := reg.Adapter("base"); ok {
				t.Error("a model resolved as an adapter")
			}
			eps, _ := reg.Lookup("base")
			byID := map[string]*Endpoint{}
			for _, e := range eps {
				byID[e.ReplicaID] = e
			}
			for _, h := range tt.holds {
				if got := reg.Holds(byID[h.replica], h.adapter); got != h.want {
					t.Errorf("Holds(%s, %s) = %v, want %v", h.replica, h.adapter, got, h.want)
				}
			}
		})
	}
}

type statusOfLoRA struct {
	state    llmgwv1.AdapterState
	uid, inc uint64
}

func TestChangedClosesOnRebuild(t *testing.T) {
	src := newFakeSource(stateOf([]string{"demo"}))
	reg, err := New(DefaultConfig(), src, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ch := reg.Changed()
	select {
	case <-ch:
		t.Fatal("closed before a rebuild")
	default:
	}
	reg.rebuild(stateOf([]string{"demo", "other"}))
	select {
	case <-ch:
	default:
		t.Fatal("not closed by a rebuild")
	}
}
