package mtls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/llmgw/llmgw/internal/atomicfile"
)

// File names inside a CA directory and a certificate directory, the shape
// of `consul tls`: D/ca.pem and D/ca-key.pem; OUT/NAME.pem and
// OUT/NAME-key.pem.
const (
	CAFile    = "ca.pem"
	CAKeyFile = "ca-key.pem"
)

// CertFiles are the paths CreateCert writes for name in dir.
func CertFiles(dir, name string) (cert, key string) {
	return filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
}

// CAOptions says how to make a CA.
type CAOptions struct {
	// Validity is how long the CA is valid (default 5 years).
	Validity time.Duration
	// Now is the clock (default time.Now); tests inject one.
	Now func() time.Time
	// Rand is the randomness for keys and serials (default crypto/rand).
	Rand io.Reader
}

// CertOptions says how to make a role certificate.
type CertOptions struct {
	// Validity is how long the certificate is valid (default 1 year).
	Validity time.Duration
	// IPs and DNS are extra SANs, for a server reached by an address other
	// clients check (llmgw's own clients check roles, not addresses, so
	// these are for other tools such as curl against /metrics).
	IPs  []net.IP
	DNS  []string
	Now  func() time.Time
	Rand io.Reader
}

// CreateCA writes a new ECDSA P-256 CA into dir (made 0700 if missing). It
// refuses to overwrite an existing ca.pem or ca-key.pem: replacing a CA by
// accident orphans every certificate it signed.
func CreateCA(dir string, o CAOptions) (certPath string, err error) {
	now, rnd := clock(o.Now), randOf(o.Rand)
	validity := o.Validity
	if validity <= 0 {
		validity = 5 * 365 * 24 * time.Hour
	}
	certPath, keyPath := filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile)
	if err := refuseExisting(certPath, keyPath); err != nil {
		return "", err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rnd)
	if err != nil {
		return "", fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := newSerial(rnd)
	if err != nil {
		return "", err
	}
	t := now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "llmgw CA " + t.UTC().Format("2006-01-02"), Organization: []string{"llmgw"}},
		NotBefore:             t.Add(-time.Minute),
		NotAfter:              t.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rnd, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", fmt.Errorf("create CA certificate: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	if err := writePair(certPath, der, keyPath, key); err != nil {
		return "", err
	}
	return certPath, nil
}

// CreateCert signs a certificate for id with the CA in caDir and writes it
// to outDir as NAME.pem and NAME-key.pem. The certificate is good for both
// server and client authentication, because every llmgw component both
// listens and dials. It replaces an existing pair, atomically per file, so
// that renewing a certificate in place is this one command: components
// re-read their files on the next handshake (Source).
func CreateCert(caDir, outDir string, id Identity, o CertOptions) (certPath, keyPath string, err error) {
	if err := id.Validate(); err != nil {
		return "", "", err
	}
	now, rnd := clock(o.Now), randOf(o.Rand)
	validity := o.Validity
	if validity <= 0 {
		validity = 365 * 24 * time.Hour
	}
	ca, caKey, err := loadCA(caDir)
	if err != nil {
		return "", "", err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rnd)
	if err != nil {
		return "", "", fmt.Errorf("generate key: %w", err)
	}
	serial, err := newSerial(rnd)
	if err != nil {
		return "", "", err
	}
	t := now()
	notAfter := t.Add(validity)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	dns := append([]string{id.Role.DNSName(), id.Name + "." + id.Role.DNSName(), "localhost"}, o.DNS...)
	ips := append([]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, o.IPs...)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: id.Name, OrganizationalUnit: []string{string(id.Role)}, Organization: []string{"llmgw"}},
		NotBefore:    t.Add(-time.Minute),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     dns,
		IPAddresses:  ips,
		URIs:         []*url.URL{id.URI()},
	}
	der, err := x509.CreateCertificate(rnd, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", "", fmt.Errorf("sign certificate: %w", err)
	}
	if err := os.MkdirAll(outDir, 0o700); err != nil {
		return "", "", fmt.Errorf("create %s: %w", outDir, err)
	}
	certPath, keyPath = CertFiles(outDir, id.Name)
	if err := writePair(certPath, der, keyPath, key); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}

func loadCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, nil, fmt.Errorf("read CA: %w (make one with `llmgwctl tls ca create --dir %s`)", err, dir)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("read CA key: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, nil, fmt.Errorf("%s: no CERTIFICATE block", filepath.Join(dir, CAFile))
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA: %w", err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, nil, fmt.Errorf("%s: no PEM block", filepath.Join(dir, CAKeyFile))
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA key: %w", err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, fmt.Errorf("CA key is %T, want ECDSA", k)
	}
	return ca, ek, nil
}

func writePair(certPath string, der []byte, keyPath string, key *ecdsa.PrivateKey) error {
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode key: %w", err)
	}
	// The key first: a reader that sees the new certificate must find its
	// key (Source retries a pair that does not match, so the other order
	// only costs a retry, but this one costs nothing).
	if err := atomicfile.Write(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return err
	}
	return atomicfile.Write(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func refuseExisting(paths ...string) error {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return fmt.Errorf("%s exists; refusing to overwrite a CA (remove it first if that is what you mean)", p)
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("stat %s: %w", p, err)
		}
	}
	return nil
}

func newSerial(rnd io.Reader) (*big.Int, error) {
	s, err := rand.Int(rnd, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial: %w", err)
	}
	return s, nil
}

func clock(now func() time.Time) func() time.Time {
	if now == nil {
		return time.Now
	}
	return now
}

func randOf(r io.Reader) io.Reader {
	if r == nil {
		return rand.Reader
	}
	return r
}
