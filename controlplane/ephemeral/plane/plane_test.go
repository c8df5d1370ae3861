package plane

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/ephemeral"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mesh connects planes in memory; drop, when set, loses a message.
type mesh struct {
	mu     sync.Mutex
	planes map[string]*Plane
	stores map[string]*ephemeral.Store
	drop   func(from, to string, m *message) bool
	// largest is the largest message sent to each peer.
	largest map[string]int
}

type meshTransport struct {
	mesh *mesh
	self string
}

func (t meshTransport) Peers() []string {
	t.mesh.mu.Lock()
	defer t.mesh.mu.Unlock()
	var out []string
	for id := range t.mesh.planes {
		out = append(out, id)
	}
	return out
}

func (t meshTransport) Send(peer string, b []byte) error {
	t.mesh.mu.Lock()
	p, drop := t.mesh.planes[peer], t.mesh.drop
	t.mesh.mu.Unlock()
	if p == nil {
		return fmt.Errorf("no peer %s", peer)
	}
	t.mesh.mu.Lock()
	t.mesh.largest[peer] = max(t.mesh.largest[peer], len(b))
	t.mesh.mu.Unlock()
	if drop != nil {
		m, err := decode(b)
		if err != nil {
			return err
		}
		if drop(t.self, peer, m) {
			return nil // lost without a trace, as a crash after the write
		}
	}
	p.Receive(b)
	return nil
}

func newMesh(t *testing.T, ids ...string) *mesh {
	t.Helper()
	chunks := map[string]int{}
	for _, id := range ids {
		chunks[id] = 0
	}
	return newChunkedMesh(t, chunks)
}

// newChunkedMesh is newMesh with each plane's ChunkBytes (0: a server of
// a release before chunks).
func newChunkedMesh(t *testing.T, chunks map[string]int) *mesh {
	t.Helper()
	m := &mesh{planes: map[string]*Plane{}, stores: map[string]*ephemeral.Store{}, largest: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for id, chunk := range chunks {
		st := ephemeral.NewStore()
		p := New(Config{Self: id, Tick: 5 * time.Millisecond, Keepalive: 50 * time.Millisecond, ChunkBytes: chunk}, st, meshTransport{m, id},
			NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
		m.planes[id], m.stores[id] = p, st
	}
	for _, p := range m.planes {
		wg.Go(func() { p.Run(ctx) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return m
}

// accept applies an agent's update on its owner, as the agent session
// does, and forwards it.
func (m *mesh) accept(t *testing.T, owner string, u *llmgwv1.EphemeralUpdate) {
	t.Helper()
	if v := m.stores[owner].Apply(u); v != ephemeral.Accepted {
		t.Fatalf("owner %s: %v", owner, v)
	}
	m.planes[owner].Forward(u, time.Now())
}

func holds(st *ephemeral.Store, node string, epoch, seq uint64) bool {
	e, s, ok := st.Held(node)
	return ok && e == epoch && s == seq
}

func update(epoch, seq uint64, full bool) *llmgwv1.EphemeralUpdate {
	return &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: epoch, Seq: seq, Full: full, Statuses: []*llmgwv1.ReplicaStatus{
		{ReplicaId: "m-0", Uid: 7, Incarnation: seq, Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY}}}
}

func TestForwardRepairAndSupersede(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, m *mesh)
	}{
		{"updates reach every peer unchanged", func(t *testing.T, m *mesh) {
			m.planes["a"].SessionStarted("n1", 5)
			m.accept(t, "a", update(5, 1, true))
			m.accept(t, "a", update(5, 2, false))
			m.accept(t, "a", update(5, 3, false))
			for _, id := range []string{"b", "c"} {
				testkit.Wait(t, id+" holds 5/3", func() bool { return holds(m.stores[id], "n1", 5, 3) })
				testkit.Wait(t, id+" sees the session", func() bool { live, _ := m.planes[id].Live("n1"); return live })
			}
			st, _ := m.stores["c"].FullCopy("n1")
			if st.Statuses[0].Incarnation != 3 {
				t.Fatalf("c holds %v", st)
			}
			m.planes["a"].SessionEnded("n1", 5)
			testkit.Wait(t, "the end announced", func() bool { live, at := m.planes["b"].Live("n1"); return !live && !at.IsZero() })
		}},
		{"a lost batch is repaired by a full copy on the gap", func(t *testing.T, m *mesh) {
			m.planes["a"].SessionStarted("n1", 5)
			m.accept(t, "a", update(5, 1, true))
			testkit.Wait(t, "b holds 5/1", func() bool { return holds(m.stores["b"], "n1", 5, 1) })
			var once sync.Once
			m.mu.Lock()
			m.drop = func(from, to string, msg *message) bool {
				lost := false
				if to == "b" && len(msg.Updates) > 0 && msg.Updates[0].Update.Seq == 2 {
					once.Do(func() { lost = true })
				}
				return lost
			}
			m.mu.Unlock()
			m.accept(t, "a", update(5, 2, false))
			testkit.Wait(t, "c holds 5/2", func() bool { return holds(m.stores["c"], "n1", 5, 2) })
			m.accept(t, "a", update(5, 3, false))
			testkit.Wait(t, "b repaired to 5/3", func() bool { return holds(m.stores["b"], "n1", 5, 3) })
		}},
		{"a lost last delta is repaired by the digest", func(t *testing.T, m *mesh) {
			m.planes["a"].SessionStarted("n1", 5)
			m.accept(t, "a", update(5, 1, true))
			testkit.Wait(t, "b holds 5/1", func() bool { return holds(m.stores["b"], "n1", 5, 1) })
			m.mu.Lock()
			m.drop = func(from, to string, msg *message) bool {
				return to == "b" && len(msg.Updates) > 0 && len(msg.Requests) == 0 && !msg.Updates[0].Update.Full
			}
			m.mu.Unlock()
			m.accept(t, "a", update(5, 2, false))
			testkit.Wait(t, "c holds 5/2", func() bool { return holds(m.stores["c"], "n1", 5, 2) })
			if holds(m.stores["b"], "n1", 5, 2) {
				t.Fatal("b got the dropped delta")
			}
			// memberlist's push/pull, by hand.
			m.planes["b"].MergeRemoteState(m.planes["a"].LocalState())
			testkit.Wait(t, "b repaired to 5/2", func() bool { return holds(m.stores["b"], "n1", 5, 2) })
		}},
		{"a newer session supersedes everywhere; the old one's late delta is dropped", func(t *testing.T, m *mesh) {
			m.planes["a"].SessionStarted("n1", 5)
			m.accept(t, "a", update(5, 1, true))
			testkit.Wait(t, "c holds 5/1", func() bool { return holds(m.stores["c"], "n1", 5, 1) })
			m.planes["b"].SessionStarted("n1", 9)
			m.accept(t, "b", update(9, 1, true))
			for _, id := range []string{"a", "c"} {
				testkit.Wait(t, id+" holds 9/1", func() bool { return holds(m.stores[id], "n1", 9, 1) })
			}
			// The old owner's late delta: stale on its own store and on
			// every peer it might reach.
			late := update(5, 2, false)
			if v := m.stores["a"].Apply(late); v != ephemeral.Stale {
				t.Fatalf("late delta on its owner: %v", v)
			}
			b, _ := encode(&message{Kind: kindBatch, From: "a", Counter: 1, Updates: []forwarded{{Update: late}}})
			m.planes["c"].Receive(b)
			if !holds(m.stores["c"], "n1", 9, 1) {
				t.Fatal("c moved off the newer session")
			}
			m.planes["a"].SessionEnded("n1", 5)
			testkit.Wait(t, "c: b owns n1", func() bool {
				m.planes["c"].mu.Lock()
				defer m.planes["c"].mu.Unlock()
				return m.planes["c"].ownerLocked("n1") == "b" && len(m.planes["c"].claims["n1"]) == 1
			})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.run(t, newMesh(t, "a", "b", "c"))
		})
	}
}

// TestReorder: deltas that arrive early wait for the one they follow.
func TestReorder(t *testing.T) {
	st := ephemeral.NewStore()
	p := New(Config{Self: "b"}, st, meshTransport{&mesh{planes: map[string]*Plane{}}, "b"}, NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	send := func(us ...*llmgwv1.EphemeralUpdate) {
		var fs []forwarded
		for _, u := range us {
			fs = append(fs, forwarded{Update: u})
		}
		b, err := encode(&message{Kind: kindBatch, From: "a", Counter: 1, Updates: fs})
		if err != nil {
			t.Fatal(err)
		}
		p.Receive(b)
	}
	send(update(5, 1, true))
	send(update(5, 4, false), update(5, 3, false))
	if !holds(st, "n1", 5, 1) {
		t.Fatal("applied past a gap")
	}
	send(update(5, 2, false))
	if !holds(st, "n1", 5, 4) {
		e, s, _ := st.Held("n1")
		t.Fatalf("held %d/%d after the gap closed, want 5/4", e, s)
	}
	if len(p.reorder) != 0 {
		t.Fatalf("reorder buffer left with %v", p.reorder)
	}
}

func TestWireRoundTrip(t *testing.T) {
	in := &message{Kind: kindBatch, From: "c1", Counter: 42,
		Sessions: []session{{Node: "n1", Epoch: 9, Seq: 3}},
		Updates:  []forwarded{{RecvUnixNano: 123, Update: update(9, 3, false)}},
		Requests: []request{{Node: "n2", Reason: "gap"}}}
	b, err := encode(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if out.From != in.From || out.Counter != in.Counter || len(out.Sessions) != 1 || out.Sessions[0] != in.Sessions[0] ||
		len(out.Updates) != 1 || out.Updates[0].RecvUnixNano != 123 || !proto.Equal(out.Updates[0].Update, in.Updates[0].Update) ||
		len(out.Requests) != 1 || out.Requests[0] != in.Requests[0] {
		t.Fatalf("round trip: %+v", out)
	}
}

func TestDecodeRefuses(t *testing.T) {
	good, _ := encode(&message{Kind: kindBatch, From: "c1"})
	tests := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"tombstones JSON", []byte(`{"c1":{"r":true}}`)},
		{"kind only", []byte{kindBatch}},
		{"truncated", good[:len(good)-1]},
		{"session without a node", func() []byte {
			b, _ := encode(&message{Kind: kindDigest, From: "c1", Sessions: []session{{Epoch: 1}}})
			return b
		}()},
		{"update that is not an EphemeralUpdate", append(append([]byte{}, good...), 0x22, 0x03, 0x12, 0x01, 0xff)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if m, err := decode(tt.b); err == nil {
				t.Fatalf("decoded %+v", m)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	b, _ := encode(&message{Kind: kindBatch, From: "c1", Counter: 1, Sessions: []session{{Node: "n1", Epoch: 2, Seq: 3}},
		Updates: []forwarded{{RecvUnixNano: 5, Update: update(2, 3, true)}}, Requests: []request{{Node: "n1", Reason: "x"}}, ChunkBytes: 1 << 20})
	f.Add(b)
	d, _ := encode(&message{Kind: kindDigest, From: "c2", Sessions: []session{{Node: "n1", Epoch: 2, Seq: 3}}})
	f.Add(d)
	f.Add([]byte(`{"c1":{"r":true,"t":1}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decode(b)
		if err != nil {
			return
		}
		again, err := encode(m)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if _, err := decode(again); err != nil {
			t.Fatalf("a decoded message does not decode again: %v", err)
		}
	})
}

// A full copy larger than the chunk budget reaches a peer that takes
// chunks in messages within the budget, and a peer of the release before
// chunks whole: both end up holding all of it.
func TestFullCopyInChunks(t *testing.T) {
	const chunk = 64 << 10
	m := newChunkedMesh(t, map[string]int{"a": chunk, "b": chunk, "old": 0})
	u := &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 5, Seq: 1, Full: true}
	for r := range 8 {
		b := &llmgwv1.KVBlocks{ReplicaId: fmt.Sprintf("m-%d", r), Uid: 1, Reset_: true}
		for i := range 20_000 {
			b.Stored = append(b.Stored, uint64(r)<<32|uint64(i))
		}
		u.Kv = append(u.Kv, b)
		u.Statuses = append(u.Statuses, &llmgwv1.ReplicaStatus{ReplicaId: b.ReplicaId, Uid: 1})
	}
	whole := proto.Size(u)
	// Let b and old announce themselves first, as a live peer does within
	// a keepalive.
	testkit.Wait(t, "a learning its peers' chunk budgets", func() bool {
		m.planes["a"].mu.Lock()
		defer m.planes["a"].mu.Unlock()
		_, b := m.planes["a"].peerChunk["b"]
		_, o := m.planes["a"].peerChunk["old"]
		return b && o
	})
	m.planes["a"].SessionStarted("n1", 5)
	m.accept(t, "a", u)
	for _, id := range []string{"b", "old"} {
		testkit.Wait(t, id+" holding the full copy", func() bool { return holds(m.stores[id], "n1", 5, 1) })
		got, _ := m.stores[id].FullCopy("n1")
		want, _ := m.stores["a"].FullCopy("n1")
		if !proto.Equal(got, want) {
			t.Fatalf("%s holds a different copy (%d bytes, want %d)", id, proto.Size(got), proto.Size(want))
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := m.largest["b"]; n > chunk+1<<10 {
		t.Errorf("largest message to b is %d bytes, above the %d budget", n, chunk)
	}
	if n := m.largest["old"]; n < whole {
		t.Errorf("largest message to old is %d bytes; want the whole %d-byte copy in one", n, whole)
	}
}

// A chunk lost on the way leaves its update half held: the receiver, after
// a longer wait than for a plain gap, asks for a full copy, and the copy
// that comes makes it whole.
func TestLostChunkIsRepaired(t *testing.T) {
	const chunk = 16 << 10
	m := newChunkedMesh(t, map[string]int{"a": chunk, "b": chunk})
	var dropped bool
	m.mu.Lock()
	m.drop = func(from, to string, msg *message) bool {
		for _, f := range msg.Updates {
			if f.Update.GetChunks() > 1 && f.Update.GetChunk() == f.Update.GetChunks()-1 && !dropped {
				dropped = true
				return true
			}
		}
		return false
	}
	m.mu.Unlock()
	testkit.Wait(t, "a learning b's chunk budget", func() bool {
		m.planes["a"].mu.Lock()
		defer m.planes["a"].mu.Unlock()
		_, ok := m.planes["a"].peerChunk["b"]
		return ok
	})
	u := &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 5, Seq: 1, Full: true, Kv: []*llmgwv1.KVBlocks{{ReplicaId: "m-0", Uid: 1, Reset_: true}}}
	for i := range 20_000 {
		u.Kv[0].Stored = append(u.Kv[0].Stored, uint64(i))
	}
	m.planes["a"].SessionStarted("n1", 5)
	m.accept(t, "a", u)
	// A delta after it, in a message of its own, reveals the gap.
	testkit.Wait(t, "b holding part of the copy", func() bool {
		b := m.planes["b"]
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.chunks["a"] != nil && b.chunks["a"].Assembling("n1")
	})
	d := &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 5, Seq: 2, Statuses: []*llmgwv1.ReplicaStatus{{ReplicaId: "m-0", Uid: 1}}}
	m.accept(t, "a", d)
	testkit.Wait(t, "b holding the copy and the delta after the lost chunk", func() bool { return holds(m.stores["b"], "n1", 5, 2) })
	m.mu.Lock()
	defer m.mu.Unlock()
	if !dropped {
		t.Fatal("no chunk was dropped: the test did not test the loss")
	}
	if got, _ := m.stores["b"].FullCopy("n1"); len(got.GetKv()) != 1 || len(got.Kv[0].Stored) != 20_000 {
		t.Fatalf("b holds %v blocks, want 20000", got.GetKv())
	}
}
