package api

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/endpoint"
)

// apiError is OpenAI's error body as the tests read it.
type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func do(t *testing.T, method, url, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
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

// TestSurface: every path and method the router does not serve, every
// model sent to the other task's endpoint, gets OpenAI's error body with
// the right status (the SDKs show it), and the endpoints of each task
// reach the engine.
func TestSurface(t *testing.T) {
	var gotPath string
	eng := engine(t, func(w http.ResponseWriter, r *http.Request) {
		gotPath = r.URL.Path
		io.WriteString(w, `{"object":"list"}`)
	})
	e := ep("emb-0", eng)
	tb := &table{
		models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", eng)}, "emb": {e}},
		list: []*llmgwv1.Model{{Name: "demo", CreatedUnix: 1_700_000_000},
			{Name: "emb", Task: "embed", CreatedUnix: 1_700_000_100}},
	}
	srv := newRouter(t, tb, nil)
	tests := []struct {
		name, method, path, body string
		status                   int
		code, allow, gotPath     string
	}{
		{"unknown path", "GET", "/v1/nope", "", 404, "unknown_url", "", ""},
		{"unknown root path", "POST", "/", "{}", 404, "unknown_url", "", ""},
		{"GET a completion endpoint", "GET", "/v1/chat/completions", "", 405, "method_not_allowed", "POST", ""},
		{"DELETE models", "DELETE", "/v1/models", "", 405, "method_not_allowed", "GET, HEAD", ""},
		{"POST a model", "POST", "/v1/models/demo", "", 405, "method_not_allowed", "GET, HEAD", ""},
		{"POST healthz", "POST", "/healthz", "", 405, "method_not_allowed", "GET, HEAD", ""},
		{"embed model on chat", "POST", "/v1/chat/completions", `{"model":"emb"}`, 400, "model_not_supported", "", ""},
		{"embed model on completions", "POST", "/v1/completions", `{"model":"emb"}`, 400, "model_not_supported", "", ""},
		{"generate model on embeddings", "POST", "/v1/embeddings", `{"model":"demo","input":"x"}`, 400, "model_not_supported", "", ""},
		{"unknown model on embeddings", "POST", "/v1/embeddings", `{"model":"x","input":"x"}`, 404, "model_not_found", "", ""},
		{"unknown model card", "GET", "/v1/models/nope", "", 404, "model_not_found", "", ""},
		{"embeddings", "POST", "/v1/embeddings", `{"model":"emb","input":"x"}`, 200, "", "", "/v1/embeddings"},
		{"chat", "POST", "/v1/chat/completions", `{"model":"demo"}`, 200, "", "", "/v1/chat/completions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gotPath = ""
			resp, b := do(t, tt.method, srv.URL+tt.path, tt.body)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, b)
			}
			if got := resp.Header.Get("Allow"); got != tt.allow {
				t.Fatalf("Allow %q, want %q", got, tt.allow)
			}
			if gotPath != tt.gotPath {
				t.Fatalf("engine saw %q, want %q", gotPath, tt.gotPath)
			}
			if tt.code == "" {
				return
			}
			var e apiError
			if err := json.Unmarshal(b, &e); err != nil || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("not OpenAI's error body: %s (%v)", b, err)
			}
			if e.Error.Code == nil || *e.Error.Code != tt.code || e.Error.Message == "" || e.Error.Type != "invalid_request_error" {
				t.Fatalf("error %s, want code %s", b, tt.code)
			}
		})
	}
}

// TestModelCards: /v1/models and /v1/models/{id} give each model its
// apply time as created, adapters their model's, and a model id with a
// slash (a Hugging Face name) is one id. max_model_len is always there, as
// in vLLM's cards: the replicas' context length, null for an adapter and
// for a model whose replicas have not reported one (issue 27).
func TestModelCards(t *testing.T) {
	tb := &table{
		models:   map[string][]*endpoint.Endpoint{"demo": nil, "org/model": nil},
		adapters: map[string]endpoint.AdapterRef{"demo-sql": {Model: "demo"}},
		list: []*llmgwv1.Model{{Name: "demo", Model: "/models/demo", CreatedUnix: 1_700_000_000,
			Adapters: []*llmgwv1.Adapter{{Name: "demo-sql", Path: "/lora/sql"}}},
			{Name: "org/model", CreatedUnix: 1_700_000_500}},
		maxLen: map[string]int{"demo": 8192},
	}
	srv := newRouter(t, tb, nil)
	resp, b := do(t, "GET", srv.URL+"/v1/models", "")
	var list modelList
	if err := json.Unmarshal(b, &list); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if len(list.Data) != 3 || list.Data[0].Created != 1_700_000_000 || list.Data[1].ID != "demo-sql" ||
		list.Data[1].Created != 1_700_000_000 || list.Data[2].Created != 1_700_000_500 {
		t.Fatalf("models %+v", list.Data)
	}
	for _, tt := range []struct {
		id          string
		created     int64
		parent      string
		maxModelLen string // as JSON
	}{
		{"demo", 1_700_000_000, "", "8192"},
		{"demo-sql", 1_700_000_000, "demo", "null"},
		{"org/model", 1_700_000_500, "", "null"},
	} {
		resp, b := do(t, "GET", srv.URL+"/v1/models/"+tt.id, "")
		var m modelEntry
		if err := json.Unmarshal(b, &m); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", tt.id, resp.StatusCode, b)
		}
		if m.ID != tt.id || m.Object != "model" || m.Created != tt.created || (tt.parent != "") != (m.Parent != nil) {
			t.Fatalf("%s: %+v", tt.id, m)
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(b, &raw); err != nil {
			t.Fatal(err)
		}
		if got, ok := raw["max_model_len"]; !ok || string(got) != tt.maxModelLen {
			t.Errorf("%s: max_model_len %s (present %v), want %s", tt.id, got, ok, tt.maxModelLen)
		}
	}
}

// TestStatusAccounting: an answer delivered whole is counted by its
// status even when the client closes at once (while the engine still
// holds the stream open after [DONE]); a client that leaves before the
// end is a 499.
func TestStatusAccounting(t *testing.T) {
	tests := []struct {
		name     string
		engine   string // what the engine sends before it waits for the client to go
		stream   bool
		readTo   string // the client closes once it has read this
		wantCode string
	}{
		{"stream closed after [DONE]", "data: {\"choices\":[{}]}\n\ndata: [DONE]\n\n", true, "[DONE]", "200"},
		{"stream closed after [DONE], CRLF", "data: {\"choices\":[{}]}\r\n\r\ndata: [DONE]\r\n\r\n", true, "[DONE]", "200"},
		{"stream left before the end", "data: {\"choices\":[{}]}\n\n", true, "choices", "499"},
		{"sized body closed after its last byte", `{"choices":[{}]}`, false, "}]}", "200"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := engine(t, func(w http.ResponseWriter, r *http.Request) {
				if tt.stream {
					w.Header().Set("Content-Type", "text/event-stream")
				} else {
					w.Header().Set("Content-Length", "16")
				}
				io.WriteString(w, tt.engine)
				w.(http.Flusher).Flush()
				<-r.Context().Done() // an engine slow to end its response
			})
			reg := prometheus.NewRegistry()
			h := newHandler(t, DefaultConfig(), &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", addr)}}},
				inOrder{}, breakers(t), slog.New(slog.DiscardHandler), reg)
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)

			body := `{"model":"demo","stream":false}`
			if tt.stream {
				body = `{"model":"demo","stream":true,"stream_options":{"include_usage":true}}`
			}
			resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			rd := bufio.NewReader(resp.Body)
			var seen strings.Builder
			for !strings.Contains(seen.String(), tt.readTo) {
				b, err := rd.ReadByte()
				if err != nil {
					t.Fatalf("read %q: %v", seen.String(), err)
				}
				seen.WriteByte(b)
			}
			resp.Body.Close()
			c := h.m.requests.WithLabelValues("demo", tt.wantCode, "")
			testkit.Wait(t, "the request counted as "+tt.wantCode, func() bool { return testutil.ToFloat64(c) == 1 })
			for _, other := range []string{"200", "499"} {
				if other != tt.wantCode && testutil.ToFloat64(h.m.requests.WithLabelValues("demo", other, "")) != 0 {
					t.Fatalf("also counted as %s", other)
				}
			}
		})
	}
}

// TestFraming: a sized non-streamed answer passes with its
// Content-Length (one write, no chunking); a stream is chunked by the
// router, which flushes it as it arrives, but for the read that ended it:
// a stream that came whole in one read goes out in one write, framed by
// the server as it likes.
func TestFraming(t *testing.T) {
	release := make(chan struct{}) // the rest of the stream waits for the client's headers
	eng := engine(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "chat") {
			io.WriteString(w, `{"choices":[]}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		if r.Header.Get("X-Whole") == "" {
			io.WriteString(w, "data: {}\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	srv := newRouter(t, &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", eng)}}}, nil)
	resp, b := do(t, "POST", srv.URL+"/v1/chat/completions", `{"model":"demo"}`)
	if resp.ContentLength != int64(len(`{"choices":[]}`)) || len(resp.TransferEncoding) != 0 || string(b) != `{"choices":[]}` {
		t.Fatalf("sized answer: length %d, encoding %v, body %q", resp.ContentLength, resp.TransferEncoding, b)
	}
	stream, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"demo","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	length := stream.ContentLength // the head came with the first event, before the rest was sent
	close(release)
	if b, err := io.ReadAll(stream.Body); err != nil || length != -1 || string(b) != "data: {}\n\ndata: [DONE]\n\n" {
		t.Fatalf("stream: length %d, body %q, err %v", length, b, err)
	}
	req, err := http.NewRequest("POST", srv.URL+"/v1/completions", strings.NewReader(`{"model":"demo","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Whole", "1")
	whole, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Body.Close()
	if b, err := io.ReadAll(whole.Body); err != nil || string(b) != "data: [DONE]\n\n" {
		t.Fatalf("whole stream: body %q, err %v", b, err)
	}
}
