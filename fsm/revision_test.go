package fsm

import (
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestModelRevisionMovesOnlyForRestarts: re-applying a model bumps its
// revision exactly when its replicas must restart, and a replica records
// the model revision it was placed for (design §4 "Changes roll").
func TestModelRevisionMovesOnlyForRestarts(t *testing.T) {
	tests := []struct {
		name    string
		change  func(m *llmgwv1.Model)
		restart bool
	}{
		{"same spec again", func(*llmgwv1.Model) {}, false},
		{"replica count", func(m *llmgwv1.Model) { m.Replicas = 5 }, false},
		{"profile", func(m *llmgwv1.Model) { m.Profile = "batch" }, false},
		{"profile overrides", func(m *llmgwv1.Model) {
			m.ProfileOverrides = &llmgwv1.ProfileOverrides{TargetWaiting: 2}
		}, false},
		{"node selector", func(m *llmgwv1.Model) { m.NodeSelector = map[string]string{"gpu": "a100"} }, false},
		{"extra args", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"--max-model-len", "4096"} }, true},
		{"model path", func(m *llmgwv1.Model) { m.Model = "other/model" }, true},
		{"gpus per replica", func(m *llmgwv1.Model) { m.GpusPerReplica = 2 }, true},
		{"kv events", func(m *llmgwv1.Model) { m.KvEvents = true }, true},
		{"adapters", func(m *llmgwv1.Model) { m.Adapters = []*llmgwv1.Adapter{{Name: "a1", Path: "/a1"}} }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := New(Config{})
			for i, c := range [][]byte{upsert(t, validModel()), register(t, "n1", 4), place(t, "", "demo", "n1", 0)} {
				if _, err := f.Apply(uint64(i+1), c); err != nil {
					t.Fatalf("setup %d: %v", i, err)
				}
			}
			r, _ := f.Replica("demo-0")
			if r.ModelRevision != 1 {
				t.Fatalf("replica placed for model revision %d, want 1", r.ModelRevision)
			}
			m := validModel()
			tt.change(m)
			if _, err := f.Apply(10, upsert(t, m)); err != nil {
				t.Fatal(err)
			}
			got, _ := f.Model("demo")
			want := uint64(1)
			if tt.restart {
				want = 10
			}
			if got.Revision != want {
				t.Fatalf("model revision %d, want %d", got.Revision, want)
			}
			if _, err := f.Apply(11, place(t, "", "demo", "n1", 3)); err != nil {
				t.Fatal(err)
			}
			if r, _ := f.Replica("demo-1"); r.ModelRevision != want {
				t.Fatalf("new replica placed for model revision %d, want %d", r.ModelRevision, want)
			}
		})
	}
}
