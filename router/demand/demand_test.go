package demand

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/ttftbuckets"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/endpoint"
)

// table is a routing table of fixed models and loads.
type table struct {
	models []*llmgwv1.Model
	eps    map[string][]*endpoint.Endpoint
	loads  map[*endpoint.Endpoint]endpoint.Load
}

func (t *table) Models() []*llmgwv1.Model { return t.models }
func (t *table) Lookup(m string) ([]*endpoint.Endpoint, bool) {
	eps, ok := t.eps[m]
	return eps, ok
}
func (t *table) LoadOf(e *endpoint.Endpoint) endpoint.Load { return t.loads[e] }

type held map[string]int

func (h held) Held(m string) int { return h[m] }

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func auto(name string) *llmgwv1.Model {
	return &llmgwv1.Model{Name: name, Autoscale: &llmgwv1.Autoscale{Max: 4, TargetWaiting: 2}}
}

func load(w, r, kv float64, stale bool) endpoint.Load {
	return endpoint.Load{Reading: endpoint.Reading{Waiting: w, Running: r, KVUsage: kv}, Saturated: stale}
}

// TestDemand: one demand per autoscaled model, in name order: held is the
// waiting room's plus flow control's queued; the readings are summed over
// fresh replicas only, a stale one left out of the count too.
func TestDemand(t *testing.T) {
	a0, a1, a2 := &endpoint.Endpoint{ReplicaID: "a-0"}, &endpoint.Endpoint{ReplicaID: "a-1"}, &endpoint.Endpoint{ReplicaID: "a-2"}
	tb := &table{
		models: []*llmgwv1.Model{auto("a"), {Name: "fixed"}, auto("z")},
		eps:    map[string][]*endpoint.Endpoint{"a": {a0, a1, a2}, "fixed": {{ReplicaID: "f-0"}}},
		loads:  map[*endpoint.Endpoint]endpoint.Load{a0: load(3, 5, 0.5, false), a1: load(1, 2, 0.25, false), a2: load(100, 100, 1, true)},
	}
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	d := New(tb, held{"z": 7}, clk.now)
	depths := []*llmgwv1.FlowDepth{
		{Model: "a", Class: "interactive", Queued: 2}, {Model: "a", Class: "batch", Queued: 3}, {Model: "fixed", Class: "batch", Queued: 9},
	}
	got := d.Demand(depths)
	want := []*llmgwv1.ModelDemand{
		{Model: "a", Held: 5, Waiting: 4, Running: 7, KvUsageSum: 0.75, Replicas: 2},
		{Model: "z", Held: 7},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Demand =\n%v\nwant\n%v", got, want)
	}
}

// TestLastMinute: requests and first tokens count for the last minute —
// the current slot of 10 s and the five before it — in the shared buckets;
// an older one is gone.
func TestLastMinute(t *testing.T) {
	tb := &table{models: []*llmgwv1.Model{auto("a")}}
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	d := New(tb, nil, clk.now)
	if got := d.Demand(nil); len(got) != 1 || got[0].TtftBuckets != nil || got[0].Requests != 0 {
		t.Fatalf("nothing counted yet: %v", got)
	}
	d.Sent("a")
	d.FirstToken("a", 80*time.Millisecond)
	clk.add(30 * time.Second)
	d.Sent("a")
	d.Sent("a")
	d.FirstToken("a", 2*time.Second)
	check := func(when string, requests uint64, ttft map[int]uint64) {
		t.Helper()
		md := d.Demand(nil)[0]
		if md.Requests != requests {
			t.Errorf("%s: %d requests, want %d", when, md.Requests, requests)
		}
		want := make([]uint64, ttftbuckets.N)
		for i, c := range ttft {
			want[i] = c
		}
		if len(ttft) == 0 {
			want = nil
		}
		if fmt.Sprint(md.TtftBuckets) != fmt.Sprint(want) {
			t.Errorf("%s: buckets %v, want %v", when, md.TtftBuckets, want)
		}
	}
	i80, i2s := ttftbuckets.Index(80*time.Millisecond), ttftbuckets.Index(2*time.Second)
	check("30 s on", 3, map[int]uint64{i80: 1, i2s: 1})
	clk.add(30 * time.Second) // the first slot is a minute old
	check("60 s on", 2, map[int]uint64{i2s: 1})
	clk.add(30 * time.Second)
	check("90 s on", 0, nil)
	// A slot reused a minute later starts from nothing.
	d.Sent("a")
	check("reused", 1, nil)
}

// TestBounded: at most MaxModels demands; the counts of a model no longer
// autoscaled are forgotten, and a model past MaxModels is not counted.
func TestBounded(t *testing.T) {
	tb := &table{}
	for i := range MaxModels + 10 {
		tb.models = append(tb.models, auto(fmt.Sprintf("m%05d", i)))
	}
	d := New(tb, nil, nil)
	if got := len(d.Demand(nil)); got != MaxModels {
		t.Fatalf("%d demands, want %d", got, MaxModels)
	}
	for i := range MaxModels + 10 {
		d.Sent(fmt.Sprintf("m%05d", i))
	}
	if len(d.models) != MaxModels {
		t.Fatalf("%d models counted, want at most %d", len(d.models), MaxModels)
	}
	tb.models = []*llmgwv1.Model{auto("m00000"), {Name: "m00001"}}
	if got := d.Demand(nil); len(got) != 1 || got[0].Requests != 1 {
		t.Fatalf("Demand = %v", got)
	}
	if len(d.models) != 1 {
		t.Fatalf("%d models still counted, want the one autoscaled", len(d.models))
	}
}
