package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/llmgw/llmgw/controlplane/gossip"
	"github.com/llmgw/llmgw/internal/backoff"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Run runs membership's background loops until ctx is done and returns
// after they have stopped: the --join retries, gossip's reconnect of
// failed servers, the bootstrapper (--bootstrap-expect on a server without
// Raft state) and the watch of the cluster's minimum version. Without gossip there is nothing to run.
func (c *Cluster) Run(ctx context.Context) {
	if c.g == nil {
		return
	}
	var wg sync.WaitGroup
	if len(c.cfg.Join) > 0 {
		wg.Go(func() { c.retryJoin(ctx) })
	}
	wg.Go(func() { c.watchMinVersion(ctx, time.Second) })
	// Failed servers are retried for the reconnect window (design §5.2),
	// except those removed from Raft: a removal is the operator's, and
	// only an explicit join undoes it.
	wg.Go(func() { c.g.Reconnect(ctx, c.reconnectable) })
	if c.cfg.BootstrapExpect > 0 && !c.raft.Existing() {
		wg.Go(func() { c.bootstrap(ctx) })
	}
	wg.Wait()
}

// reconnectable is whether gossip's reconnect may retry server id: not
// once it is removed from Raft, by a gossip tombstone or the replicated
// record (removals.go), which survives a restart of every server.
func (c *Cluster) reconnectable(id string) bool { return !c.removedServers()[id] }

// retryJoin joins --join's addresses in the background until one answers
// (design §5.2: every server is started with the same --join list, in any
// order). It ends there: from then on a server gossip marks failed is
// retried by gossip's reconnect loop, not by this one. Attempts back off with jitter from JoinRetryInterval to ten
// times it, so servers started together do not retry in step.
func (c *Cluster) retryJoin(ctx context.Context) {
	addrs := c.cfg.Join
	b := backoff.New(c.cfg.JoinRetryInterval, 10*c.cfg.JoinRetryInterval, nil)
	for attempt := 1; ; attempt++ {
		n, err := c.g.Join(addrs)
		if n > 0 {
			c.log.Info("joined the gossip pool", "contacted", n, "addrs", addrs)
			return
		}
		if attempt == 1 || attempt%30 == 0 {
			c.log.Warn("gossip join failed; retrying", "addrs", addrs, "attempt", attempt, "err", err)
		}
		if !backoff.Sleep(ctx, b.Next()) {
			return
		}
	}
}

// bootstrap is --bootstrap-expect (design §5.2). It ends once this server
// is part of a Raft configuration — bootstrapped by itself or added by a
// leader — or ctx ends. The rules, each against a known split brain
// (as Nomad's maybeBootstrap guards against them):
//   - a server with Raft state never bootstraps (it is not started at all);
//   - a peer started with another expectation (or with --bootstrap) stops
//     the bootstrap, with an error in the log and in /readyz;
//   - a peer that already has voters or a leader means a cluster exists:
//     wait for its leader to add this server;
//   - in a TLS cluster, a member whose server certificate is not verified
//     (certified) is ignored: it neither counts, nor stops the bootstrap,
//     nor is bootstrapped with;
//   - otherwise, once `expect` servers with the same expectation see each
//     other, only the lowest id bootstraps, with all of them as voters; the
//     others are brought in by its first heartbeats. One bootstrapper means
//     two servers with different views of the pool cannot configure two
//     clusters.
func (c *Cluster) bootstrap(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	reported := map[string]bool{}
	lastWait := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if len(c.raft.Servers()) > 0 || c.raft.HasLeader() {
			c.bootstrapProblem.Store("")
			c.log.Info("part of a raft configuration; bootstrap wait over")
			return
		}
		expect := c.cfg.BootstrapExpect
		var peers []gossip.Member
		problem := ""
		for _, id := range gossip.SortedIDs(c.g.Snapshot()) {
			m, _ := c.g.Member(id)
			if !m.Status.Live() {
				continue
			}
			if id != c.cfg.NodeID && !c.certified(ctx, m, reported) {
				// An unverified member neither counts towards the
				// expectation, nor stops the bootstrap, nor is
				// bootstrapped with.
				continue
			}
			switch {
			case m.Meta.Bootstrap:
				problem = fmt.Sprintf("server %s was started with --bootstrap, this one with --bootstrap-expect %d: refusing to bootstrap", id, expect)
			case m.Meta.Expect != 0 && m.Meta.Expect != expect:
				problem = fmt.Sprintf("server %s expects %d servers (--bootstrap-expect), this one %d: refusing to bootstrap; start every server with the same value", id, m.Meta.Expect, expect)
			case m.Meta.Expect == expect:
				peers = append(peers, m)
			}
			if problem != "" && !reported[problem] {
				reported[problem] = true
				c.log.Error("bootstrap refused", "member", id, "err", problem)
			}
		}
		c.bootstrapProblem.Store(problem)
		if problem != "" {
			continue
		}
		if len(peers) < expect {
			if time.Since(lastWait) > 5*time.Second {
				lastWait = time.Now()
				c.log.Info("waiting for servers to bootstrap", "seen", len(peers), "expect", expect)
			}
			continue
		}
		if existing := c.findExistingCluster(ctx, peers); existing != "" {
			if !reported[existing] {
				reported[existing] = true
				c.log.Info("a peer is already in a cluster; waiting for its leader to add this server", "member", existing)
			}
			continue
		}
		if peers[0].Meta.ID != c.cfg.NodeID {
			continue // the lowest id bootstraps; its leader adds us
		}
		var boot []raft.Server
		ids := make([]string, len(peers))
		for i, p := range peers {
			boot = append(boot, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.Meta.ID), Address: raft.ServerAddress(p.Meta.Raft)})
			ids[i] = p.Meta.ID
		}
		if err := c.raft.Bootstrap(boot); err != nil {
			c.log.Warn("bootstrap not done", "err", err)
			return
		}
		c.log.Info("bootstrapped the cluster", "voters", ids)
		return
	}
}

// findExistingCluster asks each peer for its Raft view and returns the id
// of one that already has voters or a leader ("" when none does). A peer
// that does not answer counts as existing, so nothing is bootstrapped on a
// partial view.
func (c *Cluster) findExistingCluster(ctx context.Context, peers []gossip.Member) string {
	for _, p := range peers {
		if p.Meta.ID == c.cfg.NodeID {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		cs, err := llmgwv1.NewAdminServiceClient(c.pool.Conn(p.Meta.GRPC)).ClusterStatus(cctx, &llmgwv1.ClusterStatusRequest{})
		cancel()
		if err != nil || cs.Voters > 0 || cs.Leader != "" {
			return p.Meta.ID
		}
	}
	return ""
}
