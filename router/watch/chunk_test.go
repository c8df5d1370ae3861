package watch

import (
	"sync"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// chunked is a full copy of two replicas in three chunks, as the server
// splits one (chunking.Split): m-0's blocks span chunks 0
// and 1, m-1's start in chunk 1 and go on in chunk 2.
func chunked() []*llmgwv1.EphemeralUpdate {
	head := func(i uint32) *llmgwv1.EphemeralUpdate {
		return &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 4, Seq: 2, Full: true, Chunk: i, Chunks: 3}
	}
	c0, c1, c2 := head(0), head(1), head(2)
	c0.Statuses = []*llmgwv1.ReplicaStatus{{ReplicaId: "m-0", Uid: 1}, {ReplicaId: "m-1", Uid: 2}}
	c0.Kv = []*llmgwv1.KVBlocks{{ReplicaId: "m-0", Uid: 1, Reset_: true, Stored: []uint64{1, 2}}}
	c1.Kv = []*llmgwv1.KVBlocks{{ReplicaId: "m-0", Uid: 1, Reset_: true, Continued: true, Stored: []uint64{3}},
		{ReplicaId: "m-1", Uid: 2, Reset_: true, Stored: []uint64{10}}}
	c2.Kv = []*llmgwv1.KVBlocks{{ReplicaId: "m-1", Uid: 2, Reset_: true, Continued: true, Stored: []uint64{11, 12}}}
	return []*llmgwv1.EphemeralUpdate{c0, c1, c2}
}

// kvRecorder is a KVSink that keeps what it was given.
type kvRecorder struct {
	mu    sync.Mutex
	calls [][]*llmgwv1.KVBlocks
}

func (k *kvRecorder) ApplyNode(_ string, _ bool, kv []*llmgwv1.KVBlocks, _ []string) []error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, kv)
	return make([]error, len(kv))
}

// TestClientAssemblesChunks: the client asks for chunks, and an update
// sent as chunks reaches its state and its KV sink once, whole, when the
// last chunk arrives.
func TestClientAssemblesChunks(t *testing.T) {
	kv := &kvRecorder{}
	h := start(t, func(c *Config) { c.KV = kv })
	if r := h.nextRequest(); r.GetMaxChunkBytes() == 0 {
		t.Fatal("the watch request asks for no chunks")
	}
	chunks := chunked()
	for _, c := range chunks {
		h.send(&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Ephemeral{Ephemeral: c}})
	}
	st := h.waitFor("the chunked copy applied", func(s *State) bool { return s.Ephemeral["n1"] != nil })
	if e := st.Ephemeral["n1"]; e.Epoch != 4 || e.Seq != 2 || len(e.Statuses) != 2 {
		t.Fatalf("held %+v, want epoch 4 seq 2 with 2 statuses", e)
	}
	// The state is published before the KV sink is called: wait for it.
	calls := kv.waitCalls(t, 1)
	if len(calls) != 1 || len(calls[0]) != 2 || len(calls[0][0].Stored) != 3 || len(calls[0][1].Stored) != 3 {
		t.Fatalf("KV sink got %v, want one call with both replicas' 3 blocks", calls)
	}
}
