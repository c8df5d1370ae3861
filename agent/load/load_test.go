package load

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/vllm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var discard = slog.New(slog.DiscardHandler)

const vllmText = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="demo"} 3.0
vllm:num_requests_waiting{engine="0",model_name="demo"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="demo"} 0.25
`

const llamaText = `# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
llamacpp:requests_deferred 7
llamacpp:kv_cache_usage_ratio 0.5
`

func engine(t *testing.T, body string, status int) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// fakeTargets is a target list the test changes.
type fakeTargets struct {
	mu sync.Mutex
	ts []Target
}

func (f *fakeTargets) LoadTargets() []Target {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Target(nil), f.ts...)
}

func (f *fakeTargets) set(ts ...Target) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ts = ts
}

// stepClock advances by one second at every reading, so stamps are
// distinct and known without a wall clock.
type stepClock struct{ n atomic.Int64 }

func (c *stepClock) now() time.Time { return time.Unix(1000+c.n.Add(1), 0) }

func startReader(t *testing.T, targets Targets) (*Reader, func()) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Node = "n1"
	cfg.Interval = 5 * time.Millisecond
	clock := &stepClock{}
	cfg.Now = clock.now
	r, err := NewReader(cfg, targets, discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return r, stop
}

// waitSnapshot polls the reader until cond holds for a snapshot, and
// returns that snapshot.
func waitSnapshot(t *testing.T, r *Reader, what string, cond func(*llmgwv1.LoadSnapshot) bool) *llmgwv1.LoadSnapshot {
	t.Helper()
	var s *llmgwv1.LoadSnapshot
	testkit.WaitErr(t, testkit.DefaultTimeout, what, func() error {
		if s, _ = r.Latest(); cond(s) {
			return nil
		}
		return fmt.Errorf("last snapshot %v", s)
	})
	return s
}

func byID(s *llmgwv1.LoadSnapshot) map[string]*llmgwv1.ReplicaLoad {
	out := map[string]*llmgwv1.ReplicaLoad{}
	for _, rl := range s.GetReplicas() {
		out[rl.GetReplicaId()] = rl
	}
	return out
}

func TestReaderReadsEachEngineByItsNames(t *testing.T) {
	targets := &fakeTargets{}
	vl := Target{ReplicaID: "a-0", UID: 5, Incarnation: 1, Address: engine(t, vllmText, 200), Names: vllm.VLLMLoadNames}
	ll := Target{ReplicaID: "b-0", UID: 6, Incarnation: 2, Address: engine(t, llamaText, 200), Names: vllm.LlamaCppLoadNames}
	broken := Target{ReplicaID: "c-0", UID: 7, Incarnation: 1, Address: engine(t, "oops", 500), Names: vllm.VLLMLoadNames}
	wrongNames := Target{ReplicaID: "d-0", UID: 8, Incarnation: 1, Address: engine(t, llamaText, 200), Names: vllm.VLLMLoadNames}
	targets.set(vl, ll, broken, wrongNames)
	r, _ := startReader(t, targets)

	first, _ := r.Latest()
	if first.GetNode() != "n1" || first.GetIntervalNanos() != (5*time.Millisecond).Nanoseconds() {
		t.Fatalf("initial snapshot %v", first)
	}
	s := waitSnapshot(t, r, "both good engines read", func(s *llmgwv1.LoadSnapshot) bool {
		m := byID(s)
		return m["a-0"].GetScrapedUnixNano() != 0 && m["b-0"].GetScrapedUnixNano() != 0
	})
	want := map[string]*llmgwv1.ReplicaLoad{
		"a-0": {ReplicaId: "a-0", Uid: 5, Incarnation: 1, Waiting: 2, Running: 3, KvUsage: 0.25},
		"b-0": {ReplicaId: "b-0", Uid: 6, Incarnation: 2, Waiting: 7, Running: 1, KvUsage: 0.5},
		"c-0": {ReplicaId: "c-0", Uid: 7, Incarnation: 1},
		"d-0": {ReplicaId: "d-0", Uid: 8, Incarnation: 1},
	}
	got := byID(s)
	if len(got) != len(want) {
		t.Fatalf("snapshot lists %d replicas, want %d: %v", len(got), len(want), s)
	}
	for id, w := range want {
		g := got[id]
		if g.GetUid() != w.Uid || g.GetIncarnation() != w.Incarnation || g.GetWaiting() != w.Waiting ||
			g.GetRunning() != w.Running || g.GetKvUsage() != w.KvUsage {
			t.Errorf("%s: got %v, want %v", id, g, w)
		}
	}
	// An engine that never answered is listed, but with no reading.
	for _, id := range []string{"c-0", "d-0"} {
		if got[id].GetScrapedUnixNano() != 0 {
			t.Errorf("%s has a scrape time without a good read", id)
		}
	}
	if ids := []string{s.Replicas[0].ReplicaId, s.Replicas[3].ReplicaId}; ids[0] != "a-0" || ids[1] != "d-0" {
		t.Errorf("replicas not sorted: %v", s.Replicas)
	}

	// A new incarnation is a new target: its old reading is not carried over.
	vl2 := vl
	vl2.Incarnation = 2
	vl2.Address = engine(t, "oops", 503)
	targets.set(vl2)
	waitSnapshot(t, r, "only the new incarnation", func(s *llmgwv1.LoadSnapshot) bool {
		return len(s.Replicas) == 1 && s.Replicas[0].GetIncarnation() == 2
	})
	s, _ = r.Latest()
	if s.Replicas[0].GetScrapedUnixNano() != 0 || s.Replicas[0].GetRunning() != 0 {
		t.Errorf("new incarnation inherited a reading: %v", s.Replicas[0])
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"ok", func(*Config) {}, ""},
		{"node", func(c *Config) { c.Node = "" }, "--node-id"},
		{"interval", func(c *Config) { c.Interval = 0 }, "--load-interval"},
		{"read timeout", func(c *Config) { c.ReadTimeout = -time.Second }, "load read timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Node = "n1"
			tt.edit(&c)
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tt.want+":") {
				t.Fatalf("Validate = %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

// manualHub is a Snapshots the test publishes to by hand.
type manualHub struct{ hub }

func newManualHub() *manualHub {
	h := &manualHub{}
	h.init(&llmgwv1.LoadSnapshot{Node: "n1", UnixNano: 0})
	return h
}
func (h *manualHub) Latest() (*llmgwv1.LoadSnapshot, <-chan struct{}) { return h.latest() }

// serve runs LoadService for src on a loopback port.
func serve(t *testing.T, src Snapshots) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ls := NewServer(src, discard, nil)
	gs := grpc.NewServer()
	llmgwv1.RegisterLoadServiceServer(gs, ls)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(ln) }()
	t.Cleanup(func() {
		ls.Close()
		gs.Stop()
		<-done
	})
	return ln.Addr().String()
}

func subscribe(t *testing.T, addr string, opts ...grpc.DialOption) (llmgwv1.LoadService_SubscribeClient, context.CancelFunc) {
	t.Helper()
	conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := llmgwv1.NewLoadServiceClient(conn).Subscribe(ctx, &llmgwv1.LoadSubscribeRequest{ClientId: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	stop := func() { cancel(); conn.Close() }
	t.Cleanup(stop)
	return stream, stop
}

func TestSubscribeFirstAtOnceThenPerInterval(t *testing.T) {
	targets := &fakeTargets{}
	targets.set(Target{ReplicaID: "a-0", UID: 1, Incarnation: 1, Address: engine(t, vllmText, 200), Names: vllm.VLLMLoadNames})
	r, stopReader := startReader(t, targets)
	addr := serve(t, r)
	stream, _ := subscribe(t, addr)

	var prev int64
	for i := range 4 {
		s, err := stream.Recv()
		if err != nil {
			t.Fatalf("snapshot %d: %v", i, err)
		}
		if s.GetNode() != "n1" || s.GetIntervalNanos() != (5*time.Millisecond).Nanoseconds() {
			t.Fatalf("snapshot %d: %v", i, s)
		}
		if s.GetUnixNano() <= prev {
			t.Fatalf("snapshot %d at %d, not after the previous %d", i, s.GetUnixNano(), prev)
		}
		prev = s.GetUnixNano()
	}
	// The reader stopping ends nothing by itself; the stream just waits.
	stopReader()
}

func TestSlowSubscriberDoesNotBlock(t *testing.T) {
	h := newManualHub()
	addr := serve(t, h)
	// A fixed window disables BDP growth, so the slow stream's sends block
	// on flow control after a known amount.
	small := grpc.WithInitialWindowSize(64 << 10)
	slow, _ := subscribe(t, addr, small, grpc.WithInitialConnWindowSize(64<<10))
	fast, _ := subscribe(t, addr)
	for _, s := range []llmgwv1.LoadService_SubscribeClient{slow, fast} {
		if first, err := s.Recv(); err != nil || first.GetUnixNano() != 0 {
			t.Fatalf("first snapshot %v, %v", first, err)
		}
	}

	// Big snapshots, published without waiting for anyone.
	const n = 200
	pad := make([]*llmgwv1.ReplicaLoad, 400)
	for i := range pad {
		pad[i] = &llmgwv1.ReplicaLoad{ReplicaId: fmt.Sprintf("replica-%04d-with-a-long-name", i), Uid: uint64(i)}
	}
	for i := 1; i <= n; i++ {
		h.publish(&llmgwv1.LoadSnapshot{Node: "n1", UnixNano: int64(i), Replicas: pad})
	}
	// The fast subscriber reaches the last snapshot while the slow one has
	// read nothing.
	for {
		s, err := fast.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if s.GetUnixNano() == n {
			break
		}
	}
	// The slow subscriber catches up to the newest, having skipped some.
	got := 0
	for {
		s, err := slow.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got++
		if s.GetUnixNano() == n {
			break
		}
	}
	if got >= n {
		t.Fatalf("slow subscriber received all %d snapshots; latest-value semantics should skip", got)
	}
}

func TestCloseEndsSubscriptions(t *testing.T) {
	h := newManualHub()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ls := NewServer(h, discard, nil)
	gs := grpc.NewServer()
	llmgwv1.RegisterLoadServiceServer(gs, ls)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(ln) }()
	stream, _ := subscribe(t, ln.Addr().String())
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	// Close, then a graceful stop: it returns because the stream ended.
	ls.Close()
	gs.GracefulStop()
	<-done
	if _, err := stream.Recv(); err == nil {
		t.Fatal("stream still open after Close and GracefulStop")
	}
}
