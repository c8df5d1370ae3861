package watch

import (
	"crypto/sha256"
	"path/filepath"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func evKey(r uint64, op llmgwv1.ChangeOp, name, secret string) *llmgwv1.WatchEvent {
	k := &llmgwv1.ApiKey{Name: name}
	if op == put {
		h := sha256.Sum256([]byte(secret))
		k.SecretSha256 = h[:]
	}
	return &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Change{Change: &llmgwv1.Change{
		Revision: r, Op: op, Object: &llmgwv1.Change_ApiKey{ApiKey: k}}}}
}

func hasKey(st *State, secret string) bool {
	_, ok := st.APIKeys.Lookup(secret)
	return ok
}

// TestAPIKeysFollowTheStream: keys arrive in the snapshot and as changes; a
// revoke removes the key from the next published state while a state
// published before it, which a request may still hold, keeps its own set.
func TestAPIKeysFollowTheStream(t *testing.T) {
	h := start(t, nil)
	h.nextRequest()
	h.send(evBegin(10), evModel(10, put, "demo"), evKey(10, put, "a", "sa"), evEnd(10))
	before := h.waitFor("snapshot with key a", func(s *State) bool { return s.Revision == 10 })
	if !hasKey(before, "sa") || before.APIKeys.Len() != 1 {
		t.Fatalf("key a not known after the snapshot: %v", before.APIKeys.Keys())
	}
	h.send(evKey(11, put, "b", "sb"), evMark(11))
	st := h.waitFor("key b", func(s *State) bool { return s.Revision == 11 })
	if !hasKey(st, "sa") || !hasKey(st, "sb") {
		t.Fatalf("keys after a create: %v", st.APIKeys.Keys())
	}
	h.send(evKey(12, llmgwv1.ChangeOp_CHANGE_OP_DELETE, "a", ""), evMark(12))
	st = h.waitFor("a revoked", func(s *State) bool { return s.Revision == 12 })
	if hasKey(st, "sa") || !hasKey(st, "sb") {
		t.Fatalf("keys after revoking a: %v", st.APIKeys.Keys())
	}
	if !hasKey(before, "sa") || hasKey(before, "sb") {
		t.Fatalf("a published state's keys changed under it: %v", before.APIKeys.Keys())
	}
}

// TestSavedKeysAndRevocationWhileAway: the saved state keeps the keys, so a
// router restarted with no control plane still checks them; a key revoked
// while it was away is gone once the stream's snapshot arrives.
func TestSavedKeysAndRevocationWhileAway(t *testing.T) {
	st := emptyState()
	st.Revision = 20
	st.Synced = true
	for _, ev := range []*llmgwv1.WatchEvent{evKey(20, put, "a", "sa"), evKey(20, put, "b", "sb")} {
		st.applyChange(ev.GetChange())
	}
	path := filepath.Join(t.TempDir(), "state")
	if err := saveState(path, st); err != nil {
		t.Fatal(err)
	}
	got, err := loadState(path)
	if err != nil {
		t.Fatal(err)
	}
	if !hasKey(got, "sa") || !hasKey(got, "sb") || got.APIKeys.Len() != 2 {
		t.Fatalf("saved keys lost: %v", got.APIKeys.Keys())
	}

	h := start(t, func(c *Config) { c.StatePath = path })
	if cur := h.client.Current(); !hasKey(cur, "sa") {
		t.Fatalf("saved keys not served at start: %v", cur.APIKeys.Keys())
	}
	// The server is past the change log's reach, or the router asked from
	// 20 and a is gone: either way the snapshot holds only b.
	h.nextRequest()
	h.send(evBegin(30), evKey(30, put, "b", "sb"), evEnd(30))
	cur := h.waitFor("snapshot at 30", func(s *State) bool { return s.Revision == 30 })
	if hasKey(cur, "sa") || !hasKey(cur, "sb") {
		t.Fatalf("after the snapshot: %v; want b alone", cur.APIKeys.Keys())
	}
}
