package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/endpoint"
)

// AdapterControl asks the control plane to place a cold adapter (plan §7.6,
// AdapterService.EnsureAdapter on any control server). It is called
// concurrently, at most once at a time per adapter by this handler; it
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
	log  *slog.Logger
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

// EnableAdapters lets requests for a cold adapter wait up to wait for it
// to load, asking ctl to place it; wait <= 0 takes DefaultAdapterWait.
// Without it such requests get 503. Call it before serving; Close stops
// the flights in progress.
func (h *Handler) EnableAdapters(ctl AdapterControl, wait time.Duration) {
	if wait <= 0 {
		wait = DefaultAdapterWait
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.ad = &adapters{ctl: ctl, wait: wait, log: h.log, m: h.adm, ctx: ctx, cancel: cancel, flights: map[string]*flight{}}
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
// cold one to be loaded (plan §7.6): a request for an adapter goes only to
// a replica holding it, since any other answers 404. eps empty: nothing to
// wait for (the model has no ready replica; the caller answers 503).
func (h *Handler) holders(ctx context.Context, adapter, model string, eps []*endpoint.Endpoint, log *slog.Logger) ([]*endpoint.Endpoint, *apiError) {
	if len(eps) == 0 {
		return eps, nil
	}
	changed := h.eps.Changed()
	if hs := h.held(adapter, eps); len(hs) > 0 {
		return hs, nil
	}
	if h.ad == nil {
		return nil, errAdapterCold(adapter, "adapters are not loaded on demand by this router", 1)
	}
	start := time.Now()
	result := "loaded"
	h.adm.waiting.Inc()
	defer func() {
		h.adm.waiting.Dec()
		h.adm.waited.WithLabelValues(result).Inc()
		h.adm.waitSeconds.Observe(time.Since(start).Seconds())
	}()
	deadline := time.NewTimer(h.ad.wait)
	defer deadline.Stop()
	log.Info("router: adapter is cold; asking the control plane to load it", "adapter", adapter)
	f := h.ad.ensure(adapter, func() bool { return len(h.held(adapter, eps)) > 0 })
	if f == nil {
		return h.held(adapter, eps), nil
	}
	select {
	case <-f.done:
	case <-ctx.Done():
		result = "client_gone"
		return nil, errAdapterCold(adapter, "the client went away", 0)
	case <-deadline.C:
		result = "timeout"
		return nil, errAdapterCold(adapter, fmt.Sprintf("not loaded within %s", h.ad.wait), 1)
	}
	if f.err != nil {
		result = "error"
		log.Warn("router: EnsureAdapter failed", "adapter", adapter, "err", f.err)
		return nil, errAdapterCold(adapter, "the control plane could not be asked to load it: "+f.err.Error(), 1)
	}
	resp := f.resp
	switch {
	case resp.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_FAILED:
		result = "failed"
		return nil, errAdapterCold(adapter, "loading failed: "+resp.GetReason(), retrySeconds(resp.GetRetryAfterMs()))
	case resp.GetState() != llmgwv1.AdapterState_ADAPTER_STATE_LOADED:
		result = "busy"
		if resp.GetRetryAfterMs() == 0 {
			result = "timeout"
		}
		why := resp.GetReason()
		if why == "" {
			why = "no replica has a free adapter slot"
		}
		return nil, errAdapterCold(adapter, why, retrySeconds(resp.GetRetryAfterMs()))
	}
	// Loaded on the control plane's word; route once this router's table
	// shows it too, so the request goes where the adapter is.
	for {
		if hs := h.held(adapter, eps); len(hs) > 0 {
			return hs, nil
		}
		select {
		case <-changed:
			changed = h.eps.Changed()
			if fresh, _ := h.eps.Lookup(model); len(fresh) > 0 {
				eps = fresh
			}
		case <-ctx.Done():
			result = "client_gone"
			return nil, errAdapterCold(adapter, "the client went away", 0)
		case <-deadline.C:
			result = "timeout"
			return nil, errAdapterCold(adapter, fmt.Sprintf("reported loaded on %v but not routable here within %s", resp.GetLoadedOn(), h.ad.wait), 1)
		}
	}
}

func (h *Handler) held(adapter string, eps []*endpoint.Endpoint) []*endpoint.Endpoint {
	var out []*endpoint.Endpoint
	for _, e := range eps {
		if h.eps.Holds(e, adapter) {
			out = append(out, e)
		}
	}
	return out
}

// retrySeconds rounds a retry-after up to whole seconds, at least 1.
func retrySeconds(ms int64) int {
	return max(1, int((ms+999)/1000))
}

func errAdapterCold(adapter, why string, retryAfter int) *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "adapter_unavailable",
		Message: fmt.Sprintf("the adapter %q is not loaded: %s", adapter, why), RetryAfter: retryAfter}
}

// errAdapterMissing is an engine's 404 for an adapter it was thought to
// hold (it was just evicted, or the engine restarted): retried elsewhere.
var errAdapterMissing = errors.New("the engine does not hold the adapter")

type adapterMetrics struct {
	ensures       *prometheus.CounterVec
	ensureSeconds prometheus.Histogram
	waited        *prometheus.CounterVec
	waitSeconds   prometheus.Histogram
	missing       prometheus.Counter
	waiting       prometheus.Gauge
}

func newAdapterMetrics() *adapterMetrics {
	buckets := []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	return &adapterMetrics{
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
		missing: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_router_adapter_missing_total",
			Help: "Engine 404s for an adapter the router thought it held, retried elsewhere.",
		}),
	}
}

func (m *adapterMetrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.ensures, m.ensureSeconds, m.waited, m.waitSeconds, m.missing, m.waiting)
}
