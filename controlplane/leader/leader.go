package leader

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/autoscale"
	"github.com/llmgw/llmgw/controlplane/quota"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Config is what the leader's work takes from the node's configuration.
type Config struct {
	// ReconcileInterval re-runs placement without a state change (to
	// retry what did not fit).
	ReconcileInterval time.Duration
	NodeDownAfter     time.Duration
	RescheduleAfter   time.Duration
	DrainTimeout      time.Duration
	AdapterMinIdle    time.Duration
	AdapterRetryAfter time.Duration
	// Quota times and bounds the leased shares of the tenants' limits
	// (design §7.7); zero fields take package quota's defaults.
	Quota quota.Config
	// Autoscale is the timings an autoscale spec leaves at 0 (design
	// §5.7); zero fields take package autoscale's defaults.
	Autoscale autoscale.Defaults
	// TTFTP90 reads the routers' summed TTFT bucket counts
	// (internal/ttftbuckets): their p90.
	TTFTP90 func(buckets []uint64) time.Duration
	// PlaceInterval is the least time between the starts of two placement
	// rounds (placement.go); 0 means DefaultPlaceInterval.
	PlaceInterval time.Duration
	// PlaceInFlight bounds the decisions of one kind a round has proposed
	// and not yet seen committed (placement.go); 0 means
	// DefaultPlaceInFlight, 1 proposes one at a time in the plan's order.
	PlaceInFlight int
}

// Proposer commits commands on the leader (package gate over package
// store): the FSM's result and the revision it was applied at, or why not.
type Proposer interface {
	Propose(ctx context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error)
}

// Desired is the replicated desired state (package fsm). Reads return
// copies; Applied's channel is closed at the next applied entry.
type Desired interface {
	State() *llmgwv1.State
	Applied() (uint64, <-chan struct{})
	AdapterModel(adapter string) (*llmgwv1.Model, bool)
	AdapterPlacement(adapter string) (*llmgwv1.AdapterPlacement, bool)
	// Tenant and UsageTokens are what the leased shares read: a tenant's
	// limits and the roll-up's tokens of a budget's period (quota.State).
	Tenant(name string) (*llmgwv1.Tenant, bool)
	UsageTokens(tenant, model string, fromUnix int64) uint64
}

// Reports are the agents' reports (package ephemeral): a replica's status
// and adapters only for its own uid and from its own node. Changed's
// channel is closed at the next accepted update.
type Reports interface {
	StatusOf(r *llmgwv1.Replica) *llmgwv1.ReplicaStatus
	AdaptersOf(r *llmgwv1.Replica) map[string]*llmgwv1.AdapterStatus
	Changed() <-chan struct{}
}

// Sessions says since when a node has had no agent session on any server
// (package sessions); ok is false while one is attached anywhere.
type Sessions interface {
	DetachedSince(node string) (at time.Time, ok bool)
}

// Cluster says whether this server sees every server's agent sessions
// (package cluster): without gossip only a lone server does.
type Cluster interface {
	SessionsVisible() bool
}

// Leader does the leader's work. Place runs per term, between Elected and
// Resigned; EnsureAdapter is called by the AdapterService on the leader,
// Lease by the QuotaService.
type Leader struct {
	cfg      Config
	propose  Proposer
	state    Desired
	reports  Reports
	sessions Sessions
	cluster  Cluster
	metrics  *Metrics
	log      *slog.Logger
	now      func() time.Time

	// adapterMu serializes the adapter placement decisions: the re-read of
	// a placement under it is the single flight that loads each cold
	// adapter once (design §7.6). placedAt is when this node placed each
	// adapter on a replica, so one just placed counts as recently used.
	adapterMu sync.Mutex
	placedAt  map[adapterKey]time.Time
	// queue holds the calls waiting for a slot (design §7.6).
	queue *adapterQueue
	// use is the routers' requests in flight per adapter and replica.
	use *adapterUse
	// quota grants the routers' leased shares of the tenants' limits,
	// read from limits.
	quota  *quota.Allocator
	limits quota.Limits

	// scaler is the autoscaler's memory of this term (nil before the
	// first); ttftP90 reads the routers' TTFT counts.
	scaleMu sync.Mutex
	scaler  *scaler
	ttftP90 func([]uint64) time.Duration

	// unplaced is the latest reason each model is short of replicas
	// (unplaced.go), for Unplaced.
	unplaced *unplacedReasons
}

type adapterKey struct{ adapter, replica string }

// New returns the leader's work over its dependencies; now is the clock of
// every time-based judgement (node down, drain timeout, adapter idleness),
// which tests replace.
func New(cfg Config, p Proposer, state Desired, reports Reports, sessions Sessions, cluster Cluster, m *Metrics, log *slog.Logger, now func() time.Time) *Leader {
	if cfg.Autoscale.ScaleDownAfter <= 0 {
		cfg.Autoscale.ScaleDownAfter = autoscale.DefaultDefaults.ScaleDownAfter
	}
	if cfg.Autoscale.Cooldown <= 0 {
		cfg.Autoscale.Cooldown = autoscale.DefaultDefaults.Cooldown
	}
	if cfg.Autoscale.UpAfter <= 0 {
		cfg.Autoscale.UpAfter = autoscale.DefaultDefaults.UpAfter
	}
	return &Leader{ttftP90: cfg.TTFTP90, cfg: cfg, propose: p, state: state, reports: reports, sessions: sessions, cluster: cluster,
		metrics: m, log: log, now: now, placedAt: map[adapterKey]time.Time{}, queue: newAdapterQueue(), use: newAdapterUse(),
		quota: quota.New(cfg.Quota), limits: quota.StateLimits{State: state}, unplaced: newUnplacedReasons()}
}
