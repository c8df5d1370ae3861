package api

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/waitroom"
)

// demandLog is the demand counter: what it was told.
type demandLog struct {
	mu    sync.Mutex
	sent  []string
	first map[string][]time.Duration
}

func (d *demandLog) Sent(model string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sent = append(d.sent, model)
}

func (d *demandLog) FirstToken(model string, ttft time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.first == nil {
		d.first = map[string][]time.Duration{}
	}
	d.first[model] = append(d.first[model], ttft)
}

func (d *demandLog) got() ([]string, map[string][]time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.sent...), d.first
}

// holdRouter serves the models "auto" (autoscaled, with no replica yet)
// and "fixed" (not autoscaled, none either) with a waiting room on clk,
// its loop running until the test ends.
func holdRouter(t *testing.T, clk *manualClock) (string, *table, *waitroom.Room, *demandLog) {
	t.Helper()
	tb := &table{
		models: map[string][]*endpoint.Endpoint{"auto": nil, "fixed": nil},
		list: []*llmgwv1.Model{
			{Name: "auto", Autoscale: &llmgwv1.Autoscale{Max: 2, TargetWaiting: 2, HoldTimeoutS: 300}},
			{Name: "fixed"},
		},
	}
	room := waitroom.New(waitroom.Config{Tick: time.Millisecond, Now: clk.Now}, tb, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = room.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	dl := &demandLog{}
	srv := newRouter(t, tb, func(c *Config) { c.Hold, c.Demand = room, dl })
	return srv.URL, tb, room, dl
}

type answer struct {
	resp *http.Response
	body []byte
	err  error
}

// ask posts a streamed chat for model; the answer arrives on the channel.
func ask(url, model string) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		body := `{"model":"` + model + `","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			out <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		out <- answer{resp: resp, body: b, err: err}
	}()
	return out
}

func await(t *testing.T, ch <-chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatal(a.err)
		}
		return a
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10 s")
		return answer{}
	}
}

// TestHeldUntilAReplica: a request for an autoscaled model with no replica
// is held, not refused, and answered by the replica that appears, with
// the time it was held on the answer; it counts as sent, and its time to
// first token from its release. A model not autoscaled still gets 503 at
// once.
func TestHeldUntilAReplica(t *testing.T) {
	clk := &manualClock{t: time.Unix(1_700_000_000, 0)}
	url, tb, room, dl := holdRouter(t, clk)
	addr := engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[]}\n\ndata: [DONE]\n\n")
	})

	fixed := await(t, ask(url, "fixed"))
	if fixed.resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(fixed.body), "no_replica_available") {
		t.Fatalf("not autoscaled: %d %s, want 503 at once", fixed.resp.StatusCode, fixed.body)
	}

	held := ask(url, "auto")
	testkit.Wait(t, "the request held", func() bool { return room.Held("auto") == 1 })
	select {
	case a := <-held:
		t.Fatalf("answered while no replica: %v %s", a.resp.StatusCode, a.body)
	default:
	}
	if sent, _ := dl.got(); len(sent) != 0 {
		t.Fatalf("counted as sent while held: %v", sent)
	}
	clk.Advance(1500 * time.Millisecond)
	tb.route("auto", &endpoint.Endpoint{ReplicaID: "auto-0", UID: 1, Model: "auto", Address: addr, RoutableSince: clk.Now()})
	a := await(t, held)
	if a.resp.StatusCode != 200 || a.resp.Header.Get("X-Llmgw-Replica") != "auto-0" || a.resp.Header.Get("X-Llmgw-Hold-Ms") != "1500" {
		t.Fatalf("held request: %d replica %q held %q ms: %s; want 200 from auto-0 after 1500 ms",
			a.resp.StatusCode, a.resp.Header.Get("X-Llmgw-Replica"), a.resp.Header.Get("X-Llmgw-Hold-Ms"), a.body)
	}
	sent, first := dl.got()
	if len(sent) != 1 || sent[0] != "auto" || len(first["auto"]) != 1 || first["auto"][0] >= time.Second {
		t.Fatalf("demand told sent %v, first tokens %v; want one of auto, its time to first token from the release", sent, first)
	}

	// Now it has a replica: the next goes at once, nothing held.
	b := await(t, ask(url, "auto"))
	if b.resp.StatusCode != 200 || b.resp.Header.Get("X-Llmgw-Hold-Ms") != "" {
		t.Fatalf("with a replica: %d held %q", b.resp.StatusCode, b.resp.Header.Get("X-Llmgw-Hold-Ms"))
	}
}

// TestHeldTimesOut: a request held past its model's hold_timeout_s gets
// 503 with Retry-After, saying which bound it passed.
func TestHeldTimesOut(t *testing.T) {
	clk := &manualClock{t: time.Unix(1_700_000_000, 0)}
	url, _, room, _ := holdRouter(t, clk)
	held := ask(url, "auto")
	testkit.Wait(t, "the request held", func() bool { return room.Held("auto") == 1 })
	clk.Advance(300 * time.Second)
	a := await(t, held)
	var body apiError
	if err := json.Unmarshal(a.body, &body); err != nil {
		t.Fatalf("error body %s: %v", a.body, err)
	}
	if a.resp.StatusCode != http.StatusServiceUnavailable || a.resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(body.Error.Message, "within 5m0s (autoscale.hold_timeout_s)") {
		t.Fatalf("after the timeout: %d Retry-After %q: %s", a.resp.StatusCode, a.resp.Header.Get("Retry-After"), a.body)
	}
	if room.Held("auto") != 0 {
		t.Fatal("still held after its 503")
	}
}
