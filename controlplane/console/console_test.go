package console

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fakeAdmin answers the console's calls from fixed responses; peersErr
// fails ListPeers as a follower without a leader would.
type fakeAdmin struct {
	models   []*llmgwv1.Model
	replicas []*llmgwv1.ReplicaView
	peersErr error
	tenants  []*llmgwv1.Tenant
	usage    []*llmgwv1.UsageRow
	// since is the since_unix of the last Usage call.
	since   int64
	flow    *llmgwv1.FlowStatusResponse
	flowErr error
	// statuses answers ModelStatus by model; a model without one is
	// NOT_FOUND, or statusErr for every model when set. statusCalls counts
	// the calls, inFlight and maxInFlight their concurrency.
	statuses  map[string]*llmgwv1.ModelStatusResponse
	statusErr error
	// statusBlock makes ModelStatus wait for its context's end.
	statusBlock                        bool
	mu                                 sync.Mutex
	statusCalls, inFlight, maxInFlight int
}

func (f *fakeAdmin) ClusterStatus(context.Context, *llmgwv1.ClusterStatusRequest, ...grpc.CallOption) (*llmgwv1.ClusterStatusResponse, error) {
	return &llmgwv1.ClusterStatusResponse{Leader: "c1", ServerId: "c1", Revision: 9, Healthy: true, Voters: 1}, nil
}
func (f *fakeAdmin) ListPeers(context.Context, *llmgwv1.ListPeersRequest, ...grpc.CallOption) (*llmgwv1.ListPeersResponse, error) {
	return nil, f.peersErr
}
func (f *fakeAdmin) Members(context.Context, *llmgwv1.MembersRequest, ...grpc.CallOption) (*llmgwv1.MembersResponse, error) {
	return &llmgwv1.MembersResponse{}, nil
}
func (f *fakeAdmin) ListNodes(context.Context, *llmgwv1.ListRequest, ...grpc.CallOption) (*llmgwv1.ListNodesResponse, error) {
	return &llmgwv1.ListNodesResponse{}, nil
}
func (f *fakeAdmin) ListModels(context.Context, *llmgwv1.ListRequest, ...grpc.CallOption) (*llmgwv1.ListModelsResponse, error) {
	return &llmgwv1.ListModelsResponse{Models: f.models}, nil
}
func (f *fakeAdmin) ListReplicas(context.Context, *llmgwv1.ListRequest, ...grpc.CallOption) (*llmgwv1.ListReplicasResponse, error) {
	return &llmgwv1.ListReplicasResponse{Replicas: f.replicas}, nil
}
func (f *fakeAdmin) ListAdapters(context.Context, *llmgwv1.ListRequest, ...grpc.CallOption) (*llmgwv1.ListAdaptersResponse, error) {
	return &llmgwv1.ListAdaptersResponse{}, nil
}

func (f *fakeAdmin) ListTenants(context.Context, *llmgwv1.ListRequest, ...grpc.CallOption) (*llmgwv1.ListTenantsResponse, error) {
	return &llmgwv1.ListTenantsResponse{Tenants: f.tenants}, nil
}
func (f *fakeAdmin) Usage(_ context.Context, r *llmgwv1.UsageRequest, _ ...grpc.CallOption) (*llmgwv1.UsageResponse, error) {
	f.since = r.SinceUnix
	return &llmgwv1.UsageResponse{Rows: f.usage}, nil
}

func (f *fakeAdmin) FlowStatus(context.Context, *llmgwv1.FlowStatusRequest, ...grpc.CallOption) (*llmgwv1.FlowStatusResponse, error) {
	return f.flow, f.flowErr
}

func (f *fakeAdmin) ModelStatus(ctx context.Context, r *llmgwv1.ModelStatusRequest, _ ...grpc.CallOption) (*llmgwv1.ModelStatusResponse, error) {
	f.mu.Lock()
	f.statusCalls++
	f.inFlight++
	f.maxInFlight = max(f.maxInFlight, f.inFlight)
	st, err, block := f.statuses[r.GetName()], f.statusErr, f.statusBlock
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inFlight--
		f.mu.Unlock()
	}()
	if block {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if err != nil {
		return nil, err
	}
	if st == nil {
		return nil, status.Errorf(codes.NotFound, "model %q: not found", r.GetName())
	}
	return st, nil
}

func view(id string, uid uint64, phase llmgwv1.ReplicaPhase, addr string) *llmgwv1.ReplicaView {
	return &llmgwv1.ReplicaView{
		Replica: &llmgwv1.Replica{Id: id, Uid: uid, Model: "demo", Node: "n1"},
		Status:  &llmgwv1.ReplicaStatus{ReplicaId: id, Uid: uid, Phase: phase, Address: addr},
	}
}

func get(t *testing.T, h http.Handler, path string) map[string]json.RawMessage {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.RemoteAddr = "127.0.0.1:4000"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body)
	}
	var out map[string]json.RawMessage
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return out
}

// TestPages: each page's JSON holds its calls' responses and names the
// calls that failed; the models page reads ready engines' load and skips
// the others; the shell and its assets are served.
func TestPages(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "vllm:num_requests_running{model_name=\"m\"} 3\nvllm:num_requests_waiting{model_name=\"m\"} 1\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n")
	}))
	defer engine.Close()
	addr := strings.TrimPrefix(engine.URL, "http://")
	admin := &fakeAdmin{
		models: []*llmgwv1.Model{{Name: "demo", Engine: "sim"}},
		replicas: []*llmgwv1.ReplicaView{
			view("demo-0", 5, llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, addr),
			view("demo-1", 6, llmgwv1.ReplicaPhase_REPLICA_PHASE_RESTARTING, addr),
			view("demo-2", 7, llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, "127.0.0.1:1"),
		},
		peersErr: errors.New("rpc error: code = Unavailable desc = no leader"),
	}
	c := New(admin, Access{}, NewLoad(), nil, slog.New(slog.DiscardHandler))
	mux := http.NewServeMux()
	c.Register(mux)

	cl := get(t, mux, "/ui/api/cluster")
	var errs map[string]string
	if err := json.Unmarshal(cl["errors"], &errs); err != nil || !strings.Contains(errs["peers"], "no leader") {
		t.Fatalf("cluster errors %s", cl["errors"])
	}
	if !strings.Contains(string(cl["status"]), `"leader":"c1"`) {
		t.Fatalf("status %s", cl["status"])
	}

	m := get(t, mux, "/ui/api/models")
	var load map[string]ReplicaLoad
	if err := json.Unmarshal(m["load"], &load); err != nil {
		t.Fatal(err)
	}
	if l := load["demo-0"]; l.Running != 3 || l.Waiting != 1 || l.KVUsage != 0.25 || l.Error != "" {
		t.Fatalf("demo-0 load %+v", l)
	}
	if _, ok := load["demo-1"]; ok {
		t.Fatalf("a restarting replica's engine was read: %+v", load)
	}
	if !strings.Contains(load["demo-2"].Error, "unreachable") {
		t.Fatalf("demo-2 load %+v, want unreachable", load["demo-2"])
	}

	r := get(t, mux, "/ui/api/routers")
	if !strings.Contains(string(r["hint"]), "--console-router") {
		t.Fatalf("routers page without routers: %s", r["hint"])
	}

	for path, want := range map[string]string{"/ui/": "<title>llmgw console</title>", "/ui/app.js": "renderModels", "/ui/style.css": ".badge"} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.RemoteAddr = "127.0.0.1:4000"
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), want) {
			t.Errorf("GET %s: %d, want a body with %q", path, rec.Code, want)
		}
	}
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	if rec.Code != http.StatusFound || rec.Header().Get("Location") != Prefix {
		t.Errorf("GET /: %d to %q, want a redirect to %s", rec.Code, rec.Header().Get("Location"), Prefix)
	}
}
