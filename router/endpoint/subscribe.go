package endpoint

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/llmgw/llmgw/internal/backoff"
	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Bounds on the interval an agent announces: a snapshot's staleness window
// is derived from it, so a zero or absurd value must not make every reading
// stale at once, or none ever.
const (
	minAgentInterval = time.Millisecond
	maxAgentInterval = time.Minute
)

// subscription is one agent's LoadService stream (design §6 "Load
// snapshots"), kept while its node has routable replicas.
type subscription struct {
	node, addr string
	cancel     context.CancelFunc
	// lastAt is the router's clock (unix nanos) at the last snapshot, 0
	// while the stream is down; staleAfter is that snapshot's window.
	lastAt     atomic.Int64
	staleAfter atomic.Int64
}

// syncSubs keeps one subscription per node that has a routable endpoint and
// advertises an agent gRPC address, and drops the others. Called from Run's
// goroutine only.
func (r *Registry) syncSubs(ctx context.Context) {
	v := r.cur.Load()
	want := map[string]string{}
	for _, e := range v.all {
		if v.state == nil {
			break
		}
		if n := v.state.Nodes[e.Node]; n != nil && n.GetAgentGrpcAddr() != "" {
			want[e.Node] = n.GetAgentGrpcAddr()
		}
	}
	for node, s := range r.subs {
		if want[node] != s.addr {
			r.log.Debug("endpoint: load subscription dropped", "node", node, "addr", s.addr)
			s.cancel()
			delete(r.subs, node)
		}
	}
	for node, addr := range want {
		if r.subs[node] != nil {
			continue
		}
		sctx, cancel := context.WithCancel(ctx)
		s := &subscription{node: node, addr: addr, cancel: cancel}
		r.subs[node] = s
		r.subsGroup.Go(func() { r.runSub(sctx, s) })
	}
	view := make(map[string]*subscription, len(r.subs))
	for node, s := range r.subs {
		view[node] = s
	}
	r.subsView.Store(&view)
	r.subscriptions.Set(float64(len(r.subs)))
}

// stopSubs ends every subscription and waits for them.
func (r *Registry) stopSubs() {
	for node, s := range r.subs {
		s.cancel()
		delete(r.subs, node)
	}
	r.subsView.Store(&map[string]*subscription{})
	r.subsGroup.Wait()
	r.subscriptions.Set(0)
}

// covered reports whether node's agent is streaming fresh snapshots, so the
// router need not scrape its engines. A subscription that is down or has
// gone silent longer than its staleness window is not: the router then
// scrapes the engines itself (as for an agent without LoadService) rather
// than route on readings it knows are stale.
func (r *Registry) covered(node string) bool {
	s := (*r.subsView.Load())[node]
	if s == nil {
		return false
	}
	at := s.lastAt.Load()
	return at != 0 && r.now().Sub(time.Unix(0, at)) <= time.Duration(s.staleAfter.Load())
}

// runSub keeps s's stream up until ctx ends, reconnecting with a jittered,
// doubling delay (internal/backoff) that a stream which delivered anything
// resets, so routers that lost the same agent do not return in step.
func (r *Registry) runSub(ctx context.Context, s *subscription) {
	log := r.log.With("node", s.node, "addr", s.addr)
	wait := r.subscribeBackoff()
	for {
		got, err := r.subscribeOnce(ctx, s)
		s.lastAt.Store(0)
		if ctx.Err() != nil {
			return
		}
		if got {
			wait.Reset()
		}
		delay := wait.Next()
		log.Debug("endpoint: load subscription ended", "err", err, "retry_in", delay)
		if !backoff.Sleep(ctx, delay) {
			return
		}
	}
}

// subscribeBackoff is one subscription's reconnect delays: from
// SubscribeInitial doubling to SubscribeMax, each drawn from [d/2, d).
func (r *Registry) subscribeBackoff() *backoff.Backoff {
	return backoff.New(r.cfg.SubscribeInitial, r.cfg.SubscribeMax, r.cfg.Jitter)
}

// subscribeOnce runs one stream until it fails; it reports whether any
// snapshot arrived.
func (r *Registry) subscribeOnce(ctx context.Context, s *subscription) (got bool, err error) {
	conn, err := grpc.NewClient(s.addr, agentCreds(r.cfg.TLS, s.node))
	if err != nil {
		return false, fmt.Errorf("load subscription to %s: %w", s.addr, err)
	}
	defer conn.Close()
	stream, err := llmgwv1.NewLoadServiceClient(conn).Subscribe(ctx, &llmgwv1.LoadSubscribeRequest{ClientId: r.cfg.ClientID})
	if err != nil {
		return false, fmt.Errorf("load subscription to %s: %w", s.addr, err)
	}
	for {
		snap, err := stream.Recv()
		if err != nil {
			return got, fmt.Errorf("load subscription to %s: %w", s.addr, err)
		}
		if err := r.applySnapshot(s, snap); err != nil {
			// One bad snapshot loses nothing held; the next may be good.
			r.log.Warn("endpoint: load snapshot refused", "node", s.node, "err", err)
			continue
		}
		got = true
	}
}

// errBadSnapshot marks a snapshot the router will not apply.
var errBadSnapshot = errors.New("bad load snapshot")

// applySnapshot stores each reading on the endpoint of the same replica,
// uid and incarnation on the snapshot's node (design §4 "Identity"); a
// reading for any other incarnation is dropped. A reading's age is taken on
// the agent's clock (snapshot time minus scrape time) and laid onto the
// router's, so clock skew between machines does not age or rejuvenate it.
// A replica the snapshot does not list, or lists unread, keeps its last
// reading, which ages into "saturated".
func (r *Registry) applySnapshot(s *subscription, snap *llmgwv1.LoadSnapshot) error {
	if snap.GetNode() != "" && snap.GetNode() != s.node {
		return fmt.Errorf("%w: from node %q, subscribed to %q", errBadSnapshot, snap.GetNode(), s.node)
	}
	r.snapshots.Inc()
	interval := min(max(time.Duration(snap.GetIntervalNanos()), minAgentInterval), maxAgentInterval)
	staleAfter := time.Duration(r.cfg.StaleIntervals) * interval
	now := r.now()

	eps := r.cur.Load().byNode[s.node]
	for _, rl := range snap.GetReplicas() {
		e := eps[rl.GetReplicaId()]
		if e == nil || e.UID != rl.GetUid() || e.Incarnation != rl.GetIncarnation() || rl.GetScrapedUnixNano() == 0 {
			continue
		}
		if !validLoad(rl.GetWaiting()) || !validLoad(rl.GetRunning()) || !validLoad(rl.GetKvUsage()) {
			r.log.Debug("endpoint: reading with an impossible value dropped", "node", s.node, "replica", rl.GetReplicaId())
			continue
		}
		age := max(time.Duration(snap.GetUnixNano()-rl.GetScrapedUnixNano()), 0)
		r.readingAge.Observe(age.Seconds())
		e.reading.Store(&timedReading{
			Reading:    Reading{Waiting: rl.GetWaiting(), Running: rl.GetRunning(), KVUsage: rl.GetKvUsage()},
			at:         now.Add(-age),
			staleAfter: staleAfter,
		})
	}
	s.staleAfter.Store(int64(staleAfter))
	s.lastAt.Store(now.UnixNano())
	return nil
}

func validLoad(v float64) bool { return v >= 0 && !math.IsInf(v, 0) && !math.IsNaN(v) }

// agentCreds are the credentials for dialing node's LoadService: with TLS,
// the peer must hold an agent certificate of the cluster's CA and, beyond
// the role, the one naming node. The address came from the agent's own
// report, which the control plane takes only from that node's certificate,
// but an address can be reused or redirected; the name check makes sure
// the loads the router routes on are the node's own.
func agentCreds(src *mtls.Source, node string) grpc.DialOption {
	if src == nil {
		return mtls.DialOption(nil, mtls.RoleAgent)
	}
	cfg := src.ClientConfig(mtls.RoleAgent)
	verifyRole := cfg.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if err := verifyRole(cs); err != nil {
			return err
		}
		id, err := mtls.IdentityOf(cs.PeerCertificates[0])
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		if id.Name != node {
			return fmt.Errorf("tls: the LoadService of node %s presented the certificate of %s", node, id)
		}
		return nil
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg))
}
