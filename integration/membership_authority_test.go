package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Membership is the authority, not the certificate alone (issue 26, design
// §11): a server certificate of the cluster's CA whose server never joined
// used to hold every power of a member — it listed the API keys,
// registered nodes, attached as any agent with an epoch 23 h ahead (the
// bound was a day) and so redirected the node's prompts, while the real
// agent was refused. Now a server certificate counts only for a server of
// the Raft configuration, an epoch may lead the clock by five minutes, and
// an agent refused because a newer session holds its node goes above that
// session's epoch at its next hello.

// strangerHello is a hello for node with epoch, as an attacker sends it:
// the node at an address of its own, with more GPUs.
func strangerHello(node string, epoch uint64) *llmgwv1.AgentMessage {
	return &llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{
		Node: &llmgwv1.Node{Id: node, Address: "127.0.0.66", Gpus: 8, Version: "evil"}, Epoch: epoch}}}
}

// attachErr says hello on a new Attach stream of conn and returns what the
// server answered first: nil for a welcome.
func attachErr(ctx context.Context, conn *grpc.ClientConn, hello *llmgwv1.AgentMessage) error {
	st, err := llmgwv1.NewAgentServiceClient(conn).Attach(ctx)
	if err != nil {
		return err
	}
	// A stream the server refused before reading the hello fails the
	// send with io.EOF; its status is what Recv returns, either way.
	_ = st.Send(hello)
	m, err := st.Recv()
	if err == nil && m.GetWelcome() == nil {
		return fmt.Errorf("first answer %v, want a welcome or a refusal", m)
	}
	return err
}

// TestMembershipStrangerServerHasNoPower: on a 3-server TLS cluster holding
// an API key, a client with a server certificate of the same CA for c4 —
// a server that never joined — is refused, at the leader and at a
// follower, everything a member may do: listing the keys (local and
// consistent), a forwarded write, RegisterNode, an agent's hello forwarded
// or not, a snapshot, a watch, a keyring change. Each refusal is
// PERMISSION_DENIED saying it is not of the Raft configuration, and is
// counted. It may still ask ClusterStatus, which a server asks before it
// is a member. Nothing it sent was applied. A member's certificate (c2's)
// still lists the keys, and may not hold an agent's session either.
//
// Without the membership check every one of those calls succeeds (the
// certificate's role was all that was checked): the first ListApiKeys
// returns the key.
func TestMembershipStrangerServerHasNoPower(t *testing.T) {
	p := newPKI(t)
	c := startTLSCluster(t, p, 3)
	leader := c.waitLeader(c.servers, formTimeout)
	if out, err := leader.ctl("apikey", "create", "k1"); err != nil {
		t.Fatalf("apikey create: %v: %s", err, out)
	}
	follower := without(c.servers, leader)[0]
	stranger := p.source(mtls.RoleServer, "c4")
	ctx, cancel := context.WithTimeout(context.Background(), within(30*time.Second))
	defer cancel()
	fwd := metadata.AppendToOutgoingContext(ctx, "llmgw-forwarded", "c4")

	for _, s := range []*controlServer{leader, follower} {
		conn := dialAs(t, s.grpc, stranger)
		a := llmgwv1.NewAdminServiceClient(conn)
		calls := []struct {
			name string
			call func() error
		}{
			{"ListApiKeys", func() error { _, err := a.ListApiKeys(ctx, &llmgwv1.ListRequest{}); return err }},
			{"ListApiKeys consistent", func() error {
				_, err := a.ListApiKeys(ctx, &llmgwv1.ListRequest{Consistent: true})
				return err
			}},
			{"ListApiKeys marked forwarded", func() error { _, err := a.ListApiKeys(fwd, &llmgwv1.ListRequest{Consistent: true}); return err }},
			{"a forwarded ApplyModel", func() error {
				_, err := a.ApplyModel(fwd, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{
					Name: "intruder", Engine: "sim", Model: "llmgw/intruder", Replicas: 1, GpusPerReplica: 1}})
				return err
			}},
			{"ApplyModel", func() error {
				_, err := a.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{
					Name: "intruder", Engine: "sim", Model: "llmgw/intruder", Replicas: 1, GpusPerReplica: 1}})
				return err
			}},
			{"RegisterNode", func() error {
				_, err := llmgwv1.NewServerServiceClient(conn).RegisterNode(fwd, &llmgwv1.RegisterNodeRequest{
					Node: &llmgwv1.Node{Id: "a2", Address: "127.0.0.66", Gpus: 8}, ServerId: "c4"})
				return err
			}},
			{"a forwarded hello", func() error { return attachErr(fwd, conn, strangerHello("a2", 1)) }},
			{"a hello", func() error { return attachErr(ctx, conn, strangerHello("a2", uint64(time.Now().UnixNano()))) }},
			{"SnapshotSave", func() error {
				st, err := a.SnapshotSave(fwd, &llmgwv1.SnapshotSaveRequest{})
				if err == nil {
					_, err = st.Recv()
				}
				return err
			}},
			{"Watch", func() error {
				st, err := llmgwv1.NewWatchServiceClient(conn).Watch(ctx, &llmgwv1.WatchRequest{})
				if err == nil {
					_, err = st.Recv()
				}
				return err
			}},
			{"LocalKeyring", func() error {
				_, err := llmgwv1.NewServerServiceClient(conn).LocalKeyring(ctx, &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_LIST})
				return err
			}},
		}
		before := testkit.MustScrape(t, s.http, "llmgw_control_server_calls_refused_total", nil)
		for _, call := range calls {
			err := call.call()
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "server/c4 is not a server of "+s.id+"'s Raft configuration") {
				t.Errorf("%s at %s with the never-joined server/c4: %v; want PERMISSION_DENIED naming the configuration", call.name, s.id, err)
			}
		}
		if got := testkit.MustScrape(t, s.http, "llmgw_control_server_calls_refused_total", nil) - before; got != float64(len(calls)) {
			t.Errorf("%s counted %v refusals, want %d", s.id, got, len(calls))
		}
		// The one call a server makes before it is a member.
		if cs, err := a.ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{}); err != nil || cs.GetLeader() != leader.id {
			t.Errorf("ClusterStatus at %s for a server not yet a member: %v, %v; want the leader %s", s.id, cs, err, leader.id)
		}
	}

	// Nothing was applied; a member's certificate lists the key, but holds
	// no agent's session.
	admin := llmgwv1.NewAdminServiceClient(dialAs(t, leader.grpc, p.source(mtls.RoleAdmin, "ops")))
	models, err := admin.ListModels(ctx, &llmgwv1.ListRequest{Consistent: true})
	if err != nil || len(models.GetModels()) != 0 {
		t.Fatalf("models after the stranger's writes: %v, %v; want none", models.GetModels(), err)
	}
	nodes, err := admin.ListNodes(ctx, &llmgwv1.ListRequest{Consistent: true})
	if err != nil || len(nodes.GetNodes()) != 0 {
		t.Fatalf("nodes after the stranger's registrations: %v, %v; want none", nodes.GetNodes(), err)
	}
	member := dialAs(t, leader.grpc, p.source(mtls.RoleServer, follower.id))
	keys, err := llmgwv1.NewAdminServiceClient(member).ListApiKeys(fwd, &llmgwv1.ListRequest{Consistent: true})
	if err != nil || len(keys.GetKeys()) != 1 {
		t.Fatalf("a member's ListApiKeys: %v, %v; want the key", keys, err)
	}
	err = attachErr(ctx, member, strangerHello("a2", uint64(time.Now().UnixNano())))
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "never holds its session") {
		t.Fatalf("a member's certificate holding an agent's session: %v, want PERMISSION_DENIED", err)
	}
}

// forger is a session opened with the real agent's certificate (stolen,
// or a second process misconfigured with it), welcomed.
type forger struct {
	stream llmgwv1.AgentService_AttachClient
	ended  chan error
}

// forge attaches to addr as node with epoch and, once welcomed, sends a
// full copy of statuses; ended receives the error that ends the session.
func forge(t *testing.T, ctx context.Context, conn *grpc.ClientConn, node string, epoch uint64, statuses []*llmgwv1.ReplicaStatus) *forger {
	t.Helper()
	st, err := llmgwv1.NewAgentServiceClient(conn).Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = st.Send(strangerHello(node, epoch)) // a failure shows in Recv
	if m, err := st.Recv(); err != nil || m.GetWelcome() == nil {
		t.Fatalf("the forged session at epoch %d: %v, %v; want a welcome", epoch, m, err)
	}
	if err := st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: &llmgwv1.EphemeralUpdate{
		Node: node, Epoch: epoch, Seq: 1, Full: true, Statuses: statuses}}}); err != nil {
		t.Fatal(err)
	}
	f := &forger{stream: st, ended: make(chan error, 1)}
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				f.ended <- err
				return
			}
		}
	}()
	return f
}

// TestMembershipEpochAheadKeepsTheRealAgent: a 3-server TLS cluster, a real
// agent a2 serving one sim replica. A client holding a2's own certificate
// attaches as a2:
//   - with an epoch an hour ahead: refused by every server
//     (INVALID_ARGUMENT), and for a watch that follows, the real agent
//     stays attached to its one session and the replica keeps its address;
//   - with an epoch four minutes ahead, within the bound, and a full copy
//     putting a2's replica at an address of its own: welcomed, for it
//     holds a2's certificate — but the real agent, told the epoch held,
//     attaches again above it, every server holds the replica at its real
//     address again within regainBound, and the forged session is ended.
//
// Without the five-minute bound the hour-ahead hello is welcomed and the
// real agent is refused for the hour; without the held epoch going back
// to the agent (or the agent going above it), the real agent is refused
// for the four minutes, so the address is not back within regainBound.
func TestMembershipEpochAheadKeepsTheRealAgent(t *testing.T) {
	// regainBound is how soon the real agent's replica address is back on
	// every server after the forged full copy: the held epoch reaches the
	// agent's server over the plane (a 50 ms tick), the session ends at its
	// next heartbeat (500 ms), the agent reconnects after 250 ms ± jitter,
	// registers its node again and sends its full copy: about 1 s idle.
	const regainBound = 5 * time.Second
	p := newPKI(t)
	c := startTLSCluster(t, p, 3)
	var all []string
	for _, s := range c.servers {
		all = append(all, s.grpc)
	}
	agent := startAgentProc(t, "a2", all, p.flags(mtls.RoleAgent, "a2")...)
	file := filepath.Join(t.TempDir(), "m.yaml")
	writeFile(t, file, "name: m\nengine: sim\nmodel: org/m\nreplicas: 1\ngpus_per_replica: 1\n")
	if err := eventuallyErr(30*time.Second, func() error { _, err := c.servers[0].ctl("model", "apply", "-f", file); return err }); err != nil {
		t.Fatalf("model apply: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), within(60*time.Second))
	defer cancel()
	admins := map[string]llmgwv1.AdminServiceClient{}
	for _, s := range c.servers {
		admins[s.id] = llmgwv1.NewAdminServiceClient(dialAs(t, s.grpc, p.source(mtls.RoleAdmin, "ops")))
	}
	// replica is m's replica as server id holds it.
	replica := func(id string) (*llmgwv1.ReplicaView, error) {
		rs, err := admins[id].ListReplicas(ctx, &llmgwv1.ListRequest{})
		if err != nil {
			return nil, err
		}
		if len(rs.GetReplicas()) != 1 {
			return nil, fmt.Errorf("%s lists %d replicas", id, len(rs.GetReplicas()))
		}
		return rs.Replicas[0], nil
	}
	var real *llmgwv1.ReplicaView
	testkit.WaitErr(t, within(60*time.Second), "m's replica ready on a2, with its address on every server", func() error {
		for _, s := range c.servers {
			r, err := replica(s.id)
			if err != nil {
				return err
			}
			if r.GetStatus().GetPhase() != llmgwv1.ReplicaPhase_REPLICA_PHASE_READY || r.GetStatus().GetAddress() == "" {
				return fmt.Errorf("%s holds the replica as %v", s.id, r.GetStatus())
			}
			real = r
		}
		return nil
	})
	realAddr := real.GetStatus().GetAddress()
	// atRealAddress is nil once every server holds the replica at realAddr.
	atRealAddress := func() error {
		for _, s := range c.servers {
			r, err := replica(s.id)
			if err != nil {
				return err
			}
			if got := r.GetStatus().GetAddress(); got != realAddr {
				return fmt.Errorf("%s holds the replica at %s", s.id, got)
			}
		}
		return nil
	}
	sessions := func() float64 { return testkit.MustScrape(t, agent.http, "llmgw_agent_sessions_total", nil) }
	sessionsBefore := sessions()
	t.Logf("a2 attached (%v sessions), its replica %s at %s", sessionsBefore, real.GetReplica().GetId(), realAddr)

	// An hour ahead: refused everywhere, and the real agent never notices.
	stolen := p.source(mtls.RoleAgent, "a2")
	for _, s := range c.servers {
		err := attachErr(ctx, dialAs(t, s.grpc, stolen), strangerHello("a2", uint64(time.Now().Add(time.Hour).UnixNano())))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "more than 5m0s ahead of this server's clock") {
			t.Fatalf("a2's certificate with an epoch an hour ahead at %s: %v, want INVALID_ARGUMENT", s.id, err)
		}
	}
	watchEnd := time.Now().Add(within(2 * time.Second))
	for time.Now().Before(watchEnd) {
		if v, _ := testkit.Scrape(agent.http, "llmgw_agent_session_attached", nil); v != 1 {
			t.Fatalf("the real agent detached after a refused hello an hour ahead (attached = %v)", v)
		}
		if err := atRealAddress(); err != nil {
			t.Fatalf("after a refused hello an hour ahead: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := sessions(); got != sessionsBefore {
		t.Fatalf("the real agent has %v sessions after the refused hello, want still %v", got, sessionsBefore)
	}

	// Four minutes ahead, within the bound: the forged session is taken,
	// and the real agent takes the node back within regainBound.
	evil := &llmgwv1.ReplicaStatus{ReplicaId: real.GetReplica().GetId(), Uid: real.GetReplica().GetUid(), Model: "m", Node: "a2",
		Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, Address: "127.0.0.66:18000", UpdatedUnixNano: time.Now().UnixNano()}
	forgedEpoch := uint64(time.Now().Add(4 * time.Minute).UnixNano())
	forgedAt := time.Now()
	f := forge(t, ctx, dialAs(t, c.servers[0].grpc, stolen), "a2", forgedEpoch, []*llmgwv1.ReplicaStatus{evil})
	testkit.WaitErr(t, within(regainBound), "the real agent back, the replica at its real address on every server", func() error {
		if got := sessions(); got <= sessionsBefore {
			return fmt.Errorf("the real agent has not attached again (%v sessions)", got)
		}
		if v, _ := testkit.Scrape(agent.http, "llmgw_agent_session_attached", nil); v != 1 {
			return fmt.Errorf("the real agent is not attached")
		}
		return atRealAddress()
	})
	regained := time.Since(forgedAt)
	select {
	case err := <-f.ended:
		if status.Code(err) != codes.Aborted {
			t.Fatalf("the forged session ended with %v, want ABORTED (a newer session)", err)
		}
	case <-time.After(within(5 * time.Second)):
		t.Fatal("the forged session was not ended once the real agent was back")
	}
	if got := testkit.MustScrape(t, agent.http, "llmgw_agent_sessions_superseded_total", testkit.Labels{"held": "raised"}); got < 1 {
		t.Fatalf("the agent did not go above the held epoch (llmgw_agent_sessions_superseded_total{held=raised} = %v)", got)
	}
	// The node's registration is the real agent's again.
	nodes, err := admins[c.servers[0].id].ListNodes(ctx, &llmgwv1.ListRequest{Consistent: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.GetNodes() {
		if n.GetId() == "a2" && (n.GetAddress() != "127.0.0.1" || n.GetVersion() == "evil") {
			t.Fatalf("a2's registration is the forger's: %v", n)
		}
	}
	t.Logf("the forged session four minutes ahead held a2 for %v (bound %v); the hello an hour ahead was refused by all 3 servers", regained.Round(time.Millisecond), within(regainBound))
}
