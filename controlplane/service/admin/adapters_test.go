package admin

import (
	"context"
	"log/slog"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fakeState is a Desired holding one fixed state.
type fakeState struct{ st *llmgwv1.State }

func (f fakeState) State() *llmgwv1.State                 { return f.st }
func (f fakeState) Config() *llmgwv1.ClusterConfig        { return f.st.Config }
func (f fakeState) Node(string) (*llmgwv1.Node, bool)     { return nil, false }
func (f fakeState) Revision() uint64                      { return f.st.Revision }
func (f fakeState) Snapshot() ([]byte, error)             { return nil, nil }
func (f fakeState) Tenant(string) (*llmgwv1.Tenant, bool) { return nil, false }
func (f fakeState) Tenants() []*llmgwv1.Tenant            { return f.st.Tenants }
func (f fakeState) Usage(string, string, int64) []*llmgwv1.UsageRow {
	return f.st.Usage
}
func (f fakeState) Aliases() []*llmgwv1.Alias           { return f.st.Aliases }
func (f fakeState) Alias(string) (*llmgwv1.Alias, bool) { return nil, false }

// fakeReports reports adapters per replica id.
type fakeReports map[string]map[string]*llmgwv1.AdapterStatus

func (f fakeReports) AdaptersOf(r *llmgwv1.Replica) map[string]*llmgwv1.AdapterStatus {
	return f[r.Id]
}

func (fakeReports) StatusOf(*llmgwv1.Replica) *llmgwv1.ReplicaStatus { return nil }
func (fakeReports) KVOf(*llmgwv1.Replica) *llmgwv1.ReplicaKV         { return nil }

// TestListAdapters: every declared adapter is listed, sorted, with its
// placement (none for a cold one) and each replica's reported state,
// including a replica unloading it after it left the placement.
func TestListAdapters(t *testing.T) {
	st := &llmgwv1.State{
		Revision: 12,
		Models: []*llmgwv1.Model{
			{Name: "m", Adapters: []*llmgwv1.Adapter{{Name: "sql", Path: "/a/sql"}, {Name: "cold", Path: "/a/cold"}}},
			{Name: "b", Adapters: []*llmgwv1.Adapter{{Name: "x", Path: "/a/x"}}},
		},
		Replicas: []*llmgwv1.Replica{{Id: "m-1", Model: "m"}, {Id: "m-0", Model: "m"}, {Id: "b-0", Model: "b"}},
		AdapterPlacements: []*llmgwv1.AdapterPlacement{
			{Model: "m", Adapter: "sql", Replicas: []string{"m-0"}},
		},
	}
	reports := fakeReports{
		"m-0": {"sql": {ReplicaId: "m-0", Adapter: "sql", State: llmgwv1.AdapterState_ADAPTER_STATE_LOADED}},
		"m-1": {"sql": {ReplicaId: "m-1", Adapter: "sql", State: llmgwv1.AdapterState_ADAPTER_STATE_UNLOADING}},
	}
	a := New("c1", Deps{State: fakeState{st}, Reports: reports}, slog.New(slog.DiscardHandler))
	resp, err := a.ListAdapters(context.Background(), &llmgwv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := &llmgwv1.ListAdaptersResponse{Revision: 12, Adapters: []*llmgwv1.AdapterView{
		{Model: "b", Adapter: "x", Path: "/a/x"},
		{Model: "m", Adapter: "cold", Path: "/a/cold"},
		{Model: "m", Adapter: "sql", Path: "/a/sql", PlacedOn: []string{"m-0"}, Statuses: []*llmgwv1.AdapterStatus{
			{ReplicaId: "m-0", Adapter: "sql", State: llmgwv1.AdapterState_ADAPTER_STATE_LOADED},
			{ReplicaId: "m-1", Adapter: "sql", State: llmgwv1.AdapterState_ADAPTER_STATE_UNLOADING},
		}},
	}}
	if got, w := protojson.Format(resp), protojson.Format(want); got != w {
		t.Fatalf("ListAdapters:\n%s\nwant\n%s", got, w)
	}
}
