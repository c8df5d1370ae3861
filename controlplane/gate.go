package controlplane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The minimum-version gate (plan §4, §13.3). A command type introduced in a
// release is proposed only when every server of the Raft configuration —
// voters and non-voters — reports that release or newer over gossip. The
// first time the gate opens for a release, the leader commits it as
// ClusterConfig.min_version before the gated entry, so the log itself says
// which servers may read it: from then on an older server is refused at
// join, and one already in the configuration stops at the min_version
// entry rather than meet a command it would have to guess at.
//
// The gate is committed lazily, at the first gated write, not as soon as
// every server runs the new release: until a new command is used, the
// cluster can still be rolled back to the old binaries.

var (
	// errGate refuses a gated command (FAILED_PRECONDITION).
	errGate = errors.New("minimum-version gate")
	// errBelowMinVersion stops a server whose version is below the
	// cluster's committed minimum.
	errBelowMinVersion = errors.New("this server's version is below the cluster's minimum version")
)

// gateBlockers returns "id (version)" for every server whose version is
// below want, sorted; versions maps server id to its reported version, ""
// when unknown (no gossip metadata), which never passes.
func gateBlockers(want string, versions map[string]string) []string {
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

// configVersions is the version of every server of the Raft configuration
// as this node knows it: its own, and the others' from gossip.
func (s *Server) configVersions() map[string]string {
	out := map[string]string{}
	for _, srv := range s.raftServers() {
		id := string(srv.ID)
		switch {
		case id == s.cfg.NodeID:
			out[id] = s.cfg.Version
		case s.gossip != nil:
			m, _ := s.gossip.memberByID(id)
			out[id] = m.meta.Version
		default:
			out[id] = ""
		}
	}
	return out
}

// gate checks that t may be proposed and, the first time its release's
// gate opens, commits that release as the cluster's minimum version. It
// runs on the leader, before the command is proposed.
func (s *Server) gate(ctx context.Context, t llmgwv1.CommandType) error {
	if !fsm.Known(t) {
		return fmt.Errorf("%w: %s is not known to this server's build (%s); upgrade every server to a release that has it", errGate, t, s.cfg.Version)
	}
	want := fsm.Introduced(t)
	if want == "" {
		return nil
	}
	cfg := s.fsm.Config()
	if fsm.AtLeast(cfg.MinVersion, want) && cfg.MinVersion != "" {
		return nil // committed: older servers are kept out already
	}
	if b := gateBlockers(want, s.configVersions()); len(b) > 0 {
		return fmt.Errorf("%w: %s needs every server at %s or newer; below it: %s (upgrade them first: llmgwctl upgrade plan)", errGate, t, want, strings.Join(b, ", "))
	}
	cfg.MinVersion = want
	cfg.Revision = 0
	_, rev, err := s.propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: cfg})
	if err != nil {
		return fmt.Errorf("commit minimum version %s: %w", want, err)
	}
	s.log.Warn("cluster minimum version raised: older servers are refused from now on", "min_version", want, "revision", rev, "command", t.String())
	return nil
}

// refusal says why this cluster keeps server m out of Raft, "" when it
// does not: its version is below the committed minimum, or it was started
// with another bootstrap expectation.
func (s *Server) refusal(m serverMeta) string {
	if min := s.fsm.Config().GetMinVersion(); !fsm.AtLeast(m.Version, min) {
		v := m.Version
		if v == "" {
			v = "an unknown version"
		}
		return fmt.Sprintf("runs %s, below the cluster's minimum version %s", v, min)
	}
	if s.expectMismatch(m) || m.Bootstrap {
		return fmt.Sprintf("started with --bootstrap-expect %d (bootstrap %v); this cluster expects %d", m.Expect, m.Bootstrap, s.cfg.BootstrapExpect)
	}
	return ""
}

// checkMinVersion stops this server when the state it applied says the
// cluster needs a newer release than it runs: it cannot be trusted with
// the entries that follow.
func (a *fsmAdapter) checkMinVersion() {
	min := a.fsm.Config().GetMinVersion()
	if fsm.AtLeast(a.version, min) {
		return
	}
	a.stopped.Store(true)
	a.fatal(fmt.Errorf("%w: it runs %s, the cluster requires %s or newer (committed at revision %d); downgrading is not possible once a newer command is in use: %w",
		errBelowMinVersion, a.version, min, a.fsm.Revision(), fsm.ErrUnknownCommand))
}

// watchMinVersion is how a server the cluster refuses learns why: while it
// is not in a Raft configuration and knows no leader, it asks an alive
// peer for the cluster's minimum version every interval, and reports a
// version below it in the log (once) and in /readyz.
func (s *Server) watchMinVersion(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	reported := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.hasLeader() || slices.ContainsFunc(s.raftServers(), func(srv raft.Server) bool { return string(srv.ID) == s.cfg.NodeID }) {
			s.versionProblem.Store("")
			continue
		}
		problem := ""
		for id, m := range s.gossip.snapshot() {
			if id == s.cfg.NodeID || (m.status != statusAlive && m.status != statusSuspect) {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			cs, err := llmgwv1.NewAdminServiceClient(s.conns.get(m.meta.GRPC)).ClusterStatus(cctx, &llmgwv1.ClusterStatusRequest{})
			cancel()
			if err != nil || cs.Leader == "" {
				continue
			}
			if !fsm.AtLeast(s.cfg.Version, cs.MinVersion) {
				problem = fmt.Sprintf("this server runs %s, below the cluster's minimum version %s: the leader will not add it; run %s or newer", s.cfg.Version, cs.MinVersion, cs.MinVersion)
			}
			break
		}
		s.versionProblem.Store(problem)
		if problem != "" && problem != reported {
			s.log.Error("refused by the cluster", "err", problem)
		}
		reported = problem
	}
}

// SetNodeLabels is AdminService.SetNodeLabels (answered by the leader):
// the gated command of plan §13.3.
func (a *adminService) SetNodeLabels(ctx context.Context, req *llmgwv1.SetNodeLabelsRequest) (*llmgwv1.SetNodeLabelsResponse, error) {
	if err := fsm.ValidateNodeLabels(req.GetId(), req.GetSet(), req.GetRemove()); err != nil {
		return nil, toStatus(fmt.Errorf("set node labels: %w", err))
	}
	if _, ok := a.s.fsm.Node(req.Id); !ok {
		return nil, toStatus(fmt.Errorf("set node labels %s: node %w", req.Id, fsm.ErrNotFound))
	}
	res, rev, err := a.s.propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_LABELS, &llmgwv1.SetNodeLabelsCommand{Id: req.Id, Set: req.Set, Remove: req.Remove})
	if err != nil {
		return nil, toStatus(fmt.Errorf("set node labels %s: %w", req.Id, err))
	}
	n, _ := res.(*llmgwv1.Node)
	a.s.log.Info("node relabeled by operator", "target_node", req.Id, "revision", rev)
	return &llmgwv1.SetNodeLabelsResponse{Revision: rev, Node: n}, nil
}
