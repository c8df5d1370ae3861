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

func setRemoved(t testing.TB, id string, removed bool, at int64) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_SERVER_REMOVED, &llmgwv1.SetServerRemovedCommand{ServerId: id, Removed: removed, AtUnixNano: at})
}

// TestSetServerRemoved: the newest verb for a server decides, whatever
// order the commands are logged in; a cleared record stays known; other
// servers have no record; a command without an id or a time is refused
// and changes nothing.
func TestSetServerRemoved(t *testing.T) {
	type want struct {
		removed, known bool
		at             int64
		rev            uint64 // the revision that set the record
	}
	tests := []struct {
		name    string
		cmds    [][]byte // applied at 100, 101, ...
		want    map[string]want
		invalid string
	}{
		{name: "removed", cmds: [][]byte{setRemoved(t, "c3", true, 10)},
			want: map[string]want{"c3": {true, true, 10, 100}, "c2": {}}},
		{name: "removed then joined", cmds: [][]byte{setRemoved(t, "c3", true, 10), setRemoved(t, "c3", false, 11)},
			want: map[string]want{"c3": {false, true, 11, 101}}},
		{name: "joined then removed again", cmds: [][]byte{setRemoved(t, "c3", true, 10), setRemoved(t, "c3", false, 11), setRemoved(t, "c3", true, 12)},
			want: map[string]want{"c3": {true, true, 12, 102}}},
		{name: "an older join logged later changes nothing", cmds: [][]byte{setRemoved(t, "c3", true, 12), setRemoved(t, "c3", false, 11)},
			want: map[string]want{"c3": {true, true, 12, 100}}},
		{name: "same time: the later command wins", cmds: [][]byte{setRemoved(t, "c3", true, 12), setRemoved(t, "c3", false, 12)},
			want: map[string]want{"c3": {false, true, 12, 101}}},
		{name: "cleared without a removal", cmds: [][]byte{setRemoved(t, "c4", false, 5)},
			want: map[string]want{"c4": {false, true, 5, 100}}},
		{name: "servers are independent", cmds: [][]byte{setRemoved(t, "c3", true, 10), setRemoved(t, "c4", true, 1), setRemoved(t, "c3", false, 11)},
			want: map[string]want{"c3": {false, true, 11, 102}, "c4": {true, true, 1, 101}}},
		{name: "no id", cmds: [][]byte{setRemoved(t, "", true, 10)}, invalid: "server_id"},
		{name: "no time", cmds: [][]byte{setRemoved(t, "c3", true, 0)}, invalid: "at_unix_nano"},
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
			// The result is the record as it stands after the command.
			if r, ok := res.(*llmgwv1.ServerRemoval); !ok {
				t.Fatalf("result %v, want a *ServerRemoval", res)
			} else if cur, _ := f.ServerRemoved(r.ServerId); !proto.Equal(r, cur) {
				t.Fatalf("result %v, record %v", r, cur)
			}
			for id, w := range tt.want {
				r, known := f.ServerRemoved(id)
				if known != w.known || r.GetRemoved() != w.removed || r.GetAtUnixNano() != w.at || r.GetRevision() != w.rev {
					t.Errorf("ServerRemoved(%s) = %v, %v; want %+v", id, r, known, w)
				}
			}
			// The list agrees with the lookups, sorted.
			var ids []string
			for _, r := range f.ServerRemovals() {
				ids = append(ids, r.ServerId)
				if cur, _ := f.ServerRemoved(r.ServerId); !proto.Equal(cur, r) {
					t.Errorf("ServerRemovals has %v, ServerRemoved says %v", r, cur)
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
	cmds := append(history(t), setRemoved(t, "c5", true, 30), setRemoved(t, "c3", true, 10), setRemoved(t, "c4", true, 20), setRemoved(t, "c4", false, 21))
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
		if r, known := c.ServerRemoved(id); !known || r.Removed != want {
			t.Errorf("after restore ServerRemoved(%s) = %v, %v; want removed %v", id, r, known, want)
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
	if _, err := f.Apply(50, setRemoved(t, "c3", true, 1)); err != nil {
		t.Fatal(err)
	}
	if got, ok := f.ChangesSince(2); !ok || len(got) != 0 || f.Revision() != 50 {
		t.Fatalf("ChangesSince(2) = %v, %v at revision %d; want no change at 50", got, ok, f.Revision())
	}
}
