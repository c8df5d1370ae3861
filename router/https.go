package router

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"
)

// httpsCert is the certificate the OpenAI API is served with over HTTPS
// (--https-cert, --https-key): any web certificate the router's clients
// trust, not the cluster's own CA. It is re-read when either file changes,
// looked at no more than once a second, so a renewed certificate (an ACME
// client writing over the old one) is used by the next handshake with no
// restart. A changed pair that fails to load keeps the last good one: a
// renewal caught half-written must not take the API down.
type httpsCert struct {
	cert, key string
	now       func() time.Time

	mu      sync.Mutex
	checked time.Time
	stamp   [2]time.Time
	pair    *tls.Certificate
}

// loadHTTPSCert reads the pair, failing at start rather than at the first
// client's handshake.
func loadHTTPSCert(cert, key string, now func() time.Time) (*httpsCert, error) {
	h := &httpsCert{cert: cert, key: key, now: now}
	pair, stamp, err := h.read()
	if err != nil {
		return nil, err
	}
	h.pair, h.stamp, h.checked = pair, stamp, now()
	return h, nil
}

func (h *httpsCert) read() (*tls.Certificate, [2]time.Time, error) {
	var stamp [2]time.Time
	for i, p := range []string{h.cert, h.key} {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, stamp, fmt.Errorf("--https-cert/--https-key: %w", err)
		}
		stamp[i] = fi.ModTime()
	}
	pair, err := tls.LoadX509KeyPair(h.cert, h.key)
	if err != nil {
		return nil, stamp, fmt.Errorf("--https-cert %s, --https-key %s: %w", h.cert, h.key, err)
	}
	return &pair, stamp, nil
}

// getCertificate is tls.Config.GetCertificate.
func (h *httpsCert) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if now := h.now(); now.Sub(h.checked) >= time.Second {
		h.checked = now
		changed := false
		for i, p := range []string{h.cert, h.key} {
			if fi, err := os.Stat(p); err == nil && !fi.ModTime().Equal(h.stamp[i]) {
				changed = true
			}
		}
		if changed {
			if pair, stamp, err := h.read(); err == nil {
				h.pair, h.stamp = pair, stamp
			}
		}
	}
	return h.pair, nil
}

// tlsConfig is the API's server TLS configuration: TLS 1.2 and up, as web
// clients expect (the cluster's own connections are TLS 1.3).
func (h *httpsCert) tlsConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: h.getCertificate}
}
