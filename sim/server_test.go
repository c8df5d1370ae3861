package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/vllm"
)

// gateClock holds every non-zero Sleep until the test lets one through,
// so a test decides when each decode step happens.
type gateClock struct{ step chan struct{} }

func newGateClock() *gateClock { return &gateClock{step: make(chan struct{})} }

func (gateClock) Now() time.Time { return time.Unix(1700000000, 0) }

func (g *gateClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	select {
	case <-g.step:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func testConfig() Config {
	cfg := DefaultConfig()
	cfg.Model = "/models/llama"
	cfg.ServedModelNames = []string{"llama"}
	cfg.PythonHashSeed = "0"
	cfg.EnablePromptTokensDetails = true
	cfg.PrefillPerToken, cfg.DecodePerToken = 0, 0
	cfg.NumGPUBlocks, cfg.MaxModelLen = 256, 4096
	return cfg
}

func newTestServer(t *testing.T, cfg Config, opts ...Option) (*Server, *httptest.Server) {
	t.Helper()
	s, err := New(cfg, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, ts
}

func post(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

const longSystem = "You are a careful assistant that answers questions about GPU fleets, " +
	"prefix caches, routers and replicas, in short and precise sentences, always."

func chatBody(user string, extra string) string {
	return `{"model":"llama","messages":[{"role":"system","content":"` + longSystem +
		`"},{"role":"user","content":"` + user + `"}]` + extra + `}`
}

func TestChatCachedTokens(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	var cached []int
	for _, user := range []string{"first question", "second question here"} {
		resp, b := post(t, ts.URL+"/v1/chat/completions", chatBody(user, `,"max_tokens":5`))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		var c vllm.ChatCompletion
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		if c.Object != "chat.completion" || !strings.HasPrefix(c.ID, "chatcmpl-") || c.Model != "llama" {
			t.Errorf("envelope: %+v", c)
		}
		u := c.Usage
		if u.CompletionTokens != 5 || u.TotalTokens != u.PromptTokens+5 || u.PromptTokensDetails == nil {
			t.Fatalf("usage: %+v", u)
		}
		if *c.Choices[0].FinishReason != "length" || c.Choices[0].Message.Content == "" {
			t.Errorf("choice: %+v", c.Choices[0])
		}
		cached = append(cached, u.PromptTokensDetails.CachedTokens)
	}
	if cached[0] != 0 || cached[1] == 0 || cached[1]%16 != 0 {
		t.Errorf("cached tokens = %v, want 0 then a positive multiple of the block size", cached)
	}
}

func TestGenerationDeterministic(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	var texts []string
	for range 2 {
		_, b := post(t, ts.URL+"/v1/completions", `{"model":"llama","prompt":"Say something","max_tokens":8}`)
		var c vllm.Completion
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		texts = append(texts, c.Choices[0].Text)
	}
	if texts[0] != texts[1] || texts[0] == "" {
		t.Errorf("texts differ or empty: %q", texts)
	}
}

func TestPromptTokensDetailsOff(t *testing.T) {
	cfg := testConfig()
	cfg.EnablePromptTokensDetails = false
	_, ts := newTestServer(t, cfg)
	_, b := post(t, ts.URL+"/v1/completions", `{"prompt":"x"}`)
	if !strings.Contains(string(b), `"prompt_tokens_details":null`) {
		t.Errorf("want null prompt_tokens_details without the flag: %s", b)
	}
}

// readEvents reads SSE data lines.
type sseReader struct{ r *bufio.Reader }

func (s sseReader) next(t *testing.T) string {
	t.Helper()
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading stream: %v", err)
		}
		if data, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "data: "); ok {
			return data
		}
	}
}

func TestStreamShape(t *testing.T) {
	tests := []struct {
		name, path, body string
		chat, usage      bool
	}{
		{"chat with usage", "/v1/chat/completions", chatBody("hi", `,"stream":true,"max_tokens":3,"stream_options":{"include_usage":true}`), true, true},
		{"chat", "/v1/chat/completions", chatBody("hi", `,"stream":true,"max_tokens":3`), true, false},
		{"completion with usage", "/v1/completions", `{"prompt":"hi","stream":true,"max_tokens":3,"stream_options":{"include_usage":true}}`, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ts := newTestServer(t, testConfig())
			resp, err := http.Post(ts.URL+tc.path, "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Fatalf("content type %q", ct)
			}
			r := sseReader{bufio.NewReader(resp.Body)}
			if tc.chat {
				var role vllm.ChatCompletionChunk
				if err := json.Unmarshal([]byte(r.next(t)), &role); err != nil || role.Choices[0].Delta.Role != "assistant" {
					t.Fatalf("first chunk is not the role: %+v %v", role, err)
				}
			}
			for i := range 3 {
				data := r.next(t)
				var chunk struct {
					Object  string
					Choices []struct {
						FinishReason *string `json:"finish_reason"`
					}
					Usage *vllm.Usage
				}
				if err := json.Unmarshal([]byte(data), &chunk); err != nil {
					t.Fatal(err)
				}
				if (chunk.Choices[0].FinishReason != nil) != (i == 2) || chunk.Usage != nil {
					t.Errorf("token chunk %d: %s", i, data)
				}
			}
			data := r.next(t)
			if tc.usage {
				var chunk struct {
					Choices []json.RawMessage
					Usage   *vllm.Usage
				}
				if err := json.Unmarshal([]byte(data), &chunk); err != nil || chunk.Usage == nil || len(chunk.Choices) != 0 {
					t.Fatalf("usage chunk: %s", data)
				}
				if chunk.Usage.CompletionTokens != 3 || chunk.Usage.PromptTokensDetails == nil {
					t.Errorf("usage: %+v", chunk.Usage)
				}
				data = r.next(t)
			}
			if data != "[DONE]" {
				t.Errorf("last event %q, want [DONE]", data)
			}
		})
	}
}

// TestStreamChunksArriveOneByOne reads the first token while the server is
// still held before the second: chunks are flushed as produced.
func TestStreamChunksArriveOneByOne(t *testing.T) {
	cfg := testConfig()
	cfg.DecodePerToken = time.Second // gated, never actually waited
	clock := newGateClock()
	_, ts := newTestServer(t, cfg, WithClock(clock))
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"hello","stream":true,"max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := sseReader{bufio.NewReader(resp.Body)}
	first := r.next(t) // produced by prefill; the server now waits in decode
	if !strings.Contains(first, `"finish_reason":null`) {
		t.Errorf("first chunk: %s", first)
	}
	clock.step <- struct{}{}
	r.next(t)
	clock.step <- struct{}{}
	if last := r.next(t); !strings.Contains(last, `"finish_reason":"length"`) {
		t.Errorf("last chunk: %s", last)
	}
	if done := r.next(t); done != "[DONE]" {
		t.Errorf("got %q, want [DONE]", done)
	}
}

func TestClientDisconnectFreesSlot(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs = 1
	cfg.DecodePerToken = time.Second
	clock := newGateClock()
	s, ts := newTestServer(t, cfg, WithClock(clock))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions",
		strings.NewReader(`{"prompt":"hold","stream":true,"max_tokens":4}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sseReader{bufio.NewReader(resp.Body)}.next(t) // running, held in decode
	if st := s.eng.stats(); st.Running != 1 {
		t.Fatalf("running = %d", st.Running)
	}
	cancel()
	resp.Body.Close()
	testkit.Wait(t, "the slot to be freed", func() bool { return s.eng.stats().Running == 0 })
}

func TestErrors(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	tests := []struct {
		name, path, body string
		status           int
		errType, msg     string
	}{
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-4","messages":[{"role":"user","content":"x"}]}`, 404, "NotFoundError", "The model `gpt-4` does not exist."},
		{"unknown model tokenize", "/tokenize", `{"model":"gpt-4","prompt":"x"}`, 404, "NotFoundError", "The model `gpt-4` does not exist."},
		{"bad json", "/v1/chat/completions", `{"model":`, 400, "BadRequestError", ""},
		{"bad json completion", "/v1/completions", `[`, 400, "BadRequestError", ""},
		{"no messages", "/v1/chat/completions", `{"messages":[]}`, 400, "BadRequestError", ""},
		{"max tokens too large", "/v1/completions", `{"prompt":"x","max_tokens":5000}`, 400, "BadRequestError", "'max_tokens' or 'max_completion_tokens' is too large"},
		{"zero max tokens", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400, "BadRequestError", ""},
		{"bad token id", "/v1/completions", `{"prompt":[1,-2]}`, 400, "BadRequestError", ""},
		{"n > 1", "/v1/completions", `{"prompt":"x","n":2}`, 400, "BadRequestError", ""},
		{"detokenize negative", "/detokenize", `{"tokens":[-1]}`, 400, "BadRequestError", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := post(t, ts.URL+tc.path, tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			var e vllm.ErrorResponse
			if err := json.Unmarshal(b, &e); err != nil {
				t.Fatal(err)
			}
			if e.Error.Type != tc.errType || e.Error.Code != tc.status || !strings.Contains(e.Error.Message, tc.msg) {
				t.Errorf("body %s", b)
			}
		})
	}
}

func TestModels(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	resp, err := http.Get(ts.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list vllm.ModelList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	if len(list.Data) != 1 {
		t.Fatalf("models: %+v", list)
	}
	m := list.Data[0]
	if list.Object != "list" || m.ID != "llama" || m.OwnedBy != "vllm" || m.Root != "/models/llama" ||
		m.Parent != nil || m.MaxModelLen == nil || *m.MaxModelLen != 4096 {
		t.Errorf("card: %+v", m)
	}
}

func TestTokenizeForms(t *testing.T) {
	s, ts := newTestServer(t, testConfig())
	chat := `{"model":"llama","messages":[{"role":"user","content":"Hi there"}]}`
	tests := []struct {
		name, body string
		wantTokens []int
		strs       bool
	}{
		{"prompt adds BOS", `{"prompt":"Hi there"}`, append([]int{TokenBeginOfText}, s.tok.Encode("Hi there")...), false},
		{"prompt without special", `{"prompt":"Hi there","add_special_tokens":false,"return_token_strs":true}`, s.tok.Encode("Hi there"), true},
		{"chat renders the template", chat, s.tok.Encode("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := post(t, ts.URL+"/tokenize", tc.body)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			var tr vllm.TokenizeResponse
			if err := json.Unmarshal(b, &tr); err != nil {
				t.Fatal(err)
			}
			if tr.Count != len(tr.Tokens) || tr.MaxModelLen != 4096 || !equalInts(tr.Tokens, tc.wantTokens) {
				t.Errorf("got %s", b)
			}
			if (tr.TokenStrs != nil) != tc.strs || (!tc.strs && !strings.Contains(string(b), `"token_strs":null`)) {
				t.Errorf("token_strs: %s", b)
			}
		})
	}
	// The chat form's tokens are what a chat completion is charged for.
	_, b := post(t, ts.URL+"/tokenize", chat)
	var tr vllm.TokenizeResponse
	_ = json.Unmarshal(b, &tr)
	_, b = post(t, ts.URL+"/v1/chat/completions", chat)
	var c vllm.ChatCompletion
	_ = json.Unmarshal(b, &c)
	if c.Usage == nil || c.Usage.PromptTokens != tr.Count {
		t.Errorf("chat prompt_tokens %+v, tokenize count %d", c.Usage, tr.Count)
	}
	// And detokenize inverts tokenize.
	tb, _ := json.Marshal(vllm.DetokenizeRequest{Tokens: s.tok.Encode("Hi there, fleet")})
	_, b = post(t, ts.URL+"/detokenize", string(tb))
	if !strings.Contains(string(b), `"prompt":"Hi there, fleet"`) {
		t.Errorf("detokenize: %s", b)
	}
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

func TestMetricsNames(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	post(t, ts.URL+"/v1/completions", `{"prompt":"warm up the counters"}`)
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	text := string(b)
	labels := `{engine="0",model_name="llama"}`
	for _, want := range []string{
		vllm.MetricNumRequestsRunning + labels + " 0",
		vllm.MetricNumRequestsWaiting + labels + " 0",
		vllm.MetricKVCacheUsagePerc + labels + " 0",
		vllm.MetricPrefixCacheQueries + labels,
		vllm.MetricPrefixCacheHits + labels,
		vllm.MetricPromptTokens + labels,
		vllm.MetricGenerationTokens + labels + " 16",
		vllm.MetricRequestSuccess + `{engine="0",finished_reason="length",model_name="llama"} 1`,
		vllm.MetricTimeToFirstToken + `_bucket{engine="0",model_name="llama",le="0.001"}`,
		vllm.MetricTimeToFirstToken + `_count` + labels + " 1",
		vllm.MetricCacheConfigInfo + `{block_size="16"`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestHealthResetAndUnknownRoute(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	tests := []struct {
		method, path string
		status       int
	}{
		{"GET", "/health", 200},
		{"POST", "/reset_prefix_cache", 200},
		{"GET", "/nope", 404},
	}
	for _, tc := range tests {
		req, _ := http.NewRequest(tc.method, ts.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.status)
		}
	}
}

func TestFaults(t *testing.T) {
	cfg := testConfig()
	cfg.Faults = Faults{FailRate: 1, FailStatus: 503}
	_, ts := newTestServer(t, cfg)
	if resp, _ := post(t, ts.URL+"/v1/completions", `{"prompt":"x"}`); resp.StatusCode != 503 {
		t.Errorf("status %d, want injected 503", resp.StatusCode)
	}
	if resp, b := post(t, ts.URL+"/sim/faults", `{"fail_rate":0}`); resp.StatusCode != 200 {
		t.Fatalf("set faults: %d %s", resp.StatusCode, b)
	}
	if resp, _ := post(t, ts.URL+"/v1/completions", `{"prompt":"x"}`); resp.StatusCode != 200 {
		t.Errorf("status %d after clearing faults", resp.StatusCode)
	}
	if resp, _ := post(t, ts.URL+"/sim/faults", `{"fail_rate":2}`); resp.StatusCode != 400 {
		t.Errorf("invalid faults accepted: %d", resp.StatusCode)
	}
}

func TestServeStopsAndCrashes(t *testing.T) {
	tests := []struct {
		name    string
		crash   bool
		wantErr error
	}{
		{"stops on cancel", false, nil},
		{"crash after one request", true, ErrCrashed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			if tc.crash {
				cfg.Faults.CrashAfter = 1
			}
			s, err := New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- s.Serve(ctx, ln) }()
			url := "http://" + ln.Addr().String()
			resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
			if tc.crash {
				if err == nil {
					resp.Body.Close()
					t.Error("crashed server answered")
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				cancel()
			}
			if err := <-errc; !errors.Is(err, tc.wantErr) {
				t.Errorf("Serve = %v, want %v", err, tc.wantErr)
			}
			http.DefaultClient.CloseIdleConnections()
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"default with model is valid", func(*Config) {}, ""},
		{"no model", func(c *Config) { c.Model = "" }, "model: required"},
		{"max num seqs", func(c *Config) { c.MaxNumSeqs = -1 }, "--max-num-seqs"},
		{"gpu profile", func(c *Config) { c.GPU = "v100" }, "--sim-gpu"},
		{"no shape for the model", func(c *Config) { c.GPU = "l4" }, "--sim-model-shape"},
		{"bad shape", func(c *Config) { c.GPU, c.ModelShape = "l4", "layers=2" }, "--sim-model-shape"},
		{"gpu timing without a gpu", func(c *Config) { c.Timing = TimingGPU }, "--sim-timing"},
		{"timing", func(c *Config) { c.Timing = "fast" }, "--sim-timing"},
		{"utilization", func(c *Config) { c.GPUMemoryUtilization = 1.5 }, "--gpu-memory-utilization"},
		{"weights do not fit", func(c *Config) { c.GPU, c.Model, c.GPUMemoryUtilization = "l4", "Qwen/Qwen3-8B", 0.5 }, "--gpu-memory-utilization"},
		{"budget without chunked prefill", func(c *Config) { c.EnableChunkedPrefill, c.MaxNumBatchedTokens = false, 2048 }, "--max-num-batched-tokens"},
		{"gpu with a built-in shape is valid", func(c *Config) { c.GPU, c.Model = "a100-80gb", "meta-llama/Llama-3.1-8B-Instruct" }, ""},
		{"context does not fit", func(c *Config) { c.NumGPUBlocks = 10 }, "--max-model-len"},
		{"hash seed", func(c *Config) { c.PythonHashSeed = "x" }, "PYTHONHASHSEED"},
		{"kv events json", func(c *Config) { c.KVEventsConfig = "{" }, "--kv-events-config"},
		{"lora rank", func(c *Config) { c.MaxLoRARank = 7 }, "--max-lora-rank"},
		{"fail rate", func(c *Config) { c.Faults.FailRate = 2 }, "--sim-fail-rate"},
		{"hash algo", func(c *Config) { c.PrefixCachingHashAlgo = "md5" }, "--prefix-caching-hash-algo"},
		{"auto tools without a parser", func(c *Config) { c.EnableAutoToolChoice = true }, "--enable-auto-tool-choice: requires --tool-call-parser"},
		{"max logprobs", func(c *Config) { c.MaxLogprobs = -2 }, "--max-logprobs"},
		{"stream write timeout", func(c *Config) { c.StreamWriteTimeout = -time.Second }, "--sim-stream-write-timeout"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Model = "m"
			tc.change(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to name %q", err, tc.want)
			}
		})
	}
}

func fuzzServer(f *testing.F) *Server {
	cfg := testConfig()
	cfg.DefaultMaxTokens = 2
	cfg.MaxModelLen = 512
	cfg.NumGPUBlocks = 64
	s, err := New(cfg, nil)
	if err != nil {
		f.Fatal(err)
	}
	return s
}

// fuzzHandler posts body to path and checks the answer is a success or a
// well-formed client error.
func fuzzHandler(f *testing.F, path string, seeds []string) {
	s := fuzzServer(f)
	for _, seed := range seeds {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest("POST", path, strings.NewReader(string(body))))
		switch rec.Code {
		case 200:
		case 400, 404:
			var e vllm.ErrorResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Code != rec.Code {
				t.Fatalf("error body %q: %v", rec.Body, err)
			}
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		if st := s.eng.stats(); st.Running != 0 || st.Waiting != 0 {
			t.Fatalf("request left engine state behind: %+v", st)
		}
	})
}

func FuzzChatCompletions(f *testing.F) {
	fuzzHandler(f, "/v1/chat/completions", []string{
		chatBody("hi", ""), chatBody("hi", `,"stream":true,"stream_options":{"include_usage":true}`),
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"tools":[{"type":"function"}]}`,
		`{"messages":[]}`, `{`, `{"model":"x","messages":[{"role":"user","content":"x"}]}`,
	})
}

func FuzzCompletions(f *testing.F) {
	fuzzHandler(f, "/v1/completions", []string{
		`{"prompt":"hi"}`, `{"prompt":[1,2,3],"max_tokens":1}`, `{"prompt":["a"],"stream":true}`,
		`{"prompt":[[1]]}`, `{"prompt":null}`, `{"prompt":"x","max_tokens":100000}`,
	})
}

func FuzzTokenize(f *testing.F) {
	fuzzHandler(f, "/tokenize", []string{
		`{"prompt":"hi"}`, `{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":false}`,
		`{"messages":[{"role":"user","content":"x"}],"continue_final_message":true}`, `{}`,
	})
}

func FuzzResponses(f *testing.F) {
	fuzzHandler(f, "/v1/responses", []string{
		`{"input":"hi"}`, `{"input":"hi","stream":true,"include":["message.output_text.logprobs"],"top_logprobs":2}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"x"}]}`,
		`{"input":"x","tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer"}}}}],"tool_choice":"required"}`,
		`{"input":"x","text":{"format":{"type":"json_schema","name":"s","schema":{"type":"array","items":{"enum":[1,2]}}}}}`,
		`{"input":null}`, `{"input":"x","max_output_tokens":0}`,
	})
}

func FuzzMessages(f *testing.F) {
	s := fuzzServer(f)
	for _, seed := range []string{
		`{"model":"llama","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"llama","max_tokens":2,"stream":true,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"tool_result","tool_use_id":"t","content":"r"}]}]}`,
		`{"model":"llama","max_tokens":64,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":1}}]}],"tools":[{"name":"f","input_schema":{"properties":{"a":{"type":"number"}}}}],"tool_choice":{"type":"any"}}`,
		`{"model":"llama","max_tokens":64,"messages":[{"role":"user","content":"x"}],"output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, httptest.NewRequest("POST", path, strings.NewReader(string(body))))
			switch rec.Code {
			case 200:
			case 400, 404:
				var e vllm.AnthropicErrorResponse
				if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Type != "error" || e.Error.Message == "" {
					t.Fatalf("error body %q: %v", rec.Body, err)
				}
			default:
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
		}
		if st := s.eng.stats(); st.Running != 0 || st.Waiting != 0 {
			t.Fatalf("request left engine state behind: %+v", st)
		}
	})
}
