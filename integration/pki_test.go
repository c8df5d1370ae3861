package integration

import (
	"testing"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
)

// testPKI is a CA in a test's temporary directory, issuing role
// certificates on demand (design §11): mtlstest's, with the names the
// integration tests use. Two newPKI calls make two CAs that do not trust
// each other (the "certificate from another CA" case).
type testPKI struct{ ca *mtlstest.CA }

func newPKI(t *testing.T) *testPKI { return &testPKI{ca: mtlstest.New(t)} }

// files returns the CA, certificate and key paths for role/name, issuing
// the certificate the first time.
func (p *testPKI) files(role mtls.Role, name string) mtls.Files { return p.ca.Files(role, name) }

// flags are the --tls-* flags for role/name, for a component's command line
// or llmgwctl's.
func (p *testPKI) flags(role mtls.Role, name string) []string { return p.ca.Flags(role, name) }

// source loads role/name's files, for a test's own gRPC client.
func (p *testPKI) source(role mtls.Role, name string) *mtls.Source { return p.ca.Source(role, name) }
