package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// ErrGate refuses a gated command (FAILED_PRECONDITION).
var ErrGate = errors.New("minimum-version gate")

// Store is the Raft store the gate proposes through (package store).
type Store interface {
	// IsLeader reports whether this node leads; NotLeader is the error
	// naming the leader when it does not.
	IsLeader() bool
	NotLeader() error
	// Propose commits one command and returns what the FSM made of it
	// and its revision.
	Propose(ctx context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error)
}

// Desired is the replicated state's cluster config, whose min_version
// records the gate once committed.
type Desired interface {
	Config() *llmgwv1.ClusterConfig
}

// Versions reports the version of every server of the Raft configuration,
// voters and non-voters, by id; "" when unknown, which never passes
// (package cluster).
type Versions interface {
	ConfigVersions() map[string]string
}

// Gate proposes commands through the store, checking the gate first.
type Gate struct {
	version  string
	store    Store
	state    Desired
	versions Versions
	log      *slog.Logger
}

// New returns the gate of a server running version.
func New(version string, st Store, state Desired, v Versions, log *slog.Logger) *Gate {
	return &Gate{version: version, store: st, state: state, versions: v, log: log}
}

// Propose commits one command through Raft on the leader, as the store's
// Propose does, once the gate lets it through (see the package doc).
func (g *Gate) Propose(ctx context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error) {
	if !g.store.IsLeader() {
		return nil, 0, g.store.NotLeader()
	}
	if err := g.check(ctx, t); err != nil {
		return nil, 0, err
	}
	return g.store.Propose(ctx, t, payload)
}

// Require checks that t may be proposed, opening its release's gate as
// Propose would, without proposing it: for a command not gated itself
// whose new fields only servers of that release apply alike (a model's
// autoscale spec rides SET_MODEL_SCALE's release, design §5.7).
func (g *Gate) Require(ctx context.Context, t llmgwv1.CommandType) error {
	if !g.store.IsLeader() {
		return g.store.NotLeader()
	}
	return g.check(ctx, t)
}

// check checks that t may be proposed and, the first time its release's
// gate opens, commits that release as the cluster's minimum version. It
// runs on the leader, before the command is proposed.
func (g *Gate) check(ctx context.Context, t llmgwv1.CommandType) error {
	if !fsm.Known(t) {
		return fmt.Errorf("%w: %s is not known to this server's build (%s); upgrade every server to a release that has it", ErrGate, t, g.version)
	}
	want := fsm.Introduced(t)
	if want == "" {
		return nil
	}
	cfg := g.state.Config()
	if fsm.AtLeast(cfg.MinVersion, want) && cfg.MinVersion != "" {
		return nil // committed: older servers are kept out already
	}
	if b := Blockers(want, g.versions.ConfigVersions()); len(b) > 0 {
		return fmt.Errorf("%w: %s needs every server at %s or newer; below it: %s (upgrade them first: llmgwctl upgrade plan)", ErrGate, t, want, strings.Join(b, ", "))
	}
	cfg.MinVersion = want
	cfg.Revision = 0
	_, rev, err := g.store.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: cfg})
	if err != nil {
		return fmt.Errorf("commit minimum version %s: %w", want, err)
	}
	g.log.Warn("cluster minimum version raised: older servers are refused from now on", "min_version", want, "revision", rev, "command", t.String())
	return nil
}

// Blockers returns "id (version)" for every server whose version is below
// want, sorted; versions maps server id to its reported version, "" when
// unknown (no gossip metadata), which never passes.
func Blockers(want string, versions map[string]string) []string {
	var out []string
	for id, v := range versions {
		if !fsm.AtLeast(v, want) || v == "" {
			if v == "" {
				v = "unknown version"
			}
			out = append(out, fmt.Sprintf("%s (%s)", id, v))
		}
	}
	slices.Sort(out)
	return out
}
