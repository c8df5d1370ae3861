package integration

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/testkit"
)

// Certificate renewal in place under chat load (issue #12, design §11):
// `llmgwctl tls cert create` over a running component's files is picked up
// by its next handshake, with no restart and no failed client request.

// startTLSCluster starts n control servers on mutual TLS, each with a
// server certificate naming it and reached by llmgwctl as admin/ops, with
// --bootstrap-expect n and --join the others, and waits until they agree on
// a leader and on the n voters.
func startTLSCluster(t *testing.T, p *testPKI, n int) *cluster {
	t.Helper()
	c := &cluster{t: t}
	for i := 1; i <= n; i++ {
		c.servers = append(c.servers, tlsServer(t, p, fmt.Sprintf("c%d", i), serverOpts{expect: n}))
	}
	for _, s := range c.servers {
		var join []string
		for _, o := range c.servers {
			if o != s {
				join = append(join, o.gossip)
			}
		}
		s.args = append(s.args, "--join", strings.Join(join, ","))
	}
	for _, s := range c.servers {
		s.start()
	}
	c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	return c
}

// certSerial is the serial number (hex) of the certificate in a PEM file.
func certSerial(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s holds no PEM block", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return c.SerialNumber.Text(16)
}

// presentedSerial makes one fresh mutual-TLS handshake with the listener
// at addr, as the client probe, and returns the serial (hex) of the
// certificate the listener presented, which must be a role certificate of
// the probe's CA. A new connection every time: no session resumption, so
// the listener's current certificate is what is sent.
func presentedSerial(addr string, probe mtls.Files, role mtls.Role) (string, error) {
	pair, err := tls.LoadX509KeyPair(probe.Cert, probe.Key)
	if err != nil {
		return "", err
	}
	caPEM, err := os.ReadFile(probe.CA)
	if err != nil {
		return "", err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: within(5 * time.Second)}, Config: &tls.Config{
		MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: role.DNSName(),
		Certificates: []tls.Certificate{pair}, NextProtos: []string{"h2"},
	}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return conn.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.Text(16), nil
}

// witnessed is one handshake a certWitness saw.
type witnessed struct {
	at     time.Time
	id     string // role/name of the client's certificate
	serial string
}

// certWitness stands where a client fails over to a control server: TLS
// listeners with a server certificate of the cluster's CA, which record
// the client certificate of every handshake and then close the connection
// (the client moves on to its next address). In TLS 1.3 the client's
// certificate is encrypted, so only the other end of the handshake can
// tell which one a client presents: this is that end.
type certWitness struct {
	addrs []string
	lis   []net.Listener
	wg    sync.WaitGroup

	mu   sync.Mutex
	seen []witnessed
}

func startCertWitness(t *testing.T, p *testPKI, n int) *certWitness {
	t.Helper()
	f := p.files(mtls.RoleServer, "witness")
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		t.Fatal(err)
	}
	w := &certWitness{}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pair},
		ClientAuth: tls.RequireAnyClientCert, NextProtos: []string{"h2"}}
	for range n {
		l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
		if err != nil {
			t.Fatal(err)
		}
		w.lis = append(w.lis, l)
		w.addrs = append(w.addrs, l.Addr().String())
		w.wg.Go(func() { w.accept(l) })
	}
	t.Cleanup(w.close)
	return w
}

func (w *certWitness) accept(l net.Listener) {
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		conns.Go(func() {
			defer c.Close()
			tc := c.(*tls.Conn)
			_ = tc.SetDeadline(time.Now().Add(within(5 * time.Second)))
			if tc.Handshake() != nil {
				return
			}
			certs := tc.ConnectionState().PeerCertificates
			id := "(no llmgw identity)"
			if got, err := mtls.IdentityOf(certs[0]); err == nil {
				id = got.String()
			}
			w.mu.Lock()
			w.seen = append(w.seen, witnessed{at: time.Now(), id: id, serial: certs[0].SerialNumber.Text(16)})
			w.mu.Unlock()
		})
	}
}

// since is the handshakes of id seen after t.
func (w *certWitness) since(id string, t time.Time) []witnessed {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []witnessed
	for _, s := range w.seen {
		if s.id == id && s.at.After(t) {
			out = append(out, s)
		}
	}
	return out
}

func (w *certWitness) close() {
	for _, l := range w.lis {
		l.Close()
	}
	w.wg.Wait()
}

// TestCertRenewalUnderLoad is issue #12's "a certificate renewal under chat
// load: 0 failed requests". Three control servers, an agent and two
// routers on mutual TLS serve chat through both routers; while the load
// runs, every component's certificate and the admin's are renewed in place
// with `llmgwctl tls cert create` over the same files. Then, with nothing
// restarted:
//   - a fresh handshake with every listener — each server's gRPC and Raft
//     port, the agent's LoadService — presents the renewed certificate
//     (serial of the new file), within a deadline (the reload is ≤ 1 s);
//   - llmgwctl with the renewed admin certificate is served.
//
// Then the long-lived connections are made to handshake again: the server
// the agent and the routers are attached to is restarted (one at a time,
// the cluster keeps its quorum). Each router's next handshake is seen by a
// certWitness that stands next in its --control rotation, and presents the
// router's renewed certificate; the agent attaches again, the restarted
// server rejoins Raft (its peers dial it with their renewed client
// certificates), and the routers watch again through a real server. No
// chat request fails at any point.
//
// Not observed: the agent's and the servers' client certificates on their
// new connections (their rotations reach a witness only after every real
// server failed). Each process has one mtls.Source for listening and
// dialing, so the new serial on its listener is the pair its dials read.
//
// Each check bites: with mtls.Source never re-reading its files the
// listeners keep presenting the old serials, and with its dials keeping the
// first pair the witness sees a router's old certificate.
func TestCertRenewalUnderLoad(t *testing.T) {
	requireClusterTLS(t)
	p := newPKI(t)
	c := startTLSCluster(t, p, 3)
	c1 := c.servers[0]
	w := startCertWitness(t, p, len(c.servers))
	var all, routerControl []string
	for i, s := range c.servers {
		all = append(all, s.grpc)
		// Each server is followed by a witness in the routers' rotation
		// (configured addresses come first, then the learned ones, which
		// are the same servers): whichever server a router loses, its next
		// handshake is with a witness.
		routerControl = append(routerControl, s.grpc, w.addrs[i])
	}
	agent := startAgentProc(t, "n1", all, p.flags(mtls.RoleAgent, "n1")...)
	agentGRPC := agent.args[slicesIndex(agent.args, "--grpc-addr")+1]
	routers := []*controlServer{
		startRouterWith(t, "r1", routerControl, p.flags(mtls.RoleRouter, "r1")...),
		startRouterWith(t, "r2", routerControl, p.flags(mtls.RoleRouter, "r2")...),
	}
	file := filepath.Join(t.TempDir(), "chat.yaml")
	writeFile(t, file, "name: chat\nengine: sim\nmodel: org/chat\nreplicas: 2\ngpus_per_replica: 1\n"+
		"extra_args: [\"--sim-decode-ms-per-token\", \"1\"]\n")
	if err := eventuallyErr(30*time.Second, func() error { _, err := c1.ctl("model", "apply", "-f", file); return err }); err != nil {
		t.Fatalf("model apply over TLS: %v", err)
	}
	if !eventually(90*time.Second, func() bool {
		for _, r := range routers {
			if code, _ := chat(r.http, "chat"); code != http.StatusOK {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the routers do not both serve chat over TLS within %v", within(90*time.Second))
	}

	// What is renewed: every component's pair and the admin's, in the
	// directories they were issued to (newPKI's layout).
	type renewal struct {
		role mtls.Role
		name string
		// listeners presenting this certificate, probed after renewal.
		listeners []string
		old, new  string // serials
		// due is when every handshake must present the new pair: its
		// files written, plus mtls.Source's reload bound (1 s) and a
		// second for a handshake already under way then.
		due time.Time
	}
	var renewals []*renewal
	for _, s := range c.servers {
		renewals = append(renewals, &renewal{role: mtls.RoleServer, name: s.id, listeners: []string{s.grpc, s.raft}})
	}
	renewals = append(renewals,
		&renewal{role: mtls.RoleAgent, name: "n1", listeners: []string{agentGRPC}},
		&renewal{role: mtls.RoleRouter, name: "r1"}, &renewal{role: mtls.RoleRouter, name: "r2"},
		&renewal{role: mtls.RoleAdmin, name: "ops"})
	// A server certificate, which every listener accepts at the handshake
	// (Raft's admits servers only).
	probe := p.files(mtls.RoleServer, "probe")
	for _, rn := range renewals {
		rn.old = certSerial(t, p.files(rn.role, rn.name).Cert)
		for _, addr := range rn.listeners {
			got, err := presentedSerial(addr, probe, rn.role)
			if err != nil || got != rn.old {
				t.Fatalf("before the renewal, %s/%s's listener %s presents %q (%v), want its certificate %s", rn.role, rn.name, addr, got, err, rn.old)
			}
		}
	}

	l := startLoad("chat", 2, routers...)
	l.carry(t, time.Second, 20, "before the renewal")
	beforeOK := l.answered()
	renewedAt := time.Now()
	for _, rn := range renewals {
		f := p.files(rn.role, rn.name)
		if _, err := ctlAt("127.0.0.1:1", "tls", "cert", "create", "--ca", filepath.Dir(f.CA),
			"--role", string(rn.role), "--name", rn.name, "--dir", filepath.Dir(f.Cert)); err != nil {
			t.Fatalf("renew %s/%s: %v", rn.role, rn.name, err)
		}
		if rn.new = certSerial(t, f.Cert); rn.new == rn.old {
			t.Fatalf("llmgwctl tls cert create left %s/%s's certificate %s in place", rn.role, rn.name, rn.old)
		}
		rn.due = time.Now().Add(2 * time.Second)
	}
	renewed := time.Since(renewedAt)
	for _, rn := range renewals {
		for _, addr := range rn.listeners {
			var got string
			if err := eventuallyErr(5*time.Second, func() (err error) {
				if got, err = presentedSerial(addr, probe, rn.role); err == nil && got != rn.new {
					err = fmt.Errorf("presents %s", got)
				}
				return err
			}); err != nil {
				t.Fatalf("%s/%s's listener %s does not present its renewed certificate %s (old %s) within %v of the renewal: %v",
					rn.role, rn.name, addr, rn.new, rn.old, within(5*time.Second), err)
			}
		}
	}
	pickedUp := time.Since(renewedAt)
	// The admin's renewed pair is accepted (llmgwctl reads it per call).
	if _, err := c1.ctl("cluster", "status"); err != nil {
		t.Fatalf("llmgwctl with the renewed admin certificate: %v", err)
	}
	// carry and checkNoFailures: at least 20 requests answered in each
	// phase, none of them failed.
	l.carry(t, time.Second, 20, "after the renewal")
	duringOK := l.answered() - beforeOK

	// Make the long-lived connections handshake again: restart the server
	// each of the agent and the routers is on, one at a time.
	sessions, _ := testkit.Scrape(agent.http, "llmgw_agent_sessions_total", nil)
	var targets []*controlServer
	if s := serverByGRPC(c, attachedTo(agent)); s != nil {
		targets = append(targets, s)
	}
	for _, r := range routers {
		if s := serverByGRPC(c, lastOf(watchAddrs(r))); s != nil && !slices.Contains(targets, s) {
			targets = append(targets, s)
		}
	}
	if len(targets) == 0 {
		t.Fatalf("cannot tell which server the agent (%q) and the routers are on", attachedTo(agent))
	}
	restartedAt := time.Now()
	for _, s := range targets {
		s.stop()
		s.start()
		c.waitLeader(c.servers, formTimeout)
		c.waitPeers(c.servers, ids(c.servers), formTimeout)
	}
	// A router dials the witnesses all along (its reports rotate through
	// every --control address), so a handshake between the start of the
	// renewals and its own pair's reload rightly shows the old serial:
	// what must hold is every handshake after its pair is due, including
	// those the restart caused.
	due := make(map[string]time.Time)
	for _, rn := range renewals {
		if rn.role == mtls.RoleRouter {
			due["router/"+rn.name] = rn.due
		}
	}
	for _, r := range routers {
		id := "router/" + r.id
		from := due[id]
		if restartedAt.After(from) {
			from = restartedAt
		}
		var seen []witnessed
		if !eventually(20*time.Second, func() bool { seen = w.since(id, from); return len(seen) > 0 }) {
			t.Fatalf("%s made no handshake with the witness after the restart within %v; its log:\n%s", id, within(20*time.Second), tail(r.output(), 20))
		}
		seen = w.since(id, due[id])
		want := certSerial(t, p.files(mtls.RoleRouter, r.id).Cert)
		for _, s := range seen {
			if s.serial != want {
				t.Fatalf("%s's handshake at %s (after its renewed pair was due at %s) presented certificate %s, want the renewed %s", id, s.at.Format("15:04:05.000"), due[id].Format("15:04:05.000"), s.serial, want)
			}
		}
		if !eventually(20*time.Second, func() bool {
			return lastWatchOpen(r).After(restartedAt) && serverByGRPC(c, lastOf(watchAddrs(r))) != nil
		}) {
			t.Fatalf("%s does not watch through a control server again within %v; its log:\n%s", r.id, within(20*time.Second), tail(r.output(), 20))
		}
	}
	if !eventually(20*time.Second, func() bool {
		n, _ := testkit.Scrape(agent.http, "llmgw_agent_sessions_total", nil)
		up, _ := testkit.Scrape(agent.http, "llmgw_agent_session_attached", nil)
		return n > sessions && up == 1
	}) {
		t.Fatalf("the agent did not attach again within %v; its log:\n%s", within(20*time.Second), tail(agent.output(), 20))
	}
	afterBase := l.answered()
	l.carry(t, time.Second, 20, "after the reconnections")
	total := l.answered()
	l.checkNoFailures(t, 100)
	t.Logf("renewed %d certificates in %v; every listener presented its new one %v after the first renewal",
		len(renewals), renewed.Round(time.Millisecond), pickedUp.Round(time.Millisecond))
	t.Logf("requests answered: %d before the renewal, %d during and after it, %d across the restart of %v and after (%d in the last phase)",
		beforeOK, duringOK, total-beforeOK-duringOK, ids(targets), total-afterBase)
	for _, r := range routers {
		t.Logf("router/%s handshakes with the witness since the renewal: %d, all with the renewed certificate", r.id, len(w.since("router/"+r.id, due["router/"+r.id])))
	}
}
