package cluster

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// watchMinVersion is how a server the cluster refuses learns why (design
// §13.3): while it is not in a Raft configuration and knows no leader, it
// asks an alive peer for the cluster's minimum version every interval, and
// reports a version below it in the log (once) and in /readyz.
func (c *Cluster) watchMinVersion(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	reported := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if c.raft.HasLeader() || slices.ContainsFunc(c.raft.Servers(), func(srv raft.Server) bool { return string(srv.ID) == c.cfg.NodeID }) {
			c.versionProblem.Store("")
			continue
		}
		problem := ""
		for id, m := range c.g.Snapshot() {
			if id == c.cfg.NodeID || !m.Status.Live() {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			cs, err := llmgwv1.NewAdminServiceClient(c.pool.Conn(m.Meta.GRPC)).ClusterStatus(cctx, &llmgwv1.ClusterStatusRequest{})
			cancel()
			if err != nil || cs.Leader == "" {
				continue
			}
			if !fsm.AtLeast(c.cfg.Version, cs.MinVersion) {
				problem = fmt.Sprintf("this server runs %s, below the cluster's minimum version %s: the leader will not add it; run %s or newer", c.cfg.Version, cs.MinVersion, cs.MinVersion)
			}
			break
		}
		c.versionProblem.Store(problem)
		if problem != "" && problem != reported {
			c.log.Error("refused by the cluster", "err", problem)
		}
		reported = problem
	}
}
