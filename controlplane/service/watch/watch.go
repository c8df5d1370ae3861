package watch

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/chunking"
	"github.com/llmgw/llmgw/controlplane/ephemeral"
	"github.com/llmgw/llmgw/controlplane/service"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Config is what the watch streams take from the node's configuration.
type Config struct {
	// HeartbeatInterval paces heartbeats and server-list checks.
	HeartbeatInterval time.Duration
	// WatchWait bounds the wait for from_revision to be applied here.
	WatchWait time.Duration
	// WatchQueue bounds each watcher's queue of ephemeral updates.
	WatchQueue int
	// ChunkBytes is the chunk budget of ephemeral updates
	// (ephemeral_chunk_bytes, design §5.4 "Chunks"): to a client that
	// assembles chunks, a larger update goes as chunks of at most this or
	// the client's own budget, the smaller. 0 sends every update whole.
	ChunkBytes int
}

// Desired is the replicated state as this server has applied it (package
// fsm). Applied's channel closes at the next applied entry; ChangesSince
// is false when its log no longer reaches back to rev.
type Desired interface {
	Applied() (uint64, <-chan struct{})
	Revision() uint64
	ChangesSince(rev uint64) ([]*llmgwv1.Change, bool)
	State() *llmgwv1.State
}

// Reports are the agents' data held here (package ephemeral).
type Reports interface {
	// Subscribe returns a subscription to every update accepted from now
	// on, queueing up to buffer of them, and a full copy per node as of
	// the subscription: nothing falls between the copies and the deltas.
	Subscribe(buffer int) (*ephemeral.Subscription, []*llmgwv1.EphemeralUpdate)
}

// Peers gives the server list routers fail over along (package cluster).
type Peers interface {
	Servers() []*llmgwv1.ControlServer
}

// Service is the WatchService.
type Service struct {
	llmgwv1.UnimplementedWatchServiceServer
	cfg     Config
	state   Desired
	reports Reports
	peers   Peers
	metrics *Metrics
	log     *slog.Logger
}

// New returns the WatchService.
func New(cfg Config, state Desired, reports Reports, peers Peers, m *Metrics, log *slog.Logger) *Service {
	return &Service{cfg: cfg, state: state, reports: reports, peers: peers, metrics: m, log: log}
}

// Watch sends, in order: the desired state after from_revision (changes and
// a mark, or a framed snapshot when from_revision is 0 or older than the
// change log), the servers list, a full ephemeral copy per node, then live
// changes, ephemeral deltas exactly as the agents sent them, and
// heartbeats.
func (w *Service) Watch(req *llmgwv1.WatchRequest, stream llmgwv1.WatchService_WatchServer) error {
	ctx := stream.Context()
	if err := w.waitFor(ctx, req.FromRevision); err != nil {
		return err
	}
	// Subscribe before reading the desired state, so no ephemeral update
	// falls between the copies and the deltas.
	sub, copies := w.reports.Subscribe(w.cfg.WatchQueue)
	defer sub.Close()
	w.metrics.watchers.Inc()
	defer w.metrics.watchers.Dec()
	log := w.log.With("client", req.ClientId)
	log.Debug("watch started", "from_revision", req.FromRevision)

	sent := req.FromRevision
	var err error
	if sent, err = w.sendDesired(stream, sent, req.FromRevision == 0); err != nil {
		return err
	}
	lastServers := w.peers.Servers()
	if err := stream.Send(&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Servers{Servers: &llmgwv1.ServerList{Servers: lastServers}}}); err != nil {
		return err
	}
	chunk := w.chunkBytes(req)
	for _, c := range copies {
		if err := w.sendEphemeral(stream, c, chunk); err != nil {
			return err
		}
	}
	hb := time.NewTicker(w.cfg.HeartbeatInterval)
	defer hb.Stop()
	for {
		_, applied := w.state.Applied()
		if sent, err = w.sendDesired(stream, sent, false); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-applied:
		case u := <-sub.Updates():
			// An agent reports a placement only after it was applied: send
			// the desired state first, so a router never gets a status for
			// a uid it cannot know yet (and would drop as an old one).
			if sent, err = w.sendDesired(stream, sent, false); err != nil {
				return err
			}
			if err := w.sendEphemeral(stream, u, chunk); err != nil {
				return err
			}
		case <-sub.Overflowed():
			w.metrics.watchOverflows.Inc()
			log.Warn("watcher fell behind; disconnecting it so it resumes", "revision", sent)
			return status.Error(codes.Unavailable, "watch: fell behind on ephemeral updates; resume from your revision")
		case now := <-hb.C:
			if cur := w.peers.Servers(); !service.ServersEqual(cur, lastServers) {
				lastServers = cur
				if err := stream.Send(&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Servers{Servers: &llmgwv1.ServerList{Servers: cur}}}); err != nil {
					return err
				}
			}
			if err := stream.Send(&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Heartbeat{Heartbeat: &llmgwv1.Heartbeat{UnixNano: now.UnixNano()}}}); err != nil {
				return err
			}
		}
	}
}

// chunkBytes is the chunk budget of one stream: the smaller of the
// server's and the client's, or 0 (whole updates) when either has none —
// a client of an earlier release cannot assemble chunks.
func (w *Service) chunkBytes(req *llmgwv1.WatchRequest) int {
	c := int(req.GetMaxChunkBytes())
	if c <= 0 || w.cfg.ChunkBytes <= 0 {
		return 0
	}
	return min(c, w.cfg.ChunkBytes)
}

// sendEphemeral sends one update, as chunks when it is larger than chunk
// (0: whole). The chunks go one after another, so a client assembles one
// update at a time.
func (w *Service) sendEphemeral(stream llmgwv1.WatchService_WatchServer, u *llmgwv1.EphemeralUpdate, chunk int) error {
	parts := chunking.Split(u, chunk)
	if len(parts) > 1 {
		w.metrics.chunked.Inc()
	}
	for _, p := range parts {
		if err := stream.Send(&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Ephemeral{Ephemeral: p}}); err != nil {
			return err
		}
	}
	return nil
}

// waitFor waits until the FSM has applied rev, up to WatchWait: a client
// that saw rev elsewhere must not see this server go backwards.
func (w *Service) waitFor(ctx context.Context, rev uint64) error {
	timer := time.NewTimer(w.cfg.WatchWait)
	defer timer.Stop()
	for {
		cur, applied := w.state.Applied()
		if cur >= rev {
			return nil
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-timer.C:
			return status.Errorf(codes.Unavailable, "watch: this server is at revision %d, behind the requested %d; try another server", cur, rev)
		case <-applied:
		}
	}
}

// sendDesired brings the client from revision sent to the FSM's current
// one, and returns the revision the client now has. It sends the changes
// and a mark, or — when asked, or when the change log no longer reaches
// back to sent — a framed snapshot.
func (w *Service) sendDesired(stream llmgwv1.WatchService_WatchServer, sent uint64, snapshot bool) (uint64, error) {
	cur := w.state.Revision()
	var changes []*llmgwv1.Change
	if !snapshot {
		var ok bool
		changes, ok = w.state.ChangesSince(sent)
		snapshot = !ok
	}
	if snapshot {
		return w.sendSnapshot(stream)
	}
	if cur <= sent && len(changes) == 0 {
		return sent, nil
	}
	for _, c := range changes {
		if err := stream.Send(&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Change{Change: c}}); err != nil {
			return sent, err
		}
		cur = max(cur, c.Revision)
	}
	// Every change up to cur was in the log when it was read after cur, so
	// the client is current to cur even if the last entries changed nothing.
	if err := stream.Send(&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Mark{Mark: &llmgwv1.RevisionMark{Revision: cur}}}); err != nil {
		return sent, err
	}
	return cur, nil
}

func (w *Service) sendSnapshot(stream llmgwv1.WatchService_WatchServer) (uint64, error) {
	st := w.state.State()
	w.metrics.watchSnapshots.Inc()
	events := make([]*llmgwv1.WatchEvent, 0, 3+len(st.Models)+len(st.Nodes)+len(st.Replicas)+len(st.AdapterPlacements)+len(st.ApiKeys)+len(st.Tenants)+len(st.Aliases))
	events = append(events, &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_SnapshotBegin{SnapshotBegin: &llmgwv1.SnapshotBegin{Revision: st.Revision}}})
	put := func(c *llmgwv1.Change) {
		c.Revision, c.Op = st.Revision, llmgwv1.ChangeOp_CHANGE_OP_PUT
		events = append(events, &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Change{Change: c}})
	}
	for _, m := range st.Models {
		put(&llmgwv1.Change{Object: &llmgwv1.Change_Model{Model: m}})
	}
	for _, n := range st.Nodes {
		put(&llmgwv1.Change{Object: &llmgwv1.Change_Node{Node: n}})
	}
	for _, r := range st.Replicas {
		put(&llmgwv1.Change{Object: &llmgwv1.Change_Replica{Replica: r}})
	}
	for _, p := range st.AdapterPlacements {
		put(&llmgwv1.Change{Object: &llmgwv1.Change_AdapterPlacement{AdapterPlacement: p}})
	}
	// Router API keys travel with their hashes: routers check requests
	// against them (design §11). Only routers, admins and servers may
	// watch once the control plane authenticates its callers.
	for _, k := range st.ApiKeys {
		put(&llmgwv1.Change{Object: &llmgwv1.Change_ApiKey{ApiKey: k}})
	}
	// Tenants carry the limits routers enforce (design §7.7); the usage
	// roll-up stays in the control plane.
	for _, t := range st.Tenants {
		put(&llmgwv1.Change{Object: &llmgwv1.Change_Tenant{Tenant: t}})
	}
	// Model aliases: routers resolve them (design §7.9).
	for _, a := range st.Aliases {
		put(&llmgwv1.Change{Object: &llmgwv1.Change_Alias{Alias: a}})
	}
	put(&llmgwv1.Change{Object: &llmgwv1.Change_Config{Config: st.Config}})
	events = append(events, &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_SnapshotEnd{SnapshotEnd: &llmgwv1.SnapshotEnd{Revision: st.Revision}}})
	for _, e := range events {
		if err := stream.Send(e); err != nil {
			return 0, err
		}
	}
	return st.Revision, nil
}
