package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseStat(t *testing.T) {
	tests := []struct {
		name, in string
		want     time.Duration
		err      bool
	}{
		{"plain", "1234 (llmgw) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 100 0 0", 3250 * time.Millisecond, false},
		{"name with spaces and parens", "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 0 0", 70 * time.Millisecond, false},
		{"no name", "1234 llmgw S", 0, true},
		{"short", "1 (x) S 1 2 3", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat(tt.in)
			if (err != nil) != tt.err || got != tt.want {
				t.Errorf("parseStat = %v, %v; want %v, error %t", got, err, tt.want, tt.err)
			}
		})
	}
	if _, err := readStat("self"); err != nil {
		t.Errorf("readStat(self): %v", err)
	}
}

func TestParseRSS(t *testing.T) {
	got, err := parseRSS("Name:\tllmgw\nVmPeak:\t  100 kB\nVmRSS:\t   2048 kB\nThreads: 9\n")
	if err != nil || got != 2048<<10 {
		t.Errorf("parseRSS = %d, %v; want %d", got, err, 2048<<10)
	}
	if _, err := parseRSS("Name: x\n"); err == nil {
		t.Error("parseRSS without VmRSS: no error")
	}
	if _, err := readRSS("self"); err != nil {
		t.Errorf("readRSS(self): %v", err)
	}
}

func TestParseMetrics(t *testing.T) {
	in := `# HELP go_memstats_heap_inuse_bytes x
go_memstats_heap_inuse_bytes 1.5e+06
llmgw_control_watch_overflows_total{server="a"} 2
llmgw_control_watch_overflows_total{server="b"} 3
llmgw_control_watch_overflows_totalx 100
llmgw_router_watch_events_total{type="ephemeral"} 40
llmgw_router_watch_events_total{type="heartbeat"} 2
other 7
`
	got, err := parseMetrics(strings.NewReader(in), []string{"go_memstats_heap_inuse_bytes", "llmgw_control_watch_overflows_total", "absent", routerEphemeral})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"go_memstats_heap_inuse_bytes": 1.5e6, "llmgw_control_watch_overflows_total": 5, "absent": 0, routerEphemeral: 40}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

func TestSummarize(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i
	}
	tests := []struct {
		name string
		in   []time.Duration
		want summary
	}{
		{"none", nil, summary{}},
		{"one", ms(700), summary{N: 1, P50: 700, P99: 700, Max: 700}},
		{"nearest rank of 100", ms(hundred...), summary{N: 100, P50: 50, P99: 99, Max: 100}},
		{"p99 of 101 is the max", ms(append(hundred, 5000)...), summary{N: 101, P50: 51, P99: 100, Max: 5000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := summarize(tt.in); got != tt.want {
				t.Errorf("summarize = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestHoldsProbe(t *testing.T) {
	tests := []struct {
		name   string
		hashes []uint64
		seq    uint64
		want   bool
	}{
		{"none", nil, 5, false},
		{"this one", []uint64{probeHash(5)}, 5, true},
		{"a later one", []uint64{probeHash(9)}, 5, true},
		{"an earlier one", []uint64{probeHash(4)}, 5, false},
		{"a churn hash with a large low part", []uint64{1<<47 | 1<<40}, 5, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := holdsProbe(tt.hashes, tt.seq); got != tt.want {
				t.Errorf("holdsProbe = %t, want %t", got, tt.want)
			}
		})
	}
}

// TestAgentUpdates: the fake agent's updates keep every churning set at
// its size (each event pair stores one new block and removes that
// replica's oldest), the first live update reports every replica with a
// reset, and a probe moves the carrier's single block.
func TestAgentUpdates(t *testing.T) {
	a := &fakeAgent{id: "n1", replicas: 4, blocks: 16, reps: map[string]*fakeReplica{}, seed: 1}
	d := &llmgwv1.DesiredReplicas{}
	for i := range 4 {
		d.Replicas = append(d.Replicas, &llmgwv1.Replica{Id: "m-" + string(rune('a'+i)), Uid: uint64(10 + i), Model: "m"})
	}
	a.setDesired(d)
	if a.probeID != "m-a" {
		t.Fatalf("probe carrier %q, want m-a (lowest uid)", a.probeID)
	}
	if u, _ := a.update(1, 1, true, 0); len(u.GetStatuses()) != 0 || len(u.GetKv()) != 0 {
		t.Fatalf("before live: update %v, want an empty full copy", u)
	}
	a.live.Store(true)
	u, _ := a.update(1, 2, false, 0)
	if len(u.GetStatuses()) != 4 || len(u.GetKv()) != 4 {
		t.Fatalf("first live update: %d statuses, %d kv; want 4 and 4", len(u.GetStatuses()), len(u.GetKv()))
	}
	held := map[string]map[uint64]bool{}
	for _, kv := range u.Kv {
		if !kv.Reset_ {
			t.Fatalf("first live update: kv of %s is not a reset", kv.ReplicaId)
		}
		held[kv.ReplicaId] = map[uint64]bool{}
		for _, h := range kv.Stored {
			held[kv.ReplicaId][h] = true
		}
	}
	p := &probe{seq: 7, sentCh: make(chan time.Time, 1)}
	if err := a.addProbe(p); err != nil {
		t.Fatal(err)
	}
	for seq := uint64(3); seq < 10; seq++ {
		u, probes := a.update(1, seq, false, 5)
		if seq == 3 && len(probes) != 1 {
			t.Fatalf("the probe did not ride the next update (%d probes)", len(probes))
		}
		events := 0
		for _, kv := range u.Kv {
			for _, h := range kv.Removed {
				if !held[kv.ReplicaId][h] {
					t.Fatalf("update %d removes %x from %s, which does not hold it", seq, h, kv.ReplicaId)
				}
				delete(held[kv.ReplicaId], h)
			}
			for _, h := range kv.Stored {
				held[kv.ReplicaId][h] = true
			}
			if kv.ReplicaId != a.probeID {
				events += len(kv.Stored) + len(kv.Removed)
			}
		}
		if events != 10 {
			t.Errorf("update %d: %d churn events, want 10 (5 pairs)", seq, events)
		}
	}
	for id, set := range held {
		want := 16
		if id == a.probeID {
			want = 1
		}
		if len(set) != want {
			t.Errorf("replica %s holds %d blocks, want %d", id, len(set), want)
		}
	}
	if !held[a.probeID][probeHash(7)] {
		t.Errorf("probe carrier holds %v, want only probe 7's block", held[a.probeID])
	}
	// More pairs than a set holds: each replica turns over once, no more
	// (a block stored and removed within one update is no net change).
	u, _ = a.update(1, 10, false, 1000)
	for _, kv := range u.Kv {
		if kv.ReplicaId != a.probeID && (len(kv.Stored) != 16 || len(kv.Removed) != 16) {
			t.Errorf("1000 pairs over 3 replicas of 16 blocks: %s stores %d, removes %d; want 16 and 16", kv.ReplicaId, len(kv.Stored), len(kv.Removed))
		}
		for _, h := range kv.Removed {
			delete(held[kv.ReplicaId], h)
		}
		for _, h := range kv.Stored {
			held[kv.ReplicaId][h] = true
		}
	}
	// A full copy (new session) carries every replica as a reset of what
	// it holds now.
	u, _ = a.update(2, 1, true, 0)
	for _, kv := range u.Kv {
		if !kv.Reset_ || len(kv.Stored) != len(held[kv.ReplicaId]) {
			t.Errorf("full copy: %s reset %t with %d blocks, want a reset of %d", kv.ReplicaId, kv.Reset_, len(kv.Stored), len(held[kv.ReplicaId]))
		}
		for _, h := range kv.Stored {
			if !held[kv.ReplicaId][h] {
				t.Errorf("full copy: %s stores %x, which it no longer holds", kv.ReplicaId, h)
			}
		}
	}
}

func TestConfigValidate(t *testing.T) {
	ok := config{replicas: []int{100}, perAgent: 8, blocks: 1, rates: []float64{1, 2}, routers: 1, flush: time.Second, window: time.Second,
		probeInterval: time.Second, probePoll: time.Second, probeTimeout: time.Second, lagLimit: time.Second, setupTimeout: time.Second}
	tests := []struct {
		name   string
		mutate func(*config)
		want   string
	}{
		{"defaults", func(*config) {}, ""},
		{"one replica per agent", func(c *config) { c.perAgent = 1 }, "--replicas-per-agent: must be at least 2 (one carries the probes), got 1"},
		{"fleet below one agent", func(c *config) { c.replicas = []int{4} }, "--replicas: 4 is fewer than --replicas-per-agent 8"},
		{"rates not increasing", func(c *config) { c.rates = []float64{5, 5} }, "--rates: must be positive and increasing, got [5 5]"},
		{"no routers", func(c *config) { c.routers = 0 }, "--routers: must be at least 1, got 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mutate(&c)
			err := c.validate()
			if (err == nil) != (tt.want == "") || (err != nil && err.Error() != tt.want) {
				t.Errorf("validate = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestPairs(t *testing.T) {
	tests := []struct {
		name     string
		rate     float64
		acc      float64
		dt       time.Duration
		want     int
		wantLeft float64
	}{
		{"a flush at 1000/s", 1000, 0, 250 * time.Millisecond, 125, 0},
		{"an odd event carried", 6, 0, 500 * time.Millisecond, 1, 1},
		{"the carry completes a pair", 2, 1, 500 * time.Millisecond, 1, 0},
		{"idle", 0, 0, time.Second, 0, 0},
		{"a clock step back adds nothing", 1000, 1, -time.Second, 0, 1},
		{"a broken acc starts again", 10, -450, 100 * time.Millisecond, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &fakeAgent{}
			a.setRate(tt.rate)
			acc := tt.acc
			if got := a.pairs(&acc, tt.dt); got != tt.want || acc != tt.wantLeft {
				t.Errorf("pairs = %d, acc %v; want %d, acc %v", got, acc, tt.want, tt.wantLeft)
			}
		})
	}
}

// TestAgentStopsDraining: a live agent reports a replica the control plane
// drains STOPPED once, at its next update (nothing runs in a fake engine),
// and churns it no more; a full copy says STOPPED too.
func TestAgentStopsDraining(t *testing.T) {
	a := &fakeAgent{id: "n1", replicas: 3, blocks: 4, reps: map[string]*fakeReplica{}, seed: 1}
	d := &llmgwv1.DesiredReplicas{}
	for i := range 3 {
		d.Replicas = append(d.Replicas, &llmgwv1.Replica{Id: fmt.Sprintf("m-%d", i), Uid: uint64(10 + i), Model: "m"})
	}
	a.setDesired(d)
	a.live.Store(true)
	a.update(1, 1, true, 0)
	d.Replicas[2].Draining = true
	a.setDesired(d)
	phases := func(u *llmgwv1.EphemeralUpdate) map[string]llmgwv1.ReplicaPhase {
		out := map[string]llmgwv1.ReplicaPhase{}
		for _, s := range u.GetStatuses() {
			out[s.ReplicaId] = s.Phase
		}
		return out
	}
	u, _ := a.update(1, 2, false, 8)
	if got := phases(u); len(got) != 1 || got["m-2"] != llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED {
		t.Fatalf("after the drain: statuses %v, want m-2 STOPPED only", got)
	}
	for _, kv := range u.Kv {
		if kv.ReplicaId == "m-2" {
			t.Fatalf("a draining replica churns: %v", kv)
		}
	}
	if u, _ := a.update(1, 3, false, 0); len(u.GetStatuses()) != 0 {
		t.Fatalf("STOPPED sent again: %v", u.GetStatuses())
	}
	if got := phases(func() *llmgwv1.EphemeralUpdate { u, _ := a.update(2, 1, true, 0); return u }()); got["m-2"] != llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED || got["m-0"] != llmgwv1.ReplicaPhase_REPLICA_PHASE_READY {
		t.Fatalf("full copy: %v, want m-2 STOPPED, the others READY", got)
	}
}
