//go:build !llmgw_upgrade_old

package controlplane

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestRemovalSurvivesFullRestart: a server removed with remove-peer stays
// out after every other server restarted (gossip's tombstones are gone;
// the replicated record is not) and it came back alive; an explicit join
// still brings it back, and the leader records that clear in the
// replicated state too.
func TestRemovalSurvivesFullRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := newHACluster(t, 3, "c1", "c2", "c3")
	leader := c.agreedLeader(ctx, 3)
	victim := c.follower(leader)
	c.stop(victim)
	if _, err := c.admin(leader).RemovePeer(ctx, &llmgwv1.RemovePeerRequest{Id: victim}); err != nil {
		t.Fatalf("remove peer %s: %v", victim, err)
	}
	var remaining, starred []string
	for id := range c.nodes {
		remaining = append(remaining, id)
		starred = append(starred, id+"*")
	}
	slices.Sort(starred)
	c.wantPeers(ctx, leader, starred...)
	removedOn := func(id string, want bool) error {
		r, ok := c.nodes[id].srv.fsm.ServerRemoved(victim)
		if !ok || r.Removed != want {
			return fmt.Errorf("%s's replicated record of %s: %v (%v), want removed %v", id, victim, r, ok, want)
		}
		return nil
	}
	testkit.WaitCtx(ctx, t, "the removal in every remaining server's replicated state", func() error {
		for _, id := range remaining {
			if err := removedOn(id, true); err != nil {
				return err
			}
		}
		return nil
	})

	// Every server restarts: the two remaining together (neither alone has
	// a quorum), then the removed one.
	for _, id := range remaining {
		c.stop(id)
	}
	for _, id := range remaining {
		c.nodes[id] = launch(t, c.cfgs[id], nil)
	}
	for _, id := range remaining {
		c.nodes[id].awaitReady(t)
	}
	cur := c.agreedLeader(ctx, 2)
	for _, id := range remaining {
		if ts := c.nodes[id].srv.gossip.Tombstones(); len(ts) != 0 {
			t.Fatalf("%s kept gossip tombstones over its restart: %v", id, ts)
		}
	}
	c.nodes[victim] = launch(t, c.cfgs[victim], nil)
	c.staysOut(ctx, cur, victim, starred, "removed server came back after a full restart")

	// An explicit join brings it back, and the clear is replicated.
	if _, err := c.admin(cur).Join(ctx, &llmgwv1.JoinRequest{GossipAddrs: []string{c.cfgs[victim].GossipAddr}}); err != nil {
		t.Fatalf("explicit join: %v", err)
	}
	c.nodes[victim].awaitReady(t)
	all := append(slices.Clone(starred), victim+"*")
	slices.Sort(all)
	c.wantPeers(ctx, cur, all...)
	testkit.WaitCtx(ctx, t, "the join's clear in the replicated state", func() error { return removedOn(cur, false) })
}
