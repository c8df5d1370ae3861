package integration

import (
	"path/filepath"
	"sync"
	"testing"

	"github.com/llmgw/llmgw/internal/mtls"
)

// testPKI is a CA in a test's temporary directory, issuing role
// certificates on demand (design §11). Tests of TLS and identities share it.
type testPKI struct {
	t   *testing.T
	dir string
	mu  sync.Mutex
	got map[mtls.Identity]mtls.Files
}

// newPKI makes a fresh CA; two calls make two CAs that do not trust each
// other (the "certificate from another CA" case).
func newPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	if _, err := mtls.CreateCA(filepath.Join(dir, "ca"), mtls.CAOptions{}); err != nil {
		t.Fatalf("create CA: %v", err)
	}
	return &testPKI{t: t, dir: dir, got: map[mtls.Identity]mtls.Files{}}
}

// files returns the CA, certificate and key paths for role/name, issuing
// the certificate the first time.
func (p *testPKI) files(role mtls.Role, name string) mtls.Files {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	id := mtls.Identity{Role: role, Name: name}
	if f, ok := p.got[id]; ok {
		return f
	}
	cert, key, err := mtls.CreateCert(filepath.Join(p.dir, "ca"), filepath.Join(p.dir, string(role)), id, mtls.CertOptions{})
	if err != nil {
		p.t.Fatalf("certificate for %s: %v", id, err)
	}
	f := mtls.Files{CA: filepath.Join(p.dir, "ca", mtls.CAFile), Cert: cert, Key: key}
	p.got[id] = f
	return f
}

// flags are the --tls-* flags for role/name, for a component's command line
// or llmgwctl's.
func (p *testPKI) flags(role mtls.Role, name string) []string {
	f := p.files(role, name)
	return []string{"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}
}

// source loads role/name's files, for a test's own gRPC client.
func (p *testPKI) source(role mtls.Role, name string) *mtls.Source {
	p.t.Helper()
	s, err := mtls.Load(p.files(role, name))
	if err != nil {
		p.t.Fatalf("load %s/%s: %v", role, name, err)
	}
	return s
}
