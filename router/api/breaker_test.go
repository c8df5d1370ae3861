package api

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/director"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/scheduler"
)

type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *manualClock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// TestEngineKilledUnderLoad runs the real scheduler over three engines,
// kills one while requests flow, and checks that no request that had not
// received a byte fails (each is retried on another replica), that the
// dead replica's breaker opens, and that once the engine is back a probe
// after the cooldown closes it.
func TestEngineKilledUnderLoad(t *testing.T) {
	var served [3]atomic.Int64
	var down atomic.Bool
	mk := func(i int) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if i == 0 && down.Load() {
				// Killed: the connection drops before any byte is answered.
				hj, _ := w.(http.Hijacker)
				conn, _, _ := hj.Hijack()
				conn.Close()
				return
			}
			served[i].Add(1)
			io.WriteString(w, `{"ok":true}`)
		}))
	}
	var eps []*endpoint.Endpoint
	for i := range 3 {
		s := mk(i)
		defer s.Close()
		eps = append(eps, &endpoint.Endpoint{ReplicaID: fmt.Sprint("demo-", i), UID: uint64(i + 1), Incarnation: 1,
			Model: "demo", Address: strings.TrimPrefix(s.URL, "http://")})
	}
	clk := &manualClock{t: time.Unix(1000, 0)}
	scfg := scheduler.DefaultConfig()
	scfg.Rand = scheduler.NewRand(1)
	log := slog.New(slog.DiscardHandler)
	sched, err := scheduler.New(scfg, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	bcfg := breaker.DefaultConfig()
	bcfg.Now = clk.Now
	brs, err := breaker.NewSet(bcfg, func(k scheduler.Key) string { return k.ID }, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	h := newHandler(t, DefaultConfig(), &table{models: map[string][]*endpoint.Endpoint{"demo": eps}}, sched, brs, log, reg)
	srv := httptest.NewServer(h)
	defer srv.Close()

	// The model has no profile, so the chat profile schedules. A dead
	// replica answers nothing, so its in-flight count stays 0 and it keeps
	// looking attractive: only its breaker takes it out.
	send := func(n int) (failed int) {
		var wg sync.WaitGroup
		var bad atomic.Int64
		for i := range n {
			wg.Go(func() {
				resp, err := http.Post(srv.URL+"/v1/completions", "application/json",
					strings.NewReader(fmt.Sprintf(`{"model":"demo","prompt":"request %d"}`, i)))
				if err != nil {
					bad.Add(1)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					bad.Add(1)
				}
			})
		}
		wg.Wait()
		return int(bad.Load())
	}
	if f := send(30); f != 0 {
		t.Fatalf("%d failures with every engine up", f)
	}
	down.Store(true)
	if f := send(60); f != 0 {
		t.Fatalf("%d requests failed after the engine died; each should have been retried elsewhere", f)
	}
	k := director.Key(eps[0])
	if st, _ := brs.Get(k).View(); st != breaker.Open {
		t.Fatalf("dead replica's breaker is %s, want open", st)
	}
	before := served[1].Load() + served[2].Load()
	if f := send(20); f != 0 || served[1].Load()+served[2].Load()-before != 20 {
		t.Fatalf("with the breaker open: %d failures, %d served by the live replicas", f, served[1].Load()+served[2].Load()-before)
	}

	down.Store(false)
	clk.Advance(bcfg.Cooldown)
	if st, due := brs.Get(k).View(); st != breaker.Open || !due {
		t.Fatalf("after the cooldown: %s due %v, want a probe due", st, due)
	}
	if f := send(20); f != 0 {
		t.Fatalf("%d failures after the engine came back", f)
	}
	if st, _ := brs.Get(k).View(); st != breaker.Closed {
		t.Fatalf("after a successful probe the breaker is %s, want closed", st)
	}
}
