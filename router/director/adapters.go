package director

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/openai"
)

// AdapterControl asks the control plane to place a cold adapter (design §7.6,
// AdapterService.EnsureAdapter on any control server). It is called
// concurrently, at most once at a time per adapter by this router; it
// returns when the control plane answers or ctx ends.
type AdapterControl interface {
	EnsureAdapter(ctx context.Context, req *llmgwv1.EnsureAdapterRequest) (*llmgwv1.EnsureAdapterResponse, error)
}

// adapters makes requests for cold adapters wait until one is loaded:
// one EnsureAdapter call per adapter at a time (single flight: the control
// plane loads a cold adapter once, and this router does not even ask it
// twice), then the routing table showing a replica that reports it LOADED.
type adapters struct {
	ctl  AdapterControl
	wait time.Duration
	m    *adapterMetrics

	// ctx ends the flights at Close; wg waits for them.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	flights map[string]*flight
}

// flight is one EnsureAdapter call that every request for the adapter
// arriving meanwhile shares; resp and err are set before done closes.
type flight struct {
	done chan struct{}
	resp *llmgwv1.EnsureAdapterResponse
	err  error
}

// newAdapters returns the single flights of cold adapters, each waited
// for up to wait (DefaultAdapterWait when wait <= 0); close stops them.
func newAdapters(ctl AdapterControl, wait time.Duration, m *adapterMetrics) *adapters {
	if wait <= 0 {
		wait = DefaultAdapterWait
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &adapters{ctl: ctl, wait: wait, m: m, ctx: ctx, cancel: cancel, flights: map[string]*flight{}}
}

// DefaultAdapterWait is how long a request waits for a cold adapter: a
// load from local disk takes seconds, and a client would rather wait than
// retry.
const DefaultAdapterWait = 30 * time.Second

func (a *adapters) close() {
	if a == nil {
		return
	}
	a.cancel()
	a.wg.Wait()
}

// ensure returns the flight for adapter, starting one if none is running
// and held (checked under the lock a flight ends under) is still false;
// nil when it turned true, so a request that just missed a flight does not
// start another for an adapter already routable.
func (a *adapters) ensure(adapter string, held func() bool) *flight {
	a.mu.Lock()
	defer a.mu.Unlock()
	if f := a.flights[adapter]; f != nil {
		return f
	}
	if held() {
		return nil
	}
	f := &flight{done: make(chan struct{})}
	a.flights[adapter] = f
	a.wg.Go(func() {
		// The call outlives any one request: others may be waiting on it.
		ctx, cancel := context.WithTimeout(a.ctx, a.wait+time.Second)
		defer cancel()
		start := time.Now()
		f.resp, f.err = a.ctl.EnsureAdapter(ctx, &llmgwv1.EnsureAdapterRequest{Adapter: adapter, TimeoutMs: a.wait.Milliseconds()})
		a.m.ensures.WithLabelValues(ensureResult(f.resp, f.err)).Inc()
		a.m.ensureSeconds.Observe(time.Since(start).Seconds())
		a.mu.Lock()
		delete(a.flights, adapter)
		a.mu.Unlock()
		close(f.done)
	})
	return f
}

func ensureResult(resp *llmgwv1.EnsureAdapterResponse, err error) string {
	switch {
	case err != nil:
		return "error"
	case resp.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_LOADED:
		return "loaded"
	case resp.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_FAILED:
		return "failed"
	case resp.GetRetryAfterMs() > 0:
		return "busy"
	default:
		return "timeout"
	}
}

// holders returns the endpoints of eps that hold adapter now, waiting for a
// cold one to be loaded (design §7.6): a request for an adapter goes only to
// a replica holding it, since any other answers 404. eps empty: nothing to
// wait for (the model has no ready replica; the caller answers 503).
func (r *resolver) holders(ctx context.Context, adapter, model string, eps []*endpoint.Endpoint, log *slog.Logger) ([]*endpoint.Endpoint, *openai.Error) {
	if len(eps) == 0 {
		return eps, nil
	}
	changed := r.holdings.Changed()
	if hs := r.held(adapter, eps); len(hs) > 0 {
		return hs, nil
	}
	if r.ad == nil {
		return nil, openai.AdapterCold(adapter, "adapters are not loaded on demand by this router", 1)
	}
	start := time.Now()
	result := "loaded"
	r.m.waiting.Inc()
	defer func() {
		r.m.waiting.Dec()
		r.m.waited.WithLabelValues(result).Inc()
		r.m.waitSeconds.Observe(time.Since(start).Seconds())
	}()
	deadline := time.NewTimer(r.ad.wait)
	defer deadline.Stop()
	log.Info("router: adapter is cold; asking the control plane to load it", "adapter", adapter)
	f := r.ad.ensure(adapter, func() bool { return len(r.held(adapter, eps)) > 0 })
	if f == nil {
		return r.held(adapter, eps), nil
	}
	select {
	case <-f.done:
	case <-ctx.Done():
		result = "client_gone"
		return nil, openai.AdapterCold(adapter, "the client went away", 0)
	case <-deadline.C:
		result = "timeout"
		return nil, openai.AdapterCold(adapter, fmt.Sprintf("not loaded within %s", r.ad.wait), 1)
	}
	if f.err != nil {
		result = "error"
		log.Warn("router: EnsureAdapter failed", "adapter", adapter, "err", f.err)
		return nil, openai.AdapterCold(adapter, "the control plane could not be asked to load it: "+f.err.Error(), 1)
	}
	resp := f.resp
	switch {
	case resp.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_FAILED:
		result = "failed"
		return nil, openai.AdapterCold(adapter, "loading failed: "+resp.GetReason(), retrySeconds(resp.GetRetryAfterMs()))
	case resp.GetState() != llmgwv1.AdapterState_ADAPTER_STATE_LOADED:
		result = "busy"
		if resp.GetRetryAfterMs() == 0 {
			result = "timeout"
		}
		why := resp.GetReason()
		if why == "" {
			why = "no replica has a free adapter slot"
		}
		return nil, openai.AdapterCold(adapter, why, retrySeconds(resp.GetRetryAfterMs()))
	}
	// Loaded on the control plane's word; route once this router's table
	// shows it too, so the request goes where the adapter is.
	for {
		if hs := r.held(adapter, eps); len(hs) > 0 {
			return hs, nil
		}
		select {
		case <-changed:
			changed = r.holdings.Changed()
			if fresh, _ := r.models.Lookup(model); len(fresh) > 0 {
				eps = fresh
			}
		case <-ctx.Done():
			result = "client_gone"
			return nil, openai.AdapterCold(adapter, "the client went away", 0)
		case <-deadline.C:
			result = "timeout"
			return nil, openai.AdapterCold(adapter, fmt.Sprintf("reported loaded on %v but not routable here within %s", resp.GetLoadedOn(), r.ad.wait), 1)
		}
	}
}

func (r *resolver) held(adapter string, eps []*endpoint.Endpoint) []*endpoint.Endpoint {
	var out []*endpoint.Endpoint
	for _, e := range eps {
		if r.holdings.Holds(e, adapter) {
			out = append(out, e)
		}
	}
	return out
}

// retrySeconds rounds a retry-after up to whole seconds, at least 1.
func retrySeconds(ms int64) int {
	return max(1, int((ms+999)/1000))
}

type adapterMetrics struct {
	ensures       *prometheus.CounterVec
	ensureSeconds prometheus.Histogram
	waited        *prometheus.CounterVec
	waitSeconds   prometheus.Histogram
	waiting       prometheus.Gauge
}

// newAdapterMetrics registers the cold-adapter metrics with reg (nil for
// none), whether or not cold adapters are loaded on demand: a router that
// refuses them still counts the refusals.
func newAdapterMetrics(reg prometheus.Registerer) *adapterMetrics {
	buckets := []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	m := &adapterMetrics{
		ensures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_adapter_waits_total",
			Help: "EnsureAdapter calls for cold adapters (one per adapter at a time, shared by the requests waiting), by result: loaded, failed, busy, timeout, error.",
		}, []string{"result"}),
		ensureSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "llmgw_router_adapter_ensure_seconds", Help: "Duration of EnsureAdapter calls.", Buckets: buckets,
		}),
		waited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_adapter_waited_requests_total",
			Help: "Requests that waited for a cold adapter, by result: loaded, failed, busy, timeout, error, client_gone.",
		}, []string{"result"}),
		waitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "llmgw_router_adapter_wait_seconds", Help: "Time requests waited for a cold adapter to load.", Buckets: buckets,
		}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_router_adapter_waiting_requests", Help: "Requests waiting for a cold adapter now.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.ensures, m.ensureSeconds, m.waited, m.waitSeconds, m.waiting)
	}
	return m
}
