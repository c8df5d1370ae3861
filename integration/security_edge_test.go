package integration

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The edge of design §11: agents and routers on mutual TLS, their refusal
// to listen beyond loopback in plain text, and llmgw dev on loopback only.

// runToExit runs llmgw with args and returns its output once it exits,
// which it must do by itself within(timeout): these are starts that are
// refused.
func runToExit(t *testing.T, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within(timeout))
	defer cancel()
	out, err := exec.CommandContext(ctx, bins.llmgw, args...).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("llmgw %s still running after %v; it should have refused to start:\n%s", strings.Join(args, " "), within(timeout), tail(string(out), 20))
	}
	return string(out), err
}

// wildcard is an address on every interface with a port nothing else uses.
func wildcard(t *testing.T) string {
	t.Helper()
	_, port, _ := net.SplitHostPort(freeAddr(t))
	return "0.0.0.0:" + port
}

// viaLoopback is addr (on every interface) reached through 127.0.0.1: the
// tests never send to another address.
func viaLoopback(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return "127.0.0.1:" + port
}

func agentArgs(t *testing.T, node string, httpAddr, grpcAddr string, extra ...string) []string {
	return append([]string{"agent", "--node-id", node, "--control", "127.0.0.1:1", "--data-dir", t.TempDir(),
		"--http-addr", httpAddr, "--grpc-addr", grpcAddr, "--advertise-addr", "127.0.0.1", "--gpus", "0"}, extra...)
}

func routerArgs(t *testing.T, httpAddr string, extra ...string) []string {
	return append([]string{"router", "--id", "r1", "--control", "127.0.0.1:1", "--data-dir", t.TempDir(), "--http-addr", httpAddr,
		"--ops-addr", freeAddr(t)}, extra...)
}

func healthy(addr string) bool {
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// subscribeOnce opens LoadService.Subscribe at addr and returns the first
// snapshot.
func subscribeOnce(addr string, dial grpc.DialOption) (*llmgwv1.LoadSnapshot, error) {
	conn, err := grpc.NewClient(addr, dial)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), within(5*time.Second))
	defer cancel()
	stream, err := llmgwv1.NewLoadServiceClient(conn).Subscribe(ctx, &llmgwv1.LoadSubscribeRequest{ClientId: "test"})
	if err != nil {
		return nil, err
	}
	return stream.Recv()
}

// TestEdgeRefusesPlainTextBeyondLoopback: an agent or router asked to
// listen beyond loopback without TLS refuses to start, naming the flag and
// saying why and how to proceed; with --insecure it starts and serves.
func TestEdgeRefusesPlainTextBeyondLoopback(t *testing.T) {
	tests := []struct {
		name string
		args func(wild string) []string
		// serves checks the started process on its wildcard listener.
		serves func(wild string) bool
		want   string
	}{
		{"agent --grpc-addr", func(w string) []string { return agentArgs(t, "n1", freeAddr(t), w) },
			func(w string) bool {
				_, err := subscribeOnce(viaLoopback(w), mtls.DialOption(nil, mtls.RoleAgent))
				return err == nil
			},
			"--grpc-addr (grpc_addr) %s: refusing to listen beyond loopback without TLS"},
		{"agent --http-addr", func(w string) []string { return agentArgs(t, "n1", w, freeAddr(t)) },
			func(w string) bool { return healthy(viaLoopback(w)) },
			"--http-addr (http_addr) %s: refusing to listen beyond loopback without TLS"},
		{"router --http-addr", func(w string) []string { return routerArgs(t, w) },
			func(w string) bool { return healthy(viaLoopback(w)) },
			"--http-addr (http_addr): %s: refusing to serve beyond loopback without TLS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wild := wildcard(t)
			out, err := runToExit(t, 20*time.Second, tt.args(wild)...)
			want := fmt.Sprintf(tt.want, wild)
			if err == nil || !strings.Contains(out, want) || !strings.Contains(out, "--insecure") || !strings.Contains(out, "--tls-ca") {
				t.Fatalf("exit %v, output:\n%s\nwant a refusal containing %q that names --tls-ca and --insecure", err, out, want)
			}

			wild = wildcard(t)
			p := llmgwProcess(t, tt.name, append(tt.args(wild), "--insecure")...)
			p.start()
			if !eventually(20*time.Second, func() bool { return tt.serves(wild) }) {
				t.Fatalf("with --insecure, %s does not serve on %s within %v:\n%s", tt.name, wild, within(20*time.Second), tail(p.output(), 20))
			}
		})
	}
}

// TestEdgeAgentTLS: an agent on TLS refuses a certificate that is not its
// node's agent certificate, and its LoadService — on every interface,
// which TLS allows — streams to routers only: another role is denied by
// name, another CA's router and plain text never get a stream.
func TestEdgeAgentTLS(t *testing.T) {
	p := newPKI(t)
	for _, bad := range []struct {
		name string
		role mtls.Role
		cert string
	}{{"a router's certificate", mtls.RoleRouter, "n1"}, {"another node's", mtls.RoleAgent, "n2"}} {
		t.Run(bad.name, func(t *testing.T) {
			out, err := runToExit(t, 20*time.Second, agentArgs(t, "n1", freeAddr(t), freeAddr(t), p.flags(bad.role, bad.cert)...)...)
			want := fmt.Sprintf("is the certificate of %s/%s, but this agent is agent/n1", bad.role, bad.cert)
			if err == nil || !strings.Contains(out, "--tls-cert") || !strings.Contains(out, want) {
				t.Fatalf("exit %v, output:\n%s\nwant a refusal naming --tls-cert and %q", err, out, want)
			}
		})
	}

	wild := wildcard(t)
	a := llmgwProcess(t, "n1", agentArgs(t, "n1", freeAddr(t), wild, p.flags(mtls.RoleAgent, "n1")...)...)
	a.start()
	addr := viaLoopback(wild)
	router := mtls.DialOption(p.source(mtls.RoleRouter, "r1"), mtls.RoleAgent)
	var snap *llmgwv1.LoadSnapshot
	if err := eventuallyErr(20*time.Second, func() (err error) { snap, err = subscribeOnce(addr, router); return err }); err != nil {
		t.Fatalf("a router's subscription: %v\n%s", err, tail(a.output(), 20))
	}
	if snap.GetNode() != "n1" {
		t.Fatalf("snapshot of node %q, want n1", snap.GetNode())
	}
	other := newPKI(t)
	for _, c := range []struct {
		name     string
		dial     grpc.DialOption
		wantCode codes.Code
		wantMsg  string
	}{
		{"a server", mtls.DialOption(p.source(mtls.RoleServer, "c1"), mtls.RoleAgent), codes.PermissionDenied, "expected role router"},
		{"an agent", mtls.DialOption(p.source(mtls.RoleAgent, "n2"), mtls.RoleAgent), codes.PermissionDenied, "expected role router"},
		{"an admin", mtls.DialOption(p.source(mtls.RoleAdmin, "ops"), mtls.RoleAgent), codes.PermissionDenied, "expected role router"},
		{"another CA's router", mtls.DialOption(other.source(mtls.RoleRouter, "r1"), mtls.RoleAgent), codes.Unavailable, ""},
		{"plain text", mtls.DialOption(nil, mtls.RoleAgent), codes.Unavailable, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := subscribeOnce(addr, c.dial)
			if status.Code(err) != c.wantCode || !strings.Contains(status.Convert(err).Message(), c.wantMsg) {
				t.Fatalf("Subscribe as %s: %v, want code %s with %q", c.name, err, c.wantCode, c.wantMsg)
			}
		})
	}
}

// TestDevListensOnLoopbackOnly: every socket `llmgw dev` and its engines
// listen on is on loopback (design §11: dev has no TLS and no
// authentication), read from the kernel's socket tables; and dev refuses a
// listener beyond it.
func TestDevListensOnLoopbackOnly(t *testing.T) {
	d := startDev(t)
	pids := processTree(d.cmd.Process.Pid)
	socks, err := listeningSockets(pids)
	if err != nil {
		t.Fatal(err)
	}
	// Six of dev's own (router, control gRPC, Raft and HTTP, agent HTTP
	// and gRPC) and one per engine: fewer means the scan missed some.
	if len(socks) < 6+2 {
		t.Fatalf("found %d listening sockets of dev's processes %v, want at least 8: %v", len(socks), pids, socks)
	}
	for _, s := range socks {
		if !s.ip.IsLoopback() {
			t.Errorf("%s socket on %s:%d (pid %d) is beyond loopback", s.proto, s.ip, s.port, s.pid)
		}
	}
	t.Logf("%d listening sockets of %d processes, all on loopback", len(socks), len(pids))

	wild := wildcard(t)
	out, err := runToExit(t, 20*time.Second, "dev", "--http-addr", wild, "--data-dir", t.TempDir())
	if want := "--http-addr " + wild + ": llmgw dev listens on loopback only"; err == nil || !strings.Contains(out, want) {
		t.Fatalf("dev --http-addr %s: exit %v, output:\n%s\nwant %q", wild, err, tail(out, 10), want)
	}
}

// processTree is root and every process descended from it, from /proc.
func processTree(root int) []int {
	parent := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 {
			parent[pid], _ = strconv.Atoi(f[1])
		}
	}
	tree := []int{root}
	for i := 0; i < len(tree); i++ {
		for pid, pp := range parent {
			if pp == tree[i] && !slices.Contains(tree, pid) {
				tree = append(tree, pid)
			}
		}
	}
	return tree
}

type socket struct {
	proto string
	ip    net.IP
	port  int
	pid   int
}

// listeningSockets are the TCP sockets in LISTEN and the unconnected UDP
// sockets that pids hold open.
func listeningSockets(pids []int) ([]socket, error) {
	owner := map[string]int{} // socket inode → pid
	for _, pid := range pids {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if err == nil && strings.HasPrefix(link, "socket:[") {
				owner[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = pid
			}
		}
	}
	var out []socket
	for _, proto := range []string{"tcp", "tcp6", "udp", "udp6"} {
		f, err := os.Open("/proc/net/" + proto)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fl := strings.Fields(sc.Text())
			if len(fl) < 10 {
				continue
			}
			pid, ok := owner[fl[9]]
			if !ok {
				continue
			}
			listening := fl[3] == "0A" // TCP_LISTEN
			if strings.HasPrefix(proto, "udp") {
				_, rport, _ := strings.Cut(fl[2], ":")
				listening = rport == "0000" // bound, not connected
			}
			if !listening {
				continue
			}
			ip, port, err := procAddr(fl[1])
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("/proc/net/%s: %w", proto, err)
			}
			out = append(out, socket{proto: proto, ip: ip, port: port, pid: pid})
		}
		f.Close()
	}
	return out, nil
}

// procAddr decodes /proc/net/tcp's HEXIP:HEXPORT: the address is written
// as 32-bit words in host (little-endian) order.
func procAddr(s string) (net.IP, int, error) {
	h, p, ok := strings.Cut(s, ":")
	b, err := hex.DecodeString(h)
	if !ok || err != nil || (len(b) != 4 && len(b) != 16) {
		return nil, 0, fmt.Errorf("bad address %q", s)
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return nil, 0, fmt.Errorf("bad port in %q", s)
	}
	return net.IP(b), int(port), nil
}

// requireClusterTLS skips a test until `llmgw control` and llmgwctl take
// --tls-ca, --tls-cert and --tls-key (the control plane's half of design
// §11, built beside this one).
func requireClusterTLS(t *testing.T) {
	t.Helper()
	for _, c := range [][]string{{bins.llmgw, "control", "--help"}, {bins.llmgwctl, "--help"}} {
		out, _ := exec.Command(c[0], c[1:]...).CombinedOutput()
		for _, f := range []string{"--tls-ca", "--tls-cert", "--tls-key"} {
			if !strings.Contains(string(out), f) {
				t.Skipf("%s lacks %s: the end-to-end TLS test needs the control plane's TLS (merge it to enable this test)", strings.Join(c, " "), f)
			}
		}
	}
}

// TestEdgeTLSEndToEnd runs a control server, an agent and a router, each
// on mutual TLS with certificates of one CA, and serves chat requests;
// then attackers try to take node n1's session — in plain text, with
// another CA's certificate for n1, with this CA's agent certificate of
// another node, with a router's — and report n1's replicas as served by an
// endpoint of theirs. None is welcomed, and while they try, every request
// is answered by the real replicas and the attackers' endpoint receives
// none. An agent of another CA offering GPUs never becomes a node either.
func TestEdgeTLSEndToEnd(t *testing.T) {
	requireClusterTLS(t)
	p := newPKI(t)
	c1 := newServer(t, "c1", serverOpts{extra: append([]string{"--bootstrap", "--gossip-addr", ""}, p.flags(mtls.RoleServer, "c1")...)})
	c1.start()
	admin := p.flags(mtls.RoleAdmin, "ops")
	ctl := func(args ...string) (string, error) { return ctlAt(c1.grpc, append(slices.Clone(admin), args...)...) }
	file := filepath.Join(t.TempDir(), "m.yaml")
	apply := func(replicas int) {
		t.Helper()
		writeFile(t, file, fmt.Sprintf("name: m\nengine: sim\nmodel: org/m\nreplicas: %d\ngpus_per_replica: 1\n"+
			"extra_args: [\"--sim-decode-ms-per-token\", \"1\"]\n", replicas))
		if err := eventuallyErr(30*time.Second, func() error { _, err := ctl("model", "apply", "-f", file); return err }); err != nil {
			t.Fatalf("model apply over TLS: %v\n%s", err, tail(c1.output(), 20))
		}
	}
	apply(2)
	agent := startAgentProc(t, "n1", []string{c1.grpc}, p.flags(mtls.RoleAgent, "n1")...)
	router := startRouterWith(t, "r1", []string{c1.grpc}, p.flags(mtls.RoleRouter, "r1")...)
	if !eventually(90*time.Second, func() bool { code, _ := chat(router.http, "m"); return code == http.StatusOK }) {
		code, body := chat(router.http, "m")
		t.Fatalf("no chat served over TLS within %v: %d %s\nagent:\n%s\nrouter:\n%s", within(90*time.Second), code, body,
			tail(agent.output(), 20), tail(router.output(), 20))
	}
	// The router's operations port speaks mutual TLS: read as an admin.
	ops := opsClient(t, p, p.source(mtls.RoleAdmin, "ops"))
	if !eventually(20*time.Second, func() bool {
		n, _ := testkit.ScrapeWith(ops, "https://"+router.ops+"/metrics", "llmgw_router_load_snapshots_total", nil)
		return n > 0
	}) {
		t.Fatalf("the router received no load snapshot from the agent over TLS:\n%s", tail(router.output(), 20))
	}

	// Both replicas ready (the chat above needed only one).
	var statuses []*llmgwv1.ReplicaStatus
	legit := map[string]bool{}
	var out string
	if !eventually(60*time.Second, func() bool {
		var err error
		if out, err = ctl("replica", "list", "-o", "json"); err != nil {
			return false
		}
		statuses, legit = nil, map[string]bool{}
		for _, r := range decodeReplicas(t, out) {
			if r.Replica.Model == "m" && r.ready() {
				uid, _ := strconv.ParseUint(string(r.Status.UID), 10, 64)
				inc, _ := strconv.ParseUint(string(r.Status.Incarnation), 10, 64)
				statuses = append(statuses, &llmgwv1.ReplicaStatus{ReplicaId: r.Replica.ID, Uid: uid, Incarnation: inc, Model: "m", Node: "n1",
					Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, UpdatedUnixNano: time.Now().UnixNano()})
				legit[r.Replica.ID] = true
			}
		}
		return len(statuses) == 2
	}) {
		t.Fatalf("%d ready replicas of m within %v, want 2: %s", len(statuses), within(60*time.Second), out)
	}

	var stolen atomic.Int64
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		stolen.Add(1)
		http.Error(w, "attacker", http.StatusTeapot)
	}))
	defer attacker.Close()
	for _, s := range statuses {
		s.Address = strings.TrimPrefix(attacker.URL, "http://")
	}
	other := newPKI(t)
	attacks := []struct {
		name string
		dial grpc.DialOption
	}{
		{"plain text", mtls.DialOption(nil, mtls.RoleServer)},
		{"another CA's agent/n1", mtls.DialOption(other.source(mtls.RoleAgent, "n1"), mtls.RoleServer)},
		{"agent/evil claiming n1", mtls.DialOption(p.source(mtls.RoleAgent, "evil"), mtls.RoleServer)},
		{"router/r1 claiming n1", mtls.DialOption(p.source(mtls.RoleRouter, "r1"), mtls.RoleServer)},
	}
	ctx, stopAttacks := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	welcomed := make([]atomic.Bool, len(attacks))
	for i, a := range attacks {
		wg.Go(func() { welcomed[i].Store(hijack(ctx, c1.grpc, a.dial, "n1", statuses)) })
	}
	// An agent of another CA offering GPUs, while the model wants two
	// replicas more than n1 holds: admitted, it would be given them.
	rogue := startAgentProc(t, "evil", []string{c1.grpc}, append(other.flags(mtls.RoleAgent, "evil"), "--gpus", "8")...)
	apply(4)

	// The attacks run for a stated length while requests are served.
	var served, failed int
	var firstFailure string
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		if code, body := chat(router.http, "m"); code != http.StatusOK {
			if failed++; failed == 1 {
				firstFailure = fmt.Sprintf("%d %s", code, body)
			}
			continue
		}
		served++
	}
	if failed > 0 {
		t.Errorf("%d of %d chats during the attacks failed, the first: %s", failed, served+failed, firstFailure)
	}
	stopAttacks()
	wg.Wait()
	for i, a := range attacks {
		if welcomed[i].Load() {
			t.Errorf("attack %q was welcomed by the control server", a.name)
		}
	}
	if n := stolen.Load(); n > 0 {
		t.Errorf("the attackers' endpoint received %d user requests", n)
	}
	nodes, err := ctl("node", "list", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(nodes, `"n1"`) || strings.Contains(nodes, `"evil"`) {
		t.Errorf("node list should hold n1 and not the other CA's agent evil: %s", nodes)
	}
	if got := recordedEngines(rogue); len(got) > 0 {
		t.Errorf("the other CA's agent runs engines %v", got)
	}
	t.Logf("%d requests served during the attacks, %d failed, %d to the attackers", served, failed, stolen.Load())
}

func decodeReplicas(t *testing.T, out string) []replicaView {
	t.Helper()
	var list []replicaView
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("decode replica list: %v: %s", err, out)
	}
	return list
}

// hijack attaches to addr as node with dial's credentials and, if the
// server lets it, reports statuses (replicas served at the attacker's
// address) and keeps the session up with heartbeats until ctx ends. It
// reports whether the server welcomed it.
func hijack(ctx context.Context, addr string, dial grpc.DialOption, node string, statuses []*llmgwv1.ReplicaStatus) bool {
	conn, err := grpc.NewClient(addr, dial)
	if err != nil {
		return false
	}
	defer conn.Close()
	stream, err := llmgwv1.NewAgentServiceClient(conn).Attach(ctx)
	if err != nil {
		return false
	}
	// An epoch far ahead of the real agent's, so a server that took the
	// hello would prefer this session.
	epoch := uint64(time.Now().Add(time.Hour).UnixNano())
	hello := &llmgwv1.AgentHello{Node: &llmgwv1.Node{Id: node, Address: "127.0.0.1", Gpus: 2, State: llmgwv1.NodeState_NODE_STATE_ACTIVE},
		Epoch: epoch, Running: statuses}
	if stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: hello}}) != nil {
		return false
	}
	m, err := stream.Recv()
	if err != nil || m.GetWelcome() == nil {
		return false
	}
	update := &llmgwv1.EphemeralUpdate{Node: node, Epoch: epoch, Seq: 1, Full: true, Statuses: statuses}
	_ = stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: update}})
	// Drain the server's messages until the stream ends: ctx's end or a
	// broken stream, either of which also ends the heartbeats below.
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
		}
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			<-drained
			return true
		case <-drained:
			return true
		case <-tick.C:
			hb := &llmgwv1.Heartbeat{UnixNano: time.Now().UnixNano()}
			_ = stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Heartbeat{Heartbeat: hb}})
		}
	}
}

// TestProcAddr: the kernel's socket-table addresses decode, so that the
// loopback check above reads what the kernel holds.
func TestProcAddr(t *testing.T) {
	tests := []struct {
		in   string
		ip   string
		port int
	}{
		{"0100007F:1F90", "127.0.0.1", 8080},
		{"00000000:1CED", "0.0.0.0", 7405},
		{"0A00000A:0050", "10.0.0.10", 80},
		{"00000000000000000000000001000000:1F90", "::1", 8080},
		{"00000000000000000000000000000000:0016", "::", 22},
	}
	for _, tt := range tests {
		ip, port, err := procAddr(tt.in)
		if err != nil || ip.String() != tt.ip || port != tt.port {
			t.Errorf("procAddr(%q) = %v, %d, %v; want %s, %d", tt.in, ip, port, err, tt.ip, tt.port)
		}
	}
}

// TestEdgeRouterHTTPS: with --https-cert and --https-key the router's API
// is served over HTTPS only.
func TestEdgeRouterHTTPS(t *testing.T) {
	p := newPKI(t)
	f := p.files(mtls.RoleRouter, "api")
	addr := freeAddr(t)
	r := llmgwProcess(t, "router", routerArgs(t, addr, "--https-cert", f.Cert, "--https-key", f.Key)...)
	r.start()
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(f.CA)
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("read CA: %v", err)
	}
	// The certificate names router.llmgw (and no IP), so that is the name
	// the client checks while dialing loopback.
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: mtls.RoleRouter.DNSName()}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: within(10 * time.Second)}
	var status int
	if !eventually(20*time.Second, func() bool {
		resp, err := client.Get("https://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		status = resp.StatusCode
		return resp.TLS != nil && status == http.StatusOK
	}) {
		t.Fatalf("no HTTPS answer from the router within %v (last status %d):\n%s", within(20*time.Second), status, tail(r.output(), 20))
	}
	plain := &http.Client{Timeout: within(10 * time.Second), Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := plain.Get("http://" + addr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("the HTTPS router answered a plain-HTTP request")
		}
	}
}
