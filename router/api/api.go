// Package api is the router's HTTP surface (design §7.1): OpenAI's
// completion endpoints and Responses API, Anthropic's Messages API (and
// its count_tokens), /v1/models and the probes, and nothing about other
// users (/metrics and the debug pages are on the router's operations
// port, router/ops.go). Every inference API runs the same pipeline; what
// differs between them — where the prompt is, how the answer reports its
// usage and ends its stream, the shape of an error — is router/openai's,
// asked through the request's openai.API. A completion request runs as a
// pipeline of stages, in the shape of the Gateway API Inference Extension
// (handler → director → scheduler → proxy), each given only what it needs:
//
//  1. decode and sniff: read the body within its limit, and just enough of
//     it (router/openai) to route it; then, for an autoscaled model with
//     no replica ready to take it, wait in the waiting room until one can
//     (router/waitroom, §5.7);
//  2. resolve: the model and adapter the name means, and the replicas that
//     may serve it, waiting for a cold adapter (router/director, §7.6);
//  3. prepare: the body as the engine must get it, tier 1's prefix hashes
//     and tier 2's tokens and block hashes (router/director, §7.5);
//  4. schedule: a replica for each attempt, never one tried before
//     (router/director over router/scheduler, §7.3);
//  5. forward: to that replica, retried elsewhere only before the first
//     byte reached the client (router/proxy, §7.4);
//  6. account: the request's metrics, tier 2's prediction held against
//     what the engine reported; the scheduler's memory learns where the
//     request went the moment a replica accepts it, and each attempt's
//     breaker its outcome as the attempt ends, since both must not wait for
//     the answer to finish.
//
// The handler does no routing of its own: it runs the stages in order and
// answers a refusal from any of them with the API's error body (OpenAI's,
// or Anthropic's on /v1/messages). Nor does it
// build them: the router (router.New) builds the director and the proxy
// and hands them to New, which sees each only through the interface it
// declares here (Director, Forwarder), so their options and dependencies
// (scheduler, breakers, KV index, adapter control) are none of its business.
//
// The session key session affinity routes by (design §7.5 tier 0) is the
// first of Config.SessionHeaders the request carries: X-Session-ID, or a
// coding agent's own session header.
//
// Before any of them, every /v1/ request is checked for an API key while
// the cluster requires keys (its first key turns that on), or always with
// RequireKey (router/auth, design §11): 401 without a valid one. The key's name is logged and labels the
// request metrics; a key limited to some models gets 403 for others, told
// before the name is resolved, and /v1/models lists only what it may use.
// Then its caller — the key, or the client's address without one — takes
// one of its MaxKeyInflight places until the answer ends (429 past them),
// so one caller's requests, slow uploads included, cannot fill the router.
package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/auth"
	"github.com/llmgw/llmgw/router/capture"
	"github.com/llmgw/llmgw/router/director"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/flow"
	"github.com/llmgw/llmgw/router/openai"
	"github.com/llmgw/llmgw/router/proxy"
	"github.com/llmgw/llmgw/router/quota"
	"github.com/llmgw/llmgw/router/tokenize"
	"github.com/llmgw/llmgw/router/waitroom"
	"github.com/llmgw/llmgw/vllm"
)

// Models is desired state as the handler reads it (endpoint.Registry):
// the models and adapters /v1/models lists, and what a name means before
// it is resolved, so a key's models are told apart. Safe for concurrent
// use; never blocks on the control plane.
type Models interface {
	// Models returns the desired models, sorted by name.
	Models() []*llmgwv1.Model
	// Lookup reports whether a model is in desired state (and its
	// routable endpoints, which the handler does not read).
	Lookup(model string) (eps []*endpoint.Endpoint, known bool)
	// Adapter resolves an adapter name to its base model (design §7.6).
	Adapter(name string) (endpoint.AdapterRef, bool)
	// MaxModelLen is the context length every routable replica of a
	// model accepts, as their engines report it; false when unknown.
	MaxModelLen(model string) (int, bool)
}

// Director is stages 2 to 4 of the pipeline (director.Director): what a
// request's name means and where it may go, and the plan that schedules
// each attempt and is told how the request ended. Safe for concurrent use.
type Director interface {
	// ResolveFor is stage 2 for a request from a caller (whose key or
	// session a sticky alias routes by): on error, the target's Base is
	// set when the name resolved to a model, and an error while ctx is
	// done means the client went away.
	ResolveFor(ctx context.Context, name string, c director.Caller, log *slog.Logger) (director.Target, *openai.Error)
	// Fallback is stage 2 again for an alias's request its target refused
	// before any byte reached the client (design §7.9): the next of the
	// alias's candidates, or false when there is none to try.
	Fallback(ctx context.Context, t director.Target, code int, diverted bool, log *slog.Logger) (director.Target, bool)
	// Prepare is stage 3; the plan it returns is stage 4's route and
	// answers to stage 6.
	Prepare(ctx context.Context, t director.Target, in director.Input) (*director.Plan, *openai.Error)
	// AdapterMissing is told the replicas that answered 404 for an adapter
	// the table said they hold, before the request is resolved again.
	AdapterMissing(adapter string, eps []*endpoint.Endpoint)
}

// Forwarder is stage 5 (proxy.Proxy): when the result carries an error,
// nothing has been written to the client. Safe for concurrent use.
type Forwarder interface {
	Serve(w http.ResponseWriter, r *http.Request, req *proxy.Request) proxy.Result
}

// Config configures the handler. Zero values take DefaultConfig's.
type Config struct {
	// MaxBodyBytes bounds a request body; larger ones get 413.
	MaxBodyBytes int64
	// Ready reports readiness for /readyz; nil means always ready.
	Ready func() bool
	// Keys returns the router API keys in force now (the watch client's
	// current state); nil, or a nil set, means none.
	Keys func() *auth.Set
	// RequireKey refuses requests without a valid key even while the
	// cluster has no key (--require-api-key).
	RequireKey bool
	// KeysRequired reports the cluster's own requirement (ClusterConfig
	// api_keys_required, set by the first key ever created): with it, no
	// key left means no request passes. nil means false.
	KeysRequired func() bool
	// MaxKeyInflight bounds the /v1/ requests one caller has in flight —
	// an API key, or a client address while requests without a key pass —
	// from its key's check to its answer's end, its body's upload
	// included; past it, 429 (callers.go). 0 is no bound.
	MaxKeyInflight int
	// Quota admits each completion against its tenant's limits and meters
	// its usage (design §7.7); nil: no tenants, nothing metered.
	Quota Admitter
	// Flow holds requests at saturation (design §7.8); nil: none held.
	Flow FlowControl
	// Tenants returns the tenants in force now, for their priority
	// classes; nil means none.
	Tenants func() map[string]*llmgwv1.Tenant
	// Hold is the waiting room (router/waitroom, design §5.7): a request
	// for an autoscaled model with no replica ready to take it waits there
	// instead of getting 503; nil: none is held.
	Hold Holder
	// Demand counts the autoscaled models' requests and time to first
	// token for the router's demand report (router/demand); nil: not
	// counted.
	Demand DemandCounter
	// Capture records each request, without its text, for a replay
	// (router/capture, design §9); nil: none recorded.
	Capture Capturer
	// Aliases returns the model aliases in force now, by name, which
	// /v1/models lists (design §7.9); nil means none.
	Aliases func() map[string]*llmgwv1.Alias
	// SessionHeaders name the request headers that carry a session's key
	// (design §7.5 tier 0), first present wins; nil takes
	// DefaultSessionHeaders, empty means none.
	SessionHeaders []string
	// Tracer, when set, traces each inference request (trace.go, design
	// §9 "Tracing"); nil: tracing off, at the cost of a nil check.
	Tracer trace.TracerProvider
}

// DefaultSessionHeaders are the session headers the router reads unless
// told otherwise: llmgw's own X-Session-ID, Claude Code's
// X-Claude-Code-Session-Id (a UUID per conversation, sent on every request
// since Claude Code 2.1.86) and the Codex CLI's session_id (its
// conversation id: openai/codex codex-rs/codex-api/src/requests/headers.rs
// build_conversation_headers).
func DefaultSessionHeaders() []string {
	return []string{"X-Session-Id", "X-Claude-Code-Session-Id", "Session_id"}
}

// session is the request's session key: the value of the first session
// header it carries, "" when none.
func (h *Handler) session(hd http.Header) string {
	for _, k := range h.cfg.SessionHeaders {
		if v := hd[k]; len(v) > 0 && v[0] != "" {
			return v[0]
		}
	}
	return ""
}

// Holder is the waiting room (router/waitroom): Enter lets a request of
// an autoscaled model through, at once or once a replica can take it, or
// refuses it (a nil Err: the client left while held); the Pass is Done
// once when the request ends.
type Holder interface {
	Enter(ctx context.Context, r waitroom.Request) (*waitroom.Pass, *waitroom.Refusal)
}

// DemandCounter counts, per autoscaled model, the requests sent and the
// time to first token of their streamed answers (router/demand).
type DemandCounter interface {
	Sent(model string)
	FirstToken(model string, ttft time.Duration)
}

// FlowControl is flow control at saturation (router/flow): Resolve gives
// a request's class from its header and its tenant's classes, Admit lets
// it on — at once, or after it waited in the queue — or refuses it; the
// grant is Done once with the weighted tokens it used.
type FlowControl interface {
	Enabled() bool
	Resolve(header, tenantDefault, tenantMax string) (int, *openai.Error)
	Admit(ctx context.Context, r flow.Request) (*flow.Grant, *flow.Refusal)
	Class(rank int) string
	Weighted(input, output float64) float64
}

// Admitter is the tenants' admission (router/quota): Admit decides a
// request against its tenant's shares and reserves what it may use; the
// ticket it returns is settled once with what the request used. A
// refusal comes with the x-ratelimit-* headers to send with it.
type Admitter interface {
	Admit(r quota.Request) (*quota.Ticket, *openai.Error, quota.Headers)
}

// DefaultConfig returns the defaults of design §7.1.
func DefaultConfig() Config {
	return Config{MaxBodyBytes: 4 << 20, SessionHeaders: DefaultSessionHeaders()}
}

// Handler serves the router's HTTP API. It runs the stages it is given
// and owns none of them: whoever built them closes them once no request
// runs.
type Handler struct {
	cfg     Config
	desired Models
	log     *slog.Logger
	mux     *http.ServeMux
	m       *metrics
	dir     Director
	fwd     Forwarder
	callers *callers
	tracer  trace.Tracer // nil: tracing off
}

// New builds the handler over the routing table's models and the stages
// after decoding: dir resolves, prepares and schedules, fwd forwards. reg
// receives its metrics, which the router serves on its operations port,
// never here: they name API keys and engines (design §11).
func New(cfg Config, models Models, dir Director, fwd Forwarder, log *slog.Logger, reg prometheus.Registerer) *Handler {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultConfig().MaxBodyBytes
	}
	if cfg.SessionHeaders == nil {
		cfg.SessionHeaders = DefaultSessionHeaders()
	}
	// Header maps are keyed canonically (Session_id for session_id).
	hs := make([]string, 0, len(cfg.SessionHeaders))
	for _, k := range cfg.SessionHeaders {
		hs = append(hs, http.CanonicalHeaderKey(k))
	}
	cfg.SessionHeaders = hs
	h := &Handler{cfg: cfg, desired: models, log: log, m: newMetrics(reg), dir: dir, fwd: fwd, callers: newCallers(cfg.MaxKeyInflight, reg)}
	if cfg.Tracer != nil {
		h.tracer = cfg.Tracer.Tracer(tracerName)
	}
	// Patterns carry no method: Only answers a wrong one, and "/" an
	// unknown path, in OpenAI's error body rather than ServeMux's plain text.
	mux := http.NewServeMux()
	for _, a := range []openai.API{openai.Chat, openai.Completions, openai.Embeddings, openai.Responses, openai.Messages, openai.CountTokens} {
		mux.Handle(a.Path(), Only(http.MethodPost, h.endpoint(a)))
	}
	mux.Handle("/v1/models", Only(http.MethodGet, http.HandlerFunc(h.models)))
	mux.Handle("/v1/models/{id...}", Only(http.MethodGet, http.HandlerFunc(h.model)))
	mux.Handle("/healthz", Only(http.MethodGet, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })))
	mux.Handle("/readyz", Only(http.MethodGet, http.HandlerFunc(h.readyz)))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		openai.WriteErrorAt(w, r.URL.Path, openai.UnknownPath(r.Method, r.URL.Path))
	})
	h.mux = mux
	return h
}

// Only serves h for method (and HEAD with GET, as ServeMux does) and
// answers any other method with a 405 in the path's API's error body
// (openai.WriteErrorAt) and its Allow header.
func Only(method string, h http.Handler) http.Handler {
	allow := method
	if method == http.MethodGet {
		allow = "GET, HEAD"
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method && (method != http.MethodGet || r.Method != http.MethodHead) {
			openai.WriteErrorAt(w, r.URL.Path, openai.MethodNotAllowed(r.Method, r.URL.Path, allow))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// endpoint is the handler of the inference API a.
func (h *Handler) endpoint(a openai.API) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.complete(w, r, a) })
}

// ServeHTTP gives every request an X-Request-ID (the client's, or a new
// one), echoed in the response and forwarded to the engine, and checks the
// API key of every /v1/ request (the probes need none).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("X-Request-Id")
	if id == "" || len(id) > 128 {
		id = newRequestID()
		r.Header.Set("X-Request-Id", id)
	}
	w.Header().Set("X-Request-Id", id)
	var sp trace.Span // the request's, when traced
	if h.tracer != nil {
		if a, ok := openai.APIOf(r.URL.Path); ok {
			r, sp = h.startRequestSpan(r, a, id)
			defer sp.End()
		}
	}
	if strings.HasPrefix(r.URL.Path, "/v1/") {
		var keys *auth.Set
		if h.cfg.Keys != nil {
			keys = h.cfg.Keys()
		}
		require := h.cfg.RequireKey || (h.cfg.KeysRequired != nil && h.cfg.KeysRequired())
		key, aerr := auth.Check(keys, require, r.Header)
		if aerr != nil {
			h.log.Debug("router: request refused", "request_id", id, "path", r.URL.Path, "err", aerr)
			if sp != nil && sp.IsRecording() {
				sp.AddEvent("llmgw.auth", trace.WithAttributes(attribute.Bool("llmgw.allowed", false)))
				endRequestSpan(sp, aerr.Status)
			}
			w.Header().Set("WWW-Authenticate", auth.Challenge)
			openai.WriteErrorAt(w, r.URL.Path, aerr)
			if isCompletion(r.URL.Path) {
				h.m.requests.WithLabelValues("_unknown", strconv.Itoa(aerr.Status), "").Inc()
			}
			return
		}
		c := callerOf(r, key)
		if cerr := h.callers.acquire(c); cerr != nil {
			h.log.Debug("router: request refused", "request_id", id, "path", r.URL.Path, "err", cerr)
			if sp != nil && sp.IsRecording() {
				sp.AddEvent("llmgw.caller_limit", trace.WithAttributes(attribute.Bool("llmgw.allowed", false)))
				endRequestSpan(sp, cerr.Status)
			}
			if r.ContentLength != 0 {
				// Go's server would read the rest of the unread body before
				// sending the answer: a slow upload would wait for its 429
				// as long as it takes to send. Closing answers at once.
				w.Header().Set("Connection", "close")
			}
			openai.WriteErrorAt(w, r.URL.Path, cerr)
			if isCompletion(r.URL.Path) {
				h.m.requests.WithLabelValues("_unknown", strconv.Itoa(cerr.Status), key.GetName()).Inc()
			}
			return
		}
		defer h.callers.release(c)
		if sp != nil && sp.IsRecording() {
			sp.AddEvent("llmgw.auth", trace.WithAttributes(attribute.Bool("llmgw.allowed", true),
				attribute.String("llmgw.key", key.GetName()), attribute.String("llmgw.tenant", tenantOf(key))))
		}
		if key != nil {
			r = r.WithContext(context.WithValue(r.Context(), keyCtx{}, key))
		}
	}
	h.mux.ServeHTTP(w, r)
}

// keyCtx carries the request's API key, once checked.
type keyCtx struct{}

// keyOf is the API key the request presented; nil while the check is off.
func keyOf(r *http.Request) *llmgwv1.ApiKey {
	k, _ := r.Context().Value(keyCtx{}).(*llmgwv1.ApiKey)
	return k
}

// isCompletion reports whether path is an inference endpoint, whose
// requests the request metrics count.
func isCompletion(path string) bool {
	_, ok := openai.APIOf(path)
	return ok
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
// base model), max_model_len the context length the model's replicas
// report (null for an adapter, as vLLM's, and while the replicas have not
// said: no ready replica, or an engine whose card has none).
type modelEntry struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen *int    `json:"max_model_len"`
}

// models lists the models in desired state, ready or not, each followed by
// its adapters (design §7.1): a model being rolled out exists, it only
// answers 503 for a moment, and an adapter is servable whether or not a
// replica holds it now. created is the model's first apply (its adapters
// share it). Aliases follow, sorted by name (aliasEntry). A key limited to
// some models sees only those (auth.Allows).
func (h *Handler) models(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, modelList{Object: "list", Data: h.modelEntries(keyOf(r), "")})
}

// model is GET /v1/models/{id}: one model or adapter's card, or OpenAI's
// 404 for a name that is neither or that the key may not use.
func (h *Handler) model(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	es := h.modelEntries(keyOf(r), id)
	if len(es) == 0 {
		openai.WriteError(w, openai.ModelNotFound(id))
		return
	}
	writeJSON(w, es[0])
}

// modelEntries are the cards key may see, or only the one named only
// when it is set.
func (h *Handler) modelEntries(key *llmgwv1.ApiKey, only string) []modelEntry {
	out := []modelEntry{}
	for _, m := range h.desired.Models() {
		root := m.GetModel()
		if root == "" {
			root = m.GetName()
		}
		if (only == "" || only == m.GetName()) && auth.Allows(key, m.GetName(), "") {
			e := modelEntry{ID: m.GetName(), Object: "model", Created: m.GetCreatedUnix(), OwnedBy: "llmgw", Root: root}
			if n, ok := h.desired.MaxModelLen(m.GetName()); ok {
				e.MaxModelLen = &n
			}
			out = append(out, e)
		}
		for _, a := range m.GetAdapters() {
			if only != "" && only != a.GetName() {
				continue
			}
			if ref, ok := h.desired.Adapter(a.GetName()); ok && ref.Model == m.GetName() && auth.Allows(key, a.GetName(), ref.Model) {
				out = append(out, modelEntry{ID: a.GetName(), Object: "model", Created: m.GetCreatedUnix(), OwnedBy: "llmgw",
					Root: a.GetPath(), Parent: &ref.Model})
			}
		}
	}
	if h.cfg.Aliases == nil {
		return out
	}
	as := h.cfg.Aliases()
	for _, name := range slices.Sorted(maps.Keys(as)) {
		if (only == "" || only == name) && auth.Allows(key, name, "") {
			out = append(out, h.aliasEntry(as[name]))
		}
	}
	return out
}

// aliasEntry is an alias's card (design §7.9): a model owned by llmgw,
// its root the target of the largest weight that exists (its primary),
// created that target's model's; max_model_len the least of every model
// it may send a request to (targets and fallbacks that exist, an adapter
// counting as its model), so a request sized by it fits wherever it goes,
// and null while any of them has not said.
func (h *Handler) aliasEntry(a *llmgwv1.Alias) modelEntry {
	e := modelEntry{ID: a.GetName(), Object: "model", OwnedBy: "llmgw", Root: a.GetName()}
	baseOf := func(name string) string {
		if _, ok := h.desired.Lookup(name); ok {
			return name
		}
		if ref, ok := h.desired.Adapter(name); ok {
			return ref.Model
		}
		return ""
	}
	found, best := false, uint32(0)
	for _, t := range a.GetTargets() {
		if b := baseOf(t.GetTarget()); b != "" && (!found || t.GetWeight() > best) {
			found, best = true, t.GetWeight()
			e.Root, e.Created = t.GetTarget(), h.spec(b).GetCreatedUnix()
		}
	}
	least, known := 0, false
	for _, name := range append(targetNames(a), a.GetFallbacks()...) {
		b := baseOf(name)
		if b == "" {
			continue
		}
		n, ok := h.desired.MaxModelLen(b)
		if !ok {
			return e // one has not said: null
		}
		if !known || n < least {
			least, known = n, true
		}
	}
	if known {
		e.MaxModelLen = &least
	}
	return e
}

func targetNames(a *llmgwv1.Alias) []string {
	out := make([]string, 0, len(a.GetTargets())+len(a.GetFallbacks()))
	for _, t := range a.GetTargets() {
		out = append(out, t.GetTarget())
	}
	return out
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// complete serves the inference endpoints: the pipeline, then the
// request's metrics.
func (h *Handler) complete(w http.ResponseWriter, r *http.Request, api openai.API) {
	start := time.Now()
	h.m.inflight.Inc()
	defer h.m.inflight.Dec()
	code, model := h.run(w, r, api, start)
	if sp := h.recording(r); sp != nil {
		endRequestSpan(sp, code)
	}
	label := model // set only for models that exist, so junk names cannot grow it
	if label == "" {
		label = "_unknown"
	}
	// Key names come from the replicated state, so they are bounded too;
	// "" is a request without a key (the check is off).
	h.m.requests.WithLabelValues(label, codeLabel(code), keyOf(r).GetName()).Inc()
	h.m.duration.WithLabelValues(label).Observe(time.Since(start).Seconds())
}

// codeLabel is code as the metrics' label; the usual ones without
// formatting (strconv.Itoa allocates for numbers past 99).
func codeLabel(code int) string {
	switch code {
	case 200:
		return "200"
	case 400:
		return "400"
	case 404:
		return "404"
	case 429:
		return "429"
	case proxy.ClientClosed:
		return "499"
	case 502:
		return "502"
	case 503:
		return "503"
	}
	return strconv.Itoa(code)
}

// run takes one completion request through the stages and returns the
// status the client got and the base model it was for ("" when the name
// resolved to none). Adapters share their model's label: names are many,
// models few.
func (h *Handler) run(w http.ResponseWriter, r *http.Request, api openai.API, start time.Time) (code int, model string) {
	rid := r.Header.Get("X-Request-Id")
	key := keyOf(r)
	reqLog, rh := newReqLog(h.log.Handler(), rid, key.GetName())
	refuse := func(err *openai.Error) int {
		reqLog.Debug("router: request refused", "err", err)
		openai.WriteErrorFor(w, api, err)
		return err.Status
	}

	// 1. Decode and sniff. Embeddings and count_tokens neither stream nor
	// share prefixes worth routing by: the scheduler's load scorers alone
	// choose (no prefix hashes).
	body, req, aerr := h.decode(w, r, api)
	if aerr != nil {
		return refuse(aerr), ""
	}
	sp := h.recording(r) // nil unless the request is traced
	if sp != nil {
		sp.SetAttributes(attribute.String("gen_ai.request.model", req.Model), attribute.Bool("llmgw.stream", req.Stream),
			attribute.Int("llmgw.body_bytes", len(body)))
	}

	// The key's models, before resolving: a key may not make the control
	// plane load an adapter it may not use (router/auth).
	base, ok := h.mayUse(key, req.Model)
	if !ok {
		return refuse(auth.Forbidden(req.Model)), base
	}

	// 1b. The waiting room (design §5.7): an autoscaled model with no
	// replica ready to take the request holds it until one can, in
	// arrival order; the rest of the pipeline runs after, as for any.
	limits, autoscaled := waitroom.LimitsOf(h.spec(base))
	// Time to first token counts from the request's release: its time
	// held is counted as held (router/demand).
	ttftFrom := start
	var pass *waitroom.Pass
	defer func() { pass.Done() }()
	if autoscaled && h.cfg.Hold != nil {
		var ref *waitroom.Refusal
		hsp := h.stage(sp, "llmgw.waitroom")
		pass, ref = h.cfg.Hold.Enter(r.Context(), waitroom.Request{Model: base, Limits: limits, Bytes: len(body)})
		if hsp != nil {
			var rerr *openai.Error
			if ref != nil {
				rerr = ref.Err
			}
			hsp.end(rerr)
		}
		if ref != nil {
			if ref.Err == nil { // the client left while it was held
				return proxy.ClientClosed, base
			}
			return refuse(ref.Err), base
		}
		if pass.Waited > 0 {
			w.Header().Set(holdHeader, strconv.FormatInt(pass.Waited.Milliseconds(), 10))
			ttftFrom = time.Now()
		}
	}
	counted := autoscaled && h.cfg.Demand != nil

	// 2 to 5, again (at most adapterRetries times) when every replica
	// tried answered 404 for an adapter the table said it holds: those are
	// marked, and the request waits for a holder (design §7.6).
	var tgt director.Target
	var plan *director.Plan
	var res proxy.Result
	// The tenant's reservation, settled once however the request ends:
	// with used, set from the answer, or nothing for a request no engine
	// served (design §7.7).
	var ticket *quota.Ticket
	var used quota.Usage
	defer func() { ticket.Settle(used) }()
	// Its place in flow control, given back however it ends (design §7.8).
	// count_tokens is answered from the engine's tokenizer at once, with no
	// generation to meter or to queue: neither tenants' limits nor flow
	// control hold it.
	metered := api != openai.CountTokens
	rank := -1
	if metered {
		var ferr *openai.Error
		if rank, ferr = h.classOf(r, key); ferr != nil {
			return refuse(ferr), tgt.Base
		}
	}
	var grant *flow.Grant
	defer func() {
		if grant != nil {
			grant.Done(h.cfg.Flow.Weighted(float64(used.Input), float64(used.Output)), used.Known)
		}
	}()
	var events *openai.EventCounter
	// next is an alias's fallback, served instead of resolving the name
	// again (design §7.9); missingRetries counts the adapter retries.
	var next *director.Target
	missingRetries := 0
	caller := director.Caller{Key: key.GetName(), Session: r.Header.Get("X-Session-Id")}
	for try := 0; ; try++ {
		// 2. Resolve the model, adapter or alias, and the replicas that may serve it.
		var aerr *openai.Error
		if next != nil {
			tgt, next = *next, nil
		} else {
			// Again after an adapter's 404s: an alias is drawn again (a
			// sticky one lands where it did).
			rsp := h.stage(sp, "llmgw.resolve")
			tgt, aerr = h.dir.ResolveFor(r.Context(), req.Model, caller, reqLog)
			if rsp != nil {
				rsp.end(aerr)
			}
		}
		if sp != nil && aerr == nil {
			resolved(sp, api, tgt)
		}
		if aerr != nil {
			if (tgt.Adapter != "" || tgt.Alias != "") && r.Context().Err() != nil {
				return proxy.ClientClosed, tgt.Base
			}
			return refuse(aerr), tgt.Base
		}
		if err := checkTask(tgt, api); err != nil {
			return refuse(err), tgt.Base
		}
		log := rh.withTarget(tgt.Base, tgt.Adapter)

		// 3. Prepare: the engine's body, tier 1's hashes, tier 2's query.
		psp := h.stage(sp, "llmgw.prepare")
		plan, aerr = h.dir.Prepare(r.Context(), tgt, director.Input{ID: rid, Session: h.session(r.Header),
			Kind: tokenKind(api), API: api, Body: body, Stream: req.Stream, Prompt: req.Prompt})
		if psp != nil {
			if aerr != nil {
				psp.end(aerr)
			} else {
				psp.end(nil, prepared(plan)...)
				plan.TraceWith(schedTrace{sp})
			}
		}
		if aerr != nil {
			return refuse(aerr), tgt.Base
		}

		// 3b. Admit against the tenant's limits, once: the prompt's tokens
		// are known now when tier 2 tokenized it.
		if try == 0 && h.cfg.Quota != nil && metered {
			var qerr *openai.Error
			qsp := h.stage(sp, "llmgw.admit")
			ticket, qerr = h.admit(w, api, key, tgt, plan, body)
			if qsp != nil {
				in, out := ticket.Expected()
				qsp.end(qerr, attribute.String("llmgw.tenant", tenantOf(key)),
					attribute.Float64("llmgw.expected_input_tokens", in), attribute.Float64("llmgw.expected_output_tokens", out))
			}
			if qerr != nil {
				plan.Done("", qerr.Status)
				return refuse(qerr), tgt.Base
			}
		}

		// 3c. Wait for room at saturation, by class and tenant.
		if try == 0 && rank >= 0 {
			var ref *flow.Refusal
			fsp := h.stage(sp, "llmgw.queue")
			grant, ref = h.flow(r.Context(), w, key, tgt, ticket, rank, len(body))
			if fsp != nil {
				var ferr *openai.Error
				kv := []attribute.KeyValue{attribute.String("llmgw.class", h.cfg.Flow.Class(rank))}
				if ref != nil {
					ferr = ref.Err
					kv = append(kv, attribute.String("llmgw.flow_reason", ref.Reason))
				}
				if grant != nil {
					kv = append(kv, attribute.Int64("llmgw.queued_ms", grant.Waited.Milliseconds()))
				}
				fsp.end(ferr, kv...)
			}
			if ref != nil {
				if ref.Err == nil { // the client left while it waited
					plan.Done("", proxy.ClientClosed)
					return proxy.ClientClosed, tgt.Base
				}
				plan.Done("", ref.Err.Status)
				return refuse(ref.Err), tgt.Base
			}
		}
		// 3d. An engine that schedules by priority (vLLM's
		// --scheduling-policy priority) is told the class, 0 the highest,
		// so the engine's own queue keeps the order flow control chose;
		// without classes every request is 0 (design §7.8). vLLM's Messages
		// API takes no priority (it ignores the field), nor does
		// count_tokens schedule anything.
		if vllm.PriorityScheduling(tgt.Model.GetExtraArgs()) && !api.Anthropic() {
			body, err := openai.WithPriority(plan.Body, max(rank, 0))
			if err != nil {
				plan.Done("", http.StatusBadRequest)
				return refuse(openai.InvalidField("priority", "the body is not a JSON object")), tgt.Base
			}
			plan.Body = body
		}
		tail := plan.Tail()
		if ticket != nil && plan.Stream {
			// A stream the client cancels has no usage chunk: its events
			// are the tokens it was sent.
			events = &openai.EventCounter{Next: tail, API: api}
			tail = events
		}

		// 4 and 5. Schedule each attempt (the plan is the route) and forward.
		if try == 0 && counted {
			h.cfg.Demand.Sent(tgt.Base)
		}
		res = h.fwd.Serve(w, r, &proxy.Request{Route: plan, Replicas: len(plan.Endpoints),
			Name: tgt.Name, Model: tgt.Base, Adapter: tgt.Adapter, API: api,
			Body: plan.Body, Stream: plan.Stream, StripUsage: plan.StripUsage, Tail: tail,
			Divert: plan.Divert(), Start: start, Log: log, Tracer: h.tracer})
		// An alias's target refused before any byte reached the client:
		// the next of its candidates serves instead (design §7.9).
		if res.Err != nil && len(res.Missing) == 0 && tgt.Alias != "" && r.Context().Err() == nil {
			if fb, ok := h.dir.Fallback(r.Context(), tgt, res.Code, res.Diverted, log); ok {
				plan.Done("", http.StatusBadGateway) // close the attempt's record
				next = &fb
				continue
			}
		}
		if res.Err == nil || len(res.Missing) == 0 || missingRetries == adapterRetries {
			break
		}
		missingRetries++
		// Every attempt failed: the plan's last record (its queued prefill,
		// its speculative entries) is closed before the next one.
		plan.Done("", http.StatusBadGateway)
		h.dir.AdapterMissing(tgt.Adapter, res.Missing)
		log.Info("router: no replica tried holds the adapter; waiting for a holder", "replicas", len(res.Missing))
	}
	if res.Err != nil {
		plan.Done("", http.StatusBadGateway) // close the last attempt's record
		return refuse(res.Err), tgt.Base
	}

	// 6. Account: tier 2's prediction against what the engine reported
	// (the caller records the metrics), and the tenant's usage.
	if ticket != nil && res.Replica != nil {
		used = usedBy(plan, ticket, events, api)
	}
	var rec *capture.Request
	capOut, capOK := 0, false // the answer's output tokens, for the capture
	if h.cfg.Capture != nil {
		rec = h.captured(r, api, key, tgt, plan, len(body), start)
	}
	if res.Replica != nil {
		if sp != nil {
			usageAttrs(sp, plan)
			sp.SetAttributes(attribute.String("llmgw.replica", res.Replica.ReplicaID))
		}
		out, ok := plan.Done(res.Replica.ReplicaID, res.Code)
		capOut, capOK = out, ok
		h.m.perReplica(tgt.Base, res.Replica.ReplicaID, res.Code, out, ok)
	}
	if counted && res.Code == http.StatusOK && !res.FirstByte.IsZero() {
		h.cfg.Demand.FirstToken(tgt.Base, res.FirstByte.Sub(ttftFrom))
	}
	if rec != nil {
		h.capture(rec, api, body, res, capOut, capOK)
	}
	return res.Code, tgt.Base
}

// holdHeader is the time an answer's request waited in the waiting room.
const holdHeader = "X-Llmgw-Hold-Ms"

// spec is the desired state of the model called name; nil when there is
// none ("" included).
func (h *Handler) spec(name string) *llmgwv1.Model {
	if name == "" {
		return nil
	}
	ms := h.desired.Models()
	if i, ok := slices.BinarySearchFunc(ms, name, func(m *llmgwv1.Model, n string) int { return strings.Compare(m.GetName(), n) }); ok {
		return ms[i]
	}
	return nil
}

// admit asks the tenants' admission for the request and sets the
// x-ratelimit-* headers on the answer, whichever it is.
func (h *Handler) admit(w http.ResponseWriter, api openai.API, key *llmgwv1.ApiKey, tgt director.Target, plan *director.Plan, body []byte) (*quota.Ticket, *openai.Error) {
	q := quota.Request{Tenant: tenantOf(key), Model: tgt.Name, Base: tgt.Base}
	if n, ok := plan.PromptTokens(); ok {
		q.Input, q.InputExact = n, true
	} else {
		// Without tier 2's tokens: estimated from the body's length,
		// settled with the engine's count.
		q.Bytes = len(body)
	}
	if n, ok := openai.MaxTokensFor(api, body); ok {
		q.MaxTokens = n
	}
	ticket, refusal, hd := h.cfg.Quota.Admit(q)
	setRateHeaders(w.Header(), hd)
	return ticket, refusal
}

// classOf is the rank of the request's priority class (-1: no flow
// control), or the 400 for a header naming no class.
func (h *Handler) classOf(r *http.Request, key *llmgwv1.ApiKey) (int, *openai.Error) {
	if h.cfg.Flow == nil || !h.cfg.Flow.Enabled() {
		return -1, nil
	}
	var t *llmgwv1.Tenant
	if h.cfg.Tenants != nil {
		t = h.cfg.Tenants()[tenantOf(key)]
	}
	return h.cfg.Flow.Resolve(r.Header.Get(flowPriorityHeader), t.GetDefaultClass(), t.GetMaxClass())
}

// The headers of flow control: the class asked for, and answered with the
// class served; the reason of a flow-control 429; the time queued.
const (
	flowPriorityHeader = "X-Llmgw-Priority"
	flowReasonHeader   = "X-Llmgw-Flow-Reason"
	flowQueuedHeader   = "X-Llmgw-Queue-Ms"
)

// flow asks flow control to let the request on, and writes the class (and
// the time it waited, or why it was refused) on the answer's headers.
func (h *Handler) flow(ctx context.Context, w http.ResponseWriter, key *llmgwv1.ApiKey, tgt director.Target, ticket *quota.Ticket, rank, bytes int) (*flow.Grant, *flow.Refusal) {
	in, out := ticket.Expected()
	g, ref := h.cfg.Flow.Admit(ctx, flow.Request{Model: tgt.Base, Tenant: tenantOf(key), Rank: rank, Bytes: bytes,
		Cost: h.cfg.Flow.Weighted(in, out)})
	hd := w.Header()
	hd.Set(flowPriorityHeader, h.cfg.Flow.Class(rank))
	if ref != nil && ref.Reason != "" {
		hd.Set(flowReasonHeader, ref.Reason)
	}
	if g != nil && g.Waited > 0 {
		hd.Set(flowQueuedHeader, strconv.FormatInt(g.Waited.Milliseconds(), 10))
	}
	return g, ref
}

// tenantOf is the tenant a key's requests count against: its own, or the
// one named like the key (fsm.EffectiveTenant); "" without a key.
func tenantOf(k *llmgwv1.ApiKey) string {
	if k == nil {
		return ""
	}
	if t := k.GetTenant(); t != "" {
		return t
	}
	return k.GetName()
}

// setRateHeaders writes OpenAI's x-ratelimit-* headers.
func setRateHeaders(h http.Header, hd quota.Headers) {
	if hd.HasRequests {
		h.Set("X-Ratelimit-Limit-Requests", strconv.FormatUint(hd.LimitRequests, 10))
		h.Set("X-Ratelimit-Remaining-Requests", strconv.FormatUint(hd.RemainingRequests, 10))
		h.Set("X-Ratelimit-Reset-Requests", resetString(hd.ResetRequests))
	}
	if hd.HasTokens {
		h.Set("X-Ratelimit-Limit-Tokens", strconv.FormatUint(hd.LimitTokens, 10))
		h.Set("X-Ratelimit-Remaining-Tokens", strconv.FormatUint(hd.RemainingTokens, 10))
		h.Set("X-Ratelimit-Reset-Tokens", resetString(hd.ResetTokens))
	}
}

// resetString is a reset time as OpenAI writes it ("20ms", "1s", "6m0s").
func resetString(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// usedBy is what a served request used: the answer's usage block, or for
// a stream cut before it (the client went away) the events carrying
// tokens it was sent — a chat stream's first being the role's — with the
// prompt as admitted.
func usedBy(plan *director.Plan, ticket *quota.Ticket, events *openai.EventCounter, api openai.API) quota.Usage {
	if u, ok := plan.Usage(); ok {
		cached := 0
		if u.PromptTokensDetails != nil {
			cached = u.PromptTokensDetails.CachedTokens
		}
		return quota.Usage{Input: u.PromptTokens, Cached: cached, Output: u.CompletionTokens, Known: true}
	}
	if events == nil {
		return quota.Usage{}
	}
	out := events.Events
	if api == openai.Chat {
		out--
	}
	return quota.Usage{Input: ticket.Input(), Output: max(0, out), Known: true, Cut: true}
}

// tokenKind is the prompt form tier 2 tokenizes a request of api in.
func tokenKind(api openai.API) tokenize.Kind {
	switch api {
	case openai.Completions:
		return tokenize.Completion
	case openai.Responses:
		return tokenize.Responses
	case openai.Messages:
		return tokenize.Messages
	case openai.Embeddings, openai.CountTokens:
		return tokenize.None
	}
	return tokenize.Chat
}

// checkTask refuses a model on an endpoint of the other task, as vLLM
// would (a pooling runner serves no completions, a generating one no
// embeddings), before a replica is bothered with it.
func checkTask(tgt director.Target, api openai.API) *openai.Error {
	embed := tgt.Model.GetTask() == "embed"
	switch {
	case embed && api != openai.Embeddings:
		return openai.WrongTask(tgt.Name, "embed", api.Path(), openai.PathEmbeddings)
	case !embed && api == openai.Embeddings:
		return openai.WrongTask(tgt.Name, "generate", api.Path(),
			"/v1/chat/completions, /v1/completions, /v1/responses or /v1/messages")
	}
	return nil
}

// adapterRetries is how many times a request is resolved again after its
// adapter's holders all answered 404: a holder that unloaded it is marked
// for a couple of seconds, so each retry waits for a fresh holder.
const adapterRetries = 2

// mayUse reports whether key may use the model or adapter called name, and
// the base model it names when it exists ("" otherwise), for the metrics.
func (h *Handler) mayUse(key *llmgwv1.ApiKey, name string) (string, bool) {
	base := ""
	if _, known := h.desired.Lookup(name); known {
		base = name
	} else if ref, ok := h.desired.Adapter(name); ok {
		base = ref.Model
	}
	adapterOf := ""
	if base != name {
		adapterOf = base
	}
	return base, auth.Allows(key, name, adapterOf)
}

// decode is stage 1: the body within MaxBodyBytes, and what the router
// reads of it.
func (h *Handler) decode(w http.ResponseWriter, r *http.Request, api openai.API) ([]byte, openai.Request, *openai.Error) {
	body, err := readBody(w, r, h.cfg.MaxBodyBytes)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, openai.Request{}, openai.TooLarge(h.cfg.MaxBodyBytes)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) { // the server's body timeout
			return nil, openai.Request{}, openai.BodyTimeout()
		}
		return nil, openai.Request{}, openai.InvalidField("", "reading the body: "+err.Error())
	}
	req, err := openai.SniffFor(api, body)
	if err != nil {
		var ae *openai.Error
		errors.As(err, &ae)
		return nil, openai.Request{}, ae
	}
	return body, req, nil
}

// readBody reads the request body within limit: into one buffer of the
// declared length when the client sent one (io.ReadAll would grow its
// buffer several times for a large prompt), else as io.ReadAll does.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	src := http.MaxBytesReader(w, r.Body, limit)
	if n := r.ContentLength; n > 0 && n <= limit {
		body := make([]byte, n)
		if _, err := io.ReadFull(src, body); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, fmt.Errorf("the body ended before its Content-Length: %w", err)
			}
			return nil, err
		}
		return body, nil
	}
	return io.ReadAll(src)
}

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inflight prometheus.Gauge
	// Per replica: what an operator asks first of a replica ("how much does
	// it serve?"), which the engines' own metrics answer only where they
	// are scraped. Label sets of replicas that left are deleted (Forget).
	replicaRequests *prometheus.CounterVec
	replicaOutput   *prometheus.CounterVec

	seenMu sync.Mutex
	seen   map[string]struct{} // replica ids with label sets
}

// perReplica counts an answer replica gave: its status, and its output
// tokens when the answer said (ok).
func (m *metrics) perReplica(model, replica string, code, output int, ok bool) {
	m.seenMu.Lock()
	m.seen[replica] = struct{}{}
	m.seenMu.Unlock()
	m.replicaRequests.WithLabelValues(model, replica, codeLabel(code)).Inc()
	if ok {
		m.replicaOutput.WithLabelValues(model, replica).Add(float64(output))
	}
}

// ForgetReplicas deletes the per-replica series of every replica keep
// refuses (one no longer placed), so the router's series do not grow with
// every replica the cluster ever had. The router calls it with its other
// forgetting (design §7.5 "Forget").
func (h *Handler) ForgetReplicas(keep func(replica string) bool) {
	m := h.m
	m.seenMu.Lock()
	var gone []string
	for id := range m.seen {
		if !keep(id) {
			gone = append(gone, id)
			delete(m.seen, id)
		}
	}
	m.seenMu.Unlock()
	for _, id := range gone {
		m.replicaRequests.DeletePartialMatch(prometheus.Labels{"replica": id})
		m.replicaOutput.DeletePartialMatch(prometheus.Labels{"replica": id})
	}
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_requests_total",
			Help: "Completion requests by model, HTTP status (499: the client went away) and API key name (\"\": none).",
		}, []string{"model", "code", "key"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmgw_router_request_duration_seconds", Help: "End-to-end request latency.", Buckets: proxy.LatencyBuckets(),
		}, []string{"model"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_router_inflight", Help: "Completion requests being served.",
		}),
		replicaRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_replica_requests_total",
			Help: "Answers by the replica that gave them, with their HTTP status; requests no replica answered are only in llmgw_router_requests_total.",
		}, []string{"model", "replica", "code"}),
		replicaOutput: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_replica_output_tokens_total",
			Help: "Output tokens (usage.completion_tokens) of the successful answers each replica gave: rate() is its output tokens per second.",
		}, []string{"model", "replica"}),
		seen: map[string]struct{}{},
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration, m.inflight, m.replicaRequests, m.replicaOutput)
	}
	return m
}
