//go:build !llmgw_upgrade_old

package fsm

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func setRemoved(t testing.TB, id string, removed bool) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_SERVER_REMOVED, &llmgwv1.SetServerRemovedCommand{ServerId: id, Removed: removed})
}

// TestSetServerRemoved: the newest command for a server decides; a
// cleared record stays known; other servers have no record; an empty id is
// refused and changes nothing.
func TestSetServerRemoved(t *testing.T) {
	type want struct{ removed, known bool }
	tests := []struct {
		name    string
		cmds    [][]byte
		want    map[string]want
		invalid string
	}{
		{name: "removed", cmds: [][]byte{setRemoved(t, "c3", true)},
			want: map[string]want{"c3": {true, true}, "c2": {false, false}}},
		{name: "removed then joined", cmds: [][]byte{setRemoved(t, "c3", true), setRemoved(t, "c3", false)},
			want: map[string]want{"c3": {false, true}}},
		{name: "joined then removed again", cmds: [][]byte{setRemoved(t, "c3", true), setRemoved(t, "c3", false), setRemoved(t, "c3", true)},
			want: map[string]want{"c3": {true, true}}},
		{name: "cleared without a removal", cmds: [][]byte{setRemoved(t, "c4", false)},
			want: map[string]want{"c4": {false, true}}},
		{name: "servers are independent", cmds: [][]byte{setRemoved(t, "c3", true), setRemoved(t, "c4", true), setRemoved(t, "c3", false)},
			want: map[string]want{"c3": {false, true}, "c4": {true, true}}},
		{name: "no id", cmds: [][]byte{setRemoved(t, "", true)}, invalid: "server_id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := New(Config{})
			applyAll(t, f, history(t)[:1])
			before, _ := f.Snapshot()
			var err error
			var res any
			for i, c := range tt.cmds {
				if res, err = f.Apply(uint64(100+i), c); err != nil {
					break
				}
			}
			if tt.invalid != "" {
				var ve *ValidationError
				if !errors.As(err, &ve) || ve.Field != tt.invalid {
					t.Fatalf("err = %v, want a validation error on %s", err, tt.invalid)
				}
				after := f.State()
				after.Revision = 2
				if a, _ := (proto.MarshalOptions{Deterministic: true}).Marshal(after); !bytes.Equal(a, before) {
					t.Fatal("a refused command changed the state")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			last := uint64(100 + len(tt.cmds) - 1)
			if r, ok := res.(*llmgwv1.ServerRemoval); !ok || r.Revision != last {
				t.Fatalf("result %v, want the record at revision %d", res, last)
			}
			for id, w := range tt.want {
				if removed, known := f.ServerRemoved(id); removed != w.removed || known != w.known {
					t.Errorf("ServerRemoved(%s) = %v, %v; want %v, %v", id, removed, known, w.removed, w.known)
				}
			}
			// The list agrees with the lookups, sorted.
			var ids []string
			for _, r := range f.ServerRemovals() {
				ids = append(ids, r.ServerId)
				if removed, _ := f.ServerRemoved(r.ServerId); removed != r.Removed {
					t.Errorf("ServerRemovals has %s removed=%v, ServerRemoved says %v", r.ServerId, r.Removed, removed)
				}
			}
			if !slices.IsSorted(ids) {
				t.Errorf("ServerRemovals not sorted: %v", ids)
			}
		})
	}
}

// TestServerRemovalsDeterministic: two FSMs fed the same history with
// removals marshal identically, and the records survive a snapshot and
// restore, which is what keeps them across a restart of every server.
func TestServerRemovalsDeterministic(t *testing.T) {
	cmds := append(history(t), setRemoved(t, "c5", true), setRemoved(t, "c3", true), setRemoved(t, "c4", true), setRemoved(t, "c4", false))
	a, b := New(Config{}), New(Config{})
	applyAll(t, a, cmds)
	applyAll(t, b, cmds)
	sa, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if sb, _ := b.Snapshot(); !bytes.Equal(sa, sb) {
		t.Fatal("two FSMs fed the same commands gave different snapshots")
	}
	c := New(Config{})
	if err := c.Restore(sa); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if sc, _ := c.Snapshot(); !bytes.Equal(sa, sc) {
		t.Fatal("snapshot -> restore -> snapshot differs")
	}
	for id, want := range map[string]bool{"c3": true, "c4": false, "c5": true} {
		if removed, known := c.ServerRemoved(id); !known || removed != want {
			t.Errorf("after restore ServerRemoved(%s) = %v, %v; want %v, true", id, removed, known, want)
		}
	}
	got := c.ServerRemovals()
	if len(got) != 3 || got[0].ServerId != "c3" || got[2].ServerId != "c5" || got[1].Revision != a.Revision() {
		t.Fatalf("after restore ServerRemovals = %v", got)
	}
	// Restoring a snapshot without records (an older one) drops them.
	empty := New(Config{})
	applyAll(t, empty, history(t))
	se, _ := empty.Snapshot()
	if err := c.Restore(se); err != nil {
		t.Fatal(err)
	}
	if _, known := c.ServerRemoved("c3"); known || len(c.ServerRemovals()) != 0 {
		t.Fatal("records outlived a restore of a snapshot without them")
	}
}

// TestServerRemovalNoChange: a removal record is not a watched object: the
// revision moves, no change is logged.
func TestServerRemovalNoChange(t *testing.T) {
	f := New(Config{})
	applyAll(t, f, history(t)[:1])
	if _, err := f.Apply(50, setRemoved(t, "c3", true)); err != nil {
		t.Fatal(err)
	}
	if got, ok := f.ChangesSince(2); !ok || len(got) != 0 || f.Revision() != 50 {
		t.Fatalf("ChangesSince(2) = %v, %v at revision %d; want no change at 50", got, ok, f.Revision())
	}
}
