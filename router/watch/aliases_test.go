package watch

import (
	"path/filepath"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func evAlias(r uint64, op llmgwv1.ChangeOp, name string, targets ...string) *llmgwv1.WatchEvent {
	a := &llmgwv1.Alias{Name: name}
	for _, t := range targets {
		a.Targets = append(a.Targets, &llmgwv1.AliasTarget{Target: t, Weight: 1})
	}
	return &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Change{Change: &llmgwv1.Change{
		Revision: r, Op: op, Object: &llmgwv1.Change_Alias{Alias: a}}}}
}

// TestAliasesFollowTheStream (design §7.9): aliases arrive in the snapshot
// and as changes, a change replaces an alias whole, a delete removes it;
// a state published before a change keeps what it had; the saved state
// keeps them, so a restarted router resolves them at once.
func TestAliasesFollowTheStream(t *testing.T) {
	h := start(t, nil)
	h.nextRequest()
	h.send(evBegin(10), evModel(10, put, "a"), evModel(10, put, "b"), evAlias(10, put, "chat", "a"), evEnd(10))
	before := h.waitFor("snapshot with alias chat", func(s *State) bool { return s.Revision == 10 })
	if a := before.Aliases["chat"]; a == nil || a.Targets[0].Target != "a" {
		t.Fatalf("alias after the snapshot: %v", before.Aliases)
	}
	h.send(evAlias(11, put, "chat", "b"), evAlias(11, put, "code", "a", "b"), evMark(11))
	st := h.waitFor("chat cut over to b", func(s *State) bool { return s.Revision == 11 })
	if a := st.Aliases["chat"]; a == nil || len(a.Targets) != 1 || a.Targets[0].Target != "b" || st.Aliases["code"] == nil {
		t.Fatalf("aliases after the changes: %v", st.Aliases)
	}
	if before.Aliases["chat"].Targets[0].Target != "a" || before.Aliases["code"] != nil {
		t.Fatalf("a published state's aliases changed under it: %v", before.Aliases)
	}
	h.send(evAlias(12, llmgwv1.ChangeOp_CHANGE_OP_DELETE, "code"), evMark(12))
	st = h.waitFor("code deleted", func(s *State) bool { return s.Revision == 12 })
	if st.Aliases["code"] != nil || st.Aliases["chat"] == nil {
		t.Fatalf("aliases after a delete: %v", st.Aliases)
	}

	path := filepath.Join(t.TempDir(), "state")
	if err := saveState(path, st); err != nil {
		t.Fatal(err)
	}
	got, err := loadState(path)
	if err != nil {
		t.Fatal(err)
	}
	if a := got.Aliases["chat"]; a == nil || a.Targets[0].Target != "b" || len(got.Aliases) != 1 {
		t.Fatalf("saved aliases: %v", got.Aliases)
	}
}
