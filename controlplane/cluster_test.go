package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestThreeServers checks a cluster formed by hand, without gossip: the
// followers cannot learn the leader's gRPC address, so after holding they
// refuse writes and consistent reads with UNAVAILABLE; they serve local
// reads and watches, and a new leader takes over writes when the leader
// stops. (ha_test.go covers clusters formed with --bootstrap-expect.)
func TestThreeServers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cfgFor := func(id string, boot bool) Config {
		c := testConfig(t, t.TempDir(), freeAddr(t))
		c.NodeID, c.Bootstrap = id, boot
		return c
	}
	c1 := start(t, cfgFor("c1", true))
	others := map[string]*running{}
	for _, id := range []string{"c2", "c3"} {
		cfg := cfgFor(id, false)
		others[id] = launch(t, cfg, nil)
		if err := c1.srv.store.Raw().AddVoter(raft.ServerID(id), raft.ServerAddress(cfg.RaftAddr), 0, 10*time.Second).Error(); err != nil {
			t.Fatalf("add voter %s: %v", id, err)
		}
	}
	for _, r := range others {
		r.awaitReady(t)
		defer r.stop(t)
	}
	c2 := llmgwv1.NewAdminServiceClient(others["c2"].conn)

	// A follower learns the configuration that names all three from the
	// leader's log, some time after it is ready (it may be ready before the
	// leader's first append reaches it).
	testkit.WaitCtx(ctx, t, "a follower's ClusterStatus naming the leader and three servers", func() error {
		cs, err := c2.ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{})
		if err != nil {
			return fmt.Errorf("ClusterStatus on a follower: %w", err)
		}
		if cs.Leader != "c1" || cs.ServerId != "c2" || len(cs.Servers) != 3 {
			return fmt.Errorf("ClusterStatus on a follower: %v", cs)
		}
		return nil
	})
	model := &llmgwv1.Model{Name: "demo", Engine: "sim", Model: "m", Replicas: 1}
	if _, err := c2.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: model}); status.Code(err) != codes.Unavailable {
		t.Fatalf("write on a follower: %v", err)
	}
	if _, err := c2.ListModels(ctx, &llmgwv1.ListRequest{Consistent: true}); status.Code(err) != codes.Unavailable {
		t.Fatalf("consistent read on a follower: %v", err)
	}
	applied, err := llmgwv1.NewAdminServiceClient(c1.conn).ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: model})
	if err != nil {
		t.Fatal(err)
	}

	// A router that saw the revision on the leader may watch a follower: it
	// waits for the follower to apply it, then gets the model.
	w, err := llmgwv1.NewWatchServiceClient(others["c3"].conn).Watch(ctx, &llmgwv1.WatchRequest{FromRevision: applied.Revision - 1})
	if err != nil {
		t.Fatal(err)
	}
	if c := recvWatch(t, w).GetChange(); c.GetModel().GetName() != "demo" || c.Revision != applied.Revision {
		t.Fatalf("follower watch: %v", c)
	}

	// The leader stops; one of the others takes over writes.
	c1.stop(t)
	var leader *running
	testkit.WaitCtx(ctx, t, "a new leader", func() error {
		for _, r := range others {
			if r.srv.store.LeaderReady() {
				leader = r
			}
		}
		if leader == nil {
			return errors.New("none of the others is leader")
		}
		return nil
	})
	del, err := llmgwv1.NewAdminServiceClient(leader.conn).DeleteModel(ctx, &llmgwv1.DeleteModelRequest{Name: "demo"})
	if err != nil {
		t.Fatalf("write on the new leader: %v", err)
	}
	if del.Revision <= applied.Revision {
		t.Fatalf("revision went from %d to %d", applied.Revision, del.Revision)
	}
}

// TestClusterBadInput: refusals that leave the cluster unchanged — the
// last voter leaving, joining an address nobody answers, joining nothing.
func TestClusterBadInput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := haConfig(t, "solo", 0)
	cfg.Bootstrap = true
	r := start(t, cfg)
	defer r.stop(t)
	a := llmgwv1.NewAdminServiceClient(r.conn)
	tests := []struct {
		name string
		call func() error
		want codes.Code
		msg  string
	}{
		{"last voter leaves", func() error { _, err := a.Leave(ctx, &llmgwv1.LeaveRequest{}); return err }, codes.FailedPrecondition, "last voter"},
		{"join unreachable", func() error {
			_, err := a.Join(ctx, &llmgwv1.JoinRequest{GossipAddrs: []string{freeAddr(t)}})
			return err
		}, codes.Unavailable, "none answered"},
		{"join nothing", func() error { _, err := a.Join(ctx, &llmgwv1.JoinRequest{}); return err }, codes.InvalidArgument, "gossip_addrs"},
		{"join garbage", func() error { _, err := a.Join(ctx, &llmgwv1.JoinRequest{GossipAddrs: []string{"nope"}}); return err }, codes.InvalidArgument, "host:port"},
		{"remove unknown", func() error { _, err := a.RemovePeer(ctx, &llmgwv1.RemovePeerRequest{Id: "ghost"}); return err }, codes.NotFound, "ghost"},
		{"remove self", func() error { _, err := a.RemovePeer(ctx, &llmgwv1.RemovePeerRequest{Id: "solo"}); return err }, codes.FailedPrecondition, "leader"},
		{"transfer to unknown", func() error {
			_, err := a.TransferLeadership(ctx, &llmgwv1.TransferLeadershipRequest{To: "ghost"})
			return err
		}, codes.NotFound, "ghost"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if status.Code(err) != tt.want || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got %v, want %v containing %q", err, tt.want, tt.msg)
			}
		})
	}
	cs, err := a.ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{})
	if err != nil || cs.Leader != "solo" || cs.Voters != 1 || !cs.Healthy {
		t.Fatalf("cluster changed: %v %v", cs, err)
	}
	peers, err := a.ListPeers(ctx, &llmgwv1.ListPeersRequest{})
	if err != nil || len(peers.Peers) != 1 || !peers.Peers[0].Leader {
		t.Fatalf("peers: %v %v", peers, err)
	}
}
