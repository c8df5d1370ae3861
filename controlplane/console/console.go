// Package console is the control node's read-only web console (design §9):
// a page per subject — the cluster's servers, the nodes, the models with
// their replicas and live load, why any replica of a model's count is not
// ready and its autoscaler's decisions, the adapters and where they are held,
// each router's routing decisions by tier, the tenants with their
// limits, usage and budgets left, and the routers' flow-control queues —
// served under /ui/ on the node's HTTP listener, beside /metrics.
//
// What it reads, and why from there:
//
//   - The cluster, nodes, models, replicas, adapters, tenants, the usage
//     roll-up and the routers' flow-control queues come from AdminService,
//     called over gRPC on the node's own listener — the calls llmgwctl
//     makes, through the same authorization and forwarding, so the console
//     can never show what the CLI would not (a follower forwards ListPeers
//     to the leader exactly as it does for llmgwctl). The JSON under
//     /ui/api/ is those responses in protojson, one object per page (the
//     tenants page's usage summed per hour, day and month). Each model's
//     ModelStatus (the leader's count, its reason for unplaced replicas and
//     the autoscaler's decisions) is one call per model, bounded
//     (modelstatus.go), with a summary the console composes so that a
//     model short of its count always says why.
//   - Live load is nowhere in the control plane: agents stream it to
//     routers only (LoadService admits routers alone). The console reads
//     each ready replica's engine /metrics itself when the models page asks
//     (Load), with vllm.ParseLoad, the agent's own parser. Engines are plain
//     HTTP; where they are firewalled to the routers the page says
//     "unreachable" for each.
//   - Routers report nothing of their routing decisions to the control
//     plane (only their flow-control queues, which the leader holds for a
//     few seconds: FlowStatus), and it does not know their addresses. The
//     operator names them (--console-router); a Sampler reads their
//     /metrics every few seconds and keeps minutes of the decision
//     counters, which is what "decisions over the last minutes" needs
//     without a Prometheus.
//
// Access (design §11): with mutual TLS the listener also speaks TLS (Split)
// and the console answers only TLS callers holding an admin certificate of
// the cluster's CA; without TLS, only loopback callers, unless --insecure.
package console

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Admin is the part of AdminService the console reads: the calls llmgwctl
// makes for the same listings. llmgwv1.AdminServiceClient satisfies it.
type Admin interface {
	ClusterStatus(ctx context.Context, in *llmgwv1.ClusterStatusRequest, opts ...grpc.CallOption) (*llmgwv1.ClusterStatusResponse, error)
	ListPeers(ctx context.Context, in *llmgwv1.ListPeersRequest, opts ...grpc.CallOption) (*llmgwv1.ListPeersResponse, error)
	Members(ctx context.Context, in *llmgwv1.MembersRequest, opts ...grpc.CallOption) (*llmgwv1.MembersResponse, error)
	ListNodes(ctx context.Context, in *llmgwv1.ListRequest, opts ...grpc.CallOption) (*llmgwv1.ListNodesResponse, error)
	ListModels(ctx context.Context, in *llmgwv1.ListRequest, opts ...grpc.CallOption) (*llmgwv1.ListModelsResponse, error)
	ListReplicas(ctx context.Context, in *llmgwv1.ListRequest, opts ...grpc.CallOption) (*llmgwv1.ListReplicasResponse, error)
	ListAdapters(ctx context.Context, in *llmgwv1.ListRequest, opts ...grpc.CallOption) (*llmgwv1.ListAdaptersResponse, error)
	ListTenants(ctx context.Context, in *llmgwv1.ListRequest, opts ...grpc.CallOption) (*llmgwv1.ListTenantsResponse, error)
	Usage(ctx context.Context, in *llmgwv1.UsageRequest, opts ...grpc.CallOption) (*llmgwv1.UsageResponse, error)
	FlowStatus(ctx context.Context, in *llmgwv1.FlowStatusRequest, opts ...grpc.CallOption) (*llmgwv1.FlowStatusResponse, error)
	// ModelStatus is answered by the leader (a follower forwards it),
	// whose memory holds why replicas are missing and the autoscaler's
	// decisions.
	ModelStatus(ctx context.Context, in *llmgwv1.ModelStatusRequest, opts ...grpc.CallOption) (*llmgwv1.ModelStatusResponse, error)
}

// Prefix is where the console is mounted; "/" redirects there.
const Prefix = "/ui/"

// callTimeout bounds each AdminService call of one page: a page answers
// within it, with the calls that failed named, rather than hang while the
// cluster has no leader.
const callTimeout = 3 * time.Second

//go:embed web
var webFS embed.FS

// Console serves the pages and their JSON. Create it with New.
type Console struct {
	admin   Admin
	access  Access
	load    *Load
	routers *Sampler
	// now is the clock of the tenants page's hour, day and month.
	now func() time.Time
	// timeout bounds each page's AdminService calls (callTimeout).
	timeout time.Duration
	log     *slog.Logger
}

// New returns the console of one node. routers may be nil (no router
// named: the routers page says how to name them).
func New(admin Admin, access Access, load *Load, routers *Sampler, log *slog.Logger) *Console {
	return &Console{admin: admin, access: access, load: load, routers: routers, now: time.Now, timeout: callTimeout, log: log}
}

// Register mounts the console on mux: Prefix, its JSON under
// Prefix+"api/", and a redirect from "/".
func (c *Console) Register(mux *http.ServeMux) {
	web, err := fs.Sub(webFS, "web")
	if err != nil {
		panic(err) // the embedded tree is part of the build
	}
	static := http.StripPrefix(Prefix, http.FileServerFS(web))
	mux.Handle("GET "+Prefix, c.access.Wrap(static))
	mux.Handle("GET "+Prefix+"api/cluster", c.access.Wrap(http.HandlerFunc(c.cluster)))
	mux.Handle("GET "+Prefix+"api/nodes", c.access.Wrap(http.HandlerFunc(c.nodes)))
	mux.Handle("GET "+Prefix+"api/models", c.access.Wrap(http.HandlerFunc(c.models)))
	mux.Handle("GET "+Prefix+"api/adapters", c.access.Wrap(http.HandlerFunc(c.adapters)))
	mux.Handle("GET "+Prefix+"api/routers", c.access.Wrap(http.HandlerFunc(c.routerDecisions)))
	mux.Handle("GET "+Prefix+"api/tenants", c.access.Wrap(http.HandlerFunc(c.tenants)))
	mux.Handle("GET "+Prefix+"api/flow", c.access.Wrap(http.HandlerFunc(c.flow)))
	mux.Handle("GET /{$}", http.RedirectHandler(Prefix, http.StatusFound))
}

// page is one page's JSON: each call's response by name, and the calls that
// failed with their errors (the page shows what it has and names the rest).
type page struct {
	parts  map[string]json.RawMessage
	errors map[string]string
}

func newPage() *page {
	return &page{parts: map[string]json.RawMessage{}, errors: map[string]string{}}
}

var marshal = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// add records a call's response, or its error.
func (p *page) add(name string, m proto.Message, err error) {
	if err != nil {
		p.errors[name] = err.Error()
		return
	}
	b, err := marshal.Marshal(m)
	if err != nil {
		p.errors[name] = err.Error()
		return
	}
	p.parts[name] = b
}

// set records a value the console computed (load, router samples).
func (p *page) set(name string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		p.errors[name] = err.Error()
		return
	}
	p.parts[name] = b
}

func (p *page) write(w http.ResponseWriter, log *slog.Logger) {
	errs, _ := json.Marshal(p.errors)
	p.parts["errors"] = errs
	p.parts["now_unix_ms"], _ = json.Marshal(time.Now().UnixMilli())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err := json.NewEncoder(w).Encode(p.parts); err != nil {
		log.Debug("console: write page", "err", err)
	}
}

func (c *Console) cluster(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), c.timeout)
	defer cancel()
	p := newPage()
	st, err := c.admin.ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{})
	p.add("status", st, err)
	peers, err := c.admin.ListPeers(ctx, &llmgwv1.ListPeersRequest{})
	p.add("peers", peers, err)
	members, err := c.admin.Members(ctx, &llmgwv1.MembersRequest{})
	p.add("members", members, err)
	p.write(w, c.log)
}

func (c *Console) nodes(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), c.timeout)
	defer cancel()
	p := newPage()
	nodes, err := c.admin.ListNodes(ctx, &llmgwv1.ListRequest{})
	p.add("nodes", nodes, err)
	reps, err := c.admin.ListReplicas(ctx, &llmgwv1.ListRequest{})
	p.add("replicas", reps, err)
	p.write(w, c.log)
}

// models is the models page: the models, their replicas, each model's
// ModelStatus and the summary composed from them (modelstatus.go), and the
// ready engines' load. The statuses and the load are read at once: each is
// bounded, and each waits mostly on others.
func (c *Console) models(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), c.timeout)
	defer cancel()
	p := newPage()
	models, err := c.admin.ListModels(ctx, &llmgwv1.ListRequest{})
	p.add("models", models, err)
	reps, rerr := c.admin.ListReplicas(ctx, &llmgwv1.ListRequest{})
	p.add("replicas", reps, rerr)
	var sts map[string]*llmgwv1.ModelStatusResponse
	var stErrs map[string]error
	var wg sync.WaitGroup
	wg.Go(func() { sts, stErrs = c.modelStatuses(ctx, models.GetModels()) })
	if rerr == nil && c.load != nil {
		p.set("load", c.load.Read(ctx, models.GetModels(), reps.GetReplicas()))
	}
	wg.Wait()
	status := map[string]json.RawMessage{}
	summary := map[string]ModelSummary{}
	var failed []string
	for _, m := range models.GetModels() {
		st, stErr := sts[m.GetName()], stErrs[m.GetName()]
		if st != nil {
			if b, err := marshal.Marshal(st); err == nil {
				status[m.GetName()] = b
			}
		} else {
			failed = append(failed, m.GetName())
		}
		summary[m.GetName()] = summarize(m, st, stErr, reps.GetReplicas())
	}
	p.set("status", status)
	p.set("summary", summary)
	if len(failed) > 0 {
		// One line above the page, not one per model: each model's panel
		// says its own.
		p.errors["model status"] = fmt.Sprintf("%d of %d models without status, %s: %v", len(failed), len(models.GetModels()), failed[0], stErrs[failed[0]])
	}
	p.write(w, c.log)
}

func (c *Console) adapters(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), c.timeout)
	defer cancel()
	p := newPage()
	ads, err := c.admin.ListAdapters(ctx, &llmgwv1.ListRequest{})
	p.add("adapters", ads, err)
	p.write(w, c.log)
}

func (c *Console) routerDecisions(w http.ResponseWriter, _ *http.Request) {
	p := newPage()
	if c.routers == nil || len(c.routers.cfg.Routers) == 0 {
		p.set("routers", RoutersView{Tiers: Tiers, Routers: []RouterView{}})
		p.set("hint", noRoutersHint)
	} else {
		p.set("routers", c.routers.View())
	}
	p.write(w, c.log)
}
