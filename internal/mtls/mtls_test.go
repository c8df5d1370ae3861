package mtls

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pki makes a CA in dir/ca and certificates for ids in dir/certs.
func pki(t *testing.T, dir string, ids ...Identity) map[string]Files {
	t.Helper()
	ca := filepath.Join(dir, "ca")
	if _, err := CreateCA(ca, CAOptions{}); err != nil {
		t.Fatal(err)
	}
	out := map[string]Files{}
	for _, id := range ids {
		c, k, err := CreateCert(ca, filepath.Join(dir, "certs"), id, CertOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out[id.Name] = Files{CA: filepath.Join(ca, CAFile), Cert: c, Key: k}
	}
	return out
}

func load(t *testing.T, f Files) *Source {
	t.Helper()
	s, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// handshake runs one TLS handshake between a listener of srv accepting
// roles and a client of cli expecting expect; it returns the server-side
// identity of the client and each side's error.
func handshake(t *testing.T, srv *Source, roles []Role, cli *Source, expect Role) (Identity, error, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		id  Identity
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- res{err: err}
			return
		}
		defer c.Close()
		tc := tls.Server(c, srv.ServerConfig(roles...))
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err != nil {
			ch <- res{err: err}
			return
		}
		id, err := IdentityOf(tc.ConnectionState().VerifiedChains[0][0])
		// Read until the client closes, so its side of the handshake ends.
		_, _ = tc.Read(make([]byte, 1))
		ch <- res{id, err}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, cli.ClientConfig(expect))
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	cerr := tc.Handshake()
	if cerr == nil {
		// TLS 1.3: the server's verdict on the client certificate arrives
		// after the client's handshake returns; a read surfaces it.
		_, _ = tc.Write([]byte{0})
		tc.Close()
	} else {
		c.Close()
	}
	r := <-ch
	return r.id, cerr, r.err
}

func TestHandshakeRolesAndCAs(t *testing.T) {
	dir := t.TempDir()
	f := pki(t, dir, Identity{RoleServer, "s1"}, Identity{RoleAgent, "n1"}, Identity{RoleRouter, "r1"})
	other := pki(t, filepath.Join(dir, "other"), Identity{RoleServer, "evil"})
	s1, n1, r1, evil := load(t, f["s1"]), load(t, f["n1"]), load(t, f["r1"]), load(t, other["evil"])

	tests := []struct {
		name       string
		srv        *Source
		roles      []Role
		cli        *Source
		expect     Role
		wantID     Identity
		wantClient string // substring of the client's error, "" for none
		wantServer bool   // server side fails
	}{
		{name: "agent to server", srv: s1, cli: n1, expect: RoleServer, wantID: Identity{RoleAgent, "n1"}},
		{name: "server-only listener refuses a router", srv: s1, roles: []Role{RoleServer}, cli: r1, expect: RoleServer, wantServer: true},
		{name: "client expecting an agent refuses a server", srv: s1, cli: r1, expect: RoleAgent, wantClient: "not a agent", wantServer: true},
		{name: "other CA's client refused", srv: s1, cli: evil, expect: RoleServer, wantClient: "not a server", wantServer: true},
		{name: "other CA's server refused", srv: evil, cli: n1, expect: RoleServer, wantClient: "not a server", wantServer: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, cerr, serr := handshake(t, tt.srv, tt.roles, tt.cli, tt.expect)
			if tt.wantClient != "" {
				if cerr == nil || !strings.Contains(cerr.Error(), tt.wantClient) {
					t.Fatalf("client error %v, want one containing %q", cerr, tt.wantClient)
				}
			} else if cerr != nil && !tt.wantServer {
				t.Fatalf("client: %v", cerr)
			}
			if tt.wantServer != (serr != nil) {
				t.Fatalf("server error %v, want failure %v", serr, tt.wantServer)
			}
			if !tt.wantServer && id != tt.wantID {
				t.Fatalf("identity %v, want %v", id, tt.wantID)
			}
		})
	}
}

func TestRenewalPickedUpWithoutRestart(t *testing.T) {
	dir := t.TempDir()
	f := pki(t, dir, Identity{RoleServer, "s1"}, Identity{RoleAgent, "n1"})
	now := time.Now()
	srv := load(t, f["s1"])
	srv.now = func() time.Time { return now }
	srv.checked = now
	first := srv.pair.Leaf
	// Renew in place, as an operator would.
	if _, _, err := CreateCert(filepath.Join(dir, "ca"), filepath.Join(dir, "certs"), Identity{RoleServer, "s1"}, CertOptions{}); err != nil {
		t.Fatal(err)
	}
	// Make sure the modification time differs on coarse file systems.
	later := time.Now().Add(2 * time.Second)
	for _, p := range []string{f["s1"].Cert, f["s1"].Key} {
		if err := os.Chtimes(p, later, later); err != nil {
			t.Fatal(err)
		}
	}
	if pair, _ := srv.current(); pair.Leaf != first {
		t.Fatal("reloaded within reloadEvery")
	}
	now = now.Add(reloadEvery)
	pair, _ := srv.current()
	if pair.Leaf == nil || pair.Leaf.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("renewed certificate not picked up")
	}
	if _, cerr, serr := handshake(t, srv, nil, load(t, f["n1"]), RoleServer); cerr != nil || serr != nil {
		t.Fatalf("handshake after renewal: %v / %v", cerr, serr)
	}
	// A broken file keeps the last good pair and reports the error.
	if err := os.WriteFile(f["s1"].Cert, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	now = now.Add(reloadEvery)
	if p2, _ := srv.current(); p2 != pair {
		t.Fatal("a broken file replaced the good pair")
	}
	if srv.LastError() == nil {
		t.Fatal("LastError nil after a failed reload")
	}
}

func TestIdentityAndFiles(t *testing.T) {
	for _, id := range []Identity{{"root", "x"}, {RoleAgent, ""}, {RoleAgent, "a/b"}, {RoleAgent, strings.Repeat("a", 65)}} {
		if id.Validate() == nil {
			t.Errorf("%v accepted", id)
		}
	}
	if m := (Files{CA: "ca.pem"}).Missing(); len(m) != 2 || m[0] != "tls-cert" || m[1] != "tls-key" {
		t.Errorf("missing %q", m)
	}
	if p := (Files{}).Missing(); p != nil {
		t.Errorf("empty files: %q", p)
	}
	dir := t.TempDir()
	if _, err := CreateCA(dir, CAOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := CreateCA(dir, CAOptions{}); err == nil || !strings.Contains(err.Error(), "refusing to overwrite") {
		t.Fatalf("second CreateCA: %v", err)
	}
	if _, _, err := CreateCert(filepath.Join(dir, "none"), dir, Identity{RoleAgent, "n1"}, CertOptions{}); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("CreateCert without CA: %v", err)
	}
}

func TestCheckListen(t *testing.T) {
	tests := []struct {
		addr     string
		insecure bool
		ok       bool
	}{
		{"127.0.0.1:7400", false, true},
		{"localhost:7400", false, true},
		{"[::1]:7400", false, true},
		{":7400", false, false},
		{"0.0.0.0:7400", false, false},
		{"10.0.0.5:7400", false, false},
		{"10.0.0.5:7400", true, true},
	}
	for _, tt := range tests {
		err := CheckListen("--grpc-addr", tt.addr, nil, tt.insecure)
		if (err == nil) != tt.ok {
			t.Errorf("%s insecure=%v: %v", tt.addr, tt.insecure, err)
		}
		if err != nil && !strings.Contains(err.Error(), "--insecure") {
			t.Errorf("message does not say how: %v", err)
		}
	}
}

// TestCABundleRotation is the CA rotation of docs/security.md: while the
// CA file holds both the old and the new CA, certificates of either are
// accepted, so components can move to new certificates one at a time;
// once the file holds only the new CA, the old ones are refused.
func TestCABundleRotation(t *testing.T) {
	dir := t.TempDir()
	oldF := pki(t, filepath.Join(dir, "old"), Identity{RoleServer, "s1"}, Identity{RoleAgent, "n1"})
	newF := pki(t, filepath.Join(dir, "new"), Identity{RoleServer, "s1"}, Identity{RoleAgent, "n1"})
	oldCA, err := os.ReadFile(oldF["s1"].CA)
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := os.ReadFile(newF["s1"].CA)
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "bundle.pem")
	if err := os.WriteFile(bundle, append(append([]byte{}, oldCA...), newCA...), 0o644); err != nil {
		t.Fatal(err)
	}
	with := func(f Files, ca string) *Source { f.CA = ca; return load(t, f) }
	// Mid-rotation: the server already has its new certificate, the agent
	// still its old one; both trust the bundle.
	srv, cli := with(newF["s1"], bundle), with(oldF["n1"], bundle)
	if _, cerr, serr := handshake(t, srv, nil, cli, RoleServer); cerr != nil || serr != nil {
		t.Fatalf("mixed certificates under the bundle: %v / %v", cerr, serr)
	}
	// Done: only the new CA is trusted, and the old certificate is refused.
	srv = with(newF["s1"], newF["s1"].CA)
	if _, _, serr := handshake(t, srv, nil, cli, RoleServer); serr == nil {
		t.Fatal("an old-CA certificate was accepted after the rotation")
	}
	if _, cerr, serr := handshake(t, srv, nil, with(newF["n1"], newF["n1"].CA), RoleServer); cerr != nil || serr != nil {
		t.Fatalf("new certificates after the rotation: %v / %v", cerr, serr)
	}
}
