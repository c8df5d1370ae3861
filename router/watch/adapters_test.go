package watch

import (
	"path/filepath"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func adapterStatus(replica, name string, st llmgwv1.AdapterState) *llmgwv1.AdapterStatus {
	return &llmgwv1.AdapterStatus{ReplicaId: replica, Uid: 1, Incarnation: 1, Adapter: name, State: st}
}

// TestAdapterData applies placements and adapter statuses as the stream
// sends them and checks what the state then says each replica holds.
func TestAdapterData(t *testing.T) {
	const (
		loaded  = llmgwv1.AdapterState_ADAPTER_STATE_LOADED
		loading = llmgwv1.AdapterState_ADAPTER_STATE_LOADING
		removed = llmgwv1.AdapterState_ADAPTER_STATE_UNSPECIFIED
	)
	rep := &llmgwv1.Replica{Id: "demo-0", Node: "n1", Uid: 1}
	tests := []struct {
		name    string
		updates []*llmgwv1.EphemeralUpdate
		want    map[string]llmgwv1.AdapterState // adapter -> state on demo-0; absent: nil
	}{
		{"full copy", []*llmgwv1.EphemeralUpdate{
			{Node: "n1", Epoch: 1, Seq: 1, Full: true, Adapters: []*llmgwv1.AdapterStatus{adapterStatus("demo-0", "sql", loaded), adapterStatus("demo-0", "legal", loading)}},
		}, map[string]llmgwv1.AdapterState{"sql": loaded, "legal": loading}},
		{"delta upserts", []*llmgwv1.EphemeralUpdate{
			{Node: "n1", Epoch: 1, Seq: 1, Full: true, Adapters: []*llmgwv1.AdapterStatus{adapterStatus("demo-0", "legal", loading)}},
			{Node: "n1", Epoch: 1, Seq: 2, Adapters: []*llmgwv1.AdapterStatus{adapterStatus("demo-0", "legal", loaded)}},
		}, map[string]llmgwv1.AdapterState{"legal": loaded}},
		{"unspecified in a delta removes", []*llmgwv1.EphemeralUpdate{
			{Node: "n1", Epoch: 1, Seq: 1, Full: true, Adapters: []*llmgwv1.AdapterStatus{adapterStatus("demo-0", "sql", loaded), adapterStatus("demo-0", "legal", loaded)}},
			{Node: "n1", Epoch: 1, Seq: 2, Adapters: []*llmgwv1.AdapterStatus{adapterStatus("demo-0", "sql", removed)}},
		}, map[string]llmgwv1.AdapterState{"legal": loaded}},
		{"a full copy replaces", []*llmgwv1.EphemeralUpdate{
			{Node: "n1", Epoch: 1, Seq: 1, Full: true, Adapters: []*llmgwv1.AdapterStatus{adapterStatus("demo-0", "sql", loaded)}},
			{Node: "n1", Epoch: 2, Seq: 1, Full: true, Adapters: []*llmgwv1.AdapterStatus{adapterStatus("demo-0", "legal", loaded)}},
		}, map[string]llmgwv1.AdapterState{"legal": loaded}},
		{"a removed replica drops its adapters", []*llmgwv1.EphemeralUpdate{
			{Node: "n1", Epoch: 1, Seq: 1, Full: true, Adapters: []*llmgwv1.AdapterStatus{adapterStatus("demo-0", "sql", loaded)}},
			{Node: "n1", Epoch: 1, Seq: 2, RemovedReplicas: []string{"demo-0"}},
		}, map[string]llmgwv1.AdapterState{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := emptyState()
			var published []*State
			for _, u := range tt.updates {
				st = st.clone()
				st.applyEphemeral(u)
				published = append(published, st)
			}
			for _, name := range []string{"sql", "legal"} {
				got := st.AdapterStatus(rep, name)
				want, ok := tt.want[name]
				switch {
				case !ok && got != nil:
					t.Errorf("%s: got %v, want none", name, got.GetState())
				case ok && got.GetState() != want:
					t.Errorf("%s: got %v, want %v", name, got.GetState(), want)
				}
			}
			// An earlier published state is untouched by later deltas.
			first := tt.updates[0]
			for _, a := range first.GetAdapters() {
				if got := published[0].AdapterStatus(rep, a.GetAdapter()); got != a {
					t.Errorf("published state changed: %s is %v", a.GetAdapter(), got)
				}
			}
		})
	}
}

func TestPlacementsAndAdaptersAreSaved(t *testing.T) {
	st := emptyState()
	st.Revision = 7
	st.applyChange(&llmgwv1.Change{Op: llmgwv1.ChangeOp_CHANGE_OP_PUT, Object: &llmgwv1.Change_AdapterPlacement{
		AdapterPlacement: &llmgwv1.AdapterPlacement{Model: "demo", Adapter: "sql", Replicas: []string{"demo-0"}}}})
	st.applyChange(&llmgwv1.Change{Op: llmgwv1.ChangeOp_CHANGE_OP_PUT, Object: &llmgwv1.Change_AdapterPlacement{
		AdapterPlacement: &llmgwv1.AdapterPlacement{Model: "demo", Adapter: "gone"}}})
	st.applyChange(&llmgwv1.Change{Op: llmgwv1.ChangeOp_CHANGE_OP_DELETE, Object: &llmgwv1.Change_AdapterPlacement{
		AdapterPlacement: &llmgwv1.AdapterPlacement{Adapter: "gone"}}})
	st.applyEphemeral(&llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 1, Seq: 3, Full: true,
		Adapters: []*llmgwv1.AdapterStatus{adapterStatus("demo-0", "sql", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)}})
	path := filepath.Join(t.TempDir(), "state.bin")
	if err := saveState(path, st); err != nil {
		t.Fatal(err)
	}
	got, err := loadState(path)
	if err != nil {
		t.Fatal(err)
	}
	if p := got.Placements["sql"]; len(got.Placements) != 1 || p.GetReplicas()[0] != "demo-0" {
		t.Fatalf("placements after load: %v", got.Placements)
	}
	if a := got.AdapterStatus(&llmgwv1.Replica{Id: "demo-0", Node: "n1"}, "sql"); a.GetState() != llmgwv1.AdapterState_ADAPTER_STATE_LOADED {
		t.Fatalf("adapter status after load: %v", a)
	}
}
