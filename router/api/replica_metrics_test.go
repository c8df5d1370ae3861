package api

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmgw/llmgw/router/endpoint"
)

// TestPerReplicaMetrics: each answer is counted under the replica that
// gave it, with its status, and its usage.completion_tokens are added to
// that replica's output tokens, streamed or not; ForgetReplicas deletes the
// series of a replica that left and keeps the others'.
func TestPerReplicaMetrics(t *testing.T) {
	addr := engine(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n")
			io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"total_tokens\":12,\"completion_tokens\":7}}\n\n")
			io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3}}`)
	})
	reg := prometheus.NewRegistry()
	h := newHandler(t, DefaultConfig(), &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", addr)}}},
		inOrder{}, breakers(t), slog.New(slog.DiscardHandler), reg)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	for _, body := range []string{`{"model":"demo"}`, `{"model":"demo","stream":true}`, `{"model":"demo"}`} {
		resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", body, resp.StatusCode)
		}
	}
	if got := testutil.ToFloat64(h.m.replicaRequests.WithLabelValues("demo", "demo-0", "200")); got != 3 {
		t.Errorf("requests of demo-0 = %v, want 3", got)
	}
	if got := testutil.ToFloat64(h.m.replicaOutput.WithLabelValues("demo", "demo-0")); got != 3+7+3 {
		t.Errorf("output tokens of demo-0 = %v, want 13", got)
	}

	h.ForgetReplicas(func(string) bool { return true })
	if n := testutil.CollectAndCount(h.m.replicaRequests); n != 1 {
		t.Errorf("after keeping every replica: %d request series, want 1", n)
	}
	h.ForgetReplicas(func(id string) bool { return id != "demo-0" })
	if n := testutil.CollectAndCount(h.m.replicaRequests) + testutil.CollectAndCount(h.m.replicaOutput); n != 0 {
		t.Errorf("after demo-0 left: %d series, want 0", n)
	}
}
