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
	"github.com/llmgw/llmgw/router/scheduler"
)

// AdapterControl asks the control plane to place a cold adapter (design §7.6,
// AdapterService.EnsureAdapter on any control server). It is called
// concurrently, at most once at a time per adapter by this router; it
// returns when the control plane answers or ctx ends.
type AdapterControl interface {
	EnsureAdapter(ctx context.Context, req *llmgwv1.EnsureAdapterRequest) (*llmgwv1.EnsureAdapterResponse, error)
}

// adapters makes requests for cold adapters wait until one is loaded:
// in a queue per model (adapterQueue), bounded by a length and by the
// wait; one EnsureAdapter call per adapter at a time (single flight: the
// control plane loads a cold adapter once, and this router does not even
// ask it twice), carrying the adapter's waiting demand; then the routing
// table showing a replica that reports it LOADED.
type adapters struct {
	ctl   AdapterControl
	wait  time.Duration
	m     *adapterMetrics
	q     *adapterQueue
	clock Clock

	// ctx ends the flights at Close; wg waits for them.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	flights map[string]*flight
	// missing are replicas whose engine answered 404 for an adapter the
	// table says they hold, until missingFor passes; under its own lock,
	// as ensure reads it under mu.
	missingMu sync.Mutex
	missing   map[missingKey]time.Time
}

type missingKey struct {
	adapter string
	ep      scheduler.Key
}

// missingFor is how long a replica that answered 404 for an adapter is
// not sent it again on the table's word: long enough for the agent's
// report of the unload to arrive, short enough that a reload there is
// used soon.
const missingFor = 2 * time.Second

// flight is one EnsureAdapter call that every request for the adapter
// arriving meanwhile shares; resp and err are set before done closes.
type flight struct {
	done chan struct{}
	resp *llmgwv1.EnsureAdapterResponse
	err  error
}

// newAdapters returns the queue and single flights of cold adapters, each
// request waiting up to wait (DefaultAdapterWait when wait <= 0) in a queue
// of at most queueLen per model (DefaultAdapterQueue when <= 0), timed by
// clock (RealClock when nil); close stops them.
func newAdapters(ctl AdapterControl, wait time.Duration, queueLen int, clock Clock, m *adapterMetrics) *adapters {
	if wait <= 0 {
		wait = DefaultAdapterWait
	}
	if clock == nil {
		clock = RealClock{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &adapters{ctl: ctl, wait: wait, m: m, q: newAdapterQueue(queueLen), clock: clock,
		ctx: ctx, cancel: cancel, flights: map[string]*flight{}, missing: map[missingKey]time.Time{}}
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
// start another for an adapter already routable. The call asks to wait in
// the control plane's queue, with model's waiting demand for the adapter.
func (a *adapters) ensure(model, adapter string, held func() bool) *flight {
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
	req := &llmgwv1.EnsureAdapterRequest{Adapter: adapter, TimeoutMs: a.wait.Milliseconds(), Queue: true}
	if n, since := a.q.demand(model, adapter); n > 0 {
		req.Waiting, req.WaitingSinceUnixNano = uint32(n), since.UnixNano()
	}
	a.wg.Go(func() {
		// The call outlives any one request: others may be waiting on it.
		ctx, cancel := context.WithTimeout(a.ctx, a.wait+time.Second)
		defer cancel()
		start := time.Now()
		f.resp, f.err = a.ctl.EnsureAdapter(ctx, req)
		a.m.ensures.WithLabelValues(ensureResult(f.resp, f.err)).Inc()
		a.m.ensureSeconds.Observe(time.Since(start).Seconds())
		a.mu.Lock()
		delete(a.flights, adapter)
		a.mu.Unlock()
		close(f.done)
	})
	return f
}

// markMissing notes that eps answered 404 for adapter.
func (a *adapters) markMissing(adapter string, eps []*endpoint.Endpoint) {
	a.missingMu.Lock()
	defer a.missingMu.Unlock()
	until := a.clock.Now().Add(missingFor)
	for _, e := range eps {
		a.missing[missingKey{adapter, Key(e)}] = until
	}
}

// isMissing reports whether e answered 404 for adapter within missingFor.
func (a *adapters) isMissing(adapter string, e *endpoint.Endpoint) bool {
	a.missingMu.Lock()
	defer a.missingMu.Unlock()
	if len(a.missing) == 0 {
		return false
	}
	k := missingKey{adapter, Key(e)}
	until, ok := a.missing[k]
	if ok && !a.clock.Now().Before(until) {
		delete(a.missing, k)
		return false
	}
	return ok
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
// a replica holding it, since any other answers 404. It waits in the
// model's queue, asking the control plane (which places the head of the
// queue when an idle adapter frees a slot) again after each answer that is
// not LOADED or FAILED, until the table shows a holder; 503 with
// Retry-After only when the queue is full or the wait ends, saying which.
// eps empty: nothing to wait for (the model has no ready replica; the
// caller answers 503).
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
	a := r.ad
	start := a.clock.Now()
	w, n := a.q.join(model, adapter, start)
	if w == nil {
		r.m.queued.WithLabelValues(model, "queue_full").Inc()
		log.Warn("router: adapter queue full", "waiting", n)
		return nil, openai.AdapterCold(adapter, fmt.Sprintf("the queue for model %q's adapters is full (%d requests waiting, --adapter-queue)", model, n), 1)
	}
	r.m.queueLen.WithLabelValues(model).Set(float64(n))
	result := "loaded"
	r.m.waiting.Inc()
	defer func() {
		r.m.queueLen.WithLabelValues(model).Set(float64(a.q.leave(w)))
		r.m.waiting.Dec()
		r.m.waited.WithLabelValues(result).Inc()
		waited := a.clock.Now().Sub(start)
		r.m.waitSeconds.Observe(waited.Seconds())
		r.m.queueWait.WithLabelValues(model).Observe(waited.Seconds())
		r.m.queued.WithLabelValues(model, queueResult(result)).Inc()
		log.Info("router: adapter wait ended", "result", queueResult(result), "waited_ms", waited.Milliseconds())
	}()
	deadline := a.clock.After(a.wait)
	log.Info("router: adapter is cold; waiting for the control plane to load it", "adapter", adapter)
	held := func() bool { return len(r.held(adapter, eps)) > 0 }
	var last *llmgwv1.EnsureAdapterResponse // the control plane's last answer
	var retry <-chan time.Time              // set: ask again then
	for {
		if hs := r.held(adapter, eps); len(hs) > 0 {
			return hs, nil
		}
		select {
		case <-deadline: // before asking again, when both are due
			result = "timeout"
			return nil, openai.AdapterCold(adapter, timeoutReason(model, a.wait, last), 1)
		default:
		}
		var done <-chan struct{}
		var f *flight
		if retry == nil {
			if f = a.ensure(model, adapter, held); f == nil {
				continue
			}
			done = f.done
		}
		select {
		case <-done:
			last = f.resp
			if f.err != nil {
				log.Warn("router: EnsureAdapter failed; asking again", "adapter", adapter, "err", f.err)
				retry = a.clock.After(ensureRetry)
				continue
			}
			switch resp := f.resp; {
			case resp.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_FAILED:
				result = "failed"
				return nil, openai.AdapterCold(adapter, "loading failed: "+resp.GetReason(), retrySeconds(resp.GetRetryAfterMs()))
			case resp.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_LOADED:
				// Loaded on the control plane's word; route once this
				// router's table shows it too, so the request goes where
				// the adapter is. Until then, wait for the table (asking
				// again after a while, in case it was evicted meanwhile).
				retry = a.clock.After(loadedRecheck)
			case resp.GetRetryAfterMs() > 0 && resp.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_UNSPECIFIED:
				// Busy without queuing (a control plane from before the
				// queue, or no ready replica): ask again after its
				// retry-after (served meanwhile if the table shows a
				// holder).
				retry = a.clock.After(time.Duration(resp.GetRetryAfterMs()) * time.Millisecond)
			default:
				// The control plane's wait ended unplaced (LOADING): ask
				// again, after a pause in case it answered at once.
				retry = a.clock.After(ensureRetry)
			}
		case <-retry:
			retry = nil
		case <-changed:
			changed = r.holdings.Changed()
			if fresh, _ := r.models.Lookup(model); len(fresh) > 0 {
				eps = fresh
			}
		case <-ctx.Done():
			result = "client_gone"
			return nil, openai.AdapterCold(adapter, "the client went away", 0)
		case <-deadline:
			result = "timeout"
			return nil, openai.AdapterCold(adapter, timeoutReason(model, a.wait, last), 1)
		}
	}
}

// loadedRecheck is how long a request told LOADED waits for the table to
// show it before asking again.
const loadedRecheck = 5 * time.Second

// ensureRetry is the pause before asking the control plane again after
// its call failed (a leader change, a restart) or its wait ended.
const ensureRetry = 250 * time.Millisecond

// timeoutReason says why a request's wait ended, from the control plane's
// last answer.
func timeoutReason(model string, wait time.Duration, last *llmgwv1.EnsureAdapterResponse) string {
	switch {
	case last.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_LOADED:
		return fmt.Sprintf("reported loaded on %v but not routable here within %s (--adapter-wait)", last.GetLoadedOn(), wait)
	case last.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_LOADING && !last.GetQueued():
		return fmt.Sprintf("placed but not loaded within %s (--adapter-wait)", wait)
	default:
		return fmt.Sprintf("no slot of model %q freed for it within %s (--adapter-wait)", model, wait)
	}
}

// queueResult is the queue metric's result for a wait's outcome.
func queueResult(result string) string {
	switch result {
	case "loaded":
		return "served_after_wait"
	case "timeout":
		return "timed_out"
	default:
		return result
	}
}

func (r *resolver) held(adapter string, eps []*endpoint.Endpoint) []*endpoint.Endpoint {
	var out []*endpoint.Endpoint
	for _, e := range eps {
		if r.holdings.Holds(e, adapter) && (r.ad == nil || !r.ad.isMissing(adapter, e)) {
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
	queueLen      *prometheus.GaugeVec
	queueWait     *prometheus.HistogramVec
	queued        *prometheus.CounterVec
	// The adapter use reports (adapteruse.go).
	useInflight prometheus.Gauge
	useReports  *prometheus.CounterVec
	useWaits    *prometheus.CounterVec
}

// newAdapterMetrics registers the cold-adapter and adapter-use metrics
// with reg (nil for none), whether or not cold adapters are loaded on
// demand: a router that refuses them still counts the refusals.
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
		queueLen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmgw_router_adapter_queue_length", Help: "Requests waiting in the model's queue for one of its adapters to be loaded.",
		}, []string{"model"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmgw_router_adapter_queue_wait_seconds", Help: "Time requests spent in the model's adapter queue, whatever the outcome.", Buckets: buckets,
		}, []string{"model"}),
		queued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_adapter_queue_requests_total",
			Help: "Requests that waited in the model's adapter queue, by result: served_after_wait, timed_out (--adapter-wait), queue_full (--adapter-queue), failed, client_gone.",
		}, []string{"model", "result"}),
		useInflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_router_adapter_inflight_requests", Help: "Requests for LoRA adapters this router has in flight to replicas, as it reports them to the control plane.",
		}),
		useReports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_adapter_use_reports_total", Help: "Reports of requests in flight per adapter and replica sent to the control plane, by result: ok, error.",
		}, []string{"result"}),
		useWaits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_adapter_use_waits_total", Help: "Requests for an adapter not used lately on their replica that waited for the control plane to acknowledge them before being sent, by how the wait ended: answered, failed, timeout (200 ms), client_gone.",
		}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(m.ensures, m.ensureSeconds, m.waited, m.waitSeconds, m.waiting, m.queueLen, m.queueWait, m.queued,
			m.useInflight, m.useReports, m.useWaits)
	}
	return m
}
