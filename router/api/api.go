// Package api is the router's OpenAI-compatible HTTP surface (plan §7.1):
// it reads just enough of a request to choose a replica, forwards the
// original bytes there, and streams the answer back as it arrives.
package api

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/prefix"
	"github.com/llmgw/llmgw/router/scheduler"
	"github.com/llmgw/llmgw/router/tokenize"
)

// Endpoints is the routing table the handler reads (endpoint.Registry).
// Implementations are safe for concurrent use and never block on the
// control plane.
type Endpoints interface {
	// Lookup returns a model's routable endpoints and whether the model is
	// in desired state. The slice is not modified by the caller.
	Lookup(model string) (eps []*endpoint.Endpoint, known bool)
	// Models returns the desired models, sorted by name.
	Models() []*llmgwv1.Model
	// LoadOf returns an endpoint's current load.
	LoadOf(e *endpoint.Endpoint) endpoint.Load
	// Adapter resolves an adapter name to its base model (plan §7.6).
	Adapter(name string) (endpoint.AdapterRef, bool)
	// Holds reports whether an endpoint can serve the adapter now.
	Holds(e *endpoint.Endpoint, adapter string) bool
	// Changed is closed once the routing table is rebuilt.
	Changed() <-chan struct{}
}

// Scheduler chooses replicas (scheduler.Scheduler, plan §7.3). Its
// methods are called concurrently.
type Scheduler interface {
	// ProfileFor returns the model's scheduling profile.
	ProfileFor(m *llmgwv1.Model) *scheduler.Profile
	// Pick returns an index into cands, or -1 when none may take r now.
	Pick(p *scheduler.Profile, r *scheduler.Request, cands []scheduler.Candidate) int
	// Observe records where r was sent, once the replica accepted it.
	Observe(p *scheduler.Profile, r *scheduler.Request, chosen scheduler.Candidate)
}

// Breakers are the per-replica circuit breakers (breaker.Set).
type Breakers interface {
	// Get returns the replica's breaker, creating a closed one.
	Get(k scheduler.Key) *breaker.Breaker
	// Peek returns it without creating one (nil: never failed, closed).
	Peek(k scheduler.Key) *breaker.Breaker
}

// Config configures the handler. Zero values take DefaultConfig's.
type Config struct {
	// MaxBodyBytes bounds a request body; larger ones get 413.
	MaxBodyBytes int64
	// ConnectTimeout bounds dialling an engine.
	ConnectTimeout time.Duration
	// FirstByteTimeout bounds the wait for an engine's response headers. A
	// non-streamed completion sends its headers only when it is done, so
	// this is also the longest non-streamed generation.
	FirstByteTimeout time.Duration
	// MaxAttempts bounds the replicas tried for one request (plan §7.4).
	MaxAttempts int
	// Ready reports readiness for /readyz; nil means always ready.
	Ready func() bool
}

// DefaultConfig returns the defaults of plan §7.1.
func DefaultConfig() Config {
	return Config{
		MaxBodyBytes:     4 << 20,
		ConnectTimeout:   2 * time.Second,
		FirstByteTimeout: 5 * time.Minute,
		MaxAttempts:      3,
	}
}

// Handler serves the router's HTTP API. Close releases its idle upstream
// connections once no request runs.
type Handler struct {
	cfg       Config
	eps       Endpoints
	sched     Scheduler
	breakers  Breakers
	log       *slog.Logger
	transport *http.Transport
	mux       *http.ServeMux
	m         *metrics
	kv        *tier2    // nil: tier 2 off (EnableKV)
	ad        *adapters // nil: cold adapters are refused (EnableAdapters)
	adm       *adapterMetrics
}

// New builds the handler; reg receives its metrics and gather serves
// /metrics (normally the same registry).
func New(cfg Config, eps Endpoints, sched Scheduler, breakers Breakers, log *slog.Logger, reg prometheus.Registerer, gather prometheus.Gatherer) *Handler {
	d := DefaultConfig()
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = d.MaxBodyBytes
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = d.ConnectTimeout
	}
	if cfg.FirstByteTimeout <= 0 {
		cfg.FirstByteTimeout = d.FirstByteTimeout
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = d.MaxAttempts
	}
	h := &Handler{
		cfg: cfg, eps: eps, sched: sched, breakers: breakers, log: log,
		transport: &http.Transport{
			DialContext:           (&net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
			ResponseHeaderTimeout: cfg.FirstByteTimeout,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       90 * time.Second,
			// Engines speak plain HTTP/1.1; compression would hold SSE chunks back.
			DisableCompression: true,
		},
		m:   newMetrics(reg),
		adm: newAdapterMetrics(),
	}
	if reg != nil {
		h.adm.register(reg)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/chat/completions", h.proxy)
	mux.HandleFunc("/v1/completions", h.proxy)
	mux.HandleFunc("GET /v1/models", h.models)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", h.readyz)
	if gather != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(gather, promhttp.HandlerOpts{}))
	}
	h.mux = mux
	return h
}

// ServeHTTP gives every request an X-Request-ID (the client's, or a new
// one), echoed in the response and forwarded to the engine.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("X-Request-ID")
	if id == "" || len(id) > 128 {
		id = newRequestID()
		r.Header.Set("X-Request-ID", id)
	}
	w.Header().Set("X-Request-ID", id)
	h.mux.ServeHTTP(w, r)
}

// Close stops the adapter loads requests were waiting on and drops idle
// upstream connections. Call it after the HTTP server has stopped.
func (h *Handler) Close() {
	h.ad.close()
	h.transport.CloseIdleConnections()
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (h *Handler) readyz(w http.ResponseWriter, _ *http.Request) {
	if h.cfg.Ready != nil && !h.cfg.Ready() {
		http.Error(w, "not ready\n", http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "ok\n")
}

type modelList struct {
	Object string       `json:"object"`
	Data   []modelEntry `json:"data"`
}

// modelEntry is vLLM's model card: root is what was loaded (the model,
// or the adapter's path), parent the base model of an adapter (null for a
// base model).
type modelEntry struct {
	ID      string  `json:"id"`
	Object  string  `json:"object"`
	Created int64   `json:"created"`
	OwnedBy string  `json:"owned_by"`
	Root    string  `json:"root"`
	Parent  *string `json:"parent"`
}

// models lists the models in desired state, ready or not, each followed by
// its adapters (plan §7.1): a model being rolled out exists, it only
// answers 503 for a moment, and an adapter is servable whether or not a
// replica holds it now. Desired state has no creation time, so created is 0.
func (h *Handler) models(w http.ResponseWriter, _ *http.Request) {
	out := modelList{Object: "list", Data: []modelEntry{}}
	for _, m := range h.eps.Models() {
		root := m.GetModel()
		if root == "" {
			root = m.GetName()
		}
		out.Data = append(out.Data, modelEntry{ID: m.GetName(), Object: "model", OwnedBy: "llmgw", Root: root})
		for _, a := range m.GetAdapters() {
			if ref, ok := h.eps.Adapter(a.GetName()); ok && ref.Model == m.GetName() {
				out.Data = append(out.Data, modelEntry{ID: a.GetName(), Object: "model", OwnedBy: "llmgw",
					Root: a.GetPath(), Parent: &ref.Model})
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// proxy serves the completion endpoints.
func (h *Handler) proxy(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	h.m.inflight.Inc()
	defer h.m.inflight.Dec()
	rid := r.Header.Get("X-Request-ID")
	model := "" // the label is set only for models that exist, so junk names cannot grow it
	code := h.serveProxy(w, r, start, rid, &model)
	label := model
	if label == "" {
		label = "_unknown"
	}
	h.m.requests.WithLabelValues(label, strconv.Itoa(code)).Inc()
	h.m.duration.WithLabelValues(label).Observe(time.Since(start).Seconds())
}

// clientClosed is recorded when the client went away before an answer.
const clientClosed = 499

func (h *Handler) serveProxy(w http.ResponseWriter, r *http.Request, start time.Time, rid string, modelLabel *string) int {
	fail := func(err *apiError) int {
		h.log.Debug("router: request refused", "request_id", rid, "err", err)
		writeError(w, err)
		return err.Status
	}
	if r.Method != http.MethodPost {
		return fail(errMethod("POST"))
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return fail(errTooLarge(h.cfg.MaxBodyBytes))
		}
		return fail(errInvalidField("", "reading the body: "+err.Error()))
	}
	req, err := sniff(body)
	if err != nil {
		var ae *apiError
		errors.As(err, &ae)
		return fail(ae)
	}
	// `model` names a model or one of its adapters (plan §7.6), as with vLLM.
	base, adapter := req.Model, ""
	eps, known := h.eps.Lookup(base)
	ref, isAdapter := endpoint.AdapterRef{}, false
	if !known {
		if ref, isAdapter = h.eps.Adapter(req.Model); isAdapter {
			base, adapter = ref.Model, req.Model
			eps, known = h.eps.Lookup(base)
		}
	}
	if !known {
		return fail(errModelNotFound(req.Model))
	}
	*modelLabel = base // adapters share their model's label: names are many, models few
	log := h.log.With("request_id", rid, "model", base)
	if adapter != "" {
		log = log.With("adapter", adapter)
		var aerr *apiError
		if eps, aerr = h.holders(r.Context(), adapter, base, eps, log); aerr != nil {
			if r.Context().Err() != nil {
				return clientClosed
			}
			return fail(aerr)
		}
	}
	model := h.model(base)
	// The body goes out as the client sent it but for two fields: usage on
	// streams (the router learns cached_tokens from it) and llama.cpp's
	// adapter addressing.
	stripUsage := false
	if req.Stream && !wantsUsage(body) {
		b, err := withUsage(body)
		if err != nil {
			var ae *apiError
			if errors.As(err, &ae) {
				return fail(ae)
			}
			return fail(errInvalidField("", err.Error()))
		}
		body, stripUsage = b, true
	}
	if adapter != "" && model.GetEngine() == "llamacpp" {
		b, err := forLlamaCpp(body, base, ref.Index)
		if err != nil {
			return fail(errInvalidField("", err.Error()))
		}
		body = b
	}

	sreq := &scheduler.Request{ID: rid, Model: base, Adapter: adapter, Session: r.Header.Get("X-Session-ID"),
		Prefix: prefix.Hashes(make([]uint64, 0, maxPrefixChunks), req.Prompt, prefix.DefaultChunk, maxPrefixChunks)}
	prof := h.sched.ProfileFor(model)
	kind := tokenize.Chat
	if strings.HasSuffix(r.URL.Path, "/v1/completions") {
		kind = tokenize.Completion
	}
	sreq.KV = h.kv.query(r.Context(), h, model, adapter, kind, body, eps)
	// tail keeps the end of the answer when tier 2 predicted something, so
	// the engine's cached_tokens can be held against the prediction.
	var tail *tailBuffer
	var tap io.Writer
	if sreq.KV != nil && sreq.KV.Fallback == "" {
		tail = &tailBuffer{max: 256 << 10}
		if req.Stream {
			tail.max = 16 << 10 // the usage chunk is the last event
		}
		tap = tail
	}
	fw := forwarding{body: body, stream: req.Stream, stripUsage: stripUsage, adapter: adapter, tail: tap}

	// tried holds every replica this request has been sent to, or whose
	// breaker refused it, so each attempt goes somewhere new (plan §7.4).
	tried := make([]*endpoint.Endpoint, 0, h.cfg.MaxAttempts)
	var lastErr error
	for attempt := 0; attempt < h.cfg.MaxAttempts; {
		ep, cand := h.choose(prof, sreq, eps, tried, adapter)
		if ep == nil {
			break
		}
		tried = append(tried, ep)
		br := h.breakers.Get(cand.Key)
		if br.Acquire() != nil {
			continue // another request took its probe; not an attempt
		}
		attempt++
		last := attempt == h.cfg.MaxAttempts || len(tried) == len(eps)
		code, err := h.forward(w, r, &fw, ep, start, last, log, func() { h.sched.Observe(prof, sreq, cand) })
		if err == nil {
			if tail != nil && code == http.StatusOK {
				h.kv.observe(sreq.KV, ep.ReplicaID, req.Stream, tail.b)
				tail.b = tail.b[:0]
			}
			switch {
			case code == clientClosed:
				br.Release()
			case code >= 500:
				br.Failure()
			default:
				br.Success()
			}
			return code
		}
		if r.Context().Err() != nil {
			br.Release()
			log.Info("router: client went away", "replica", ep.ReplicaID)
			return clientClosed
		}
		lastErr = err
		if errors.Is(err, errAdapterMissing) {
			// The replica is healthy; the table was a moment behind.
			br.Release()
			h.adm.missing.Inc()
			log.Info("router: replica does not hold the adapter; trying another", "replica", ep.ReplicaID)
			continue
		}
		br.Failure()
		h.m.upstreamErrors.WithLabelValues(base).Inc()
		log.Warn("router: replica failed before the first byte; trying another", "replica", ep.ReplicaID, "err", err)
	}
	if lastErr == nil {
		return fail(errNoReplica(req.Model))
	}
	if errors.Is(lastErr, errAdapterMissing) {
		return fail(errAdapterCold(adapter, "no replica tried holds it now", 1))
	}
	return fail(errUpstream(lastErr))
}

// maxPrefixChunks bounds the prompt text the prefix tree keys on: 128
// chunks of 64 bytes, 8 KiB — past a system prompt and a few turns, where
// replicas' caches stop differing in ways the tree could tell apart.
const maxPrefixChunks = 128

// model returns the desired-state model named name, or an empty one (the
// default profile) if it vanished since Lookup.
func (h *Handler) model(name string) *llmgwv1.Model {
	ms := h.eps.Models()
	if i, ok := slices.BinarySearchFunc(ms, name, func(m *llmgwv1.Model, n string) int { return strings.Compare(m.GetName(), n) }); ok {
		return ms[i]
	}
	return &llmgwv1.Model{Name: name}
}

// choose asks the scheduler among the endpoints not yet tried.
func (h *Handler) choose(prof *scheduler.Profile, sreq *scheduler.Request, eps, tried []*endpoint.Endpoint, adapter string) (*endpoint.Endpoint, scheduler.Candidate) {
	left := make([]*endpoint.Endpoint, 0, len(eps))
	for _, e := range eps {
		if !slices.Contains(tried, e) {
			left = append(left, e)
		}
	}
	if len(left) == 0 {
		return nil, scheduler.Candidate{}
	}
	cands := make([]scheduler.Candidate, len(left))
	for i, e := range left {
		l := h.eps.LoadOf(e)
		k := Key(e)
		cands[i] = scheduler.Candidate{Key: k, Waiting: l.Waiting, Running: l.Running, KVUsage: l.KVUsage,
			Inflight: l.Inflight, Weight: e.Weight, Saturated: l.Saturated, Breaker: h.breakerView(k),
			HasAdapter: adapter != "" && h.eps.Holds(e, adapter)}
	}
	i := h.sched.Pick(prof, sreq, cands)
	if i < 0 || i >= len(left) {
		return nil, scheduler.Candidate{}
	}
	return left[i], cands[i]
}

// Key is an endpoint's identity for per-replica state (plan §4).
func Key(e *endpoint.Endpoint) scheduler.Key {
	return scheduler.Key{ID: e.ReplicaID, UID: e.UID, Incarnation: e.Incarnation}
}

func (h *Handler) breakerView(k scheduler.Key) scheduler.BreakerView {
	b := h.breakers.Peek(k)
	if b == nil {
		return scheduler.BreakerClosed
	}
	switch st, due := b.View(); {
	case st == breaker.Closed:
		return scheduler.BreakerClosed
	case due:
		return scheduler.BreakerProbeDue
	default:
		return scheduler.BreakerCoolingDown
	}
}

// hopHeaders are per-connection headers a proxy must not forward (RFC 9110 §7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// forward sends the request to ep. It returns an error only while nothing
// has been written to the client — a connection failure, or a 5xx when
// another replica may still be tried (last is false) — so the caller may
// retry elsewhere (plan §7.4). Once the response has started, it is the
// answer, whatever happens to it; accepted runs just before, so the
// scheduler records where the request really went (plan §7.5).
// forwarding is what forward sends and how it treats the answer.
type forwarding struct {
	body   []byte
	stream bool
	// stripUsage drops the usage chunk the router added to the stream.
	stripUsage bool
	// adapter, when set, makes an engine's 404 before the first byte a
	// reason to try another replica (plan §7.6).
	adapter string
	// tail, when set, receives the engine's bytes for tier 2's accounting.
	tail io.Writer
}

func (h *Handler) forward(w http.ResponseWriter, r *http.Request, fw *forwarding, ep *endpoint.Endpoint,
	start time.Time, last bool, log *slog.Logger, accepted func()) (int, error) {
	body := fw.body
	release := ep.Acquire()
	defer release()

	// The request's context: a client that goes away cancels the engine's work.
	out, err := http.NewRequestWithContext(r.Context(), http.MethodPost,
		"http://"+ep.Address+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("build request for %s: %w", ep.Address, err)
	}
	out.Header = r.Header.Clone()
	for _, k := range hopHeaders {
		out.Header.Del(k)
	}
	out.Header.Del("Content-Length")
	out.ContentLength = int64(len(body))

	resp, err := h.transport.RoundTrip(out)
	if err != nil {
		return 0, fmt.Errorf("replica %s at %s: %w", ep.ReplicaID, ep.Address, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 500 && !last {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return 0, fmt.Errorf("replica %s answered %s", ep.ReplicaID, resp.Status)
	}
	if resp.StatusCode == http.StatusNotFound && fw.adapter != "" && !last {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return 0, fmt.Errorf("replica %s, adapter %s: %w", ep.ReplicaID, fw.adapter, errAdapterMissing)
	}

	accepted()
	hdr := w.Header()
	for k, v := range resp.Header {
		hdr[k] = v
	}
	for _, k := range hopHeaders {
		hdr.Del(k)
	}
	hdr.Del("Content-Length") // the server frames what we copy
	hdr.Set("X-Llmgw-Replica", ep.ReplicaID)
	hdr.Set("X-Request-ID", r.Header.Get("X-Request-ID"))
	w.WriteHeader(resp.StatusCode)

	var src io.Reader = resp.Body
	if fw.tail != nil {
		src = io.TeeReader(resp.Body, fw.tail) // tail keeps the usage for tier 2's accounting
	}
	var dst io.Writer = w
	var strip *usageStripper
	if fw.stripUsage && resp.StatusCode == http.StatusOK {
		strip = &usageStripper{dst: w}
		dst = strip
	}
	n, err := h.copyFlushing(w, dst, src, func() {
		if fw.stream {
			h.m.ttft.WithLabelValues(ep.Model).Observe(time.Since(start).Seconds())
		}
	})
	if strip != nil && err == nil {
		if ferr := strip.Flush(); ferr != nil {
			err = fmt.Errorf("write to client: %w", ferr)
		}
	}
	if err != nil && r.Context().Err() == nil {
		// Too late to answer with an error: the client sees a cut stream.
		h.m.upstreamErrors.WithLabelValues(ep.Model).Inc()
		log.Warn("router: response cut short", "replica", ep.ReplicaID, "bytes", n, "err", err)
	}
	log.Debug("router: request done", "replica", ep.ReplicaID, "status", resp.StatusCode, "bytes", n)
	if r.Context().Err() != nil {
		return clientClosed, nil
	}
	return resp.StatusCode, nil
}

// copyFlushing copies src to dst (w, or a filter writing to w), flushing w
// after every read so SSE chunks reach the client one by one; first runs
// before the first byte is written.
func (h *Handler) copyFlushing(w http.ResponseWriter, dst io.Writer, src io.Reader, first func()) (int64, error) {
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	var n int64
	for {
		k, rerr := src.Read(buf)
		if k > 0 {
			if n == 0 {
				first()
			}
			if _, err := dst.Write(buf[:k]); err != nil {
				return n, fmt.Errorf("write to client: %w", err)
			}
			n += int64(k)
			if err := rc.Flush(); err != nil {
				return n, fmt.Errorf("flush to client: %w", err)
			}
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, fmt.Errorf("read from engine: %w", rerr)
		}
	}
}

type metrics struct {
	requests       *prometheus.CounterVec
	duration       *prometheus.HistogramVec
	ttft           *prometheus.HistogramVec
	upstreamErrors *prometheus.CounterVec
	inflight       prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	buckets := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_requests_total",
			Help: "Completion requests by model and HTTP status (499: the client went away).",
		}, []string{"model", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmgw_router_request_duration_seconds", Help: "End-to-end request latency.", Buckets: buckets,
		}, []string{"model"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmgw_router_ttft_seconds", Help: "Time to the first streamed byte sent to the client.", Buckets: buckets,
		}, []string{"model"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_upstream_errors_total",
			Help: "Engine failures: connection errors, 5xx answers retried elsewhere, streams cut short.",
		}, []string{"model"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_router_inflight", Help: "Completion requests being served.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration, m.ttft, m.upstreamErrors, m.inflight)
	}
	return m
}
