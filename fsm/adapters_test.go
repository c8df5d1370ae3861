package fsm

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func loraModel(name string, n uint32, adapters ...string) *llmgwv1.Model {
	m := &llmgwv1.Model{Name: name, Engine: "sim", Model: "m", Replicas: 2, MaxLoadedAdapters: n}
	for _, a := range adapters {
		m.Adapters = append(m.Adapters, &llmgwv1.Adapter{Name: a, Path: "/adapters/" + a})
	}
	return m
}

func setPlacement(t testing.TB, model, adapter string, replicas ...string) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_ADAPTER_PLACEMENT, &llmgwv1.SetAdapterPlacementCommand{
		Placement: &llmgwv1.AdapterPlacement{Model: model, Adapter: adapter, Replicas: replicas}})
}

// placements renders the state's placements as adapter -> replicas.
func placements(f *FSM) map[string][]string {
	out := map[string][]string{}
	for _, p := range f.State().AdapterPlacements {
		out[p.Adapter] = p.Replicas
	}
	return out
}

func TestAdapterPlacement(t *testing.T) {
	// lora (N=2, adapters sql, legal, chat) has lora-0, lora-1 on n1; demo
	// (no adapters) has demo-0. sql is on lora-0 at index 7, legal on
	// lora-0 and lora-1 at index 8.
	setup := func(t *testing.T) *FSM {
		f := New(Config{})
		cmds := [][]byte{
			upsert(t, loraModel("lora", 2, "sql", "legal", "chat")),
			upsert(t, validModel()),
			register(t, "n1", 4),
			place(t, "", "lora", "n1", 0),
			place(t, "", "lora", "n1", 1),
			place(t, "", "demo", "n1", 2),
			setPlacement(t, "lora", "sql", "lora-0"),
			setPlacement(t, "lora", "legal", "lora-1", "lora-0"),
		}
		for i, c := range cmds {
			if _, err := f.Apply(uint64(i+1), c); err != nil {
				t.Fatalf("setup %d: %v", i, err)
			}
		}
		return f
	}
	tests := []struct {
		name    string
		cmd     func(t testing.TB) []byte
		wantErr error
		invalid string
		want    map[string][]string // placements after; nil = unchanged
		changes int                 // changes the command logged, when it succeeds
	}{
		{name: "place on a free slot", cmd: func(t testing.TB) []byte { return setPlacement(t, "lora", "chat", "lora-1") },
			want: map[string][]string{"sql": {"lora-0"}, "legal": {"lora-0", "lora-1"}, "chat": {"lora-1"}}, changes: 1},
		{name: "more than N on a replica", cmd: func(t testing.TB) []byte { return setPlacement(t, "lora", "chat", "lora-0") }, wantErr: ErrConflict},
		{name: "replace keeps its own slot", cmd: func(t testing.TB) []byte { return setPlacement(t, "lora", "legal", "lora-0") },
			want: map[string][]string{"sql": {"lora-0"}, "legal": {"lora-0"}}, changes: 1},
		{name: "empty list deletes", cmd: func(t testing.TB) []byte { return setPlacement(t, "lora", "sql") },
			want: map[string][]string{"legal": {"lora-0", "lora-1"}}, changes: 1},
		{name: "deleting an absent placement is a no-op", cmd: func(t testing.TB) []byte { return setPlacement(t, "lora", "chat") }, changes: 0},
		{name: "adapter not in the catalog", cmd: func(t testing.TB) []byte { return setPlacement(t, "lora", "nope", "lora-1") }, wantErr: ErrNotFound},
		{name: "adapter of another model", cmd: func(t testing.TB) []byte { return setPlacement(t, "demo", "chat", "demo-0") }, wantErr: ErrNotFound},
		{name: "unknown model", cmd: func(t testing.TB) []byte { return setPlacement(t, "ghost", "chat", "lora-1") }, wantErr: ErrNotFound},
		{name: "replica of another model", cmd: func(t testing.TB) []byte { return setPlacement(t, "lora", "chat", "demo-0") }, wantErr: ErrConflict},
		{name: "unknown replica", cmd: func(t testing.TB) []byte { return setPlacement(t, "lora", "chat", "lora-9") }, wantErr: ErrNotFound},
		{name: "replica twice", cmd: func(t testing.TB) []byte { return setPlacement(t, "lora", "chat", "lora-1", "lora-1") }, invalid: "placement.replicas"},
		{name: "no adapter", cmd: func(t testing.TB) []byte { return setPlacement(t, "lora", "", "lora-1") }, invalid: "placement.adapter"},
		{name: "no placement", cmd: func(t testing.TB) []byte {
			return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_ADAPTER_PLACEMENT, &llmgwv1.SetAdapterPlacementCommand{})
		}, invalid: "placement"},
		{name: "removing a replica drops it from placements", cmd: func(t testing.TB) []byte { return remove(t, "lora-0", 4) },
			want: map[string][]string{"legal": {"lora-1"}}, changes: 3}, // sql deleted, legal put, replica deleted
		{name: "stale remove keeps placements", cmd: func(t testing.TB) []byte { return remove(t, "lora-0", 3) }, changes: 0},
		{name: "deleting the model deletes its placements", cmd: func(t testing.TB) []byte {
			return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_DELETE_MODEL, &llmgwv1.DeleteModelCommand{Name: "lora"})
		}, want: map[string][]string{}, changes: 5},
		{name: "an adapter leaving the catalog loses its placement", cmd: func(t testing.TB) []byte { return upsert(t, loraModel("lora", 2, "legal", "chat")) },
			want: map[string][]string{"legal": {"lora-0", "lora-1"}}, changes: 2},
		{name: "max_loaded_adapters 0 drops every placement", cmd: func(t testing.TB) []byte { return upsert(t, loraModel("lora", 0, "sql", "legal", "chat")) },
			want: map[string][]string{}, changes: 3},
		{name: "a lower max_loaded_adapters trims in name order", cmd: func(t testing.TB) []byte { return upsert(t, loraModel("lora", 1, "sql", "legal", "chat")) },
			want: map[string][]string{"legal": {"lora-0", "lora-1"}}, changes: 2},
		{name: "another model leaves placements alone", cmd: func(t testing.TB) []byte { return upsert(t, loraModel("all", 0, "a1")) }, changes: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := setup(t)
			before, _ := f.Snapshot()
			beforePlacements := placements(f)
			_, err := f.Apply(10, tt.cmd(t))
			switch {
			case tt.invalid != "":
				var ve *ValidationError
				if !errors.As(err, &ve) || ve.Field != tt.invalid {
					t.Fatalf("err %v, want a validation error on %q", err, tt.invalid)
				}
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err %v, want %v", err, tt.wantErr)
				}
			case err != nil:
				t.Fatalf("Apply: %v", err)
			}
			if err != nil {
				after := f.State()
				after.Revision = 8
				a, _ := proto.MarshalOptions{Deterministic: true}.Marshal(after)
				if !bytes.Equal(a, before) {
					t.Fatal("a rejected command changed the state")
				}
				return
			}
			want := tt.want
			if want == nil {
				want = beforePlacements
			}
			got := placements(f)
			if len(got) != len(want) {
				t.Fatalf("placements %v, want %v", got, want)
			}
			for k, v := range want {
				if !slices.Equal(got[k], v) {
					t.Fatalf("placements %v, want %v", got, want)
				}
			}
			ch, _ := f.ChangesSince(8)
			if len(ch) != tt.changes {
				t.Fatalf("%d changes logged, want %d: %v", len(ch), tt.changes, ch)
			}
			// No revision shows a placement on a replica that does not
			// exist or of a model that does not exist.
			for _, p := range f.State().AdapterPlacements {
				if _, ok := f.Model(p.Model); !ok {
					t.Fatalf("placement %v of a deleted model", p)
				}
				for _, id := range p.Replicas {
					if _, ok := f.Replica(id); !ok {
						t.Fatalf("placement %v names removed replica %q", p, id)
					}
				}
			}
		})
	}
}

func TestAdapterPlacementSnapshotAndDesired(t *testing.T) {
	cmds := [][]byte{
		upsert(t, loraModel("lora", 1, "sql", "legal")),
		register(t, "n1", 1),
		register(t, "n2", 1),
		place(t, "", "lora", "n1", 0),
		place(t, "", "lora", "n2", 0),
		setPlacement(t, "lora", "sql", "lora-1"),
		setPlacement(t, "lora", "legal", "lora-0"),
	}
	a, b := New(Config{}), New(Config{})
	applyAll(t, a, cmds)
	applyAll(t, b, cmds)
	sa, _ := a.Snapshot()
	sb, _ := b.Snapshot()
	if !bytes.Equal(sa, sb) {
		t.Fatal("two FSMs fed the same placements gave different snapshots")
	}
	c := New(Config{})
	if err := c.Restore(sa); err != nil {
		t.Fatal(err)
	}
	if sc, _ := c.Snapshot(); !bytes.Equal(sa, sc) {
		t.Fatal("snapshot -> restore -> snapshot differs")
	}
	if p, ok := c.AdapterPlacement("sql"); !ok || !slices.Equal(p.Replicas, []string{"lora-1"}) || p.Revision != 12 {
		t.Fatalf("restored placement %v", p)
	}
	if m, ok := c.AdapterModel("legal"); !ok || m.Name != "lora" {
		t.Fatalf("AdapterModel(legal) = %v", m)
	}
	if _, ok := c.AdapterModel("nope"); ok {
		t.Fatal("AdapterModel(nope) found a model")
	}
	// Each node is told only the placements naming its replicas.
	for node, want := range map[string]string{"n1": "legal", "n2": "sql"} {
		d := c.NodeDesired(node)
		if len(d.Adapters) != 1 || d.Adapters[0].Adapter != want {
			t.Fatalf("NodeDesired(%s).Adapters = %v, want %s", node, d.Adapters, want)
		}
	}
	// With max_loaded_adapters 0 every adapter is loaded at start: nothing
	// is placed at run time.
	if _, err := c.Apply(100, upsert(t, loraModel("all", 0, "a1"))); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Apply(101, place(t, "", "all", "n1")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Apply(102, setPlacement(t, "all", "a1", "all-0")); !errors.Is(err, ErrConflict) {
		t.Fatalf("placing with max_loaded_adapters 0: %v", err)
	}
	// The change log carries placements as their own objects.
	ch, _ := a.ChangesSince(10)
	if len(ch) != 2 || ch[0].GetAdapterPlacement().GetAdapter() != "sql" || ch[1].GetAdapterPlacement().GetAdapter() != "legal" {
		t.Fatalf("changes %v", ch)
	}
}
