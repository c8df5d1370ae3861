package watch

import (
	"fmt"
	"log/slog"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// nopKV is a KVSink that takes everything and does nothing, so a benchmark
// measures the client's own cost of an update, not the index's.
type nopKV struct{ calls int }

func (k *nopKV) ApplyNode(_ string, _ bool, kv []*llmgwv1.KVBlocks, _ []string) []error {
	k.calls++
	return make([]error, len(kv))
}

// fleetClient returns a client holding a synced state of nodes × perNode
// ready replicas, every node's agent at (epoch 1, seq 1), as the fleet
// benchmark's routers hold (docs/benchmarks.md "Fleet scale").
func fleetClient(tb testing.TB, nodes, perNode int, kv KVSink) *Client {
	tb.Helper()
	cfg := DefaultConfig()
	cfg.Addrs = []string{"127.0.0.1:1"}
	cfg.KV = kv
	c, err := New(cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		tb.Fatal(err)
	}
	evs := []*llmgwv1.WatchEvent{evBegin(1), evModel(1, put, "sim")}
	for n := range nodes {
		node := fmt.Sprintf("n%d", n)
		evs = append(evs, &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Change{Change: &llmgwv1.Change{
			Revision: 1, Op: put, Object: &llmgwv1.Change_Node{Node: &llmgwv1.Node{Id: node, Address: "127.0.0.1"}}}}})
		for r := range perNode {
			evs = append(evs, evReplica(1, fmt.Sprintf("sim-%d-%d", n, r), "sim", node, uint64(n*perNode+r+1)))
		}
	}
	evs = append(evs, evEnd(1))
	for n := range nodes {
		var sts []*llmgwv1.ReplicaStatus
		for r := range perNode {
			sts = append(sts, status(fmt.Sprintf("sim-%d-%d", n, r), uint64(n*perNode+r+1),
				llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, fmt.Sprintf("127.0.0.1:%d", 10000+n*perNode+r)))
		}
		evs = append(evs, evEph(fmt.Sprintf("n%d", n), 1, 1, true, sts...))
	}
	for _, ev := range evs {
		if err := c.handle(ev); err != nil {
			tb.Fatal(err)
		}
	}
	if got := len(c.Current().Replicas); got != nodes*perNode {
		tb.Fatalf("state holds %d replicas, want %d", got, nodes*perNode)
	}
	return c
}

// BenchmarkKVOnlyUpdate applies one KV-only delta (one replica, 100 blocks
// stored and 100 removed: 200 k events/s over 1,000 updates/s) to a client
// holding 2,000 replicas on 250 nodes, round robin over the nodes, and
// reports how many of them published a new State. Each publish also makes
// the router rebuild its endpoint registry, which this does not count.
func BenchmarkKVOnlyUpdate(b *testing.B) {
	const nodes, perNode = 250, 8
	kv := &nopKV{}
	c := fleetClient(b, nodes, perNode, kv)
	kv.calls = 0 // the full copies of the set-up
	stored := make([]uint64, 100)
	removed := make([]uint64, 100)
	for i := range stored {
		stored[i], removed[i] = uint64(i+1000), uint64(i)
	}
	seqs := make([]uint64, nodes)
	for i := range seqs {
		seqs[i] = 1
	}
	publishes := 0
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		n := i % nodes
		seqs[n]++
		ev := &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Ephemeral{Ephemeral: &llmgwv1.EphemeralUpdate{
			Node: fmt.Sprintf("n%d", n), Epoch: 1, Seq: seqs[n],
			Kv: []*llmgwv1.KVBlocks{{ReplicaId: fmt.Sprintf("sim-%d-0", n), Uid: uint64(n*perNode + 1),
				Stored: stored, Removed: removed}}}}}
		changed := c.Changed()
		if err := c.handle(ev); err != nil {
			b.Fatal(err)
		}
		select {
		case <-changed:
			publishes++
		default:
		}
	}
	b.ReportMetric(float64(publishes)/float64(b.N), "publishes/op")
	if kv.calls != b.N {
		b.Fatalf("KV sink called %d times for %d updates", kv.calls, b.N)
	}
}
