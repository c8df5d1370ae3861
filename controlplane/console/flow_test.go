package console

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestFlowPage: the flow page's JSON is FlowStatus in protojson — the
// queues summed per model and class and each router's own — or, when the
// call fails (no leader), the error by name; the page's script draws it
// and the navigation links it.
func TestFlowPage(t *testing.T) {
	admin := &fakeAdmin{flow: &llmgwv1.FlowStatusResponse{
		Routers: []*llmgwv1.FlowRouterDepths{
			{Router: "r1", ReportedUnixMs: 1_700_000_000_000, Depths: []*llmgwv1.FlowDepth{{Model: "demo", Class: "interactive", Queued: 3, QueuedBytes: 300, OldestWaitMs: 1500}}},
			{Router: "r2", ReportedUnixMs: 1_700_000_000_100},
		},
		Total: []*llmgwv1.FlowDepth{{Model: "demo", Class: "interactive", Queued: 3, QueuedBytes: 300, OldestWaitMs: 1500, Routers: 1}},
	}}
	con := New(admin, Access{}, nil, nil, slog.New(slog.DiscardHandler))
	mux := http.NewServeMux()
	con.Register(mux)

	pg := get(t, mux, "/ui/api/flow")
	for _, w := range []string{`"router":"r1"`, `"router":"r2"`, `"oldest_wait_ms":"1500"`, `"routers":1`, `"class":"interactive"`} {
		if !strings.Contains(string(pg["flow"]), w) {
			t.Errorf("flow %s lacks %s", pg["flow"], w)
		}
	}

	admin.flow, admin.flowErr = nil, errors.New("rpc error: code = Unavailable desc = no leader")
	pg = get(t, mux, "/ui/api/flow")
	var errs map[string]string
	if err := json.Unmarshal(pg["errors"], &errs); err != nil || !strings.Contains(errs["flow"], "no leader") {
		t.Fatalf("flow errors %s", pg["errors"])
	}

	for path, wants := range map[string][]string{
		"/ui/":       {`<a href="#flow" data-page="flow">Flow</a>`},
		"/ui/app.js": {"flow: renderFlow", "function renderFlow", "Oldest wait", `id="flow-routers"`},
	} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.RemoteAddr = "127.0.0.1:4000"
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		for _, w := range wants {
			if !strings.Contains(rec.Body.String(), w) {
				t.Errorf("%s lacks %q", path, w)
			}
		}
	}
}
