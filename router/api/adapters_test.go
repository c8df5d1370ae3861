package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/director"
	"github.com/llmgw/llmgw/router/endpoint"
)

// fakeAdapterService is the control plane's AdapterService as a router sees
// it: answer decides each call's response, after which onLoaded runs (the
// agent's LOADED reaching the router's table).
type fakeAdapterService struct {
	llmgwv1.UnimplementedAdapterServiceServer
	calls   atomic.Int32
	gate    chan struct{} // when set, calls wait for it to close
	answer  func(*llmgwv1.EnsureAdapterRequest) *llmgwv1.EnsureAdapterResponse
	onReply func(*llmgwv1.EnsureAdapterResponse)
}

func (f *fakeAdapterService) EnsureAdapter(ctx context.Context, req *llmgwv1.EnsureAdapterRequest) (*llmgwv1.EnsureAdapterResponse, error) {
	f.calls.Add(1)
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	resp := f.answer(req)
	if f.onReply != nil {
		f.onReply(resp)
	}
	return resp, nil
}

// grpcControl adapts the generated client to director.AdapterControl.
type grpcControl struct{ c llmgwv1.AdapterServiceClient }

func (g grpcControl) EnsureAdapter(ctx context.Context, req *llmgwv1.EnsureAdapterRequest) (*llmgwv1.EnsureAdapterResponse, error) {
	return g.c.EnsureAdapter(ctx, req)
}

// serveAdapters runs svc on a loopback gRPC server and returns a client.
func serveAdapters(t *testing.T, svc *fakeAdapterService) director.AdapterControl {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	llmgwv1.RegisterAdapterServiceServer(gs, svc)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(ln) }()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close(); gs.Stop(); <-done })
	return grpcControl{llmgwv1.NewAdapterServiceClient(cc)}
}

// loraRouter is a router over tb whose cold adapters are ensured through ctl.
func loraRouter(t *testing.T, tb *table, ctl director.AdapterControl, wait time.Duration) (string, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	var opts []director.Option
	if ctl != nil {
		opts = append(opts, director.WithAdapters(ctl, wait))
	}
	h := newHandler(t, DefaultConfig(), tb, inOrder{}, breakers(t), slog.New(slog.DiscardHandler), reg, opts...)
	s := newServer(t, h)
	return s, reg
}

func newServer(t *testing.T, h *Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return "http://" + ln.Addr().String()
}

// recorder is an engine that records the bodies it gets and answers
// with status (200: a small completion naming itself).
type recorder struct {
	name   string
	status int
	mu     sync.Mutex
	bodies []string
}

func (rc *recorder) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.bodies = append(rc.bodies, string(b))
	rc.mu.Unlock()
	if rc.status != 0 && rc.status != 200 {
		w.WriteHeader(rc.status)
		io.WriteString(w, `{"error":{"message":"The model does not exist.","type":"NotFoundError","code":404}}`)
		return
	}
	io.WriteString(w, `{"id":"x","object":"chat.completion","model":"`+rc.name+`","choices":[]}`)
}

func (rc *recorder) got() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.bodies...)
}

func loraTable(t *testing.T, engine string, r0, r1 *recorder) *table {
	m := &llmgwv1.Model{Name: "base", Model: "org/base-7b", Engine: engine, MaxLoadedAdapters: 2,
		Adapters: []*llmgwv1.Adapter{{Name: "sql", Path: "/a/sql"}, {Name: "legal", Path: "/a/legal"}}}
	return &table{
		models: map[string][]*endpoint.Endpoint{"base": {
			{ReplicaID: "r0", UID: 1, Model: "base", Address: engineAddr(t, r0)},
			{ReplicaID: "r1", UID: 1, Model: "base", Address: engineAddr(t, r1)},
		}},
		adapters: map[string]endpoint.AdapterRef{"sql": {Model: "base", Index: 0}, "legal": {Model: "base", Index: 1}},
		list:     []*llmgwv1.Model{m},
	}
}

func engineAddr(t *testing.T, rc *recorder) string { return engine(t, rc.serve) }

const chatSQL = `{"model":"sql","messages":[{"role":"user","content":"hi"}]}`

func TestAdapterRouting(t *testing.T) {
	loaded := func(on ...string) func(*llmgwv1.EnsureAdapterRequest) *llmgwv1.EnsureAdapterResponse {
		return func(*llmgwv1.EnsureAdapterRequest) *llmgwv1.EnsureAdapterResponse {
			return &llmgwv1.EnsureAdapterResponse{State: llmgwv1.AdapterState_ADAPTER_STATE_LOADED, LoadedOn: on}
		}
	}
	tests := []struct {
		name     string
		engine   string
		body     string
		held     map[string][]string // replica -> adapters held at start
		answer   func(*llmgwv1.EnsureAdapterRequest) *llmgwv1.EnsureAdapterResponse
		loadOn   string // replica the fake control plane's LOADED shows up on
		r0status int
		noCtl    bool

		wantStatus     int
		wantRetryAfter string
		wantReplica    string
		wantCalls      int32
		wantBody       func(t *testing.T, got string)
	}{
		{name: "unknown adapter is an unknown model", body: `{"model":"chem","messages":[]}`, wantStatus: 404},
		{name: "held adapter goes to its holder as sent", body: chatSQL, held: map[string][]string{"r1": {"sql"}},
			wantStatus: 200, wantReplica: "r1", wantBody: func(t *testing.T, got string) {
				if got != chatSQL {
					t.Errorf("body rewritten for a sim model: %s", got)
				}
			}},
		{name: "cold adapter: ensured, waited for, routed", body: chatSQL, answer: loaded("r1"), loadOn: "r1",
			wantStatus: 200, wantReplica: "r1", wantCalls: 1},
		{name: "failed load: 503 with the engine's retry-after", body: chatSQL,
			answer: func(*llmgwv1.EnsureAdapterRequest) *llmgwv1.EnsureAdapterResponse {
				return &llmgwv1.EnsureAdapterResponse{State: llmgwv1.AdapterState_ADAPTER_STATE_FAILED, Reason: "No adapter found for /a/sql", RetryAfterMs: 2500}
			}, wantStatus: 503, wantRetryAfter: "3", wantCalls: 1},
		{name: "every slot busy: 503 with retry-after", body: chatSQL,
			answer: func(*llmgwv1.EnsureAdapterRequest) *llmgwv1.EnsureAdapterResponse {
				return &llmgwv1.EnsureAdapterResponse{RetryAfterMs: 1000, Reason: "every loaded adapter is busy"}
			}, wantStatus: 503, wantRetryAfter: "1", wantCalls: 1},
		{name: "loaded elsewhere but never in this table: timeout 503", body: chatSQL, answer: loaded("r9"),
			wantStatus: 503, wantRetryAfter: "1", wantCalls: 1},
		{name: "no control plane: 503", body: chatSQL, noCtl: true, wantStatus: 503, wantRetryAfter: "1"},
		{name: "engine 404 for the adapter before the first byte: next holder", body: chatSQL,
			held: map[string][]string{"r0": {"sql"}, "r1": {"sql"}}, r0status: 404, wantStatus: 200, wantReplica: "r1"},
		{name: "engine 404 from the only holder: never the answer; waits for the reload elsewhere", body: chatSQL,
			held: map[string][]string{"r0": {"sql"}}, r0status: 404, answer: loaded("r1"), loadOn: "r1",
			wantStatus: 200, wantReplica: "r1", wantCalls: 1},
		{name: "llama.cpp: model is the base, the adapter its lora index", engine: "llamacpp",
			body: `{"messages":[{"role":"user","content":"hi"}], "model" : "legal","temperature":0}`, held: map[string][]string{"r0": {"legal"}},
			wantStatus: 200, wantReplica: "r0", wantBody: func(t *testing.T, got string) {
				want := `{"lora":[{"id":1,"scale":1}],"messages":[{"role":"user","content":"hi"}], "model" : "base","temperature":0}`
				if got != want {
					t.Errorf("body\n got %s\nwant %s", got, want)
				}
			}},
		{name: "base model requests are untouched by adapters", body: `{"model":"base","messages":[]}`, wantStatus: 200, wantReplica: "r0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng := tt.engine
			if eng == "" {
				eng = "sim"
			}
			r0, r1 := &recorder{name: "r0", status: tt.r0status}, &recorder{name: "r1"}
			tb := loraTable(t, eng, r0, r1)
			for rep, as := range tt.held {
				for _, a := range as {
					tb.hold(rep, a)
				}
			}
			var ctl director.AdapterControl
			svc := &fakeAdapterService{answer: tt.answer}
			if tt.loadOn != "" {
				svc.onReply = func(*llmgwv1.EnsureAdapterResponse) { tb.hold(tt.loadOn, "sql") }
			}
			if !tt.noCtl {
				ctl = serveAdapters(t, svc)
			}
			url, _ := loraRouter(t, tb, ctl, 300*time.Millisecond)
			resp := post(t, url+"/v1/chat/completions", tt.body, nil)
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			if got := resp.Header.Get("Retry-After"); got != tt.wantRetryAfter {
				t.Errorf("Retry-After %q, want %q", got, tt.wantRetryAfter)
			}
			if got := resp.Header.Get("X-Llmgw-Replica"); got != tt.wantReplica {
				t.Errorf("replica %q, want %q", got, tt.wantReplica)
			}
			if got := svc.calls.Load(); got != tt.wantCalls {
				t.Errorf("EnsureAdapter calls %d, want %d", got, tt.wantCalls)
			}
			if tt.wantBody != nil {
				rc := map[string]*recorder{"r0": r0, "r1": r1}[tt.wantReplica]
				bs := rc.got()
				if len(bs) == 0 {
					t.Fatal("the engine got nothing")
				}
				tt.wantBody(t, bs[len(bs)-1])
			}
		})
	}
}

// TestColdAdapterSingleFlight sends many requests for one cold adapter at
// once: one EnsureAdapter call, and every request served once it loads.
func TestColdAdapterSingleFlight(t *testing.T) {
	r0, r1 := &recorder{name: "r0"}, &recorder{name: "r1"}
	tb := loraTable(t, "vllm", r0, r1)
	svc := &fakeAdapterService{gate: make(chan struct{}),
		answer: func(*llmgwv1.EnsureAdapterRequest) *llmgwv1.EnsureAdapterResponse {
			return &llmgwv1.EnsureAdapterResponse{State: llmgwv1.AdapterState_ADAPTER_STATE_LOADED, LoadedOn: []string{"r0"}}
		},
		onReply: func(*llmgwv1.EnsureAdapterResponse) { tb.hold("r0", "sql") }}
	url, reg := loraRouter(t, tb, serveAdapters(t, svc), 10*time.Second)
	const n = 8
	var wg sync.WaitGroup
	codes := make(chan int, n)
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatSQL))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				codes <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	// Every request is waiting once the flight's count says so.
	testkit.WaitMetric(t, reg, "llmgw_router_adapter_waiting_requests", nil, n)
	close(svc.gate)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Errorf("status %d", c)
		}
	}
	if got := svc.calls.Load(); got != 1 {
		t.Errorf("EnsureAdapter calls %d, want 1", got)
	}
	if got := len(r0.got()); got != n {
		t.Errorf("r0 served %d, want %d", got, n)
	}
	if got := testkit.Metric(t, reg, "llmgw_router_adapter_waited_requests_total", nil); got != n {
		t.Errorf("waited requests %v, want %d", got, n)
	}
}

func TestModelsListAdapters(t *testing.T) {
	tb := loraTable(t, "sim", &recorder{}, &recorder{})
	url, _ := loraRouter(t, tb, nil, time.Second)
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		Data []struct {
			ID     string  `json:"id"`
			Root   string  `json:"root"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, d := range got.Data {
		p := "null"
		if d.Parent != nil {
			p = *d.Parent
		}
		lines = append(lines, fmt.Sprintf("%s root=%s parent=%s", d.ID, d.Root, p))
	}
	want := "base root=org/base-7b parent=null|sql root=/a/sql parent=base|legal root=/a/legal parent=base"
	if s := strings.Join(lines, "|"); s != want {
		t.Fatalf("models\n got %s\nwant %s", s, want)
	}
}

// TestUsageOnStreams: the router asks the engine for usage and strips the
// usage chunk unless the client asked for it, passing every other event
// on as it arrives (the engine sends the next only once the client has the
// previous one).
func TestUsageOnStreams(t *testing.T) {
	tests := []struct {
		name       string
		body       string
		wantUsage  bool
		wantEngine string // stream_options as the engine got it
	}{
		{"client did not ask", `{"model":"demo","stream":true,"messages":[]}`, false, `{"include_usage":true}`},
		{"client asked", `{"model":"demo","stream":true,"stream_options":{"include_usage":true},"messages":[]}`, true, `{"include_usage":true}`},
		{"other options kept", `{"model":"demo","stream":true,"stream_options":{"continuous_usage_stats":false},"messages":[]}`, false,
			`{"include_usage":true,"continuous_usage_stats":false}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gotClient := make(chan struct{})
			var engineOpts string
			addr := engine(t, func(w http.ResponseWriter, r *http.Request) {
				var f struct {
					StreamOptions json.RawMessage `json:"stream_options"`
				}
				json.NewDecoder(r.Body).Decode(&f)
				engineOpts = string(f.StreamOptions)
				w.Header().Set("Content-Type", "text/event-stream")
				fl := w.(http.Flusher)
				for _, ev := range []string{`{"choices":[{"delta":{"content":"a"}}]}`, `{"choices":[{"delta":{"content":"b"}}]}`} {
					// Split each event across two writes: the router must reassemble it.
					io.WriteString(w, "data: "+ev[:5])
					fl.Flush()
					io.WriteString(w, ev[5:]+"\n\n")
					fl.Flush()
					select {
					case <-gotClient:
					case <-time.After(10 * time.Second):
						return // the router held the event back; the client check fails
					}
				}
				io.WriteString(w, `data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}`+"\n\n")
				io.WriteString(w, "data: [DONE]\n\n")
			})
			s := newRouter(t, &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("a", addr)}}}, nil)
			resp := post(t, s.URL+"/v1/chat/completions", tt.body, nil)
			br := bufio.NewReader(resp.Body)
			var events []string
			for {
				line, err := br.ReadString('\n')
				if strings.HasPrefix(line, "data: ") {
					events = append(events, strings.TrimSpace(line))
					if strings.Contains(line, `"delta"`) {
						gotClient <- struct{}{}
					}
				}
				if err != nil {
					break
				}
			}
			if engineOpts != tt.wantEngine {
				t.Errorf("engine's stream_options %s, want %s", engineOpts, tt.wantEngine)
			}
			hasUsage := false
			for _, e := range events {
				hasUsage = hasUsage || strings.Contains(e, `"usage"`)
			}
			if hasUsage != tt.wantUsage || len(events) != map[bool]int{true: 4, false: 3}[tt.wantUsage] {
				t.Errorf("client got %q (usage wanted: %v)", events, tt.wantUsage)
			}
		})
	}
}
