package mtls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Files are the three paths a component is given (--tls-ca, --tls-cert,
// --tls-key). All three or none: half a TLS setup is a mistake, not a mode.
type Files struct {
	CA   string `yaml:"tls_ca"`
	Cert string `yaml:"tls_cert"`
	Key  string `yaml:"tls_key"`
}

// Enabled reports whether any of the three is set (Validate then demands
// all of them).
func (f Files) Enabled() bool { return f.CA != "" || f.Cert != "" || f.Key != "" }

// Missing lists the flags (tls-ca, tls-cert, tls-key) left empty while
// another is set, for a Validate to report as configfile.Flag(name):
// "required when any of --tls-ca, --tls-cert, --tls-key is given".
func (f Files) Missing() []string {
	if !f.Enabled() {
		return nil
	}
	var m []string
	for _, x := range []struct{ flag, v string }{{"tls-ca", f.CA}, {"tls-cert", f.Cert}, {"tls-key", f.Key}} {
		if x.v == "" {
			m = append(m, x.flag)
		}
	}
	return m
}

// reloadEvery bounds how often a Source looks at its files: a renewed
// certificate is picked up within this long, and a busy listener does not
// stat three files per handshake.
const reloadEvery = time.Second

// Source holds a component's CA pool and key pair, re-read when the files
// change on disk, so that a certificate renewed in place (llmgwctl tls cert
// create over the old files) is used by the next handshake with no restart
// and no dropped connection: existing connections keep their session.
//
// A changed file that fails to load (a pair caught between two writes, a
// bad PEM) keeps the last good material and is tried again on the next
// look: a renewal gone wrong must not take a running component down.
type Source struct {
	files Files
	id    Identity
	now   func() time.Time

	mu      sync.Mutex
	checked time.Time
	stamp   [3]time.Time
	pair    *tls.Certificate
	pool    *x509.CertPool
	lastErr error
}

// Load reads f. It is an error for the certificate not to carry an llmgw
// identity, not to match its key, or not to be signed by the CA: each is
// found at start rather than at the first peer's handshake.
func Load(f Files) (*Source, error) {
	if m := f.Missing(); len(m) > 0 {
		return nil, fmt.Errorf("--%s: required when any of --tls-ca, --tls-cert, --tls-key is given", m[0])
	}
	s := &Source{files: f, now: time.Now}
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

// Identity is the identity in this component's own certificate.
func (s *Source) Identity() Identity {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id
}

func (s *Source) load() error {
	var st [3]time.Time
	for i, p := range []string{s.files.CA, s.files.Cert, s.files.Key} {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		st[i] = fi.ModTime()
	}
	caPEM, err := os.ReadFile(s.files.CA)
	if err != nil {
		return fmt.Errorf("tls: read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("tls: %s holds no PEM certificate", s.files.CA)
	}
	pair, err := tls.LoadX509KeyPair(s.files.Cert, s.files.Key)
	if err != nil {
		return fmt.Errorf("tls: load %s and %s: %w", s.files.Cert, s.files.Key, err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return fmt.Errorf("tls: parse %s: %w", s.files.Cert, err)
		}
	}
	id, err := IdentityOf(leaf)
	if err != nil {
		return fmt.Errorf("tls: %s: %w", s.files.Cert, err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}, CurrentTime: s.now()}); err != nil {
		return fmt.Errorf("tls: %s is not valid under %s: %w", s.files.Cert, s.files.CA, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stamp, s.pair, s.pool, s.id, s.lastErr = st, &pair, pool, id, nil
	if s.checked.IsZero() {
		s.checked = s.now()
	}
	return nil
}

// current returns the pair and pool, re-reading the files at most once per
// reloadEvery when one of them changed.
func (s *Source) current() (*tls.Certificate, *x509.CertPool) {
	s.mu.Lock()
	now := s.now()
	if now.Sub(s.checked) < reloadEvery {
		pair, pool := s.pair, s.pool
		s.mu.Unlock()
		return pair, pool
	}
	s.checked = now
	stamp := s.stamp
	s.mu.Unlock()
	changed := false
	for i, p := range []string{s.files.CA, s.files.Cert, s.files.Key} {
		if fi, err := os.Stat(p); err == nil && !fi.ModTime().Equal(stamp[i]) {
			changed = true
		}
	}
	if changed {
		if err := s.load(); err != nil {
			s.mu.Lock()
			s.lastErr = err
			s.mu.Unlock()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pair, s.pool
}

// LastError is the error of the last failed reload, nil once one succeeds:
// for a health check or a log line, never a reason to stop serving.
func (s *Source) LastError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// ServerConfig is the tls.Config of a listener: TLS 1.3, a client
// certificate signed by the CA required, and, when roles is not empty, the
// client's role among them (the Raft transport accepts only servers). The
// CA pool and key pair are read per handshake from the Source.
func (s *Source) ServerConfig(roles ...Role) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			pair, pool := s.current()
			return &tls.Config{
				MinVersion:       tls.VersionTLS13,
				Certificates:     []tls.Certificate{*pair},
				ClientCAs:        pool,
				ClientAuth:       tls.RequireAndVerifyClientCert,
				VerifyConnection: requireRole(roles),
			}, nil
		},
	}
}

func requireRole(roles []Role) func(tls.ConnectionState) error {
	if len(roles) == 0 {
		return nil
	}
	return func(cs tls.ConnectionState) error {
		if len(cs.VerifiedChains) == 0 {
			return errors.New("no verified client certificate")
		}
		id, err := IdentityOf(cs.VerifiedChains[0][0])
		if err != nil {
			return err
		}
		for _, r := range roles {
			if id.Role == r {
				return nil
			}
		}
		return fmt.Errorf("peer %s is not allowed here: expected role %v", id, roles)
	}
}

// ClientConfig is the tls.Config of a dialer that expects its peer to hold
// role expect: the peer's certificate must chain to the CA and name
// expect.DNSName(), whatever address was dialed. (Go's own verification
// cannot take a pool that changes, so the chain is checked here against the
// Source's current pool, with the same options Go would use.)
func (s *Source) ClientConfig(expect Role) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // verified in VerifyConnection against the live pool
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			pair, _ := s.current()
			return pair, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, pool := s.current()
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: peer sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
				Roots: pool, Intermediates: inter, DNSName: expect.DNSName(),
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			})
			if err != nil {
				return fmt.Errorf("tls: peer is not a %s of this cluster's CA: %w", expect, err)
			}
			return nil
		},
	}
}

// ServerCredentials are the gRPC server credentials of a Source, or
// insecure ones when s is nil (a plain-text deployment): the one switch
// every listener goes through.
func ServerCredentials(s *Source) credentials.TransportCredentials {
	if s == nil {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(s.ServerConfig())
}

// DialOption is the gRPC transport credentials for dialing a peer of role
// expect with s, or plain text when s is nil.
func DialOption(s *Source, expect Role) grpc.DialOption {
	if s == nil {
		return grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(s.ClientConfig(expect)))
}

// CheckListen refuses a plain-text listener beyond loopback (design §11):
// without TLS, anyone who can reach addr may act as any identity. flag is
// the flag that set addr, for the message. insecure is the operator's
// explicit --insecure.
func CheckListen(flag, addr string, s *Source, insecure bool) error {
	if s != nil || insecure || IsLoopback(addr) {
		return nil
	}
	return fmt.Errorf("%s %s: refusing to listen beyond loopback without TLS (anyone who can reach it could act as any server, agent or admin); give --tls-ca, --tls-cert and --tls-key, bind 127.0.0.1, or pass --insecure to accept the risk", flag, addr)
}

// IsLoopback reports whether addr (host:port) binds only loopback. An empty
// host or 0.0.0.0 binds every interface and is not loopback; so is a name,
// which may resolve anywhere, except "localhost".
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
