package mtls

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Tree is a directory of a whole cluster's certificates, laid out as
// `llmgwctl tls init` makes it: DIR/ca/ca.pem and ca-key.pem, and each
// role's certificates in its own folder, DIR/ROLE/NAME.pem and
// NAME-key.pem. One-shot setups (the compose cluster's certs container) and
// the tests of every package that speaks TLS make their certificates
// through it, so the layout is written once.
type Tree string

// CADir is where the CA's files are.
func (t Tree) CADir() string { return filepath.Join(string(t), "ca") }

// Files are the paths of id's CA, certificate and key in the tree, whether
// or not they exist yet.
func (t Tree) Files(id Identity) Files {
	cert, key := CertFiles(filepath.Join(string(t), string(id.Role)), id.Name)
	return Files{CA: filepath.Join(t.CADir(), CAFile), Cert: cert, Key: key}
}

// EnsureCA makes the CA unless the tree has one; created says which.
func (t Tree) EnsureCA() (created bool, err error) {
	if _, err := os.Stat(filepath.Join(t.CADir(), CAFile)); err == nil {
		return false, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("stat CA: %w", err)
	}
	if _, err := CreateCA(t.CADir(), CAOptions{}); err != nil {
		return false, err
	}
	return true, nil
}

// Issue signs a certificate for id with the tree's CA, replacing any pair
// id had (a renewal).
func (t Tree) Issue(id Identity, o CertOptions) (Files, error) {
	if _, _, err := CreateCert(t.CADir(), filepath.Join(string(t), string(id.Role)), id, o); err != nil {
		return Files{}, err
	}
	return t.Files(id), nil
}

// Ensure issues id's certificate unless the tree has one; created says
// which.
func (t Tree) Ensure(id Identity) (f Files, created bool, err error) {
	f = t.Files(id)
	if _, err := os.Stat(f.Cert); err == nil {
		return f, false, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return Files{}, false, fmt.Errorf("stat %s: %w", f.Cert, err)
	}
	if _, err := t.Issue(id, CertOptions{}); err != nil {
		return Files{}, false, err
	}
	return f, true, nil
}
