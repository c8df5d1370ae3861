package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"

	"github.com/llmgw/llmgw/controlplane/gossip"
	"github.com/llmgw/llmgw/controlplane/logadapt"
	"github.com/llmgw/llmgw/fsm"
)

// WhileLeading makes Raft membership follow gossip (design §5.2, Consul's
// reconcile) and runs autopilot, for one term of this server's
// leadership: the caller starts it after the term's Barrier and cancels
// ctx when the term ends. It returns after autopilot and every removal it
// started have stopped. Without gossip membership is the operator's (a
// hand-formed cluster), and it returns at once.
func (c *Cluster) WhileLeading(ctx context.Context) {
	if c.g == nil {
		return
	}
	ap := autopilot.New(c.ap, (*autopilotDelegate)(c),
		autopilot.WithLogger(logadapt.NewHCLogger(c.log.With("subsystem", "autopilot"))),
		autopilot.WithUpdateInterval(c.cfg.AutopilotInterval),
		autopilot.WithReconcileInterval(c.cfg.ReconcileInterval))
	c.forgetHeard()
	var removals sync.WaitGroup
	c.removalsMu.Lock()
	c.removals = &removals
	c.removalsMu.Unlock()
	ap.Start(ctx)
	defer func() {
		<-ap.Stop()
		c.removalsMu.Lock()
		c.removals = nil
		c.removalsMu.Unlock()
		removals.Wait()
		c.autopilotState.Store(nil)
	}()
	reported := map[string]bool{}
	t := time.NewTicker(c.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		c.syncRemovals(ctx, reported)
		c.reconcile(ctx, reported)
		select {
		case <-ctx.Done():
			return
		case <-c.g.Changed():
		case <-t.C:
		}
	}
}

// reconcile adds live servers that gossip knows and Raft does not as
// non-voters (autopilot promotes them once stable), and removes servers
// that left. A removed (tombstoned) server is not added back until an
// explicit join clears it; a refused server (Refusal) is not added, nor,
// in a TLS cluster, one whose server certificate is not verified
// (certified): gossip alone must not make a voter.
func (c *Cluster) reconcile(ctx context.Context, reported map[string]bool) {
	removed := c.removedServers()
	inConf := map[string]raft.Server{}
	for _, srv := range c.raft.Servers() {
		inConf[string(srv.ID)] = srv
	}
	for id, m := range c.g.Snapshot() {
		if id == c.cfg.NodeID {
			continue
		}
		_, in := inConf[id]
		switch m.Status {
		case gossip.StatusAlive, gossip.StatusSuspect:
			if in || removed[id] {
				continue
			}
			if why := c.refusal(m.Meta); why != "" {
				if key := "refused/" + id + "/" + why; !reported[key] {
					reported[key] = true
					c.log.Error("server refused: not added to raft", "member", id, "its_version", m.Meta.Version, "reason", why)
				}
				continue
			}
			if !c.certified(ctx, m, reported) {
				continue
			}
			if err := c.raft.AddNonvoter(id, m.Meta.Raft); err != nil {
				c.log.Warn("adding server as non-voter failed", "member", id, "err", err)
				continue
			}
			c.log.Info("server added to raft as non-voter", "member", id, "raft_addr", m.Meta.Raft)
		case gossip.StatusLeft:
			if !in {
				continue
			}
			if err := c.raft.RemoveServer(id); err != nil {
				c.log.Warn("removing a server that left failed", "member", id, "err", err)
				continue
			}
			c.log.Info("server that left removed from raft", "member", id)
		}
	}
}

// refusal is Refusal against this cluster's minimum version and
// expectation, after the cluster identity (design §5.2 "Cluster
// identity"): a server that announces another cluster's id is of another
// cluster, and a server this one founded with --bootstrap does not take
// one started to form a cluster of its own with --bootstrap-expect — the
// check that once passed because the local expectation was 0, and let a
// server started by mistake with --bootstrap add a whole cluster to its
// own configuration.
func (c *Cluster) refusal(m gossip.Meta) string {
	cfg := c.state.Config()
	if ours := cfg.GetClusterId(); ours != "" && m.Cluster != "" && m.Cluster != ours {
		return fmt.Sprintf("belongs to cluster %s; this is cluster %s", m.Cluster, ours)
	}
	if c.cfg.Bootstrap && m.Expect != 0 {
		return fmt.Sprintf("started with --bootstrap-expect %d to form a cluster of its own; this server was started with --bootstrap", m.Expect)
	}
	return Refusal(m, cfg.GetMinVersion(), c.cfg.BootstrapExpect)
}

// Refusal says why a cluster whose committed minimum version is min and
// whose servers were started with --bootstrap-expect expect keeps server m
// out of Raft, "" when it does not: m's version is below the minimum
// (design §13.3), or it was started with another expectation (or with
// --bootstrap).
func Refusal(m gossip.Meta, min string, expect int) string {
	if !fsm.AtLeast(m.Version, min) {
		v := m.Version
		if v == "" {
			v = "an unknown version"
		}
		return fmt.Sprintf("runs %s, below the cluster's minimum version %s", v, min)
	}
	mismatch := m.Expect != 0 && expect != 0 && m.Expect != expect
	if mismatch || m.Bootstrap {
		return fmt.Sprintf("started with --bootstrap-expect %d (bootstrap %v); this cluster expects %d", m.Expect, m.Bootstrap, expect)
	}
	return ""
}
