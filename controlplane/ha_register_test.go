package controlplane

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/llmgw/llmgw/controlplane/cluster"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestFollowerRegistersNode: an agent attached to a follower is registered
// by the leader through ServerService.RegisterNode; when the leader serves
// no ServerService (an older release) the follower replays the hello
// instead, and the node is registered all the same. The build playing the
// previous release (release.go) only ever replays the hello.
func TestFollowerRegistersNode(t *testing.T) {
	const viaRPC, viaHello = `msg="node registered for a peer's agent session" `, "forwarded as a hello"
	tests := []struct {
		name            string
		noServerService bool
		leaderLogs      string
	}{
		{"RegisterNode", false, viaRPC},
		{"older leader: the hello", true, viaHello},
	}
	if asPreviousRelease {
		tests[0].leaderLogs = viaHello
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c := newHAClusterWith(t, 3, nil, func(s *Server) { s.withoutServerService = tt.noServerService }, "c1", "c2", "c3")
			leader := c.agreedLeader(ctx, 3)
			follower := c.follower(leader)
			a := attachAgent(ctx, t, c.nodes[follower], "n1", 2, 1)
			defer a.cancel()
			if _, ok := c.nodes[leader].srv.fsm.Node("n1"); !ok {
				t.Fatal("the welcome came before the registration was committed")
			}
			logs := c.nodes[leader].logs.String()
			if !strings.Contains(logs, tt.leaderLogs) || (tt.leaderLogs == viaRPC && !strings.Contains(logs, "from="+follower)) {
				t.Fatalf("the leader's log does not say %q (from %s):\n%s", tt.leaderLogs, follower, logs)
			}
			if tt.leaderLogs == viaHello && strings.Contains(logs, viaRPC) {
				t.Fatal("registered through ServerService where only the hello may be")
			}
		})
	}
}

// TestClusterStatusRaftFields: ClusterStatus carries the server's Raft
// figures as fields, and the same figures as the headers older readers
// use. The build playing the previous release sends the headers only.
func TestClusterStatusRaftFields(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := newHACluster(t, 3, "c1", "c2", "c3")
	leader := c.agreedLeader(ctx, 3)
	for id := range c.nodes {
		testkit.WaitCtx(ctx, t, id+"'s ClusterStatus figures", func() error {
			var md metadata.MD
			cs, err := c.admin(id).ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{}, grpc.Header(&md))
			if err != nil {
				return err
			}
			if len(md.Get(cluster.HeaderLastIndex)) != 1 || len(md.Get(cluster.HeaderLastTerm)) != 1 || len(md.Get(cluster.HeaderLastContact)) != 1 {
				return fmt.Errorf("headers missing: %v", md)
			}
			if asPreviousRelease {
				if cs.RaftLastIndex != nil || cs.RaftLastTerm != nil || cs.RaftLastContactMs != nil {
					t.Fatalf("the previous release's build sent the fields: %v", cs)
				}
				return nil
			}
			if cs.RaftLastIndex == nil || cs.RaftLastTerm == nil || cs.RaftLastContactMs == nil {
				return fmt.Errorf("fields missing: %v", cs)
			}
			if cs.GetRaftLastIndex() == 0 || cs.GetRaftLastTerm() == 0 {
				return fmt.Errorf("index %d term %d, want both set after the election", cs.GetRaftLastIndex(), cs.GetRaftLastTerm())
			}
			if id == leader && cs.GetRaftLastContactMs() != 0 {
				return fmt.Errorf("the leader reports last contact %d ms, want 0", cs.GetRaftLastContactMs())
			}
			hdr := func(k string) uint64 {
				n, _ := strconv.ParseUint(md.Get(k)[0], 10, 64)
				return n
			}
			// One reading of LocalStats fills both.
			if hdr(cluster.HeaderLastIndex) != cs.GetRaftLastIndex() || hdr(cluster.HeaderLastTerm) != cs.GetRaftLastTerm() || int64(hdr(cluster.HeaderLastContact)) != cs.GetRaftLastContactMs() {
				return fmt.Errorf("fields %d/%d/%d, headers %v", cs.GetRaftLastIndex(), cs.GetRaftLastTerm(), cs.GetRaftLastContactMs(), md)
			}
			return nil
		})
	}
}
