package api

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/tracing"
	"github.com/llmgw/llmgw/internal/tracing/tracingtest"
	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/capture"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/scheduler"
)

// BenchmarkTracingCost is the cost of tracing on the request path (design
// §9 "Tracing", docs/benchmarks.md): BenchmarkRequestPath's chat through
// the whole handler to an engine on loopback answering at once (so the
// router's own time is all there is to see), through two routers side by
// side — tracing off, and on at 10 % sampling with the SDK's batch
// processor exporting over OTLP/gRPC to a collector's trace service in
// this process, as `llmgw router --otlp-traces-endpoint` does. Each
// iteration sends one request through each, in alternating order, so both
// see the same machine; each reports its throughput (req/s of one client:
// requests over the time they took, the slowest 1 % left out) and its
// median latency (p50-µs), and
// the differences (slower-%, p50-diff-µs). engine-2ms is the same with an
// engine that takes 2 ms to answer — far less than any generation — to
// show the cost against a request's time rather than the router's alone.
// sampled-0pct is tracing on with nothing sampled; sampled-100pct is every
// request traced, alone.
func BenchmarkTracingCost(b *testing.B) {
	const answer = `{"id":"chatcmpl-bench","object":"chat.completion","created":1764547200,"model":"demo","choices":[{"index":0,"message":{"role":"assistant","content":"hello there"},"finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":12,"completion_tokens":160,"total_tokens":172}}`
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Bench-Engine-Ms") != "" {
			time.Sleep(2 * time.Millisecond)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	}))
	defer eng.Close()
	recv := tracingtest.StartDiscarding(b)
	tb := &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", strings.TrimPrefix(eng.URL, "http://"))}}}
	body := `{"model":"demo","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello"}],"max_tokens":160}`
	// routerFlush returns a client of a router tracing at ratio (<0: off)
	// and a func that sends the spans its provider holds (a no-op when
	// off).
	routerFlush := func(b *testing.B, ratio float64, slow bool, capt ...*capture.Writer) (func() time.Duration, func()) {
		flush := func() {}
		cfg := DefaultConfig()
		if len(capt) > 0 {
			cfg.Capture = capt[0]
		}
		if ratio >= 0 {
			p, err := tracing.New(context.Background(), tracing.Config{OTLPEndpoint: recv.Addr(), SamplingRatio: ratio}, "bench")
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = p.Shutdown(context.Background()) })
			cfg.Tracer = p.TracerProvider()
			if sdk, ok := cfg.Tracer.(interface{ ForceFlush(context.Context) error }); ok {
				flush = func() { _ = sdk.ForceFlush(context.Background()) }
			}
		}
		br, err := breaker.NewSet(breaker.DefaultConfig(), func(k scheduler.Key) string { return k.ID }, nil)
		if err != nil {
			b.Fatal(err)
		}
		h := newHandler(b, cfg, tb, inOrder{}, br, slog.New(slog.NewJSONHandler(io.Discard, nil)), prometheus.NewRegistry()) //nolint:sloglint // as llmgw router runs
		s := httptest.NewServer(h)
		b.Cleanup(s.Close)
		client := s.Client()
		send := func() time.Duration {
			req, err := http.NewRequest(http.MethodPost, s.URL+"/v1/chat/completions", strings.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			if slow {
				req.Header.Set("X-Bench-Engine-Ms", "2")
			}
			t0 := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			d := time.Since(t0)
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("status %d", resp.StatusCode)
			}
			return d
		}
		return send, flush
	}
	// router returns a client of a router tracing at ratio (<0: off).
	router := func(b *testing.B, ratio float64, slow bool, capt ...*capture.Writer) func() time.Duration {
		send, _ := routerFlush(b, ratio, slow, capt...)
		return send
	}
	// report: req/s is one client's requests over the time they took,
	// the slowest 1 % left out — on a shared machine those are other
	// processes' stalls, which would decide a mean alone.
	report := func(b *testing.B, prefix string, lat []time.Duration) (rps, p50 float64) {
		slices.Sort(lat)
		kept := lat[:len(lat)-len(lat)/100]
		var sum time.Duration
		for _, d := range kept {
			sum += d
		}
		rps, p50 = float64(len(kept))/sum.Seconds(), float64(lat[len(lat)/2].Nanoseconds())/1e3
		b.ReportMetric(rps, prefix+"req/s")
		b.ReportMetric(p50, prefix+"p50-µs")
		return rps, p50
	}
	// sideBySide runs off and on alternately, one request each per
	// iteration in alternating order, so both see the same machine, and
	// reports them and their difference.
	sideBySide := func(b *testing.B, off, on func() time.Duration, prefix string) {
		off()
		on()
		var lOff, lOn []time.Duration
		i := 0
		for b.Loop() {
			if i%2 == 0 {
				lOff = append(lOff, off())
				lOn = append(lOn, on())
			} else {
				lOn = append(lOn, on())
				lOff = append(lOff, off())
			}
			i++
		}
		rOff, pOff := report(b, "off-", lOff)
		rOn, pOn := report(b, prefix, lOn)
		b.ReportMetric(100*(rOff-rOn)/rOff, "slower-%")
		b.ReportMetric(pOn-pOff, "p50-diff-µs")
	}
	for _, slow := range []bool{false, true} {
		name := "off-vs-sampled-10pct"
		if slow {
			name += "/engine-2ms"
		}
		b.Run(name, func(b *testing.B) {
			off, on := router(b, -1, slow), router(b, 0.1, slow)
			sideBySide(b, off, on, "10pct-")
		})
	}
	// CPU: the process's CPU time (router, engine, client, exporter,
	// receiver, GC) per request of each router, in alternating blocks of
	// cpuBlock requests (each iteration is one request), the traced
	// router's spans sent at the end of each of its blocks so its export
	// is counted in it. Less hurt than req/s by other processes' stalls
	// on a shared machine: time a request waits for a core is not CPU.
	cpuSideBySide := func(b *testing.B, ratio float64, prefix string) {
		off, _ := routerFlush(b, -1, false)
		on, flush := routerFlush(b, ratio, false)
		off()
		on()
		flush()
		const cpuBlock = 500
		var cpu [2]time.Duration // off, on
		var n [2]int
		side, left, t0 := 0, cpuBlock, processCPU()
		for b.Loop() {
			if side == 1 {
				on()
			} else {
				off()
			}
			n[side]++
			if left--; left == 0 {
				if side == 1 {
					flush()
				}
				t := processCPU()
				cpu[side] += t - t0
				side, left, t0 = 1-side, cpuBlock, t
			}
		}
		if side == 1 {
			flush()
		}
		cpu[side] += processCPU() - t0
		pOff, pOn := float64(cpu[0].Nanoseconds())/1e3/float64(max(n[0], 1)), float64(cpu[1].Nanoseconds())/1e3/float64(max(n[1], 1))
		b.ReportMetric(pOff, "off-cpu-µs/req")
		b.ReportMetric(pOn, prefix+"cpu-µs/req")
		b.ReportMetric(100*(pOn-pOff)/pOff, "cpu-more-%")
	}
	for _, c := range []struct {
		name  string
		ratio float64
	}{{"off2", -1}, {"sampled-0pct", 0}, {"sampled-10pct", 0.1}, {"sampled-100pct", 1}} {
		b.Run("cpu-off-vs-"+strings.TrimSuffix(c.name, "2"), func(b *testing.B) { cpuSideBySide(b, c.ratio, c.name+"-") })
	}
	// Two routers without tracing: the comparison's floor — what two
	// identical routers differ by on this machine, in this loop.
	b.Run("off-vs-off", func(b *testing.B) {
		off, off2 := router(b, -1, false), router(b, -1, false)
		sideBySide(b, off, off2, "off2-")
	})
	// Tracing on, nothing sampled: what every request pays for tracing
	// being on (a trace id, a context, a traceparent to the engine).
	b.Run("off-vs-sampled-0pct", func(b *testing.B) {
		off, on := router(b, -1, false), router(b, 0, false)
		sideBySide(b, off, on, "0pct-")
	})
	// The traffic capture (design §10.1) beside no capture, the same way:
	// building a request's record and handing it to the writer's queue;
	// the writer's salting and writing run on its goroutine, in this
	// process's CPU.
	b.Run("off-vs-capture", func(b *testing.B) {
		rec, err := capture.New(capture.Config{Path: filepath.Join(b.TempDir(), "capture.jsonl")}, slog.New(slog.DiscardHandler), capture.Metrics{}, nil)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = rec.Run(ctx) }()
		defer func() { cancel(); <-done }()
		off, on := router(b, -1, false), router(b, -1, false, rec)
		sideBySide(b, off, on, "capture-")
	})
	b.Run("sampled-100pct", func(b *testing.B) {
		all := router(b, 1, false)
		all()
		var l []time.Duration
		for b.Loop() {
			l = append(l, all())
		}
		report(b, "", l)
	})
}
