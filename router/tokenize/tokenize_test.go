package tokenize

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/vllm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPrepare(t *testing.T) {
	tests := []struct {
		name    string
		kind    Kind
		body    string
		want    map[string]any // fields of the /tokenize body
		tokens  []int
		wantErr error
	}{
		{"chat carries the template's fields", Chat,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}],"chat_template_kwargs":{"x":1},"add_generation_prompt":false,"temperature":0.3,"max_tokens":9}`,
			map[string]any{"model": "base", "messages": []any{map[string]any{"role": "user", "content": "hi"}},
				"tools": []any{map[string]any{"type": "function"}}, "chat_template_kwargs": map[string]any{"x": 1.0}, "add_generation_prompt": false}, nil, nil},
		{"chat text parts", Chat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
			map[string]any{"model": "base", "messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "a"}}}}}, nil, nil},
		{"chat with an image", Chat, `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			nil, nil, ErrMultimodal},
		{"chat without messages", Chat, `{"model":"m"}`, nil, nil, ErrUnsupported},
		{"completion string", Completion, `{"model":"m","prompt":"once upon","add_special_tokens":false,"n":2}`,
			map[string]any{"model": "base", "prompt": "once upon", "add_special_tokens": false}, nil, nil},
		{"completion token ids skip the engine", Completion, `{"model":"m","prompt":[1,2,3]}`, nil, []int{1, 2, 3}, nil},
		{"completion batch", Completion, `{"model":"m","prompt":["a","b"]}`, nil, nil, ErrUnsupported},
		{"not json", Completion, `{`, nil, nil, ErrUnsupported},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Prepare(tc.kind, "base", []byte(tc.body))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Prepare error = %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if tc.tokens != nil {
				if !equalInts(r.tokens, tc.tokens) {
					t.Fatalf("tokens = %v, want %v", r.tokens, tc.tokens)
				}
				return
			}
			var got map[string]any
			if err := json.Unmarshal(r.body, &got); err != nil {
				t.Fatal(err)
			}
			if g, w := mustJSON(t, got), mustJSON(t, tc.want); g != w {
				t.Errorf("body = %s, want %s", g, w)
			}
			if _, err := vllm.DecodeTokenizeRequest(r.body); err != nil {
				t.Errorf("vLLM's decoder refuses the body: %v", err)
			}
		})
	}
}

func TestPrepareKeyIgnoresSampling(t *testing.T) {
	a, _ := Prepare(Chat, "m", []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0}`))
	b, _ := Prepare(Chat, "m", []byte(`{"temperature":1,"messages":[{"role":"user","content":"hi"}],"model":"m","stream":true}`))
	c, _ := Prepare(Chat, "m", []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[]}`))
	if a.key != b.key {
		t.Error("sampling fields changed the cache key")
	}
	if a.key == c.key {
		t.Error("tools did not change the cache key")
	}
}

// engine is an httptest /tokenize: one token per byte of the prompt (or of
// the messages' JSON), counting calls; block, when set, holds each call
// until the client gives up.
type engine struct {
	srv    *httptest.Server
	calls  atomic.Int32
	block  atomic.Bool
	status atomic.Int32
	delay  atomic.Int64 // before each answer, in nanoseconds
	// release ends blocked calls: the server's view of a client that gave
	// up can lag, and Close waits for every handler.
	release chan struct{}
}

func newEngine(t *testing.T) *engine {
	e := &engine{release: make(chan struct{})}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.calls.Add(1)
		if e.block.Load() {
			select {
			case <-r.Context().Done():
			case <-e.release:
			}
			return
		}
		time.Sleep(time.Duration(e.delay.Load()))
		if s := e.status.Load(); s != 0 {
			http.Error(w, "boom", int(s))
			return
		}
		body, _ := io.ReadAll(r.Body)
		req, err := vllm.DecodeTokenizeRequest(body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		text := ""
		if req.Prompt != nil {
			text = *req.Prompt
		} else {
			m, _ := json.Marshal(req.Messages)
			text = string(m)
		}
		toks := make([]int, len(text))
		for i := range text {
			toks[i] = int(text[i])
		}
		_ = json.NewEncoder(w).Encode(vllm.TokenizeResponse{Count: len(toks), Tokens: toks})
	}))
	t.Cleanup(e.srv.Close)
	t.Cleanup(func() { close(e.release) }) // runs first
	return e
}

func (e *engine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

func newClient(t *testing.T, cfg Config) *Client {
	c, err := New(cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestTokenize(t *testing.T) {
	prompt := func(s string) Request {
		r, err := Prepare(Completion, "m", []byte(`{"model":"m","prompt":"`+s+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	tests := []struct {
		name      string
		setup     func(e *engine)
		cfg       func(*Config)
		reqs      []string
		wantCalls int32 // -1: at most one (a request cut by the budget may never have reached the engine)
		wantErr   error
	}{
		{"a repeat is a cache hit", nil, nil, []string{"abc", "abc"}, 1, nil},
		{"different prompts ask twice", nil, nil, []string{"abc", "abd"}, 2, nil},
		{"LRU evicts past the token bound", nil, func(c *Config) { c.CacheTokens = 4 }, []string{"abc", "xyz", "abc"}, 3, nil},
		{"over budget is a timeout", func(e *engine) { e.block.Store(true) }, func(c *Config) { c.Budget = 50 * time.Millisecond }, []string{"abc"}, -1, ErrTimeout},
		{"engine error", func(e *engine) { e.status.Store(500) }, nil, []string{"abc"}, 1, ErrEngine},
		{"errors are not cached", func(e *engine) { e.status.Store(503) }, nil, []string{"abc", "abc"}, 2, ErrEngine},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t)
			if tc.setup != nil {
				tc.setup(e)
			}
			cfg := DefaultConfig()
			cfg.Budget = 5 * time.Second // generous: a loaded CI machine must not turn a pass into a timeout
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			c := newClient(t, cfg)
			var err error
			for _, s := range tc.reqs {
				var toks []int
				toks, err = c.Tokenize(context.Background(), e.addr(), prompt(s))
				if err == nil && string(runes(toks)) != s {
					t.Fatalf("tokens %v for %q", toks, s)
				}
			}
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
			if n := e.calls.Load(); n != tc.wantCalls && (tc.wantCalls != -1 || n > 1) {
				t.Errorf("engine calls = %d, want %d (-1: at most one)", n, tc.wantCalls)
			}
		})
	}
}

func TestTokenizeTokenPromptSkipsEngine(t *testing.T) {
	c := newClient(t, DefaultConfig())
	r, err := Prepare(Completion, "m", []byte(`{"model":"m","prompt":[5,6]}`))
	if err != nil {
		t.Fatal(err)
	}
	toks, err := c.Tokenize(context.Background(), "127.0.0.1:1", r)
	if err != nil || !equalInts(toks, []int{5, 6}) {
		t.Fatalf("Tokenize = %v, %v", toks, err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Budget: 0, CacheTokens: 1, MaxResponseBytes: 1}, "--tokenize-budget (tokenize_budget): "},
		{Config{Budget: 1, CacheTokens: -1, MaxResponseBytes: 1}, "tokenize_cache_tokens: "},
		{Config{Budget: 1, CacheTokens: 1, MaxResponseBytes: 0}, "tokenize_max_response_bytes: "},
		{Config{Budget: -1, CacheTokens: -1, MaxResponseBytes: -1}, "--tokenize-budget (tokenize_budget): must be positive, got -1ns\n" +
			"tokenize_cache_tokens: must not be negative, got -1\ntokenize_max_response_bytes: must be positive, got -1"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("DefaultConfig: %v", err)
	}
}

// FuzzDecodeResponse: an engine's answer is outside input; no panic, and
// an accepted answer's tokens agree with its count.
func FuzzDecodeResponse(f *testing.F) {
	f.Add([]byte(`{"count":2,"max_model_len":8,"tokens":[1,2],"token_strs":null}`))
	f.Add([]byte(`{"count":3,"tokens":[1,2]}`))
	f.Add([]byte(`{"tokens":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		toks, err := DecodeResponse(raw)
		if err != nil {
			if !errors.Is(err, ErrEngine) {
				t.Fatalf("error %v does not wrap ErrEngine", err)
			}
			return
		}
		if toks == nil {
			t.Fatal("nil tokens without an error")
		}
	})
}

// FuzzPrepare: a client's body is outside input; no panic, and any error
// is one of the fallback reasons.
func FuzzPrepare(f *testing.F) {
	f.Add(uint8(0), []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	f.Add(uint8(0), []byte(`{"messages":[{"content":[{"type":"input_audio"}]}]}`))
	f.Add(uint8(1), []byte(`{"prompt":[1,2,3]}`))
	f.Add(uint8(1), []byte(`{"prompt":"x","add_special_tokens":true}`))
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		_, err := Prepare(Kind(kind%3), "m", body)
		if err != nil && !errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrMultimodal) {
			t.Fatalf("unexpected error kind: %v", err)
		}
	})
}

func runes(toks []int) []byte {
	b := make([]byte, len(toks))
	for i, t := range toks {
		b[i] = byte(t)
	}
	return b
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestTokenizeTraced: an engine's /tokenize in a recorded request is a
// client span under the request's when it was slow or failed; a cache hit
// and an unrecorded request leave none. (A quick call leaves none either;
// how long a call takes is the machine's, so no case asserts it.)
func TestTokenizeTraced(t *testing.T) {
	slow := func(e *engine) { e.delay.Store(int64(5 * time.Millisecond)) }
	tests := []struct {
		name     string
		setup    func(e *engine)
		recorded bool
		reqs     []string
		wantSpan string // the span's error.type, "ok" for none, "" for no span
	}{
		{name: "slow: a span", setup: slow, recorded: true, reqs: []string{"abc"}, wantSpan: "ok"},
		{name: "slow then a cache hit: one span", setup: slow, recorded: true, reqs: []string{"abc", "abc"}, wantSpan: "ok"},
		{name: "failed: a span", setup: func(e *engine) { e.status.Store(500) }, recorded: true, reqs: []string{"abc"}, wantSpan: "engine_error"},
		{name: "slow, not recorded: none", setup: slow, reqs: []string{"abc"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t)
			if tc.setup != nil {
				tc.setup(e)
			}
			cfg := DefaultConfig()
			cfg.Budget = 5 * time.Second
			c := newClient(t, cfg)
			rec := tracetest.NewSpanRecorder()
			ratio := 0.0
			if tc.recorded {
				ratio = 1
			}
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.TraceIDRatioBased(ratio)))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			ctx, req := tp.Tracer("t").Start(context.Background(), "request")
			for _, s := range tc.reqs {
				r, err := Prepare(Completion, "m", []byte(`{"model":"m","prompt":"`+s+`"}`))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = c.Tokenize(ctx, e.addr(), r)
			}
			req.End()
			span, spans := "", 0
			for _, s := range rec.Ended() {
				switch s.Name() {
				case "llmgw.tokenize":
					span = "ok"
					spans++
					for _, kv := range s.Attributes() {
						if kv.Key == "error.type" {
							span = kv.Value.AsString()
						}
					}
					if s.Parent().SpanID() != req.SpanContext().SpanID() || s.SpanKind() != trace.SpanKindClient {
						t.Errorf("tokenize span's parent %s kind %v; want the request's, client", s.Parent().SpanID(), s.SpanKind())
					}
				}
			}
			if span != tc.wantSpan || spans > 1 {
				t.Errorf("%d tokenize spans, the last %q; want at most one, %q", spans, span, tc.wantSpan)
			}
		})
	}
}
