package fsm

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func mustCmd(t testing.TB, typ llmgwv1.CommandType, p proto.Message) []byte {
	t.Helper()
	b, err := NewCommand(typ, p)
	if err != nil {
		t.Fatalf("NewCommand(%s): %v", typ, err)
	}
	return b
}

func upsert(t testing.TB, m *llmgwv1.Model) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_UPSERT_MODEL, &llmgwv1.UpsertModelCommand{Model: m})
}

func register(t testing.TB, id string, gpus uint32) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_REGISTER_NODE, &llmgwv1.RegisterNodeCommand{Node: &llmgwv1.Node{Id: id, Address: "127.0.0.1", Gpus: gpus}})
}

func place(t testing.TB, id, model, node string, gpus ...uint32) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_PLACE_REPLICA, &llmgwv1.PlaceReplicaCommand{Replica: &llmgwv1.Replica{Id: id, Model: model, Node: node, GpuIndices: gpus}})
}

func remove(t testing.TB, id string, uid uint64) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_REMOVE_REPLICA, &llmgwv1.RemoveReplicaCommand{Id: id, Uid: uid})
}

// history is a sequence of commands that exercises every type; indexes skip
// (as Raft's do) on purpose.
func history(t testing.TB) [][]byte {
	return [][]byte{
		upsert(t, validModel()),
		register(t, "n1", 2),
		register(t, "n2", 4),
		place(t, "", "demo", "n1", 0),
		place(t, "", "demo", "n2", 1, 2),
		mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_DRAINING, &llmgwv1.SetReplicaDrainingCommand{Id: "demo-0", Uid: 8}),
		mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_STATE, &llmgwv1.SetNodeStateCommand{Id: "n2", State: llmgwv1.NodeState_NODE_STATE_DRAINING}),
		mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: &llmgwv1.ClusterConfig{MinVersion: "0.1.0", DefaultBlockSize: 16}}),
		upsert(t, &llmgwv1.Model{Name: "other", Engine: "vllm", Model: "x", Replicas: 1, NodeSelector: map[string]string{"a": "1", "b": "2", "c": "3"}}),
	}
}

// applyAll applies cmds at indexes 2, 4, 6, ... and returns the last error.
func applyAll(t testing.TB, f *FSM, cmds [][]byte) {
	t.Helper()
	for i, c := range cmds {
		if _, err := f.Apply(uint64(2*i+2), c); err != nil {
			t.Fatalf("apply %d: %v", i, err)
		}
	}
}

func TestCommands(t *testing.T) {
	setup := func(t *testing.T) *FSM {
		f := New(Config{})
		// model at 1, nodes at 2, 3, demo-0 at 4 on n1 GPU 0.
		for i, c := range [][]byte{upsert(t, validModel()), register(t, "n1", 2), register(t, "n2", 2), place(t, "", "demo", "n1", 0)} {
			if _, err := f.Apply(uint64(i+1), c); err != nil {
				t.Fatalf("setup %d: %v", i, err)
			}
		}
		return f
	}
	tests := []struct {
		name    string
		cmd     func(t testing.TB) []byte
		wantErr error // matched with errors.Is; nil = success
		invalid string
		check   func(t *testing.T, f *FSM, res any)
	}{
		{name: "upsert stores defaults and revision", cmd: func(t testing.TB) []byte {
			return upsert(t, &llmgwv1.Model{Name: "b", Engine: "sim", Model: "m", Replicas: 1})
		},
			check: func(t *testing.T, f *FSM, res any) {
				m, _ := f.Model("b")
				if m.Profile != "chat" || m.Revision != 10 || res.(*llmgwv1.Model).Name != "b" {
					t.Fatalf("stored %v", m)
				}
			}},
		{name: "cluster defaults come before built-in ones", cmd: func(t testing.TB) []byte {
			return upsert(t, &llmgwv1.Model{Name: "b", Engine: "sim", Model: "m", Replicas: 1, KvEvents: true})
		}, check: func(t *testing.T, f *FSM, _ any) {
			m, _ := f.Model("b")
			if m.HashSeed != "0" || m.BlockSize != 16 {
				t.Fatalf("without cluster defaults: seed %q block %d", m.HashSeed, m.BlockSize)
			}
			if _, err := f.Apply(11, mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: &llmgwv1.ClusterConfig{DefaultHashSeed: "42", DefaultBlockSize: 32}})); err != nil {
				t.Fatal(err)
			}
			if _, err := f.Apply(12, upsert(t, &llmgwv1.Model{Name: "c", Engine: "sim", Model: "m", Replicas: 1, KvEvents: true})); err != nil {
				t.Fatal(err)
			}
			if m, _ := f.Model("c"); m.HashSeed != "42" || m.BlockSize != 32 {
				t.Fatalf("with cluster defaults: seed %q block %d", m.HashSeed, m.BlockSize)
			}
		}},
		{name: "upsert validates again", cmd: func(t testing.TB) []byte { return upsert(t, &llmgwv1.Model{Name: "b", Engine: "sim", Model: "m"}) }, invalid: "replicas"},
		{name: "adapter name taken by model", cmd: func(t testing.TB) []byte {
			return upsert(t, &llmgwv1.Model{Name: "b", Engine: "sim", Model: "m", Replicas: 1, Adapters: []*llmgwv1.Adapter{{Name: "demo", Path: "/x"}}})
		}, invalid: "adapters[0].name"},
		{name: "delete removes replicas atomically", cmd: func(t testing.TB) []byte {
			return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_DELETE_MODEL, &llmgwv1.DeleteModelCommand{Name: "demo"})
		}, check: func(t *testing.T, f *FSM, _ any) {
			st := f.State()
			if len(st.Models) != 0 || len(st.Replicas) != 0 || len(st.NextOrdinal) != 0 {
				t.Fatalf("state after delete: %v", st)
			}
			ch, _ := f.ChangesSince(9)
			if len(ch) != 2 || ch[0].GetReplica().GetId() != "demo-0" || ch[1].GetModel().GetName() != "demo" || ch[1].Op != llmgwv1.ChangeOp_CHANGE_OP_DELETE {
				t.Fatalf("changes %v", ch)
			}
		}},
		{name: "delete unknown model", cmd: func(t testing.TB) []byte {
			return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_DELETE_MODEL, &llmgwv1.DeleteModelCommand{Name: "nope"})
		}, wantErr: ErrNotFound},
		{name: "re-register keeps draining", cmd: func(t testing.TB) []byte { return register(t, "n3", 1) }, check: func(t *testing.T, f *FSM, _ any) {
			if n, _ := f.Node("n3"); n.State != llmgwv1.NodeState_NODE_STATE_ACTIVE {
				t.Fatalf("new node state %v", n.State)
			}
		}},
		{name: "node state of unknown node", cmd: func(t testing.TB) []byte {
			return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_STATE, &llmgwv1.SetNodeStateCommand{Id: "x", State: llmgwv1.NodeState_NODE_STATE_DOWN})
		}, wantErr: ErrNotFound},
		{name: "place assigns id and uid", cmd: func(t testing.TB) []byte { return place(t, "", "demo", "n1", 1) }, check: func(t *testing.T, f *FSM, res any) {
			r := res.(*llmgwv1.Replica)
			if r.Id != "demo-1" || r.Uid != 10 || r.Weight != 1 || len(r.Shards) != 1 || r.Shards[0].Node != "n1" {
				t.Fatalf("placed %v", r)
			}
		}},
		{name: "place on a taken GPU", cmd: func(t testing.TB) []byte { return place(t, "", "demo", "n1", 0) }, wantErr: ErrConflict},
		{name: "place on a missing GPU", cmd: func(t testing.TB) []byte { return place(t, "", "demo", "n1", 2) }, wantErr: ErrConflict},
		{name: "place on unknown node", cmd: func(t testing.TB) []byte { return place(t, "", "demo", "n9") }, wantErr: ErrNotFound},
		{name: "re-place moves and gets a new uid", cmd: func(t testing.TB) []byte { return place(t, "demo-0", "demo", "n2", 0) }, check: func(t *testing.T, f *FSM, res any) {
			r := res.(*llmgwv1.Replica)
			if r.Uid != 10 || r.Node != "n2" || f.State().NextOrdinal["demo"] != 1 {
				t.Fatalf("re-placed %v", r)
			}
		}},
		{name: "stale remove is a no-op", cmd: func(t testing.TB) []byte { return remove(t, "demo-0", 3) }, check: func(t *testing.T, f *FSM, _ any) {
			if len(f.State().Replicas) != 1 {
				t.Fatal("stale remove removed the replica")
			}
		}},
		{name: "remove", cmd: func(t testing.TB) []byte { return remove(t, "demo-0", 4) }, check: func(t *testing.T, f *FSM, _ any) {
			if len(f.State().Replicas) != 0 || f.State().NextOrdinal["demo"] != 1 {
				t.Fatal("remove did not remove, or reset the ordinal")
			}
		}},
		{name: "drain", cmd: func(t testing.TB) []byte {
			return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_DRAINING, &llmgwv1.SetReplicaDrainingCommand{Id: "demo-0", Uid: 4})
		}, check: func(t *testing.T, f *FSM, _ any) {
			if !f.State().Replicas[0].Draining {
				t.Fatal("not draining")
			}
		}},
		{name: "bad cluster config", cmd: func(t testing.TB) []byte {
			return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: &llmgwv1.ClusterConfig{DefaultHashSeed: "-1"}})
		}, invalid: "default_hash_seed"},
		{name: "unknown ignorable type is skipped", cmd: func(t testing.TB) []byte {
			b, _ := NewIgnorableCommand(llmgwv1.CommandType(99), 1, &llmgwv1.DeleteModelCommand{Name: "demo"})
			return b
		}},
		{name: "unknown type is fatal", cmd: func(t testing.TB) []byte {
			b, _ := proto.Marshal(&llmgwv1.Command{Type: 99, Version: 1})
			return b
		}, wantErr: ErrUnknownCommand},
		{name: "newer version is fatal", cmd: func(t testing.TB) []byte {
			b, _ := proto.Marshal(&llmgwv1.Command{Type: llmgwv1.CommandType_COMMAND_TYPE_DELETE_MODEL, Version: 2})
			return b
		}, wantErr: ErrUnknownCommand},
		{name: "garbage", cmd: func(t testing.TB) []byte { return []byte{0xff, 0xff} }, wantErr: ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := setup(t)
			before, _ := f.Snapshot()
			res, err := f.Apply(10, tt.cmd(t))
			if f.Revision() != 10 {
				t.Fatalf("revision %d, want 10", f.Revision())
			}
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
				if IsFatal(err) != errors.Is(tt.wantErr, ErrUnknownCommand) {
					t.Fatalf("IsFatal(%v) = %v", err, IsFatal(err))
				}
			case err != nil:
				t.Fatalf("Apply: %v", err)
			}
			if err != nil {
				after := f.State()
				after.Revision = 4
				a, _ := proto.MarshalOptions{Deterministic: true}.Marshal(after)
				if !bytes.Equal(a, before) {
					t.Fatal("a rejected command changed the state")
				}
			}
			if tt.check != nil {
				tt.check(t, f, res)
			}
		})
	}
}

func TestDeterministicSnapshots(t *testing.T) {
	a, b := New(Config{}), New(Config{})
	applyAll(t, a, history(t))
	applyAll(t, b, history(t))
	sa, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sb, _ := b.Snapshot()
	if !bytes.Equal(sa, sb) {
		t.Fatal("two FSMs fed the same commands gave different snapshots")
	}
	// And again after a restore round trip.
	c := New(Config{})
	if err := c.Restore(sa); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	sc, _ := c.Snapshot()
	if !bytes.Equal(sa, sc) {
		t.Fatal("snapshot -> restore -> snapshot differs")
	}
	if c.Revision() != a.Revision() {
		t.Fatalf("restored revision %d, want %d", c.Revision(), a.Revision())
	}
	if _, ok := c.ChangesSince(a.Revision() - 1); ok {
		t.Fatal("restored FSM claims changes from before its snapshot")
	}
	// The restored FSM keeps going from where it was.
	if _, err := c.Apply(100, place(t, "", "demo", "n1", 1)); err != nil {
		t.Fatalf("apply after restore: %v", err)
	}
	if _, ok := c.State().NextOrdinal["demo"]; !ok || c.State().NextOrdinal["demo"] != 3 {
		t.Fatalf("ordinal after restore %v", c.State().NextOrdinal)
	}
}

func TestRestoreRefuses(t *testing.T) {
	newer, _ := proto.Marshal(&llmgwv1.State{Format: SnapshotFormat + 1})
	for name, data := range map[string][]byte{"garbage": {0xff}, "newer format": newer, "no format": {}} {
		t.Run(name, func(t *testing.T) {
			f := New(Config{})
			applyAll(t, f, history(t)[:1])
			if err := f.Restore(data); err == nil {
				t.Fatal("Restore accepted it")
			}
			if _, ok := f.Model("demo"); !ok {
				t.Fatal("a refused restore lost the state")
			}
		})
	}
}

func TestChangeLog(t *testing.T) {
	f := New(Config{ChangeLogSize: 3})
	rev, ch := f.Applied()
	if rev != 0 {
		t.Fatalf("revision %d", rev)
	}
	applyAll(t, f, history(t)[:3]) // changes at 2, 4, 6
	select {
	case <-ch:
	default:
		t.Fatal("Applied channel not closed by an apply")
	}
	got, ok := f.ChangesSince(2)
	if !ok || len(got) != 2 || got[0].Revision != 4 || got[1].Revision != 6 {
		t.Fatalf("ChangesSince(2) = %v, %v", got, ok)
	}
	applyAll2 := func(idx uint64, c []byte) {
		if _, err := f.Apply(idx, c); err != nil {
			t.Fatal(err)
		}
	}
	applyAll2(8, place(t, "", "demo", "n1", 0))
	applyAll2(9, place(t, "", "demo", "n1", 1)) // log now 4, 6, 8, 9 -> trimmed to 6, 8, 9
	if _, ok := f.ChangesSince(2); ok {
		t.Fatal("ChangesSince(2) ok after the log dropped revision 4")
	}
	if got, ok := f.ChangesSince(4); !ok || len(got) != 3 {
		t.Fatalf("ChangesSince(4) = %v, %v", got, ok)
	}
	if got, ok := f.ChangesSince(9); !ok || len(got) != 0 {
		t.Fatalf("ChangesSince(9) = %v, %v", got, ok)
	}
}

func TestApplyRefusesOldIndex(t *testing.T) {
	f := New(Config{})
	applyAll(t, f, history(t)[:1])
	if _, err := f.Apply(2, register(t, "n1", 1)); err == nil {
		t.Fatal("re-applying an index was accepted")
	}
}

func TestNodeDesired(t *testing.T) {
	f := New(Config{})
	applyAll(t, f, history(t))
	d := f.NodeDesired("n2")
	if len(d.Replicas) != 1 || d.Replicas[0].Id != "demo-1" || len(d.Models) != 1 || d.Models[0].Name != "demo" || d.Revision != f.Revision() {
		t.Fatalf("NodeDesired(n2) = %v", d)
	}
	if d := f.NodeDesired("nobody"); len(d.Replicas) != 0 || len(d.Models) != 0 {
		t.Fatalf("NodeDesired(nobody) = %v", d)
	}
}

func TestNewCommandRefusesWrongPayload(t *testing.T) {
	if _, err := NewCommand(llmgwv1.CommandType_COMMAND_TYPE_DELETE_MODEL, &llmgwv1.UpsertModelCommand{}); err == nil {
		t.Fatal("mismatched payload accepted")
	}
	if _, err := NewCommand(llmgwv1.CommandType(99), &llmgwv1.UpsertModelCommand{}); !errors.Is(err, ErrUnknownCommand) {
		t.Fatalf("unknown type: %v", err)
	}
}

// FuzzApply feeds arbitrary bytes as a log entry: it must never panic, and a
// rejected entry must leave the objects unchanged.
func FuzzApply(f *testing.F) {
	for _, c := range history(f) {
		f.Add(c)
	}
	f.Add([]byte{})
	f.Add([]byte{0x08, 0x63, 0x10, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		m := New(Config{})
		applyAll(t, m, history(t)[:5])
		before := m.State()
		_, err := m.Apply(1000, data)
		if err != nil {
			after := m.State()
			after.Revision = before.Revision
			if !proto.Equal(before, after) {
				t.Fatalf("rejected entry changed the state: %v", err)
			}
		}
		if _, err := m.Snapshot(); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzRestore feeds arbitrary snapshot bytes: no panic, and a refusal keeps
// the state.
func FuzzRestore(f *testing.F) {
	good := New(Config{})
	applyAll(f, good, history(f))
	s, _ := good.Snapshot()
	f.Add(s)
	f.Add([]byte{0x08, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		m := New(Config{})
		if err := m.Restore(data); err == nil {
			if _, err := m.Snapshot(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestModelCreated: created_unix is the entry's append time of the model's
// first apply, kept by later updates (which neither reset it nor roll the
// replicas for it), whatever a command carries.
func TestModelCreated(t *testing.T) {
	f := New(Config{})
	t0 := time.Unix(1_700_000_000, 0)
	m := validModel()
	m.CreatedUnix = 42 // a client's value is ignored
	v, err := f.ApplyAt(2, t0.Unix(), upsert(t, m))
	if err != nil {
		t.Fatal(err)
	}
	first := v.(*llmgwv1.Model)
	if first.CreatedUnix != t0.Unix() {
		t.Fatalf("created %d, want %d", first.CreatedUnix, t0.Unix())
	}
	m = validModel()
	m.Replicas++
	v, err = f.ApplyAt(4, t0.Add(time.Hour).Unix(), upsert(t, m))
	if err != nil {
		t.Fatal(err)
	}
	if got := v.(*llmgwv1.Model); got.CreatedUnix != t0.Unix() || got.Revision != first.Revision {
		t.Fatalf("update: created %d revision %d, want %d and %d", got.CreatedUnix, got.Revision, t0.Unix(), first.Revision)
	}
	v, err = f.Apply(6, upsert(t, &llmgwv1.Model{Name: "other", Engine: "vllm", Model: "x", Replicas: 1}))
	if err != nil {
		t.Fatal(err)
	}
	if got := v.(*llmgwv1.Model); got.CreatedUnix != 0 {
		t.Fatalf("unknown append time gave created %d, want 0", got.CreatedUnix)
	}
}
