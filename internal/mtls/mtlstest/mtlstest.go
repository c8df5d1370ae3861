// Package mtlstest gives tests a throwaway CA issuing role certificates, in
// the shape of net/http/httptest: every package that speaks TLS tests it
// with certificates made the one way (internal/mtls.Tree), and no test
// writes its own copy of that.
package mtlstest

import (
	"sync"
	"testing"

	"github.com/llmgw/llmgw/internal/mtls"
)

// CA is a CA in a test's temporary directory. Each New is a separate CA:
// certificates of one are strangers to another (the "another CA" case).
type CA struct {
	tb   testing.TB
	tree mtls.Tree
	mu   sync.Mutex
	got  map[mtls.Identity]mtls.Files
}

// New makes a CA in tb's temporary directory.
func New(tb testing.TB) *CA {
	tb.Helper()
	c := &CA{tb: tb, tree: mtls.Tree(tb.TempDir()), got: map[mtls.Identity]mtls.Files{}}
	if _, err := c.tree.EnsureCA(); err != nil {
		tb.Fatalf("create CA: %v", err)
	}
	return c
}

// Dir is the CA's tree (DIR/ca, DIR/ROLE/NAME.pem), for a test that runs
// llmgwctl tls against it.
func (c *CA) Dir() string { return string(c.tree) }

// Files are role/name's CA, certificate and key, issued the first time.
func (c *CA) Files(role mtls.Role, name string) mtls.Files {
	c.tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	id := mtls.Identity{Role: role, Name: name}
	if f, ok := c.got[id]; ok {
		return f
	}
	f, err := c.tree.Issue(id, mtls.CertOptions{})
	if err != nil {
		c.tb.Fatalf("certificate for %s: %v", id, err)
	}
	c.got[id] = f
	return f
}

// Renew issues role/name a new certificate over the same files, as an
// operator renewing in place would.
func (c *CA) Renew(role mtls.Role, name string) mtls.Files {
	c.tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	id := mtls.Identity{Role: role, Name: name}
	f, err := c.tree.Issue(id, mtls.CertOptions{})
	if err != nil {
		c.tb.Fatalf("renew %s: %v", id, err)
	}
	c.got[id] = f
	return f
}

// Source loads role/name's files.
func (c *CA) Source(role mtls.Role, name string) *mtls.Source {
	c.tb.Helper()
	s, err := mtls.Load(c.Files(role, name))
	if err != nil {
		c.tb.Fatalf("load %s/%s: %v", role, name, err)
	}
	return s
}

// Flags are the --tls-ca, --tls-cert and --tls-key flags of role/name, for
// a component's command line or llmgwctl's.
func (c *CA) Flags(role mtls.Role, name string) []string {
	c.tb.Helper()
	f := c.Files(role, name)
	return []string{"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}
}
