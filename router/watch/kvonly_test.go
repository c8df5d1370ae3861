package watch

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// waitCalls waits until the sink has taken n updates.
func (k *kvRecorder) waitCalls(t *testing.T, n int) [][]*llmgwv1.KVBlocks {
	t.Helper()
	var calls [][]*llmgwv1.KVBlocks
	testkit.WaitErr(t, testkit.DefaultTimeout, "the KV sink's updates", func() error {
		k.mu.Lock()
		calls = append([][]*llmgwv1.KVBlocks(nil), k.calls...)
		k.mu.Unlock()
		if len(calls) >= n {
			return nil
		}
		return fmt.Errorf("the KV sink took %d updates, want %d", len(calls), n)
	})
	return calls
}

func evKV(node string, epoch, seq uint64, kv ...*llmgwv1.KVBlocks) *llmgwv1.WatchEvent {
	return &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Ephemeral{Ephemeral: &llmgwv1.EphemeralUpdate{
		Node: node, Epoch: epoch, Seq: seq, Kv: kv}}}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestKVOnlyUpdateIsNotPublished: a delta of only KV blocks reaches the KV
// sink, advances the (epoch, seq) the next delta is judged by, and publishes
// nothing (so the router rebuilds no registry), whoever the replica is; a
// status delta after it publishes as before, with the statuses intact.
func TestKVOnlyUpdateIsNotPublished(t *testing.T) {
	kv := &kvRecorder{}
	h := start(t, func(c *Config) { c.KV = kv })
	h.nextRequest()
	ready := llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
	starting := llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING
	h.send(evBegin(3), evReplica(3, "m-0", "m", "n1", 1), evEnd(3))
	h.send(evEph("n1", 7, 1, true, status("m-0", 1, ready, "127.0.0.1:1")))
	h.waitFor("full copy", func(s *State) bool { return s.Ephemeral["n1"] != nil })
	kv.waitCalls(t, 1)

	before := h.client.Current()
	changed := h.client.Changed()
	h.send(evKV("n1", 7, 2, &llmgwv1.KVBlocks{ReplicaId: "m-0", Uid: 1, Stored: []uint64{5}}))
	// A replica the router holds no placement for goes to the sink as
	// before: the index, not the client, decides what to do with it.
	h.send(evKV("n1", 7, 3, &llmgwv1.KVBlocks{ReplicaId: "ghost", Uid: 9, Reset_: true, Stored: []uint64{6}}))
	calls := kv.waitCalls(t, 3)
	if calls[1][0].GetReplicaId() != "m-0" || calls[2][0].GetReplicaId() != "ghost" {
		t.Fatalf("the KV sink got %v, want m-0's then ghost's blocks", calls[1:])
	}
	// The sink is called after the publish an update makes, so by now a
	// publish would have closed the channel.
	if isClosed(changed) || h.client.Current() != before {
		t.Fatal("a KV-only update published a new state")
	}

	// seq 4 follows only if seq 2 and 3 were accepted; a gap would reconnect.
	h.send(evEph("n1", 7, 4, false, status("m-0", 1, starting, "")))
	st := h.waitFor("status delta seq 4", func(s *State) bool { return s.Ephemeral["n1"].Seq == 4 })
	if got := st.Ephemeral["n1"].Statuses["m-0"].GetPhase(); got != starting {
		t.Fatalf("m-0 is %v after the status delta, want starting", got)
	}
	if !isClosed(changed) {
		t.Fatal("the status delta did not close Changed")
	}
	select {
	case r := <-h.fake.reqs:
		t.Fatalf("reconnected: the KV-only deltas were not accepted (%v)", r)
	default:
	}
	if before.Ephemeral["n1"].Seq != 1 || before.Ephemeral["n1"].Statuses["m-0"].GetPhase() != ready {
		t.Fatalf("an earlier published state changed: %+v", before.Ephemeral["n1"])
	}
}

// TestKVOnly lists what must still publish: anything a routing table reads.
func TestKVOnly(t *testing.T) {
	kv := []*llmgwv1.KVBlocks{{ReplicaId: "m-0", Stored: []uint64{1}}}
	tests := []struct {
		name string
		u    *llmgwv1.EphemeralUpdate
		want bool
	}{
		{"kv delta", &llmgwv1.EphemeralUpdate{Kv: kv}, true},
		{"empty delta", &llmgwv1.EphemeralUpdate{}, true},
		{"full copy, kv only", &llmgwv1.EphemeralUpdate{Full: true, Kv: kv}, false},
		{"status", &llmgwv1.EphemeralUpdate{Kv: kv, Statuses: []*llmgwv1.ReplicaStatus{{ReplicaId: "m-0"}}}, false},
		{"adapter", &llmgwv1.EphemeralUpdate{Adapters: []*llmgwv1.AdapterStatus{{ReplicaId: "m-0", Adapter: "a"}}}, false},
		{"removed replica", &llmgwv1.EphemeralUpdate{Kv: kv, RemovedReplicas: []string{"m-1"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := kvOnly(tt.u); got != tt.want {
				t.Fatalf("kvOnly = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestKVOnlySeqIsSaved: the saved state holds the (epoch, seq) a KV-only
// update advanced, as it did when every update was published.
func TestKVOnlySeqIsSaved(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	kv := &kvRecorder{}
	h := start(t, func(c *Config) { c.KV = kv; c.StatePath = path; c.SaveInterval = time.Hour })
	h.nextRequest()
	ready := llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
	h.send(evBegin(3), evReplica(3, "m-0", "m", "n1", 1), evEnd(3))
	h.send(evEph("n1", 7, 1, true, status("m-0", 1, ready, "127.0.0.1:1")))
	h.send(evKV("n1", 7, 2, &llmgwv1.KVBlocks{ReplicaId: "m-0", Uid: 1, Stored: []uint64{5}}))
	kv.waitCalls(t, 2)
	h.cancel()
	h.wg.Wait() // Run saves a last time on the way out

	st, err := loadState(path)
	if err != nil || st == nil {
		t.Fatalf("load: %v, %v", st, err)
	}
	ne := st.Ephemeral["n1"]
	if ne == nil || ne.Epoch != 7 || ne.Seq != 2 || ne.Statuses["m-0"].GetAddress() != "127.0.0.1:1" || st.Revision != 3 {
		t.Fatalf("saved revision %d, n1 %+v; want revision 3, epoch 7 seq 2 with m-0's status", st.Revision, ne)
	}
}
