// Package proxy is the last stage of the router's request pipeline: it
// forwards a planned request to the replica its route chooses and streams
// the answer back as it arrives, flushing every read so SSE chunks reach
// the client one by one (design §7.1). A replica that fails before the
// first byte reached the client — a connection error, a 5xx, a 404 for an
// adapter it was thought to hold — is given up for another the route
// chooses, never one already tried; once the answer has started it is the
// answer, whatever happens to it (design §7.4). Each attempt passes the
// replica's circuit breaker and reports its outcome to it.
//
// It knows connections and bytes, not models: where to go next is the
// route's decision (router/director), what the client sees on a refusal is
// the caller's (router/api).
package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/openai"
	"github.com/llmgw/llmgw/router/scheduler"
)

// ClientClosed is the status recorded when the client went away before it
// had its answer (nginx's 499); nothing more is written to it.
const ClientClosed = 499

// Route chooses each attempt's replica and learns where the request went
// (director.Plan). It belongs to one request; its methods are called from
// that request's goroutine, in the order Next, then at most one Accepted.
type Route interface {
	// Next returns the replica for the next attempt, among the request's
	// endpoints not in tried, and its key; nil when none can take it now.
	Next(tried []*endpoint.Endpoint) (*endpoint.Endpoint, scheduler.Key)
	// Accepted is told that the replica Next returned last accepted the
	// request: its answer is about to reach the client.
	Accepted()
}

// Breakers are the per-replica circuit breakers (breaker.Set). Safe for
// concurrent use.
type Breakers interface {
	// Get returns the replica's breaker, creating a closed one.
	Get(k scheduler.Key) *breaker.Breaker
}

// Config configures a Proxy. Zero values take DefaultConfig's.
type Config struct {
	// ConnectTimeout bounds dialling an engine.
	ConnectTimeout time.Duration
	// FirstByteTimeout bounds the wait for an engine's response headers. A
	// non-streamed completion sends its headers only when it is done, so
	// this is also the longest non-streamed generation.
	FirstByteTimeout time.Duration
	// MaxAttempts bounds the replicas tried for one request (design §7.4).
	MaxAttempts int
	// ClientWriteTimeout bounds how long one write of the answer to the
	// client may block: a client that stops reading a stream (its
	// connection still open, its window shut) is taken to have gone once
	// a write has waited this long, and the engine's request is cancelled
	// with it, rather than holding a place in the engine's batch until the
	// generation's end. It bounds a stall, not a slow reader: each write
	// that goes through starts the bound anew.
	ClientWriteTimeout time.Duration
}

// DefaultConfig returns the defaults of design §7.1 and §7.4: three
// attempts, each bounded by a 2 s connect and a 5 min first-byte timeout,
// and a client's write stalled for 30 s ends its request.
func DefaultConfig() Config {
	return Config{
		ConnectTimeout:     2 * time.Second,
		FirstByteTimeout:   5 * time.Minute,
		MaxAttempts:        3,
		ClientWriteTimeout: 30 * time.Second,
	}
}

// Request is one planned request as the proxy forwards it.
type Request struct {
	// Route chooses the replicas; Replicas is how many it chooses among,
	// so the attempt that has tried them all knows it is the last.
	Route    Route
	Replicas int
	// Name is `model` as the client sent it (for the 503 when no replica
	// takes it); Model the base model, the metrics' label.
	Name, Model string
	// Adapter, when set, makes an engine's 404 before the first byte a
	// reason to try another replica (design §7.6).
	Adapter string
	// API is the API the request was sent to: what ends its stream.
	API openai.API
	// Body is what goes to the engine.
	Body   []byte
	Stream bool
	// StripUsage drops the usage chunk the router added to the stream.
	StripUsage bool
	// Tail, when set, receives a copy of the accepted answer's bytes.
	Tail io.Writer
	// Divert, when set, is asked about an answer of status 400 or more
	// before any byte of it reaches the client (a 5xx from an attempt
	// that is not the last is retried on another replica first, as
	// always), with up to DivertPeek bytes of its body. An answer it
	// claims is not passed on and no other replica is tried: Serve
	// returns with Result.Diverted set, and the caller serves the request
	// from another model (an alias's fallback, design §7.9).
	Divert func(code int, body []byte) bool
	// Start is when the request arrived, for the time to first byte.
	Start time.Time
	// Log is the request's logger.
	Log *slog.Logger
	// Tracer, when set, traces each attempt under the span in the
	// request's context (trace.go); nil: tracing off.
	Tracer trace.Tracer
}

// Result is how a request ended.
type Result struct {
	// Code is the status the client got; ClientClosed when it went away.
	Code int
	// Replica is the endpoint whose answer the client got; nil when none.
	Replica *endpoint.Endpoint
	// Err, when set, is the refusal to send: no replica answered and
	// nothing has been written to the client yet. Code is then its status.
	Err *openai.Error
	// Missing are the replicas that answered 404 for Request.Adapter
	// (never passed to the client: the caller may wait for a holder and
	// serve the request again, design §7.6).
	Missing []*endpoint.Endpoint
	// FirstByte is when a streamed answer's first byte went to the
	// client — the point llmgw_router_ttft_seconds observes, the time to
	// first token; zero for an answer not streamed (its first byte is its
	// last) and for none.
	FirstByte time.Time
	// Diverted is set when Request.Divert claimed the answer: nothing was
	// written, Code is the engine's status and Err the engine's error as
	// the client would have seen it.
	Diverted bool
}

// DivertPeek bounds the body of an answer Request.Divert is shown: an
// engine's error body is a few hundred bytes.
const DivertPeek = 16 << 10

// divertedError is an answer Request.Divert claimed.
type divertedError struct {
	code int
	body []byte
}

func (e *divertedError) Error() string { return fmt.Sprintf("answer %d diverted", e.code) }

// Proxy forwards requests to engines. Safe for concurrent use; Close drops
// its idle upstream connections.
type Proxy struct {
	cfg      Config
	breakers Breakers
	up       *upstream
	m        *metrics
	// bufs are the copy loop's 32 KiB buffers, reused: one per request
	// would be the data path's largest allocation.
	bufs sync.Pool
}

// New returns a proxy; reg receives its metrics (nil for none).
func New(cfg Config, breakers Breakers, reg prometheus.Registerer) *Proxy {
	d := DefaultConfig()
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = d.ConnectTimeout
	}
	if cfg.FirstByteTimeout <= 0 {
		cfg.FirstByteTimeout = d.FirstByteTimeout
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = d.MaxAttempts
	}
	if cfg.ClientWriteTimeout <= 0 {
		cfg.ClientWriteTimeout = d.ClientWriteTimeout
	}
	return &Proxy{
		cfg: cfg, breakers: breakers,
		// Engines speak plain HTTP/1.1, uncompressed (compression would
		// hold SSE chunks back).
		up:   newUpstream(cfg.ConnectTimeout, cfg.FirstByteTimeout),
		m:    newMetrics(reg),
		bufs: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }},
	}
}

// Close drops idle upstream connections. Call it once no request runs.
func (p *Proxy) Close() { p.up.close() }

// errAdapterMissing is an engine's 404 for an adapter it was thought to
// hold (it was just evicted, or the engine restarted): retried elsewhere.
var errAdapterMissing = errors.New("the engine does not hold the adapter")

// Serve is stage 5: it forwards req to the replicas its route chooses
// until one answers, and settles each attempt with the replica's breaker.
// A replica whose breaker refuses it (another request holds its probe) is
// skipped without counting as an attempt. When Result.Err is set nothing
// has been written and the caller answers with it.
func (p *Proxy) Serve(w http.ResponseWriter, r *http.Request, req *Request) Result {
	log := req.Log
	// tried holds every replica this request has been sent to, or whose
	// breaker refused it, so each attempt goes somewhere new (design §7.4).
	tried := make([]*endpoint.Endpoint, 0, p.cfg.MaxAttempts)
	var lastErr error
	var missing []*endpoint.Endpoint
	for attempt := 0; attempt < p.cfg.MaxAttempts; {
		ep, key := req.Route.Next(tried)
		if ep == nil {
			break
		}
		tried = append(tried, ep)
		br := p.breakers.Get(key)
		if br.Acquire() != nil {
			continue // another request took its probe; not an attempt
		}
		attempt++
		last := attempt == p.cfg.MaxAttempts || len(tried) == req.Replicas
		ar, sp := startAttempt(r, req, ep, attempt) // trace.go; r itself when not traced
		code, first, err := p.forward(w, ar, req, ep, last, log)
		endAttempt(sp, code, first, err)
		if err == nil {
			settle(br, code)
			return Result{Code: code, Replica: ep, FirstByte: first}
		}
		if r.Context().Err() != nil {
			br.Release()
			log.Info("router: client went away", "replica", ep.ReplicaID)
			return Result{Code: ClientClosed}
		}
		var dv *divertedError
		if errors.As(err, &dv) {
			// The replica answered; its breaker counts the answer as it
			// would have counted it passed on.
			settle(br, dv.code)
			log.Info("router: answer diverted", "replica", ep.ReplicaID, "status", dv.code)
			return Result{Code: dv.code, Err: engineError(dv.code, dv.body), Diverted: true}
		}
		lastErr = err
		if errors.Is(err, errAdapterMissing) {
			// The replica is healthy; the table was a moment behind.
			br.Release()
			p.m.adapterMissing.Inc()
			missing = append(missing, ep)
			log.Info("router: replica does not hold the adapter; trying another", "replica", ep.ReplicaID)
			continue
		}
		br.Failure()
		p.m.upstreamErrors.WithLabelValues(req.Model).Inc()
		log.Warn("router: replica failed before the first byte; trying another", "replica", ep.ReplicaID, "err", err)
	}
	var refusal *openai.Error
	switch {
	case lastErr == nil:
		refusal = openai.NoReplica(req.Name)
	case errors.Is(lastErr, errAdapterMissing):
		refusal = openai.AdapterCold(req.Adapter, "no replica tried holds it now", 1)
	default:
		refusal = openai.Upstream(lastErr)
	}
	return Result{Code: refusal.Status, Err: refusal, Missing: missing}
}

// settle is the breaker's part of accounting for an attempt that
// answered: a 5xx counts against the replica, a client gone counts for
// nothing, anything else is a success.
func settle(br *breaker.Breaker, code int) {
	switch {
	case code == ClientClosed:
		br.Release()
	case code >= 500:
		br.Failure()
	default:
		br.Success()
	}
}

// engineError is an engine's error answer as the client would have seen
// it: its OpenAI body's message, type, param and code where it has them
// (vLLM's, nested under "error" or flat with "object": "error"), else its
// status's text.
func engineError(code int, body []byte) *openai.Error {
	e := &openai.Error{Status: code, Type: "server_error", Message: http.StatusText(code)}
	if code < 500 {
		e.Type = "invalid_request_error"
	}
	if code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable {
		e.RetryAfter = 1
	}
	type fields struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Param   string          `json:"param"`
		Code    json.RawMessage `json:"code"`
	}
	var v struct {
		fields
		Error *fields `json:"error"`
	}
	if json.Unmarshal(body, &v) != nil {
		return e
	}
	f := v.Error
	if f == nil {
		f = &v.fields
	}
	if f.Message != "" {
		e.Message = f.Message
	}
	if f.Type != "" {
		e.Type = f.Type
	}
	e.Param = f.Param
	var c string
	if json.Unmarshal(f.Code, &c) == nil {
		e.Code = c
	}
	return e
}

// hopHeaders are per-connection headers a proxy must not forward (RFC 9110 §7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// credentialHeaders are the client's credentials: they are for the router
// (or whatever stands in front of it), never for an engine, which would
// log them or hand them to whoever controls it. The engines are reached
// without credentials of the client's.
var credentialHeaders = []string{"Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key"}

// dropped reports whether the canonical header key k of the client's
// request stays behind: hop-by-hop fields, credentials and Content-Length
// (the body's own is sent). The rest is written to the engine as it came
// (upConn.write), without copying the header.
func dropped(k string) bool {
	if k == "Content-Length" {
		return true
	}
	for _, h := range hopHeaders {
		if k == h {
			return true
		}
	}
	for _, h := range credentialHeaders {
		if k == h {
			return true
		}
	}
	return false
}

// forward sends the request to ep. It returns an error only while nothing
// has been written to the client — a connection failure, a 5xx when
// another replica may still be tried (last is false), or an adapter's 404 —
// so the caller may retry elsewhere (design §7.4). Once the response has
// started, it is the answer, whatever happens to it; the route's Accepted
// runs just before, so the scheduler records where the request really went
// (design §7.5). first is when a stream's first byte went to the client.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, req *Request, ep *endpoint.Endpoint, last bool, log *slog.Logger) (code int, first time.Time, err error) {
	body := req.Body
	release := ep.Acquire()
	defer release()

	// The request's context: a client that goes away cancels the engine's work.
	resp, err := p.up.roundTrip(r.Context(), ep.Address, r.URL.RequestURI(), r.Header, body)
	if err != nil {
		return 0, first, fmt.Errorf("replica %s at %s: %w", ep.ReplicaID, ep.Address, err)
	}
	if sp := trace.SpanFromContext(r.Context()); sp.IsRecording() {
		sp.AddEvent("llmgw.response_head", trace.WithAttributes(attribute.Int("http.response.status_code", resp.StatusCode)))
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 500 && !last {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return 0, first, fmt.Errorf("replica %s answered %s", ep.ReplicaID, resp.Status)
	}
	if resp.StatusCode == http.StatusNotFound && req.Adapter != "" {
		// Even on the last attempt: the table said it holds the adapter,
		// so this 404 is the table being behind, not the client's error.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return 0, first, fmt.Errorf("replica %s, adapter %s: %w", ep.ReplicaID, req.Adapter, errAdapterMissing)
	}
	if req.Divert != nil && resp.StatusCode >= 400 {
		peek, _ := io.ReadAll(io.LimitReader(resp.Body, DivertPeek))
		if req.Divert(resp.StatusCode, peek) {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			return 0, first, &divertedError{code: resp.StatusCode, body: peek}
		}
		// Not claimed: the answer goes on whole, what was read first.
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(peek), resp.Body), resp.Body}
	}

	req.Route.Accepted()
	hdr := w.Header()
	for k, v := range resp.Header {
		hdr[k] = v
	}
	for _, k := range hopHeaders {
		hdr.Del(k)
	}
	strip := req.StripUsage && resp.StatusCode == http.StatusOK
	// A sized answer that is not a stream passes with its length and is
	// not flushed per read: the server then sends header and body in one
	// write, unchunked, as a plain proxy would. Anything else is framed
	// by the server and flushed every read, so SSE events go out at once.
	sized := !req.Stream && !strip && resp.ContentLength >= 0
	if !sized {
		hdr.Del("Content-Length")
	}
	hdr.Set("X-Llmgw-Replica", ep.ReplicaID)
	if id := r.Header["X-Request-Id"]; id != nil {
		hdr["X-Request-Id"] = id // read only, as the server writes it
	}
	w.WriteHeader(resp.StatusCode)

	var src io.Reader = resp.Body
	if req.Tail != nil {
		src = io.TeeReader(resp.Body, req.Tail) // the tail keeps the usage for tier 2's accounting
	}
	var dst io.Writer = w
	var stripper *openai.UsageStripper
	if strip {
		stripper = openai.NewUsageStripper(w)
		dst = stripper
	}
	var ttft prometheus.Observer
	if req.Stream {
		ttft = p.m.ttft.WithLabelValues(ep.Model)
	}
	bp := p.bufs.Get().(*[]byte)
	c := copier{w: w, dst: dst, flush: !sized, start: req.Start, ttft: ttft, stall: p.cfg.ClientWriteTimeout,
		end: openai.EventCounter{API: req.API}}
	n, err := c.copy(src, *bp)
	p.bufs.Put(bp)
	if stripper != nil && err == nil {
		if ferr := stripper.Flush(); ferr != nil {
			err, c.clientErr = fmt.Errorf("write to client: %w", ferr), true
		}
	}
	first = c.first
	// Delivered whole: the engine's body ended and all of it reached the
	// client, a stream's last event (data: [DONE], message_stop,
	// response.completed) was written and flushed, or a sized body's every
	// byte was. Such an answer is counted by its status, whatever the
	// client does next (closing right after its last event is what SDKs
	// do).
	whole := err == nil || (req.Stream && c.end.Ended()) || (resp.ContentLength >= 0 && n == resp.ContentLength)
	// A write to the client that failed means it went away, whether or
	// not its context says so yet (the server cancels it on a failed
	// write); closing the engine's connection (resp.Body.Close, the body
	// unread) cancels the engine's work.
	gone := r.Context().Err() != nil || c.clientErr
	switch {
	case whole:
	case c.clientErr && errors.Is(err, os.ErrDeadlineExceeded):
		// Connected, but it stopped reading: the write stalled past
		// ClientWriteTimeout.
		p.m.clientStalls.WithLabelValues(ep.Model).Inc()
		log.Info("router: the client stopped reading; cancelling the engine's request", "replica", ep.ReplicaID, "bytes", n, "err", err)
	case !gone:
		// Too late to answer with an error: the client sees a cut stream.
		p.m.upstreamErrors.WithLabelValues(ep.Model).Inc()
		log.Warn("router: response cut short", "replica", ep.ReplicaID, "bytes", n, "err", err)
	}
	log.Debug("router: request done", "replica", ep.ReplicaID, "status", resp.StatusCode, "bytes", n, "whole", whole)
	if !whole && gone {
		return ClientClosed, first, nil
	}
	return resp.StatusCode, first, nil
}

// copier copies an engine's answer to the client (w, or a filter writing
// to w), flushing w after every read when flush is set, so SSE events
// reach the client one by one (but the read that ended the body, which
// the server flushes as the handler returns). Every write (and flush) is
// bounded by stall: a client that stops reading fails the copy instead of
// blocking it for as long as its connection lives.
type copier struct {
	w     http.ResponseWriter
	dst   io.Writer
	flush bool
	start time.Time
	// ttft, when set, observes the time from start to the first byte,
	// which is first (zero without ttft).
	ttft  prometheus.Observer
	first time.Time
	stall time.Duration
	// end follows what was written and flushed, to tell a stream that
	// ended with its last event.
	end openai.EventCounter
	// clientErr is set when the copy failed writing to the client rather
	// than reading from the engine.
	clientErr bool
	// deadline is the write deadline in force; armed tells whether one is.
	deadline time.Time
	armed    bool
}

// copy copies src to the client with buf and returns the bytes written.
func (c *copier) copy(src io.Reader, buf []byte) (n int64, err error) {
	rc := http.NewResponseController(c.w)
	defer func() {
		if c.armed {
			// The connection may carry the client's next request.
			_ = rc.SetWriteDeadline(time.Time{})
		}
	}()
	for {
		k, rerr := src.Read(buf)
		if k > 0 {
			if n == 0 && c.ttft != nil {
				c.first = time.Now()
				c.ttft.Observe(c.first.Sub(c.start).Seconds())
			}
			c.arm(rc)
			if _, err := c.dst.Write(buf[:k]); err != nil {
				c.clientErr = true
				return n, fmt.Errorf("write to client: %w", err)
			}
			n += int64(k)
			// Not when the same read ended the body: the handler returns at
			// once, and the server then writes these bytes and the body's
			// end in one write instead of two.
			if c.flush && rerr != io.EOF {
				if err := rc.Flush(); err != nil {
					c.clientErr = true
					return n, fmt.Errorf("flush to client: %w", err)
				}
			}
			_, _ = c.end.Write(buf[:k])
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, fmt.Errorf("read from engine: %w", rerr)
		}
	}
}

// arm moves the write deadline to stall from now before a write. To spare
// a timer reset on every chunk of a fast stream, the deadline is moved
// only once an eighth of stall has passed since it was last set: a write
// may then fail after between 7/8 and all of stall without progress.
func (c *copier) arm(rc *http.ResponseController) {
	if c.stall <= 0 {
		return
	}
	now := time.Now()
	if c.armed && c.deadline.Sub(now) > c.stall-c.stall/8 {
		return
	}
	c.deadline = now.Add(c.stall)
	// A writer without deadlines (a test's recorder) is bounded by nothing.
	c.armed = rc.SetWriteDeadline(c.deadline) == nil
}

type metrics struct {
	ttft           *prometheus.HistogramVec
	upstreamErrors *prometheus.CounterVec
	// clientStalls counts answers cut because a write to the client
	// stalled past ClientWriteTimeout.
	clientStalls   *prometheus.CounterVec
	adapterMissing prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmgw_router_ttft_seconds", Help: "Time to the first streamed byte sent to the client.", Buckets: LatencyBuckets(),
		}, []string{"model"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_upstream_errors_total",
			Help: "Engine failures: connection errors, 5xx answers retried elsewhere, streams cut short.",
		}, []string{"model"}),
		clientStalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_client_stalls_total",
			Help: "Answers cut because a write to a connected client stalled past --client-write-timeout (a client that stopped reading); the engine's request was cancelled.",
		}, []string{"model"}),
		adapterMissing: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_router_adapter_missing_total",
			Help: "Engine 404s for an adapter the router thought it held, retried elsewhere.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.ttft, m.upstreamErrors, m.clientStalls, m.adapterMissing)
	}
	return m
}

// LatencyBuckets are the buckets of the router's latency histograms, from
// 5 ms to the longest non-streamed generation: one set, so the end-to-end
// and first-byte histograms can be read against each other.
func LatencyBuckets() []float64 {
	return []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
}
