package router

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmgw/llmgw/internal/configfile"
	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/netlimit"
	"github.com/llmgw/llmgw/router/api"
)

// The operations port (--ops-addr, design §11): what operators and
// monitoring read of a router — /metrics, /sd/replicas, /debug/kvindex
// and, with --pprof, Go's profiles — apart from the OpenAI API, which
// answers 404 for all of them. They do not belong on the public port:
// /metrics names API keys with their usage, /sd/replicas the engines'
// addresses, and the KV index's block hashes tell whoever can hash a
// guess whether another user sent that prompt (an exact guess of a prompt
// matched 3 of 3 blocks, a wrong password in it 2 of 3).
//
// Who may read what:
//   - Without TLS the port must be on loopback, and every caller is an
//     admin: a plain-text deployment has no identities, and loopback is its
//     boundary (the control plane's AdminService is as open there).
//   - With TLS (--tls-ca, --tls-cert, --tls-key) the port speaks mutual TLS
//     under the cluster's CA, on loopback or not, and the certificate's
//     role decides: an admin reads everything; a scraper (Prometheus) and
//     a control server (the web console) read /metrics, /sd/replicas and
//     the index's summary, never a hash; every other role is refused in
//     the handshake.

// DefaultOpsAddr is the operations port's default: loopback, beside the
// control node's 7400-7403 and the agent's 7404-7405.
const DefaultOpsAddr = "127.0.0.1:7406"

// maxOpsConnections bounds the operations port's open connections: its
// callers are a few scrapers and operators, and a flood of them must not
// cost the router more than this many descriptors.
const maxOpsConnections = 64

// access is what a caller of the operations port may read.
type access uint8

const (
	// accessScrape: /metrics, /sd/replicas and the KV index's summary.
	accessScrape access = iota + 1
	// accessAdmin: everything, the KV index's hashes and the profiles too.
	accessAdmin
)

// opsRoles are the certificate roles the operations port's TLS handshake
// accepts; accessOf tells them apart.
var opsRoles = []mtls.Role{mtls.RoleAdmin, mtls.RoleScraper, mtls.RoleServer}

// validateOps checks --ops-addr and --pprof.
func (c Config) validateOps(p *configfile.Problems) {
	if c.OpsAddr == "" {
		if c.Pprof {
			p.Add(configfile.Flag("pprof"), "the profiles are served on the operations port: give --ops-addr too")
		}
		return
	}
	if _, _, err := net.SplitHostPort(c.OpsAddr); err != nil {
		p.Add(configfile.Flag("ops-addr"), "%q: %w", c.OpsAddr, err)
	} else if !c.TLS.Enabled() && !mtls.IsLoopback(c.OpsAddr) {
		// --insecure does not lift this: without TLS there is no caller
		// identity to keep users' prompt hashes and key names to admins.
		p.Add(configfile.Flag("ops-addr"), "%s: the operations port (/metrics, /sd/replicas, /debug/...) is served beyond loopback only over mutual TLS, "+
			"to admin and scraper certificates: it names API keys, engines and what users' prompts hash to; "+
			"give --tls-ca, --tls-cert and --tls-key, or bind 127.0.0.1 (--insecure does not cover it)", c.OpsAddr)
	}
}

// opsServer serves the operations port until stop.
type opsServer struct {
	srv  *http.Server
	ln   net.Listener
	done chan error
}

// startOps listens on the operations port (checked by Config.Validate) and
// serves it until stop.
func (r *Router) startOps() (*opsServer, error) {
	ln, err := net.Listen("tcp", r.cfg.OpsAddr)
	if err != nil {
		return nil, fmt.Errorf("router: --ops-addr %s: %w", r.cfg.OpsAddr, err)
	}
	// Bounded as the API port is (conns.go): a scraper's idle keep-alives
	// make room for the next caller rather than hold the port.
	lim := r.connMetrics().New("ops", netlimit.Config{MaxConns: maxOpsConnections})
	limited := lim.Listen(ln)
	scheme := "http"
	if r.tls != nil {
		// The handshake is bounded by ReadHeaderTimeout, as the headers are.
		limited = tls.NewListener(limited, r.tls.ServerConfig(opsRoles...))
		scheme = "https"
	}
	o := &opsServer{
		srv: &http.Server{
			Handler:           r.opsHandler(),
			ReadHeaderTimeout: r.cfg.ReadHeaderTimeout,
			IdleTimeout:       r.cfg.IdleTimeout,
			MaxHeaderBytes:    r.cfg.MaxHeaderBytes,
			ErrorLog:          slog.NewLogLogger(r.log.Handler(), slog.LevelWarn),
			ConnState:         lim.ConnState,
		},
		ln:   ln,
		done: make(chan error, 1),
	}
	go func() { o.done <- o.srv.Serve(limited) }()
	r.log.Info("router: serving operations", "addr", ln.Addr().String(), "scheme", scheme, "pprof", r.cfg.Pprof)
	return o, nil
}

// stop closes the listener and every connection (a profile being taken
// included) and waits for the server to end. Operations answers are short:
// none is worth holding shutdown for.
func (o *opsServer) stop() {
	if o == nil {
		return
	}
	_ = o.srv.Close()
	if err := <-o.done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		o.srv.ErrorLog.Printf("router: operations server: %v", err)
	}
}

// addr is where the operations port listens.
func (o *opsServer) addr() string { return o.ln.Addr().String() }

// OpsAddr is the operations port's bound address while Serve runs ("" before
// it listens, or without one): for `llmgw dev` and tests that ask for port 0.
func (r *Router) OpsAddr() string {
	if o := r.ops.Load(); o != nil {
		return o.addr()
	}
	return ""
}

// Routable is how many replicas of model the router would send a request
// to now: `llmgw dev` says when its demo model can serve.
func (r *Router) Routable(model string) int {
	eps, _ := r.eps.Lookup(model)
	return len(eps)
}

// opsHandler is the operations port's mux, each page behind the access it
// needs. Unknown paths are 404, as on the API.
func (r *Router) opsHandler() http.Handler {
	mux := http.NewServeMux()
	get := func(path string, need access, h http.HandlerFunc) {
		mux.Handle(path, api.Only(http.MethodGet, r.require(need, h)))
	}
	get("/metrics", accessScrape, promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{}).ServeHTTP)
	get("/sd/replicas", accessScrape, r.serveSD)
	// The summary is a scraper's; ?replica= (hashes) is checked inside.
	get("/debug/kvindex", accessScrape, r.debugKVIndex)
	if r.cfg.Pprof {
		get("/debug/pprof/", accessAdmin, pprof.Index)
		get("/debug/pprof/cmdline", accessAdmin, pprof.Cmdline)
		get("/debug/pprof/profile", accessAdmin, pprof.Profile)
		get("/debug/pprof/symbol", accessAdmin, pprof.Symbol)
		get("/debug/pprof/trace", accessAdmin, pprof.Trace)
	}
	mux.HandleFunc("/", http.NotFound)
	return mux
}

// require serves h to callers with at least need, and answers others 403
// naming the certificate they would need.
func (r *Router) require(need access, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !r.allowed(w, req, need) {
			return
		}
		h(w, req)
	})
}

// allowed reports whether req's caller has need, and answers 403 when not.
func (r *Router) allowed(w http.ResponseWriter, req *http.Request, need access) bool {
	got, who := accessOf(req, r.tls != nil)
	if got >= need {
		return true
	}
	what := "an admin certificate"
	if need == accessScrape {
		what = "an admin or scraper certificate"
	}
	http.Error(w, fmt.Sprintf("%s needs %s of this cluster's CA; the caller is %s", req.URL.Path, what, who), http.StatusForbidden)
	return false
}

// accessOf is what req's caller may read, and who it is for a refusal.
// With TLS the handshake already refused certificates of other CAs and of
// roles outside opsRoles.
func accessOf(req *http.Request, withTLS bool) (access, string) {
	if !withTLS {
		return accessAdmin, "a loopback caller"
	}
	if req.TLS == nil || len(req.TLS.VerifiedChains) == 0 || len(req.TLS.VerifiedChains[0]) == 0 {
		return 0, "unidentified"
	}
	id, err := mtls.IdentityOf(req.TLS.VerifiedChains[0][0])
	if err != nil {
		return 0, "unidentified"
	}
	switch id.Role {
	case mtls.RoleAdmin:
		return accessAdmin, id.String()
	case mtls.RoleScraper, mtls.RoleServer:
		return accessScrape, id.String()
	}
	return 0, id.String()
}
