package watch

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// refusingKV applies every entry but those of replica "bad".
type refusingKV struct {
	mu    sync.Mutex
	calls int
}

func (k *refusingKV) ApplyNode(_ string, _ bool, kv []*llmgwv1.KVBlocks, _ []string) []error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls++
	errs := make([]error, len(kv))
	for i, b := range kv {
		if b.GetReplicaId() == "bad" {
			errs[i] = errors.New("refused")
		}
	}
	return errs
}

// TestKVEventLag: each KV entry the index applies is observed as the time
// from its engine events to the router's clock, by edge; entries the index
// refused, and entries without event times (a full copy), are not; an
// engine clock ahead of the router's counts as 0.
func TestKVEventLag(t *testing.T) {
	now := time.Unix(5000, 0)
	kv := &refusingKV{}
	h := start(t, func(c *Config) { c.KV = kv; c.Now = func() time.Time { return now } })
	h.nextRequest()
	h.send(evBegin(3), evReplica(3, "m-0", "m", "n1", 1), evEnd(3))
	ns := func(s float64) int64 { return int64(s * 1e9) }
	h.send(evEph("n1", 7, 1, true))
	h.send(evKV("n1", 7, 2,
		&llmgwv1.KVBlocks{ReplicaId: "m-0", Uid: 1, Stored: []uint64{5}, OldestEventUnixNano: ns(4999.8), NewestEventUnixNano: ns(4999.9)},
		&llmgwv1.KVBlocks{ReplicaId: "bad", Uid: 2, Stored: []uint64{6}, OldestEventUnixNano: ns(4000), NewestEventUnixNano: ns(4000)},
		&llmgwv1.KVBlocks{ReplicaId: "m-1", Uid: 3, Reset_: true, Stored: []uint64{7}}))
	h.send(evKV("n1", 7, 3,
		&llmgwv1.KVBlocks{ReplicaId: "m-0", Uid: 1, Removed: []uint64{5}, OldestEventUnixNano: ns(5001), NewestEventUnixNano: ns(5001)}))
	testkit.WaitErr(t, testkit.DefaultTimeout, "the KV sink's updates", func() error {
		kv.mu.Lock()
		n := kv.calls
		kv.mu.Unlock()
		if n >= 3 {
			return nil
		}
		return fmt.Errorf("the KV sink took %d updates, want 3", n)
	})
	for _, tc := range []struct {
		edge  string
		count uint64
		sum   float64
	}{{"oldest", 2, 0.2}, {"newest", 2, 0.1}} {
		var m dto.Metric
		if err := h.client.m.kvLag.WithLabelValues(tc.edge).(interface{ Write(*dto.Metric) error }).Write(&m); err != nil {
			t.Fatal(err)
		}
		got := m.GetHistogram()
		if got.GetSampleCount() != tc.count || got.GetSampleSum()-tc.sum > 1e-6 || tc.sum-got.GetSampleSum() > 1e-6 {
			t.Errorf("%s lag: %d samples summing to %v s, want %d summing to %v", tc.edge,
				got.GetSampleCount(), got.GetSampleSum(), tc.count, tc.sum)
		}
	}
}
