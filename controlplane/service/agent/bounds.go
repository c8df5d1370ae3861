package agent

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/ephemeral"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Bounds limit what one agent session may make this server hold (design
// §11 "Limits"): reports for what its node can run. Without them one
// anonymous session once left 562 MB on a control node's heap with 300 k
// statuses, and the 46 MB it made of the state ended every new router's
// watch. The zero value bounds nothing (tests that do not care).
type Bounds struct {
	// ReplicaSlack is how many replicas beyond the node's desired set a
	// session may report: replicas it still runs after they were moved or
	// removed, or was given by a server ahead of this one.
	ReplicaSlack int
	// AdaptersPerReplica bounds the adapter statuses held per allowed
	// replica (desired plus slack); KVBlocksPerReplica the KV block hashes
	// per desired replica (KV is kept only for replicas placed on the node).
	AdaptersPerReplica int
	KVBlocksPerReplica int
	// MaxStatusBytes bounds one replica or adapter status, marshaled.
	MaxStatusBytes int
}

func (b Bounds) enabled() bool { return b != Bounds{} }

// shrinkGrace is how long a session keeps the budget of a larger desired
// set after it shrank: the agent learns of the removal, stops the engines
// and reports the replicas removed only some time later, and an update it
// sends meanwhile still holds their statuses. It is the default
// drain_timeout, the longest a removal waits for an engine to stop.
const shrinkGrace = 30 * time.Second

// sessionBudget is the ephemeral budget of one session, recomputed when the
// state has moved (its node's desired set may have changed).
type sessionBudget struct {
	state  Desired
	node   string
	bounds Bounds
	now    func() time.Time

	applied uint64
	valid   bool
	// desired is the count the budget follows: the node's desired
	// replicas, or a larger count seen within shrinkGrace (peakUntil).
	desired   int
	peakUntil time.Time
}

// get returns the budget for the state as applied now.
func (s *sessionBudget) get() ephemeral.Budget {
	if !s.bounds.enabled() {
		return ephemeral.Budget{}
	}
	now := s.now()
	if applied, _ := s.state.Applied(); !s.valid || applied != s.applied || (!s.peakUntil.IsZero() && now.After(s.peakUntil)) {
		s.applied = applied
		n := len(s.state.NodeDesired(s.node).GetReplicas())
		switch {
		case !s.valid || n >= s.desired:
			s.desired, s.peakUntil = n, time.Time{}
		case s.peakUntil.IsZero():
			s.peakUntil = now.Add(shrinkGrace) // keep the larger count a while
		case now.After(s.peakUntil):
			s.desired, s.peakUntil = n, time.Time{}
		}
		s.valid = true
	}
	// At least one: a zero field would not bound.
	replicas := max(s.desired+s.bounds.ReplicaSlack, 1)
	return ephemeral.Budget{
		Statuses: replicas,
		Adapters: replicas * s.bounds.AdaptersPerReplica,
		// KV only for the desired replicas, without the slack: ownKV keeps
		// KV only of replicas placed on the node, so the slack would only
		// widen what a flood may hold — at the default 2 Mi hashes a
		// replica, eight slack replicas are 600 MB of a server's heap.
		KVBlocks: max(s.desired, 1) * s.bounds.KVBlocksPerReplica,
	}
}

// chunkBytes bounds the chunks a session's assembler holds (0: none): the
// marshaled size of the most the budget lets the node hold — 8 bytes a
// hash, a status and an adapter status at most MaxStatusBytes — plus a
// chunk's worth of framing.
func (s *sessionBudget) chunkBytes() int {
	if !s.bounds.enabled() {
		return 0
	}
	b := s.get()
	status := max(s.bounds.MaxStatusBytes, 1<<10)
	return 8*b.KVBlocks + status*(b.Statuses+b.Adapters) + 1<<20
}

// errFlood ends a session that broke a bound; reason is its metric label.
type errFlood struct {
	reason string
	err    error
}

func (e *errFlood) Error() string { return e.err.Error() }

// checkSizes refuses an update carrying a status larger than MaxStatusBytes
// before anything of it is applied.
func (b Bounds) checkSizes(u *llmgwv1.EphemeralUpdate) error {
	if b.MaxStatusBytes <= 0 {
		return nil
	}
	for _, st := range u.Statuses {
		if n := proto.Size(st); n > b.MaxStatusBytes {
			return &errFlood{"status_bytes", fmt.Errorf("a status of replica %.64q is %d bytes, above agent_max_status_bytes %d", st.GetReplicaId(), n, b.MaxStatusBytes)}
		}
	}
	for _, a := range u.Adapters {
		if n := proto.Size(a); n > b.MaxStatusBytes {
			return &errFlood{"status_bytes", fmt.Errorf("an adapter status of replica %.64q is %d bytes, above agent_max_status_bytes %d", a.GetReplicaId(), n, b.MaxStatusBytes)}
		}
	}
	return nil
}

// applyBounded applies an update from the session within its budget.
func (a *Service) applyBounded(u *llmgwv1.EphemeralUpdate, b *sessionBudget) (ephemeral.Verdict, error) {
	if err := b.bounds.checkSizes(u); err != nil {
		return ephemeral.OverBudget, err
	}
	budget := b.get()
	v, err := a.reports.ApplyWithin(u, budget)
	var ob *ephemeral.OverBudgetError
	if errors.As(err, &ob) {
		setting := map[string]string{"statuses": "agent_replica_slack", "adapters": "agent_adapters_per_replica", "kv_blocks": "agent_kv_blocks_per_replica"}[ob.What]
		return v, &errFlood{ob.What, fmt.Errorf("%w (node has %d desired replicas; the bound follows %s)", err, b.desired, setting)}
	}
	return v, err
}

// cut ends a session that broke a bound or sent a message over the gRPC
// limit: its reports are dropped (the store has done it when dropped is
// set), so the memory they held returns, and the agent is told why. Its
// next session starts afresh with a full copy.
func (a *Service) cut(nodeID string, epoch uint64, reason string, err error, dropped bool) error {
	a.metrics.sessionsCut.WithLabelValues(reason).Inc()
	dropped = a.reports.Drop(nodeID, epoch) || dropped
	a.log.Warn("agent session ended: it sent more than this server holds for a node", "agent_node", nodeID, "epoch", epoch,
		"reason", reason, "reports_dropped", dropped, "err", err)
	return status.Errorf(codes.ResourceExhausted, "session ended by control node %s, its reports dropped: %v", a.cfg.Self, err)
}

// recvTooLarge reports whether a Recv error is gRPC refusing a message
// over grpc_max_recv_bytes.
func recvTooLarge(err error) bool { return status.Code(err) == codes.ResourceExhausted }

func newSessionsCut(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_control_agent_sessions_cut_total",
		Help: "Agent sessions ended for sending more than the node can run (statuses, adapters, kv_blocks, status_bytes), a message over grpc_max_recv_bytes (message_bytes) or chunks that make no update or pass the budget (chunks); their reports were dropped.",
	}, []string{"reason"})
	reg.MustRegister(c)
	return c
}
