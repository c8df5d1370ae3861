package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"github.com/llmgw/llmgw/controlplane/gossip"
	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// runArgs runs llmgwctl with args alone (no --addr).
func runArgs(args ...string) (string, error) {
	return run(defaultAddr, args...)
}

// TestTLSCreate: `tls ca create` writes the CA and refuses to replace it;
// `tls cert create` writes NAME.pem and NAME-key.pem carrying the identity
// asked for, replaces them on renewal, and refuses an unknown role or a bad
// name.
func TestTLSCreate(t *testing.T) {
	dir := t.TempDir()
	caDir, out := filepath.Join(dir, "ca"), filepath.Join(dir, "certs")
	got, err := runArgs("tls", "ca", "create", "--dir", caDir)
	if err != nil {
		t.Fatalf("ca create: %v", err)
	}
	for _, f := range []string{mtls.CAFile, mtls.CAKeyFile} {
		p := filepath.Join(caDir, f)
		if _, err := os.Stat(p); err != nil || !strings.Contains(got, p) {
			t.Fatalf("ca create: %s not written or not reported (%v): %s", p, err, got)
		}
	}
	if _, err := runArgs("tls", "ca", "create", "--dir", caDir); err == nil || !strings.Contains(err.Error(), "exist") {
		t.Fatalf("a second ca create: %v, want a refusal to replace the CA", err)
	}

	got, err = runArgs("tls", "cert", "create", "--ca", caDir, "--role", "admin", "--name", "ops", "--dir", out, "--ip", "10.0.0.9", "--days", "30")
	if err != nil {
		t.Fatalf("cert create: %v", err)
	}
	cert, key := mtls.CertFiles(out, "ops")
	if !strings.Contains(got, cert) || !strings.Contains(got, key) || !strings.Contains(got, "admin/ops") {
		t.Fatalf("cert create reported %q, want both paths and admin/ops", got)
	}
	files := mtls.Files{CA: filepath.Join(caDir, mtls.CAFile), Cert: cert, Key: key}
	src, err := mtls.Load(files)
	if err != nil {
		t.Fatalf("load the written pair: %v", err)
	}
	if id := src.Identity(); id != (mtls.Identity{Role: mtls.RoleAdmin, Name: "ops"}) {
		t.Fatalf("identity %s, want admin/ops", id)
	}
	before, _ := os.ReadFile(cert)
	if _, err := runArgs("tls", "cert", "create", "--ca", caDir, "--role", "admin", "--name", "ops", "--dir", out); err != nil {
		t.Fatalf("renewal: %v", err)
	}
	if after, _ := os.ReadFile(cert); string(after) == string(before) {
		t.Fatal("renewal left the old certificate")
	}

	for _, bad := range [][]string{
		{"--role", "root", "--name", "x"},
		{"--role", "agent", "--name", "-bad-"},
		{"--role", "agent"},
		{"--role", "agent", "--name", "n1", "--days", "0"},
	} {
		args := append([]string{"tls", "cert", "create", "--ca", caDir, "--dir", out}, bad...)
		if _, err := runArgs(args...); err == nil {
			t.Errorf("cert create %v succeeded", bad)
		}
	}
}

// TestTLSDial: with --tls-* (or LLMGW_TLS_*), llmgwctl dials a TLS server
// with its certificate; without them, or with half of them, it does not
// get through.
func TestTLSDial(t *testing.T) {
	ca := mtlstest.New(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(mtls.ServerCredentials(ca.Source(mtls.RoleServer, "c1"))))
	llmgwv1.RegisterAdminServiceServer(srv, newFake())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	addr := l.Addr().String()

	admin := ca.Files(mtls.RoleAdmin, "ops")
	if out, err := run(addr, append(ca.Flags(mtls.RoleAdmin, "ops"), "raft", "list-peers")...); err != nil || !strings.Contains(out, "c3") {
		t.Fatalf("with --tls-*: %v: %s", err, out)
	}
	t.Setenv("LLMGW_TLS_CA", admin.CA)
	t.Setenv("LLMGW_TLS_CERT", admin.Cert)
	t.Setenv("LLMGW_TLS_KEY", admin.Key)
	if out, err := run(addr, "raft", "list-peers"); err != nil || !strings.Contains(out, "c3") {
		t.Fatalf("with LLMGW_TLS_*: %v: %s", err, out)
	}
	t.Setenv("LLMGW_TLS_CA", "")
	t.Setenv("LLMGW_TLS_CERT", "")
	t.Setenv("LLMGW_TLS_KEY", "")
	if _, err := run(addr, "--timeout", "2s", "raft", "list-peers"); err == nil || !strings.Contains(err.Error(), "the server may require TLS") {
		t.Fatalf("plain text to a TLS server: %v, want an error that says to give certificates", err)
	}
	if _, err := run(addr, "--tls-cert", admin.Cert, "raft", "list-peers"); err == nil || !strings.Contains(err.Error(), "--tls-ca: required") {
		t.Fatalf("half the TLS flags: %v, want --tls-ca named", err)
	}
}

// TestTLSInit: tls init makes the CA and every named certificate, and a
// second run keeps them all (it is a one-shot container's command).
func TestTLSInit(t *testing.T) {
	dir := t.TempDir()
	args := []string{"tls", "init", "--dir", dir, "--server", "c1,c2", "--agent", "n1", "--router", "r1", "--admin", "ops",
		"--gossip-key-file", filepath.Join(dir, "gossip.key")}
	out, err := runArgs(args...)
	if err != nil {
		t.Fatalf("tls init: %v\n%s", err, out)
	}
	if n := strings.Count(out, "created"); n != 7 {
		t.Fatalf("first run created %d files, want the CA, 5 certificates and the gossip key:\n%s", n, out)
	}
	key, err := os.ReadFile(filepath.Join(dir, "gossip.key"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gossip.DecodeKey(string(key)); err != nil {
		t.Fatalf("gossip key: %v", err)
	}
	want := map[string]mtls.Identity{
		"server/c1": {Role: mtls.RoleServer, Name: "c1"}, "server/c2": {Role: mtls.RoleServer, Name: "c2"},
		"agent/n1": {Role: mtls.RoleAgent, Name: "n1"}, "router/r1": {Role: mtls.RoleRouter, Name: "r1"},
		"admin/ops": {Role: mtls.RoleAdmin, Name: "ops"},
	}
	var before []byte
	for rel, id := range want {
		cert, key := mtls.CertFiles(filepath.Join(dir, string(id.Role)), id.Name)
		src, err := mtls.Load(mtls.Files{CA: filepath.Join(dir, "ca", mtls.CAFile), Cert: cert, Key: key})
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if src.Identity() != id {
			t.Fatalf("%s: identity %v", rel, src.Identity())
		}
		if rel == "server/c1" {
			before, _ = os.ReadFile(cert)
		}
	}
	out, err = runArgs(args...)
	if err != nil || strings.Contains(out, "created") || strings.Count(out, "kept") != 6 {
		t.Fatalf("second run: %v\n%s", err, out)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "server", "c1.pem"))
	if string(after) != string(before) {
		t.Fatal("second run replaced server/c1's certificate")
	}
}
