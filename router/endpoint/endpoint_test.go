package endpoint

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/watch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="demo"} 3.0
vllm:num_requests_running{engine="0",model_name="demo-lora"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="demo"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="demo"} 0.25
vllm:prompt_tokens_total{engine="0",model_name="demo"} 12345.0
`

func TestParseLoad(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    Reading
		wantErr bool
	}{
		{"vllm", vllmMetrics, Reading{Waiting: 2, Running: 4, KVUsage: 0.25}, false},
		{"no labels, timestamp", "vllm:num_requests_running 1 1700000000000\nvllm:num_requests_waiting 0\n", Reading{Running: 1}, false},
		{"quoted brace and space in label", `vllm:num_requests_running{model_name="a} b"} 5` + "\nvllm:num_requests_waiting{x=\"\\\"}\"} 1\n", Reading{Running: 5, Waiting: 1}, false},
		{"old kv name", "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.5\n", Reading{KVUsage: 0.5}, false},
		{"missing gauges", "vllm:kv_cache_usage_perc 0.1\n", Reading{}, true},
		{"bad value", "vllm:num_requests_running{} abc\nvllm:num_requests_waiting 0\n", Reading{}, true},
		{"negative", "vllm:num_requests_running -1\nvllm:num_requests_waiting 0\n", Reading{}, true},
		{"unterminated labels", "vllm:num_requests_running{a=\"b 1\nvllm:num_requests_waiting 0\n", Reading{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseLoad(strings.NewReader(tt.body))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func FuzzParseLoad(f *testing.F) {
	f.Add(vllmMetrics)
	f.Add("vllm:num_requests_running{a=\"\\\\\"} 1 2\n")
	f.Add("vllm:num_requests_waiting +Inf\nvllm:num_requests_running NaN\n")
	f.Fuzz(func(t *testing.T, body string) {
		rd, err := parseLoad(strings.NewReader(body))
		if err != nil {
			return
		}
		if rd.Waiting < 0 || rd.Running < 0 || rd.KVUsage < 0 {
			t.Fatalf("negative load accepted: %+v", rd)
		}
	})
}

// fakeSource publishes states the test hands it.
type fakeSource struct {
	mu      sync.Mutex
	st      *watch.State
	changed chan struct{}
}

func newFakeSource(st *watch.State) *fakeSource {
	return &fakeSource{st: st, changed: make(chan struct{})}
}
func (f *fakeSource) Current() *watch.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}
func (f *fakeSource) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}
func (f *fakeSource) set(st *watch.State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st = st
	close(f.changed)
	f.changed = make(chan struct{})
}

type rep struct {
	id, model string
	uid       uint64
	draining  bool
	sleeping  bool
	// status; zero phase means none reported
	sUID   uint64
	phase  llmgwv1.ReplicaPhase
	addr   string
	inc    uint64
	maxLen uint32
	blocks uint64
}

func stateOf(models []string, reps ...rep) *watch.State {
	st := &watch.State{
		Synced:    true,
		Models:    map[string]*llmgwv1.Model{},
		Replicas:  map[string]*llmgwv1.Replica{},
		Ephemeral: map[string]*watch.NodeEphemeral{"n1": {Epoch: 1, Seq: 1, Statuses: map[string]*llmgwv1.ReplicaStatus{}}},
	}
	for _, m := range models {
		st.Models[m] = &llmgwv1.Model{Name: m}
	}
	for _, r := range reps {
		st.Replicas[r.id] = &llmgwv1.Replica{Id: r.id, Uid: r.uid, Model: r.model, Node: "n1", Draining: r.draining, Sleeping: r.sleeping}
		if r.phase != 0 {
			st.Ephemeral["n1"].Statuses[r.id] = &llmgwv1.ReplicaStatus{
				ReplicaId: r.id, Uid: r.sUID, Phase: r.phase, Address: r.addr, Incarnation: r.inc, MaxModelLen: r.maxLen, KvCacheBlocks: r.blocks}
		}
	}
	return st
}

const ready = llmgwv1.ReplicaPhase_REPLICA_PHASE_READY

func TestRoutable(t *testing.T) {
	tests := []struct {
		name string
		r    rep
		want bool
	}{
		{"ready", rep{id: "m-0", model: "m", uid: 5, sUID: 5, phase: ready, addr: "a:1"}, true},
		{"draining", rep{id: "m-0", model: "m", uid: 5, draining: true, sUID: 5, phase: ready, addr: "a:1"}, false},
		{"marked to sleep, still ready", rep{id: "m-0", model: "m", uid: 5, sleeping: true, sUID: 5, phase: ready, addr: "a:1"}, false},
		{"asleep", rep{id: "m-0", model: "m", uid: 5, sleeping: true, sUID: 5, phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_SLEEPING, addr: "a:1"}, false},
		{"model gone", rep{id: "x-0", model: "x", uid: 5, sUID: 5, phase: ready, addr: "a:1"}, false},
		{"no status", rep{id: "m-0", model: "m", uid: 5}, false},
		{"old placement's status", rep{id: "m-0", model: "m", uid: 5, sUID: 4, phase: ready, addr: "a:1"}, false},
		{"starting", rep{id: "m-0", model: "m", uid: 5, sUID: 5, phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING, addr: "a:1"}, false},
		{"no address", rep{id: "m-0", model: "m", uid: 5, sUID: 5, phase: ready}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := stateOf([]string{"m"}, tt.r)
			if _, got := Routable(st, st.Replicas[tt.r.id]); got != tt.want {
				t.Fatalf("Routable = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestMaxModelLen: a model's context length is the least its routable
// replicas report, and unknown when none is routable or one did not say.
func TestMaxModelLen(t *testing.T) {
	r := func(id string, maxLen uint32, phase llmgwv1.ReplicaPhase) rep {
		return rep{id: id, model: "m", uid: 5, sUID: 5, phase: phase, addr: id + ":1", maxLen: maxLen}
	}
	starting := llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING
	tests := []struct {
		name string
		reps []rep
		want int
		ok   bool
	}{
		{"one replica", []rep{r("m-0", 8192, ready)}, 8192, true},
		{"the least of two", []rep{r("m-0", 8192, ready), r("m-1", 4096, ready)}, 4096, true},
		{"a replica that did not say", []rep{r("m-0", 8192, ready), r("m-1", 0, ready)}, 0, false},
		{"only routable replicas count", []rep{r("m-0", 8192, ready), r("m-1", 2048, starting)}, 8192, true},
		{"no routable replica", []rep{r("m-0", 8192, starting)}, 0, false},
		{"no replica", nil, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newTestRegistry(t, DefaultConfig(), newFakeSource(stateOf([]string{"m"}, tt.reps...)))
			if got, ok := reg.MaxModelLen("m"); got != tt.want || ok != tt.ok {
				t.Fatalf("MaxModelLen = %d, %v; want %d, %v", got, ok, tt.want, tt.ok)
			}
			if _, ok := reg.MaxModelLen("other"); ok {
				t.Fatal("a model not in desired state has a length")
			}
		})
	}
}

// TestKVCacheBlocks: an endpoint carries its engine's cache size as the
// agent reported it (tier 2's cache-pressure rule reads it), 0 when the
// engine did not say.
func TestKVCacheBlocks(t *testing.T) {
	reg := newTestRegistry(t, DefaultConfig(), newFakeSource(stateOf([]string{"m"},
		rep{id: "m-0", model: "m", uid: 5, sUID: 5, phase: ready, addr: "a:1", blocks: 1024},
		rep{id: "m-1", model: "m", uid: 5, sUID: 5, phase: ready, addr: "b:1"})))
	got := map[string]uint64{}
	eps, _ := reg.Lookup("m")
	for _, e := range eps {
		got[e.ReplicaID] = e.KVCacheBlocks
	}
	if len(got) != 2 || got["m-0"] != 1024 || got["m-1"] != 0 {
		t.Fatalf("KVCacheBlocks %v, want m-0 1024, m-1 0", got)
	}
}

func newTestRegistry(t *testing.T, cfg Config, src Source) *Registry {
	t.Helper()
	r, err := New(cfg, src, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRebuildKeepsStateOfUnchangedReplicas(t *testing.T) {
	a := rep{id: "m-0", model: "m", uid: 5, sUID: 5, phase: ready, addr: "a:1", inc: 1}
	b := rep{id: "m-1", model: "m", uid: 6, sUID: 6, phase: ready, addr: "a:2", inc: 1}
	src := newFakeSource(stateOf([]string{"m", "empty"}, a, b))
	r := newTestRegistry(t, DefaultConfig(), src)

	eps, known := r.Lookup("m")
	if !known || len(eps) != 2 || eps[0].ReplicaID != "m-0" {
		t.Fatalf("Lookup = %v, %v", eps, known)
	}
	release := eps[0].Acquire()
	defer release()

	// m-1 restarts (incarnation 2): a new Endpoint; m-0 keeps its count.
	b.inc = 2
	r.rebuild(stateOf([]string{"m", "empty"}, a, b))
	eps2, _ := r.Lookup("m")
	if eps2[0] != eps[0] || eps2[0].Inflight() != 1 {
		t.Fatal("unchanged replica lost its endpoint state")
	}
	if eps2[1] == eps[1] {
		t.Fatal("a new incarnation reused the old endpoint")
	}
	if eps, known := r.Lookup("empty"); !known || len(eps) != 0 {
		t.Fatalf("model without replicas: %v %v", eps, known)
	}
	if _, known := r.Lookup("nope"); known {
		t.Fatal("unknown model reported known")
	}
	if ms := r.Models(); len(ms) != 2 || ms[0].GetName() != "empty" {
		t.Fatalf("Models = %v", ms)
	}
}

func TestScrapeAndStaleness(t *testing.T) {
	var hits atomic.Int64
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		io.WriteString(w, vllmMetrics)
	}))
	defer engine.Close()
	addr := strings.TrimPrefix(engine.URL, "http://")

	var mu sync.Mutex
	now := time.Unix(1000, 0)
	cfg := DefaultConfig()
	cfg.ScrapeInterval = 10 * time.Millisecond
	cfg.StaleAfter = time.Second
	cfg.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }

	src := newFakeSource(stateOf([]string{"m"}))
	r := newTestRegistry(t, cfg, src)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// The replica becomes ready after the registry started: it must follow.
	src.set(stateOf([]string{"m"}, rep{id: "m-0", model: "m", uid: 1, sUID: 1, phase: ready, addr: addr}))
	var ep *Endpoint
	testkit.Wait(t, "the endpoint to be scraped", func() bool {
		if eps, _ := r.Lookup("m"); len(eps) == 1 && eps[0].reading.Load() != nil {
			ep = eps[0]
			return true
		}
		return false
	})
	l := r.LoadOf(ep)
	if l.Saturated || l.Waiting != 2 || l.Running != 4 || l.KVUsage != 0.25 {
		t.Fatalf("load = %+v", l)
	}
	// Stop the registry, then age the reading past StaleAfter.
	cancel()
	<-done
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	if !r.LoadOf(ep).Saturated {
		t.Fatal("an old reading is not saturated")
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{{}, {ScrapeInterval: time.Second, StaleAfter: time.Millisecond}}
	for _, c := range bad {
		if err := c.Validate(); err == nil {
			t.Fatalf("%+v accepted", c)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestRoutableSince: a replica routable in the first complete state the
// router saw has no known start (zero); one that becomes routable later,
// or restarts, is dated by the registry's clock, and keeps its date while
// it stays the same incarnation.
func TestRoutableSince(t *testing.T) {
	at := time.Unix(1_700_000_000, 0)
	cfg := DefaultConfig()
	cfg.Now = func() time.Time { return at }
	a := rep{id: "m-0", model: "m", uid: 5, sUID: 5, phase: ready, addr: "a:1", inc: 1}
	b := rep{id: "m-1", model: "m", uid: 6, sUID: 6, phase: ready, addr: "a:2", inc: 1}
	src := newFakeSource(stateOf([]string{"m"}, a))
	r := newTestRegistry(t, cfg, src)
	eps, _ := r.Lookup("m")
	if len(eps) != 1 || !eps[0].RoutableSince.IsZero() {
		t.Fatalf("first state: %+v, want one endpoint of unknown start", eps)
	}

	at = at.Add(time.Minute)
	r.rebuild(stateOf([]string{"m"}, a, b))
	eps, _ = r.Lookup("m")
	if !eps[0].RoutableSince.IsZero() || !eps[1].RoutableSince.Equal(at) {
		t.Fatalf("after m-1 became routable: %v, %v; want zero and %v", eps[0].RoutableSince, eps[1].RoutableSince, at)
	}
	first := at
	at = at.Add(time.Minute)
	a.inc = 2 // m-0 restarts
	r.rebuild(stateOf([]string{"m"}, a, b))
	eps, _ = r.Lookup("m")
	if !eps[0].RoutableSince.Equal(at) || !eps[1].RoutableSince.Equal(first) {
		t.Fatalf("after m-0 restarted: %v, %v; want %v and %v", eps[0].RoutableSince, eps[1].RoutableSince, at, first)
	}
}
