// Package tokenize turns a request's prompt into the engine's token ids
// through a replica's /tokenize (design §7.5 tier 2, step 4), so the router can
// hash the prompt's blocks exactly as the engine will.
//
// Through the engine rather than a tokenizer in the router, because only the
// engine knows its chat template: tools, chat_template_kwargs and the
// generation prompt all change the tokens, and a router that guessed would
// hash a prompt the engine never sees. The price is a round trip, so answers
// are cached and bounded by a budget past which the caller falls back to
// tier 1 — a late answer is worth less than a guess on time.
package tokenize

import (
	"bytes"
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmgw/llmgw/internal/configfile"
	"github.com/llmgw/llmgw/vllm"
)

// Config configures a Client. Start from DefaultConfig.
type Config struct {
	// Budget bounds one tokenization, the engine's round trip included;
	// past it the request is routed by tier 1 (design §7.5: about 20 ms).
	// Flag --tokenize-budget.
	Budget time.Duration `yaml:"tokenize_budget"`
	// CacheTokens bounds the cached answers by their total token count
	// (8 bytes each): LRU beyond it.
	CacheTokens int `yaml:"tokenize_cache_tokens"`
	// MaxResponseBytes bounds an engine's /tokenize answer.
	MaxResponseBytes int64 `yaml:"tokenize_max_response_bytes"`
}

// DefaultConfig is a 20 ms budget and 4 Mi cached tokens (32 MiB).
func DefaultConfig() Config {
	return Config{Budget: 20 * time.Millisecond, CacheTokens: 4 << 20, MaxResponseBytes: 16 << 20}
}

// Validate reports every bad field, each named by its flag and
// configuration key, or by the key alone where there is no flag.
func (c Config) Validate() error {
	var p configfile.Problems
	if c.Budget <= 0 {
		p.Add(configfile.Flag("tokenize-budget"), "must be positive, got %s", c.Budget)
	}
	if c.CacheTokens < 0 {
		p.Add("tokenize_cache_tokens", "must not be negative, got %d", c.CacheTokens)
	}
	if c.MaxResponseBytes <= 0 {
		p.Add("tokenize_max_response_bytes", "must be positive, got %d", c.MaxResponseBytes)
	}
	return p.Err()
}

// Why a prompt was not tokenized; each is a reason for tier 1, not a
// failure of the request.
var (
	// ErrMultimodal: the prompt has images or audio, whose placeholder
	// tokens and hashes the router cannot reproduce (design §7.5).
	ErrMultimodal = errors.New("tokenize: multimodal prompt")
	// ErrUnsupported: a prompt shape tier 2 does not handle (a batch of
	// prompts, no prompt at all, unreadable messages).
	ErrUnsupported = errors.New("tokenize: unsupported prompt")
	// ErrTimeout: the engine did not answer within the budget.
	ErrTimeout = errors.New("tokenize: over budget")
	// ErrEngine: the engine refused or garbled the request.
	ErrEngine = errors.New("tokenize: engine error")
)

// Kind says which endpoint a body was sent to.
type Kind uint8

const (
	// Chat is /v1/chat/completions: tokenized in /tokenize's chat form.
	Chat Kind = iota
	// Completion is /v1/completions: the prompt form.
	Completion
	// Responses is OpenAI's Responses API, /v1/responses: its input turned
	// into chat messages as vLLM does (convert.go), then the chat form.
	Responses
	// Messages is Anthropic's Messages API, /v1/messages: its system,
	// messages and tools turned into OpenAI's as vLLM does (convert.go),
	// then the chat form.
	Messages
	// None is a request tier 2 does not route by, as it runs no prompt
	// through the engine (count_tokens): never tokenized.
	None
)

// Request is a prepared /tokenize call: the body to send and the key its
// answer is cached under. Prepare builds it from the client's body.
type Request struct {
	body []byte
	key  [sha256.Size]byte
	// tokens is set when the prompt is token ids already.
	tokens []int
}

// Prepare reads the fields of an OpenAI request body that decide its tokens
// and builds the /tokenize body for model (the base model's served name:
// adapters share their base's tokenizer). Every field that changes the chat
// template's output is carried; nothing else is, so requests differing only
// in sampling share a cache entry.
func Prepare(kind Kind, model string, body []byte) (Request, error) {
	var f struct {
		Messages             json.RawMessage `json:"messages"`
		Prompt               json.RawMessage `json:"prompt"`
		Tools                json.RawMessage `json:"tools"`
		ChatTemplate         json.RawMessage `json:"chat_template"`
		ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
		AddGenerationPrompt  json.RawMessage `json:"add_generation_prompt"`
		ContinueFinalMessage json.RawMessage `json:"continue_final_message"`
		AddSpecialTokens     json.RawMessage `json:"add_special_tokens"`
		Documents            json.RawMessage `json:"documents"`
	}
	if err := json.Unmarshal(body, &f); err != nil {
		return Request{}, fmt.Errorf("%w: %w", ErrUnsupported, err)
	}
	out := map[string]json.RawMessage{}
	set := func(k string, v json.RawMessage) {
		if len(v) > 0 && string(v) != "null" {
			out[k] = v
		}
	}
	m, err := json.Marshal(model)
	if err != nil {
		return Request{}, fmt.Errorf("%w: model: %w", ErrUnsupported, err)
	}
	out["model"] = m
	switch kind {
	case Chat:
		if err := checkMessages(f.Messages); err != nil {
			return Request{}, err
		}
		set("messages", f.Messages)
		set("tools", f.Tools)
		set("chat_template", f.ChatTemplate)
		set("chat_template_kwargs", f.ChatTemplateKwargs)
		set("add_generation_prompt", f.AddGenerationPrompt)
		set("continue_final_message", f.ContinueFinalMessage)
		set("add_special_tokens", f.AddSpecialTokens)
		set("documents", f.Documents)
	case Responses, Messages:
		return prepareConverted(kind, m, body)
	case Completion:
		var s string
		if json.Unmarshal(f.Prompt, &s) != nil {
			var ids []int
			if json.Unmarshal(f.Prompt, &ids) == nil && len(ids) > 0 {
				return Request{tokens: ids}, nil // the engine takes them as they are
			}
			return Request{}, fmt.Errorf("%w: prompt is not one string or one token list", ErrUnsupported)
		}
		set("prompt", f.Prompt)
		set("add_special_tokens", f.AddSpecialTokens)
	default:
		return Request{}, fmt.Errorf("%w: kind %d", ErrUnsupported, kind)
	}
	// encoding/json sorts map keys, so equal fields give equal bytes.
	b, err := json.Marshal(out)
	if err != nil {
		return Request{}, fmt.Errorf("%w: %w", ErrUnsupported, err)
	}
	return Request{body: b, key: sha256.Sum256(b)}, nil
}

// checkMessages refuses prompts tier 2 cannot hash: no messages, or any
// content part other than text.
func checkMessages(raw json.RawMessage) error {
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &msgs); err != nil || len(msgs) == 0 {
		return fmt.Errorf("%w: messages must be a non-empty list", ErrUnsupported)
	}
	for _, m := range msgs {
		if len(m.Content) == 0 || m.Content[0] != '[' {
			continue
		}
		var parts []struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(m.Content, &parts); err != nil {
			return fmt.Errorf("%w: content: %w", ErrUnsupported, err)
		}
		for _, p := range parts {
			if p.Type != "text" {
				return fmt.Errorf("%w: a %q part", ErrMultimodal, p.Type)
			}
		}
	}
	return nil
}

// Client tokenizes through engines' /tokenize. Safe for concurrent use;
// Close releases its idle connections.
type Client struct {
	cfg  Config
	log  *slog.Logger
	http *http.Client
	tr   *http.Transport
	m    *metrics

	mu     sync.Mutex
	lru    *list.List // of *entry, most recent first
	byKey  map[[sha256.Size]byte]*list.Element
	tokens int
}

type entry struct {
	key    [sha256.Size]byte
	tokens []int
}

// New builds a client; reg receives its metrics (nil for none).
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: cfg.Budget, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
	return &Client{cfg: cfg, log: log, tr: tr, http: &http.Client{Transport: tr}, m: newMetrics(reg),
		lru: list.New(), byKey: make(map[[sha256.Size]byte]*list.Element)}, nil
}

// Close drops idle connections to engines.
func (c *Client) Close() { c.tr.CloseIdleConnections() }

// Tokenize returns req's token ids: from the cache, from the request itself
// (a token-id prompt), or from the engine at addr (host:port) within the
// budget. The returned slice is shared and must not be modified.
func (c *Client) Tokenize(ctx context.Context, addr string, req Request) ([]int, error) {
	if req.tokens != nil {
		return req.tokens, nil
	}
	if req.body == nil {
		return nil, fmt.Errorf("%w: request not prepared", ErrUnsupported)
	}
	if t, ok := c.cached(req.key); ok {
		c.m.results.WithLabelValues("hit").Inc()
		return t, nil
	}
	start := time.Now()
	t, err := c.fetch(ctx, addr, req.body)
	end := time.Now()
	c.m.latency.Observe(end.Sub(start).Seconds())
	traceFetch(ctx, addr, start, end, len(t), err)
	if err != nil {
		switch {
		case errors.Is(err, ErrTimeout):
			c.m.results.WithLabelValues("timeout").Inc()
		default:
			c.m.results.WithLabelValues("error").Inc()
		}
		return nil, err
	}
	c.m.results.WithLabelValues("miss").Inc()
	c.store(req.key, t)
	return t, nil
}

// traceSpanMin is how long an engine's /tokenize must take to be a span of
// its own in the request's trace (the router's rule for its stages,
// design §9 "Tracing"); a quicker one is not recorded beyond tier 2's
// llmgw.tokenized event and the prepare stage's duration.
const traceSpanMin = time.Millisecond

// traceFetch records a /tokenize call to the engine at addr in the trace
// of the request whose context is ctx, when it is recorded and the call
// was slow or failed: a child span of the request's, client kind, with
// the engine's address, so a slow tokenizer shows in the trace. Cache
// hits and token-id prompts ask no engine and are not recorded.
func traceFetch(ctx context.Context, addr string, start, end time.Time, tokens int, err error) {
	if err == nil && end.Sub(start) < traceSpanMin {
		return
	}
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return
	}
	_, sp := parent.TracerProvider().Tracer(tracerName).Start(ctx, "llmgw.tokenize",
		trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(start))
	if host, port, serr := net.SplitHostPort(addr); serr == nil {
		sp.SetAttributes(attribute.String("server.address", host), attribute.String("server.port", port))
	}
	if err != nil {
		kind := "engine_error"
		if errors.Is(err, ErrTimeout) {
			kind = "timeout"
		}
		sp.SetAttributes(attribute.String("error.type", kind))
		sp.SetStatus(codes.Error, kind)
	} else {
		sp.SetAttributes(attribute.Int("llmgw.prompt_tokens", tokens))
	}
	sp.End(trace.WithTimestamp(end))
}

// tracerName is the instrumentation scope of the router's spans
// (router/api's).
const tracerName = "github.com/llmgw/llmgw/router"

func (c *Client) fetch(ctx context.Context, addr string, body []byte) ([]int, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Budget)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrEngine, addr, err)
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(hr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrTimeout, addr, err)
		}
		return nil, fmt.Errorf("%w: %s: %w", ErrEngine, addr, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, c.cfg.MaxResponseBytes+1))
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrTimeout, addr, err)
		}
		return nil, fmt.Errorf("%w: %s: reading the answer: %w", ErrEngine, addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: %s answered %s: %.200s", ErrEngine, addr, resp.Status, raw)
	}
	if int64(len(raw)) > c.cfg.MaxResponseBytes {
		return nil, fmt.Errorf("%w: %s: answer over %d bytes", ErrEngine, addr, c.cfg.MaxResponseBytes)
	}
	return DecodeResponse(raw)
}

// DecodeResponse reads a /tokenize answer: its tokens, which must be as
// many as its count says when it says.
func DecodeResponse(raw []byte) ([]int, error) {
	var r vllm.TokenizeResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("%w: decoding the answer: %w", ErrEngine, err)
	}
	if r.Tokens == nil {
		return nil, fmt.Errorf("%w: answer without tokens", ErrEngine)
	}
	if r.Count != 0 && r.Count != len(r.Tokens) {
		return nil, fmt.Errorf("%w: count %d but %d tokens", ErrEngine, r.Count, len(r.Tokens))
	}
	return r.Tokens, nil
}

func (c *Client) cached(k [sha256.Size]byte) ([]int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[k]
	if !ok {
		return nil, false
	}
	c.lru.MoveToFront(el)
	return el.Value.(*entry).tokens, true
}

func (c *Client) store(k [sha256.Size]byte, t []int) {
	if len(t) > c.cfg.CacheTokens {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byKey[k]; ok {
		return // a concurrent miss stored it first
	}
	c.byKey[k] = c.lru.PushFront(&entry{key: k, tokens: t})
	c.tokens += len(t)
	for c.tokens > c.cfg.CacheTokens {
		el := c.lru.Back()
		e := el.Value.(*entry)
		c.lru.Remove(el)
		delete(c.byKey, e.key)
		c.tokens -= len(e.tokens)
	}
	c.m.cached.Set(float64(c.tokens))
}

type metrics struct {
	results *prometheus.CounterVec
	latency prometheus.Histogram
	cached  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_tokenize_total",
			Help: "Tokenizations for tier 2 by result: hit (cache), miss (asked the engine), timeout (over budget), error.",
		}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "llmgw_router_tokenize_seconds",
			Help:    "Time an engine's /tokenize took (cache misses only; cut at the budget).",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1},
		}),
		cached: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_router_tokenize_cached_tokens", Help: "Tokens held in the tokenize cache.",
		}),
	}
	for _, r := range []string{"hit", "miss", "timeout", "error"} {
		m.results.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.results, m.latency, m.cached)
	}
	return m
}
