package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/tracing/tracingtest"
)

// Tracing end to end (issue 33 part 1; design §9 "Tracing"): a control
// server, an agent, a router and two `llmgw sim serve` engines — real
// processes — export their spans (the control server's gRPC calls too) over OTLP/gRPC to a collector's trace
// service served in this process on 127.0.0.1. At 100 % sampling every
// request's router span has the engine's llm_request span below it (the
// attempt's client span between them), the GenAI attributes are there, and
// no span carries the prompt's text; at 10 % the sampled requests are
// joined the same way (≥ 99 %), and the engines trace no request the
// router did not sample.

// startTracedEngine starts a simulator serving model that sends its
// spans to the receiver at otlp, as vLLM with --otlp-traces-endpoint.
func startTracedEngine(t *testing.T, id, model, otlp string) *externalEngine {
	t.Helper()
	e := &externalEngine{http: freeAddr(t)}
	host, port := e.http[:strings.LastIndexByte(e.http, ':')], e.http[strings.LastIndexByte(e.http, ':')+1:]
	e.proc = llmgwProcess(t, id, "sim", "serve", "org/"+model, "--host", host, "--port", port, "--served-model-name", model,
		"--enable-prompt-tokens-details", "--sim-decode-ms-per-token", "0", "--sim-prefill-us-per-token", "0",
		"--max-model-len", "1024", "--otlp-traces-endpoint", "http://"+otlp)
	e.proc.args = e.proc.args[:len(e.proc.args)-2] // vLLM's flags only: no --data-dir
	e.proc.start()
	e.waitUp(t)
	return e
}

// tracedChat sends one chat carrying a secret in its prompt, with request
// id id and, when traceparent is set, the client's trace context.
func tracedChat(t *testing.T, addr, model, id, secret, traceparent string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"%s what is %s"}],"max_tokens":4}`, model, secret, id)
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	if traceparent != "" {
		req.Header.Set("Traceparent", traceparent)
	}
	resp, err := chatClient.Do(req)
	if err != nil {
		t.Fatalf("chat %s: %v", id, err)
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat %s: %d %s", id, resp.StatusCode, b)
	}
}

// joined is one request's spans: the router's server span, its attempt
// and the engine's llm_request under the attempt (nil when missing).
type joined struct {
	request, attempt, engine *tracingtest.Span
}

// joinSpans finds, for each router request span with a request id of
// prefix, its attempt (the one that answered: the last) and the engine's
// span whose parent is that attempt.
func joinSpans(spans []tracingtest.Span, prefix string) map[string]*joined {
	byParent := map[string][]*tracingtest.Span{}
	for i := range spans {
		s := &spans[i]
		byParent[s.TraceID+"/"+s.ParentID] = append(byParent[s.TraceID+"/"+s.ParentID], s)
	}
	out := map[string]*joined{}
	for i := range spans {
		s := &spans[i]
		id := s.Attrs["llmgw.request_id"]
		if s.Service != "llmgw-router" || !strings.HasPrefix(id, prefix) {
			continue
		}
		j := &joined{request: s}
		for _, c := range byParent[s.TraceID+"/"+s.SpanID] {
			if c.Name == "llmgw.attempt" && (j.attempt == nil || c.Attrs["llmgw.attempt"] > j.attempt.Attrs["llmgw.attempt"]) {
				j.attempt = c
			}
		}
		if j.attempt != nil {
			for _, c := range byParent[s.TraceID+"/"+j.attempt.SpanID] {
				if c.Name == "llm_request" {
					j.engine = c
				}
			}
		}
		out[id] = j
	}
	return out
}

func complete(js map[string]*joined) int {
	n := 0
	for _, j := range js {
		if j.engine != nil {
			n++
		}
	}
	return n
}

func TestTracingEndToEnd(t *testing.T) {
	const model = "traced"
	recv := tracingtest.Start(t)
	cfg := filepath.Join(t.TempDir(), "control.yaml")
	writeFile(t, cfg, "reconcile_interval: 1s\n")
	c1 := newServer(t, "c1", serverOpts{expect: 1, extra: []string{"--config", cfg,
		"--otlp-traces-endpoint", recv.Addr(), "--trace-sampling-ratio", "1"}})
	c1.start()
	(&cluster{t: t, servers: []*controlServer{c1}}).waitLeader([]*controlServer{c1}, 30*time.Second)
	startAgentProc(t, "n1", []string{c1.grpc}, "--probe-interval", "250ms")
	engines := []*externalEngine{startTracedEngine(t, "e1", model, recv.Addr()), startTracedEngine(t, "e2", model, recv.Addr())}
	file := filepath.Join(t.TempDir(), model+".yaml")
	writeFile(t, file, fmt.Sprintf("name: %s\nengine: external\nendpoints: [\"http://%s\", \"http://%s\"]\n",
		model, engines[0].http, engines[1].http))
	if err := eventuallyErr(30*time.Second, func() error { _, err := ctlAt(c1.grpc, "model", "apply", "-f", file); return err }); err != nil {
		t.Fatalf("model apply: %v", err)
	}
	waitExternal(t, c1.grpc, model, engines, "both replicas READY", readyAt)

	const secret = "zebra-quartz-secret-7781"
	r := startRouterWith(t, "r1", []string{c1.grpc}, "--otlp-traces-endpoint", recv.Addr(), "--trace-sampling-ratio", "1")
	waitRouterServes(t, r.http, model)

	// 100 %: every request joined, half of them continuing the client's
	// own trace.
	const full = 40
	clientTrace := map[string]string{}
	for i := range full {
		id := fmt.Sprintf("full-%03d", i)
		tp := ""
		if i%2 == 0 {
			tid := fmt.Sprintf("%032x", 0xabc000+i)
			tp, clientTrace[id] = "00-"+tid+"-00f067aa0ba902b7-01", tid
		}
		tracedChat(t, r.http, model, id, secret, tp)
	}
	var js map[string]*joined
	if !eventually(30*time.Second, func() bool {
		js = joinSpans(recv.Spans(), "full-")
		return len(js) == full && complete(js) == full
	}) {
		t.Fatalf("100 %% sampling: %d of %d requests have a router span and %d the engine's span below it, within %v",
			len(js), full, complete(js), within(30*time.Second))
	}
	engineAddrs := map[string]bool{}
	for _, e := range engines {
		engineAddrs[e.http[:strings.LastIndexByte(e.http, ':')]] = true
	}
	for id, j := range js {
		if tid, ok := clientTrace[id]; ok && j.request.TraceID != tid {
			t.Errorf("%s: trace %s; want the client's %s continued", id, j.request.TraceID, tid)
		}
		for _, k := range []string{"gen_ai.operation.name", "gen_ai.request.model", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"} {
			if j.request.Attrs[k] == "" {
				t.Errorf("%s: router span has no %s: %v", id, k, j.request.Attrs)
			}
		}
		if j.request.Attrs["gen_ai.request.model"] != model || j.request.Attrs["gen_ai.operation.name"] != "chat" {
			t.Errorf("%s: router span model %q operation %q", id, j.request.Attrs["gen_ai.request.model"], j.request.Attrs["gen_ai.operation.name"])
		}
		if !engineAddrs[j.attempt.Attrs["server.address"]] || j.attempt.Attrs["server.port"] == "" {
			t.Errorf("%s: attempt's server.address %q port %q; want an engine's", id, j.attempt.Attrs["server.address"], j.attempt.Attrs["server.port"])
		}
		if j.engine.Attrs["gen_ai.usage.output_tokens"] != "4" || j.request.Attrs["gen_ai.usage.output_tokens"] != "4" {
			t.Errorf("%s: output tokens: engine %q, router %q; want 4", id, j.engine.Attrs["gen_ai.usage.output_tokens"], j.request.Attrs["gen_ai.usage.output_tokens"])
		}
		if j.engine.Attrs["gen_ai.usage.input_tokens"] != j.request.Attrs["gen_ai.usage.input_tokens"] {
			t.Errorf("%s: input tokens: engine %q, router %q", id, j.engine.Attrs["gen_ai.usage.input_tokens"], j.request.Attrs["gen_ai.usage.input_tokens"])
		}
		// Each stage: an event of the router span, or (when it took a
		// millisecond or more) a span under it; the scheduler's pick an
		// event.
		stages := map[string]bool{}
		for _, s := range recv.Spans() {
			if s.TraceID == j.request.TraceID && s.ParentID == j.request.SpanID {
				stages[s.Name] = true
			}
		}
		for _, e := range j.request.Events {
			stages[e.Name] = true
		}
		for _, want := range []string{"llmgw.auth", "llmgw.resolve", "llmgw.prepare", "llmgw.scheduler.pick"} {
			if !stages[want] {
				t.Errorf("%s: no %s under the router span (have %v)", id, want, stages)
			}
		}
	}
	// The control plane's gRPC calls, by otelgrpc: the model's apply.
	if !eventually(30*time.Second, func() bool {
		for _, s := range recv.Spans() {
			if s.Service == "llmgw-control" && s.Name == "llmgw.v1.AdminService/ApplyModel" {
				return true
			}
		}
		return false
	}) {
		t.Errorf("no llmgw-control span of AdminService/ApplyModel within %v", within(30*time.Second))
	}
	// No prompt text anywhere: names, attributes, events, as received.
	for _, s := range recv.Spans() {
		if strings.Contains(s.Raw.String(), secret) {
			t.Fatalf("span %s of %s carries the prompt's text: %v", s.Name, s.Service, s.Raw)
		}
	}

	// 10 %: a router of ratio 0.1 in place of the first; requests without
	// a traceparent.
	r.stop()
	// It captures its traffic too (router/capture, design §10.1).
	capFile := filepath.Join(t.TempDir(), "capture.jsonl")
	r2 := startRouterWith(t, "r2", []string{c1.grpc}, "--otlp-traces-endpoint", recv.Addr(), "--trace-sampling-ratio", "0.1",
		"--capture-path", capFile)
	waitRouterServes(t, r2.http, model)
	const tenth = 600
	for i := range tenth {
		tracedChat(t, r2.http, model, fmt.Sprintf("tenth-%04d", i), secret, "")
	}
	r2.stop() // flushes the router's last spans and its capture
	checkCapture(t, capFile, model, secret, tenth)
	var sampled, ok int
	// The engines send theirs every 2 s: wait until the share settles.
	if !eventually(30*time.Second, func() bool {
		js = joinSpans(recv.Spans(), "tenth-")
		sampled, ok = len(js), complete(js)
		return sampled > 0 && float64(ok) >= 0.99*float64(sampled)
	}) {
		t.Fatalf("10 %% sampling: %d of %d sampled requests joined within %v; want ≥ 99 %%", ok, sampled, within(30*time.Second))
	}
	// Binomial(600, 0.1): 60 ± 7.3; 25 and 110 are ±5 σ.
	if sampled < 25 || sampled > 110 {
		t.Errorf("10 %% sampling: %d of %d requests sampled; want about 60", sampled, tenth)
	}
	// The engines follow the router's decision: no llm_request of a trace
	// the router did not sample (the traces of the first router aside).
	routerTraces := map[string]bool{}
	for _, s := range recv.Spans() {
		if s.Service == "llmgw-router" {
			routerTraces[s.TraceID] = true
		}
	}
	orphans := 0
	for _, s := range recv.Spans() {
		if s.Name == "llm_request" && !routerTraces[s.TraceID] {
			orphans++
		}
	}
	if orphans > 0 {
		t.Errorf("%d engine spans belong to no router trace; want the engines to follow the router's sampling", orphans)
	}
	t.Logf("100 %%: %d/%d joined; 10 %%: %d of %d sampled, %d joined (%.1f %%)", full, full, sampled, tenth, ok,
		100*float64(ok)/float64(sampled))
}

// checkCapture reads a router's capture: the prompt's text appears nowhere
// in it, and at least want requests of model are recorded as served, with
// their lengths (these prompts are shorter than a block: the hashes are
// router/capture's and bench's tests).
func checkCapture(t *testing.T, path, model, secret string, want int) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), secret) {
		t.Fatal("the capture holds the prompt's text")
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if !strings.Contains(lines[0], `"llmgw_capture":1`) {
		t.Fatalf("the capture's first line is no header: %q", lines[0])
	}
	served := 0
	for _, line := range lines[1:] {
		var rec struct {
			Model        string `json:"model"`
			PromptBytes  int    `json:"prompt_bytes"`
			OutputTokens int    `json:"output_tokens"`
			Status       int    `json:"status"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("capture line %q: %v", line, err)
		}
		if rec.Model == model && rec.Status == http.StatusOK && rec.OutputTokens == 4 && rec.PromptBytes > 0 {
			served++
		}
	}
	if served < want {
		t.Errorf("the capture holds %d served requests with their lengths, want at least %d", served, want)
	}
}
