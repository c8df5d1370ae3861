package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Mutual TLS and identities on the control plane (design §11, issue #12):
// every service refuses callers without a certificate of the cluster's CA,
// each method admits only the roles the table allows, an agent attaches
// only as its own node, and a server joins Raft only with a server
// certificate that names it.

// tlsServer is a control server with a server certificate named id, which
// the test's llmgwctl calls reach with an admin certificate.
func tlsServer(t *testing.T, p *testPKI, id string, o serverOpts) *controlServer {
	t.Helper()
	o.extra = append(append([]string(nil), o.extra...), p.flags(mtls.RoleServer, id)...)
	o.ctl = p.flags(mtls.RoleAdmin, "ops")
	return newServer(t, id, o)
}

// startSingleTLS starts one bootstrapped TLS server and waits until an
// admin sees it lead.
func startSingleTLS(t *testing.T, p *testPKI) *controlServer {
	t.Helper()
	s := tlsServer(t, p, "c1", serverOpts{extra: []string{"--bootstrap"}})
	s.start()
	a := llmgwv1.NewAdminServiceClient(dialAs(t, s.grpc, p.source(mtls.RoleAdmin, "ops")))
	if err := eventuallyErr(20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		cs, err := a.ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{})
		if err != nil {
			return err
		}
		if cs.Leader != "c1" {
			return fmt.Errorf("leader %q", cs.Leader)
		}
		return nil
	}); err != nil {
		t.Fatalf("the TLS server did not lead: %v", err)
	}
	return s
}

// dialAs is a connection to addr with src's certificate (plain text when
// src is nil), closed when the test ends.
func dialAs(t *testing.T, addr string, src *mtls.Source) *grpc.ClientConn {
	t.Helper()
	return dialWith(t, addr, mtls.DialOption(src, mtls.RoleServer))
}

func dialWith(t *testing.T, addr string, opt grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// presenting is a client that trusts this cluster's CA (so the server's
// side of the handshake is what decides) and presents cert, or nothing.
func presenting(t *testing.T, p *testPKI, cert *mtls.Files) grpc.DialOption {
	t.Helper()
	caPEM, err := os.ReadFile(p.files(mtls.RoleAdmin, "ops").CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: mtls.RoleServer.DNSName()}
	if cert != nil {
		pair, err := tls.LoadX509KeyPair(cert.Cert, cert.Key)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg))
}

// callEvery calls one method of each service the control plane serves and
// returns each one's error, by service.
func callEvery(conn *grpc.ClientConn) map[string]error {
	ctx, cancel := context.WithTimeout(context.Background(), within(5*time.Second))
	defer cancel()
	out := map[string]error{}
	_, out["AdminService"] = llmgwv1.NewAdminServiceClient(conn).ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{
		Name: "intruder", Engine: "sim", Model: "m", Replicas: 1, GpusPerReplica: 1}})
	out["WatchService"] = func() error {
		st, err := llmgwv1.NewWatchServiceClient(conn).Watch(ctx, &llmgwv1.WatchRequest{})
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}()
	out["AgentService"] = func() error {
		st, err := llmgwv1.NewAgentServiceClient(conn).Attach(ctx)
		if err != nil {
			return err
		}
		_ = st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{
			Node: &llmgwv1.Node{Id: "intruder", Address: "127.0.0.1", Gpus: 1}, Epoch: 1}}})
		_, err = st.Recv()
		return err
	}()
	_, out["AdapterService"] = llmgwv1.NewAdapterServiceClient(conn).EnsureAdapter(ctx, &llmgwv1.EnsureAdapterRequest{Adapter: "a", TimeoutMs: 1})
	_, out["ServerService"] = llmgwv1.NewServerServiceClient(conn).RegisterNode(ctx, &llmgwv1.RegisterNodeRequest{
		Node: &llmgwv1.Node{Id: "intruder", Address: "127.0.0.1", Gpus: 1}, ServerId: "c9"})
	return out
}

// TestTLSRefusesStrangers: a TLS control server serves none of its five
// services to a plain-text client, to a client without a certificate, or
// to one whose certificate another CA signed; nothing they sent was
// applied.
func TestTLSRefusesStrangers(t *testing.T) {
	p := newPKI(t)
	s := startSingleTLS(t, p)
	foreign := newPKI(t).files(mtls.RoleAdmin, "ops")
	for _, c := range []struct {
		name string
		opt  grpc.DialOption
	}{
		{"plain text", mtls.DialOption(nil, mtls.RoleServer)},
		{"no certificate", presenting(t, p, nil)},
		{"a certificate of another CA", presenting(t, p, &foreign)},
	} {
		for svc, err := range callEvery(dialWith(t, s.grpc, c.opt)) {
			// The handshake fails, so the call never starts: gRPC reports the
			// transport's failure as UNAVAILABLE.
			if status.Code(err) != codes.Unavailable {
				t.Errorf("%s: %s answered %v, want UNAVAILABLE (no connection)", c.name, svc, err)
			}
		}
	}
	a := llmgwv1.NewAdminServiceClient(dialAs(t, s.grpc, p.source(mtls.RoleAdmin, "ops")))
	ctx, cancel := context.WithTimeout(context.Background(), within(5*time.Second))
	defer cancel()
	models, err := a.ListModels(ctx, &llmgwv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := a.ListNodes(ctx, &llmgwv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Models) != 0 || len(nodes.Nodes) != 0 {
		t.Fatalf("a stranger's writes were applied: models %v, nodes %v", models.Models, nodes.Nodes)
	}
}

// TestTLSRoles: each role reaches only what the table gives it: a router
// watches but cannot administer (PERMISSION_DENIED naming the admin
// certificate it lacks), an agent cannot watch, nobody but a server calls
// ServerService or marks a call forwarded, and an admin administers.
func TestTLSRoles(t *testing.T) {
	p := newPKI(t)
	s := startSingleTLS(t, p)
	router := dialAs(t, s.grpc, p.source(mtls.RoleRouter, "r1"))
	agent := dialAs(t, s.grpc, p.source(mtls.RoleAgent, "n1"))
	adminConn := dialAs(t, s.grpc, p.source(mtls.RoleAdmin, "ops"))
	ctx, cancel := context.WithTimeout(context.Background(), within(10*time.Second))
	defer cancel()
	denied := func(what string, err error, msg string) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), msg) {
			t.Errorf("%s: %v, want PERMISSION_DENIED containing %q", what, err, msg)
		}
	}
	model := &llmgwv1.Model{Name: "m", Engine: "sim", Model: "llmgw/m", Replicas: 1, GpusPerReplica: 1}

	ra := llmgwv1.NewAdminServiceClient(router)
	_, err := ra.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: model})
	denied("router ApplyModel", err, "AdminService/ApplyModel needs an admin certificate; caller is router/r1")
	_, err = ra.DeleteModel(ctx, &llmgwv1.DeleteModelRequest{Name: "m"})
	denied("router DeleteModel", err, "needs an admin certificate")
	_, err = ra.RemovePeer(ctx, &llmgwv1.RemovePeerRequest{Id: "c1"})
	denied("router RemovePeer", err, "needs an admin certificate")
	snap, err := ra.SnapshotSave(ctx, &llmgwv1.SnapshotSaveRequest{})
	if err == nil {
		_, err = snap.Recv()
	}
	denied("router SnapshotSave", err, "needs an admin certificate")
	_, err = llmgwv1.NewServerServiceClient(router).RegisterNode(ctx, &llmgwv1.RegisterNodeRequest{Node: &llmgwv1.Node{Id: "n1"}})
	denied("router RegisterNode", err, "needs a server certificate")

	w, err := llmgwv1.NewWatchServiceClient(agent).Watch(ctx, &llmgwv1.WatchRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	denied("agent Watch", err, "needs a router or admin certificate; caller is agent/n1")
	// The forwarded mark is metadata anyone can set: only a server's counts.
	fwd, err := llmgwv1.NewAgentServiceClient(agent).Attach(metadata.AppendToOutgoingContext(ctx, "llmgw-forwarded", "c2"))
	if err == nil {
		_ = fwd.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{Node: &llmgwv1.Node{Id: "n1"}, Epoch: 1}}})
		_, err = fwd.Recv()
	}
	denied("agent forwarded Attach", err, "only a server may forward a call; caller is agent/n1")

	if _, err := llmgwv1.NewAdminServiceClient(adminConn).ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: model}); err != nil {
		t.Fatalf("admin ApplyModel: %v", err)
	}
	w, err = llmgwv1.NewWatchServiceClient(router).Watch(ctx, &llmgwv1.WatchRequest{})
	if err != nil {
		t.Fatalf("router Watch: %v", err)
	}
	for {
		ev, err := w.Recv()
		if err != nil {
			t.Fatalf("router Watch: %v", err)
		}
		if ev.GetChange().GetModel().GetName() == "m" {
			break // the router sees the admin's write
		}
	}
	// llmgwctl with the admin certificate, as an operator runs it.
	if out, err := s.ctl("model", "list"); err != nil || !strings.Contains(out, "m") {
		t.Fatalf("llmgwctl model list with an admin certificate: %v: %s", err, out)
	}
}

// fakeAgent is a test's agent session: hello, the first full copy, then a
// heartbeat every 200 ms until the test ends; what the server sends is
// read and dropped, except the desired replicas, kept in desired.
type fakeAgent struct {
	stream  llmgwv1.AgentService_AttachClient
	epoch   uint64
	mu      sync.Mutex
	desired []*llmgwv1.Replica
	err     error
}

func attachAgent(t *testing.T, conn *grpc.ClientConn, hello *llmgwv1.AgentHello) (*fakeAgent, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := llmgwv1.NewAgentServiceClient(conn).Attach(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	if err := st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: hello}}); err != nil {
		cancel()
		return nil, err
	}
	first, err := st.Recv()
	if err != nil {
		cancel()
		return nil, err
	}
	if first.GetWelcome() == nil {
		cancel()
		return nil, fmt.Errorf("first message %v, want a welcome", first)
	}
	a := &fakeAgent{stream: st, epoch: hello.Epoch}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			m, err := st.Recv()
			if err != nil {
				a.mu.Lock()
				a.err = err
				a.mu.Unlock()
				return
			}
			if d := m.GetDesired(); d != nil {
				a.mu.Lock()
				a.desired = d.Replicas
				a.mu.Unlock()
			}
		}
	})
	wg.Go(func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Heartbeat{Heartbeat: &llmgwv1.Heartbeat{UnixNano: time.Now().UnixNano()}}}) != nil {
					return
				}
			}
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return a, nil
}

func (a *fakeAgent) send(u *llmgwv1.EphemeralUpdate) error {
	return a.stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: u}})
}

// TestTLSRogueAgent is the attack of issue #12: a client holding some
// agent's certificate attaches as the existing node n1 with a huge session
// epoch and n1's replica at the attacker's address. It is refused, and so
// is n1's own certificate with an epoch far in the future; a legitimate
// agent n2 reporting n1's replica has that status dropped. n1's
// registration, session and replica address are unchanged throughout.
//
// What routers then send where is the routers' half (their TLS dialing is
// built separately); here the control plane's state is what they read.
func TestTLSRogueAgent(t *testing.T) {
	p := newPKI(t)
	s := startSingleTLS(t, p)
	admin := llmgwv1.NewAdminServiceClient(dialAs(t, s.grpc, p.source(mtls.RoleAdmin, "ops")))
	ctx, cancel := context.WithTimeout(context.Background(), within(30*time.Second))
	defer cancel()

	realNode := &llmgwv1.Node{Id: "n1", Address: "127.0.0.1", Gpus: 1, Version: "test"}
	epoch := uint64(time.Now().UnixNano())
	n1, err := attachAgent(t, dialAs(t, s.grpc, p.source(mtls.RoleAgent, "n1")), &llmgwv1.AgentHello{Node: realNode, Epoch: epoch})
	if err != nil {
		t.Fatalf("the real agent n1: %v", err)
	}
	if _, err := admin.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{Name: "m", Engine: "sim", Model: "llmgw/m", Replicas: 1, GpusPerReplica: 1}}); err != nil {
		t.Fatal(err)
	}
	var replica *llmgwv1.Replica
	if !eventually(15*time.Second, func() bool {
		n1.mu.Lock()
		defer n1.mu.Unlock()
		if len(n1.desired) == 1 {
			replica = n1.desired[0]
		}
		return replica != nil
	}) {
		t.Fatal("n1 was given no replica")
	}
	const realAddr, evilAddr = "127.0.0.1:18000", "127.0.0.66:18000"
	statusAt := func(node, addr string) *llmgwv1.ReplicaStatus {
		return &llmgwv1.ReplicaStatus{ReplicaId: replica.Id, Uid: replica.Uid, Model: "m", Node: node,
			Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, Address: addr, UpdatedUnixNano: time.Now().UnixNano()}
	}
	if err := n1.send(&llmgwv1.EphemeralUpdate{Node: "n1", Epoch: epoch, Seq: 1, Full: true, Statuses: []*llmgwv1.ReplicaStatus{statusAt("n1", realAddr)}}); err != nil {
		t.Fatal(err)
	}
	// replicaAddr is the address the control plane holds for the replica.
	replicaAddr := func() string {
		rs, err := admin.ListReplicas(ctx, &llmgwv1.ListRequest{})
		if err != nil || len(rs.Replicas) != 1 {
			return fmt.Sprintf("(list replicas: %v, %d replicas)", err, len(rs.GetReplicas()))
		}
		return rs.Replicas[0].GetStatus().GetAddress()
	}
	if !eventually(10*time.Second, func() bool { return replicaAddr() == realAddr }) {
		t.Fatalf("the real status was not taken: address %q", replicaAddr())
	}

	huge := uint64(1) << 63
	evilHello := func(node string, e uint64) *llmgwv1.AgentHello {
		return &llmgwv1.AgentHello{Node: &llmgwv1.Node{Id: node, Address: "127.0.0.66", Gpus: 8, Version: "evil"}, Epoch: e,
			Running: []*llmgwv1.ReplicaStatus{statusAt(node, evilAddr)}}
	}
	n2conn := dialAs(t, s.grpc, p.source(mtls.RoleAgent, "n2"))
	for _, e := range []uint64{huge, uint64(time.Now().UnixNano())} {
		_, err = attachAgent(t, n2conn, evilHello("n1", e))
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "agent certificate is for node n2; cannot attach as n1") {
			t.Fatalf("n2's certificate attaching as n1 (epoch %d): %v, want PERMISSION_DENIED naming both nodes", e, err)
		}
	}
	// n1's own certificate, stolen or misused, cannot lock the real agent
	// out with an epoch no later session could beat.
	_, err = attachAgent(t, dialAs(t, s.grpc, p.source(mtls.RoleAgent, "n1")), evilHello("n1", huge))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "ahead of this server's clock") {
		t.Fatalf("n1's certificate with a huge epoch: %v, want INVALID_ARGUMENT", err)
	}
	// n2 attached as itself reports n1's replica at its own address.
	n2, err := attachAgent(t, n2conn, &llmgwv1.AgentHello{Node: &llmgwv1.Node{Id: "n2", Address: "127.0.0.66", Gpus: 1}, Epoch: uint64(time.Now().UnixNano())})
	if err != nil {
		t.Fatalf("n2 as itself: %v", err)
	}
	if err := n2.send(&llmgwv1.EphemeralUpdate{Node: "n2", Epoch: n2.epoch, Seq: 1, Full: true, Statuses: []*llmgwv1.ReplicaStatus{
		statusAt("n2", evilAddr), // n1's replica, claimed for n2
		statusAt("n1", evilAddr), // a status naming another node
	}}); err != nil {
		t.Fatal(err)
	}
	if !eventually(10*time.Second, func() bool {
		v, ok := testkit.Scrape(s.http, "llmgw_control_status_foreign_total", nil)
		return ok && v >= 2
	}) {
		t.Fatal("n2's statuses of n1's replica were not dropped (llmgw_control_status_foreign_total < 2)")
	}

	if got := replicaAddr(); got != realAddr {
		t.Fatalf("the replica's address is %q, want the real agent's %q", got, realAddr)
	}
	nodes, err := admin.ListNodes(ctx, &llmgwv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Nodes {
		if n.GetId() == "n1" && (n.GetAddress() != realNode.Address || n.GetVersion() != realNode.Version || n.GetGpus() != realNode.Gpus) {
			t.Fatalf("n1's registration changed: %v", n)
		}
	}
	if !nodes.Connected["n1"] {
		t.Fatal("n1 is no longer connected")
	}
	n1.mu.Lock()
	defer n1.mu.Unlock()
	if n1.err != nil {
		t.Fatalf("the real agent's session ended: %v", n1.err)
	}
}

// membersView is `llmgwctl server members -o json` (an array, one item
// per member), the part tests read.
type membersView struct {
	Members []struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
}

func (s *controlServer) members() (membersView, error) {
	var v membersView
	out, err := s.ctl("server", "members", "-o", "json")
	if err != nil {
		return v, err
	}
	return v, json.Unmarshal([]byte(out), &v.Members)
}

// TestTLSOnlyCertifiedServersJoin is the other attack of issue #12: a bare
// `llmgw control --join` became a Raft voter within seconds and received
// every model. In a TLS cluster, a server without a certificate, or with a
// server certificate of another CA, cannot join gossip (its streams need a
// server certificate of this CA), is never added to Raft and receives no
// model, nor is one counted or bootstrapped with while the cluster forms;
// a server given an agent's certificate does not even start. Writes and agent
// registrations through a follower still work: followers forward to the
// leader over mutual TLS, as servers.
func TestTLSOnlyCertifiedServersJoin(t *testing.T) {
	p := newPKI(t)
	var servers []*controlServer
	for i := 1; i <= 3; i++ {
		servers = append(servers, tlsServer(t, p, fmt.Sprintf("c%d", i), serverOpts{}))
	}
	for _, s := range servers {
		var join []string
		for _, o := range servers {
			if o != s {
				join = append(join, o.gossip)
			}
		}
		s.args = append(s.args, "--bootstrap-expect", "3", "--join", strings.Join(join, ","))
	}
	// c0 has no certificate and the lowest id, and expects the same three:
	// were it counted, the servers would wait for it to bootstrap them. It
	// tries to join c1 before c2 and c3 start. Gossip's streams need a
	// server certificate (controlplane/gossip), so it never gets in; were
	// it in gossip, the leader's certificate check would still keep it out
	// of Raft (cluster.VerifyByTLS, tested in its package).
	c0 := newServer(t, "c0", serverOpts{expect: 3, join: []string{servers[0].gossip}})
	servers[0].start()
	c0.start()
	if err := eventuallyErr(20*time.Second, func() error {
		if !strings.Contains(c0.output(), "gossip join failed") {
			return fmt.Errorf("c0 has not tried to join c1 yet; output:\n%s", tail(c0.output(), 5))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, s := range servers[1:] {
		s.start()
	}
	c := &cluster{t: t, servers: servers}
	leader := c.waitLeader(servers, 30*time.Second)
	c.waitPeers(servers, []string{"c1", "c2", "c3"}, 30*time.Second)

	follower := without(servers, leader)[0]
	if _, err := follower.ctl("model", "apply", "-f", "../deploy/examples/second.yaml"); err != nil {
		t.Fatalf("a write through follower %s: %v", follower.id, err)
	}
	// An agent attached to a follower is registered by the leader, which
	// the follower asks as a server (ServerService.RegisterNode).
	if _, err := attachAgent(t, dialAs(t, follower.grpc, p.source(mtls.RoleAgent, "n1")), &llmgwv1.AgentHello{
		Node: &llmgwv1.Node{Id: "n1", Address: "127.0.0.1", Gpus: 1}, Epoch: uint64(time.Now().UnixNano())}); err != nil {
		t.Fatalf("agent n1 attaching to follower %s: %v", follower.id, err)
	}
	if out, err := leader.ctl("node", "list"); err != nil || !strings.Contains(out, "n1") {
		t.Fatalf("the leader does not list n1: %v: %s", err, out)
	}

	// c6 holds an agent's certificate: it refuses to start as a server.
	c6 := newServer(t, "c6", serverOpts{join: []string{leader.gossip}, extra: p.flags(mtls.RoleAgent, "c6")})
	c6.start()
	if err, ok := c6.exited(10 * time.Second); !ok || err == nil || !strings.Contains(c6.output(), "is the certificate of agent/c6; this server needs one for server/c6") {
		t.Fatalf("c6 with an agent certificate: exited %v (%v); output:\n%s", ok, err, tail(c6.output(), 5))
	}
	// c4: no certificate at all (plain text on loopback); c5: a server
	// certificate of another CA.
	c4 := newServer(t, "c4", serverOpts{join: []string{leader.gossip}})
	other := newPKI(t)
	c5 := newServer(t, "c5", serverOpts{join: []string{leader.gossip}, extra: other.flags(mtls.RoleServer, "c5"), ctl: other.flags(mtls.RoleAdmin, "ops")})
	c4.start()
	c5.start()
	// Neither gets into gossip: each has tried (its log says so) and the
	// leader lists only the three.
	for _, rogue := range []*controlServer{c4, c5} {
		if err := eventuallyErr(20*time.Second, func() error {
			if !strings.Contains(rogue.output(), "gossip join failed") {
				return fmt.Errorf("%s has not tried to join yet; output:\n%s", rogue.id, tail(rogue.output(), 5))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	v, err := leader.members()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range v.Members {
		if m.ID == "c0" || m.ID == "c4" || m.ID == "c5" {
			t.Fatalf("the leader lists uncertified %s in gossip: %+v", m.ID, v.Members)
		}
	}
	// Gossip added each within a few rounds; Raft must not, for as long as
	// it took the bare server of the issue to become a voter.
	c.neverPeer(servers, "c4", 3*time.Second)
	c.neverPeer(servers, "c5", time.Second)
	c.neverPeer(servers, "c0", time.Second)
	c.waitPeers(servers, []string{"c1", "c2", "c3"}, 5*time.Second)
	for _, rogue := range []*controlServer{c0, c4, c5} {
		out, err := rogue.ctl("model", "list", "-o", "json")
		if err != nil {
			t.Fatalf("%s model list: %v", rogue.id, err)
		}
		if strings.Contains(out, "second") {
			t.Fatalf("%s received the cluster's models: %s", rogue.id, out)
		}
	}
}
