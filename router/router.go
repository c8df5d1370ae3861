// Package router is llmgw's OpenAI-compatible router (design §7): it follows
// the control plane's watch stream, keeps each model's routable replicas
// and their load, and proxies each request to the replica its model's
// scheduling profile chooses (design §7.3). Routers are
// stateless and many; none waits on the control plane to serve traffic.
package router

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/chunking"
	"github.com/llmgw/llmgw/internal/addrs"
	"github.com/llmgw/llmgw/internal/configfile"
	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/netlimit"
	"github.com/llmgw/llmgw/internal/tracing"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"

	"github.com/llmgw/llmgw/router/api"
	"github.com/llmgw/llmgw/router/auth"
	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/capture"
	"github.com/llmgw/llmgw/router/demand"
	"github.com/llmgw/llmgw/router/director"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/flow"
	"github.com/llmgw/llmgw/router/flowshare"
	"github.com/llmgw/llmgw/router/kvindex"
	"github.com/llmgw/llmgw/router/proxy"
	"github.com/llmgw/llmgw/router/quota"
	"github.com/llmgw/llmgw/router/scheduler"
	"github.com/llmgw/llmgw/router/tokenize"
	"github.com/llmgw/llmgw/router/waitroom"
	"github.com/llmgw/llmgw/router/watch"
)

// Config configures a Router. Start from DefaultConfig. `llmgw router`
// binds its flags to it and decodes --config's YAML file into it: every
// key is a flag's name with underscores (--http-addr is http_addr), and the
// settings without a flag keep their component's prefix (breaker_*,
// scheduler_*, kv_index_*, tokenize_*) at the top level, so one name
// finds a setting whichever way it was given.
type Config struct {
	// ID names the router to the control plane; defaults to the host name.
	ID string `yaml:"id"`
	// Control lists control servers' gRPC addresses (host:port); more are
	// learned from the stream.
	Control []string `yaml:"control"`
	// HTTPAddr is where the OpenAI API, /healthz and /readyz are served:
	// the public port, which serves nothing about other users.
	HTTPAddr string `yaml:"http_addr"`
	// OpsAddr is the operations port (ops.go): /metrics, /sd/replicas,
	// /debug/kvindex and, with Pprof, /debug/pprof/ — what an operator and
	// a monitoring system read, which names keys, engines and (the KV
	// index's hashes) what users' prompts were. Loopback by default, and
	// beyond loopback only with TLS, where each caller needs an admin or
	// scraper certificate. Empty serves none of it.
	OpsAddr string `yaml:"ops_addr"`
	// Pprof serves Go's profiles (/debug/pprof/) on the operations port,
	// to admins only: off by default, since a profile costs CPU to take and
	// shows what the router is doing with users' requests.
	Pprof bool `yaml:"pprof"`
	// GCMinHeap is the heap the garbage collector lets the router grow to
	// before it collects, however little is live (gcTuner): Go's own
	// pacing collects a small heap many times a second under load, which
	// costs CPU. The default is 16 MiB, not more: with a core of its own,
	// a 64 MiB floor cost the router 0.5 ms of p99 in a closed loop
	// against 16 MiB, for no more throughput (docs/benchmarks.md, issue
	// 15). 0 leaves Go's pacing (GOGC) alone.
	GCMinHeap int64 `yaml:"gc_min_heap"`
	// DataDir, when set, keeps the last state so a router restarted while
	// the control plane is down still routes.
	DataDir string `yaml:"data_dir"`
	// MaxBodyBytes bounds request bodies (413 beyond).
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// ScrapeInterval is how often each routable replica's /metrics is read;
	// a reading older than three intervals counts as saturated.
	ScrapeInterval time.Duration `yaml:"scrape_interval"`
	// ConnectTimeout and FirstByteTimeout bound each attempt at an engine.
	ConnectTimeout   time.Duration `yaml:"connect_timeout"`
	FirstByteTimeout time.Duration `yaml:"first_byte_timeout"`
	// ReadHeaderTimeout bounds reading a request's headers; BodyTimeout
	// reading its whole body (nginx's client_body_timeout, 408 past it);
	// IdleTimeout how long a kept-alive connection waits for its next
	// request. They keep slow and idle clients from holding connections.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	BodyTimeout       time.Duration `yaml:"body_timeout"`
	IdleTimeout       time.Duration `yaml:"idle_timeout"`
	// ClientWriteTimeout bounds one write of an answer to a client: a
	// client that stops reading a stream is taken to have gone once a
	// write has blocked this long, and its engine request is cancelled
	// (design §7.1), instead of generating into a connection nobody reads.
	ClientWriteTimeout time.Duration `yaml:"client_write_timeout"`
	// SessionHeaders name the request headers that carry a session's key
	// for session affinity (design §7.5 tier 0), the first present
	// winning: by default X-Session-ID and the coding agents' own
	// (api.DefaultSessionHeaders).
	SessionHeaders []string `yaml:"session_headers"`
	// MaxHeaderBytes and MaxHeaderCount bound a request's headers (431
	// beyond), which are held in memory and forwarded to the engine.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	MaxHeaderCount int `yaml:"max_header_count"`
	// MaxConnections bounds the client connections open at once and
	// MaxConnsPerAddr those from one IP address (an IPv6 /64), so one
	// client cannot hold them all: past either, the oldest idle
	// connection, or one still before its first request, is closed to
	// make room (of that address, for MaxConnsPerAddr), and only when
	// there is none is the new one closed at once (conns.go); 0 is no cap.
	// MaxInflight bounds the requests served at once (503 with Retry-After
	// beyond), so requests being served go on while extra ones are
	// refused; /healthz and /readyz are not counted.
	MaxConnections  int `yaml:"max_connections"`
	MaxConnsPerAddr int `yaml:"max_conns_per_addr"`
	MaxInflight     int `yaml:"max_inflight"`
	// MaxKeyInflight bounds the requests one API key — or, while keys are
	// not required, one client address — has in flight at once, bodies
	// still being uploaded included (429 with Retry-After beyond), so that
	// one caller cannot take all of MaxInflight from the others. 0 is no
	// bound.
	MaxKeyInflight int `yaml:"max_key_inflight"`
	// ShutdownGrace is how long in-flight requests may run after shutdown
	// begins before they are cut.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
	// Breaker configures the per-replica circuit breakers (design §7.4).
	Breaker breaker.Config `yaml:",inline"`
	// Scheduler configures the scheduler's memory (sessions, prefix tree)
	// and its imbalance guard.
	Scheduler scheduler.Config `yaml:",inline"`
	// KVIndex bounds the precise KV index (design §7.5 tier 2).
	KVIndex kvindex.Config `yaml:",inline"`
	// Tokenize configures tier 2's tokenization: its budget and cache.
	Tokenize tokenize.Config `yaml:",inline"`
	// Flow is flow control at saturation (design §7.8): priority classes
	// and fair queueing.
	Flow flow.Config `yaml:"flow"`
	// KVMinBlocks is the fewest leading blocks a replica must hold for
	// tier 2 to prefer it.
	KVMinBlocks int `yaml:"kv_min_blocks"`
	// AdapterWait bounds how long a request for a cold LoRA adapter waits
	// for a replica to report it loaded (design §7.6).
	AdapterWait time.Duration `yaml:"adapter_wait"`
	// AdapterQueue bounds the requests waiting for cold adapters per model;
	// past it they get 503 at once.
	AdapterQueue int `yaml:"adapter_queue"`
	// HoldMaxBytes bounds the bodies the waiting room holds at once, over
	// every model (design §5.7): past it, a request for an autoscaled model
	// with no replica ready gets 503 at once. The count and the time held
	// are each model's (autoscale.max_held, autoscale.hold_timeout_s).
	HoldMaxBytes int64 `yaml:"hold_max_bytes"`
	// Capture records a trace of the traffic, without text, for
	// `llmgwctl bench --replay` (router/capture, design §9); off unless
	// capture_path (--capture-path) is set.
	Capture capture.Config `yaml:",inline"`
	// RequireAPIKey refuses requests without a valid API key even while
	// the cluster has none (design §11); otherwise keys are required once
	// any exists (router/auth).
	RequireAPIKey bool `yaml:"require_api_key"`
	// TLS is the CA, certificate and key (--tls-ca, --tls-cert,
	// --tls-key; design §11). Given, the router watches and calls control
	// servers only over mutual TLS to a server certificate, and subscribes
	// to each agent only over mutual TLS to that node's agent certificate;
	// its own certificate must be of role router. Empty is plain text.
	TLS mtls.Files `yaml:",inline"`
	// Insecure lets --http-addr bind beyond loopback without TLS (see
	// Validate for why that is refused otherwise).
	Insecure bool `yaml:"insecure"`
	// HTTPSCert and HTTPSKey, given, serve the OpenAI API and the
	// router's other endpoints over HTTPS with this pair (a web
	// certificate for the router's clients, not one of the cluster's CA),
	// so that prompts and API keys do not cross the network in clear.
	HTTPSCert string `yaml:"https_cert"`
	HTTPSKey  string `yaml:"https_key"`
	// Tracing sends a span per request, with its stages, to an OTLP
	// receiver (design §9 "Tracing"): --otlp-traces-endpoint,
	// --trace-sampling-ratio, --trace-insecure, --trace-ca. Off by default.
	Tracing tracing.Config `yaml:",inline"`
}

// DefaultConfig returns a router for `llmgw dev`: control on 127.0.0.1:7400,
// the API on 127.0.0.1:8080 and the operations port on 127.0.0.1:7406 —
// loopback, so that the defaults are safe (design §11): serving a network
// is a choice made with --http-addr and TLS or --insecure, and
// --ops-addr and TLS.
func DefaultConfig() Config {
	a, px := api.DefaultConfig(), proxy.DefaultConfig()
	return Config{
		Control:           []string{"127.0.0.1:7400"},
		HTTPAddr:          "127.0.0.1:8080",
		OpsAddr:           DefaultOpsAddr,
		MaxBodyBytes:      a.MaxBodyBytes,
		GCMinHeap:         16 << 20,
		ScrapeInterval:    200 * time.Millisecond,
		ConnectTimeout:    px.ConnectTimeout,
		FirstByteTimeout:  px.FirstByteTimeout,
		ShutdownGrace:     30 * time.Second,
		ReadHeaderTimeout: 10 * time.Second,
		BodyTimeout:       60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		MaxHeaderCount:    100,
		MaxConnections:    4096,
		MaxConnsPerAddr:   256,
		MaxInflight:       1024,
		MaxKeyInflight:    256,
		Breaker:           breaker.DefaultConfig(),
		Scheduler:         scheduler.DefaultConfig(),
		KVIndex:           kvindex.DefaultConfig(),
		Tokenize:          tokenize.DefaultConfig(),
		Flow:              flow.DefaultConfig(),
		KVMinBlocks:       1,
		AdapterWait:       director.DefaultAdapterWait,
		AdapterQueue:      director.DefaultAdapterQueue,
		HoldMaxBytes:      waitroom.DefaultMaxBytes,

		// A client that stopped reading; the agents' session headers (§7.1.1).
		ClientWriteTimeout: px.ClientWriteTimeout,
		SessionHeaders:     api.DefaultSessionHeaders(),
		Tracing:            tracing.DefaultConfig(),
	}
}

// Validate reports every bad field, one line each, named by its flag and
// file key (or by the key alone where there is no flag).
// maxAdapterQueue bounds --adapter-queue: each waiting request holds a
// connection and its body.
const maxAdapterQueue = 100_000

func (c Config) Validate() error {
	var p configfile.Problems
	if len(c.Control) == 0 {
		p.Add(configfile.Flag("control"), "at least one control address is required")
	}
	for _, a := range c.Control {
		if _, _, err := net.SplitHostPort(a); err != nil {
			p.Add(configfile.Flag("control"), "%q: %w", a, err)
		}
	}
	if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
		p.Add(configfile.Flag("http-addr"), "%q: %w", c.HTTPAddr, err)
	} else if !c.TLS.Enabled() && !c.Insecure && !mtls.IsLoopback(c.HTTPAddr) {
		p.Add(configfile.Flag("http-addr"), "%s: refusing to serve beyond loopback without TLS: "+
			"the router would reach control servers and agents in plain text, so anyone on the network could pose as one "+
			"and be sent your users' requests; give --tls-ca, --tls-cert and --tls-key, bind 127.0.0.1, or pass --insecure to accept the risk",
			c.HTTPAddr)
	}
	c.validateOps(&p)
	if c.GCMinHeap < 0 {
		p.Add(configfile.Flag("gc-min-heap"), "must not be negative, got %d", c.GCMinHeap)
	}
	if c.MaxBodyBytes <= 0 {
		p.Add(configfile.Flag("max-body-bytes"), "must be positive, got %d", c.MaxBodyBytes)
	}
	if c.ScrapeInterval <= 0 {
		p.Add(configfile.Flag("scrape-interval"), "must be positive, got %s", c.ScrapeInterval)
	}
	if c.ConnectTimeout <= 0 {
		p.Add(configfile.Flag("connect-timeout"), "must be positive, got %s", c.ConnectTimeout)
	}
	if c.FirstByteTimeout <= 0 {
		p.Add(configfile.Flag("first-byte-timeout"), "must be positive, got %s", c.FirstByteTimeout)
	}
	if c.ShutdownGrace < 0 {
		p.Add(configfile.Flag("shutdown-grace"), "must not be negative, got %s", c.ShutdownGrace)
	}
	if c.KVMinBlocks < 1 {
		p.Add(configfile.Flag("kv-min-blocks"), "must be at least 1, got %d", c.KVMinBlocks)
	}
	if c.AdapterWait <= 0 {
		p.Add(configfile.Flag("adapter-wait"), "must be positive, got %s", c.AdapterWait)
	}
	if c.AdapterQueue <= 0 || c.AdapterQueue > maxAdapterQueue {
		p.Add(configfile.Flag("adapter-queue"), "must be between 1 and %d, got %d", maxAdapterQueue, c.AdapterQueue)
	}
	if c.HoldMaxBytes <= 0 {
		p.Add("hold_max_bytes", "must be positive, got %d", c.HoldMaxBytes)
	}
	c.Capture.WithDefaults().Validate(&p)
	if c.ReadHeaderTimeout <= 0 {
		p.Add(configfile.Flag("read-header-timeout"), "must be positive, got %s", c.ReadHeaderTimeout)
	}
	if c.BodyTimeout <= 0 {
		p.Add(configfile.Flag("body-timeout"), "must be positive, got %s", c.BodyTimeout)
	}
	if c.IdleTimeout <= 0 {
		p.Add(configfile.Flag("idle-timeout"), "must be positive, got %s", c.IdleTimeout)
	}
	if c.ClientWriteTimeout <= 0 {
		p.Add(configfile.Flag("client-write-timeout"), "must be positive, got %s", c.ClientWriteTimeout)
	}
	for _, h := range c.SessionHeaders {
		if !validHeaderName(h) {
			p.Add(configfile.Flag("session-headers"), "%q is not a header name", h)
		}
	}
	if c.MaxHeaderBytes <= 0 {
		p.Add(configfile.Flag("max-header-bytes"), "must be positive, got %d", c.MaxHeaderBytes)
	}
	if c.MaxHeaderCount <= 0 {
		p.Add(configfile.Flag("max-header-count"), "must be positive, got %d", c.MaxHeaderCount)
	}
	c.validateConns(&p)
	if c.MaxInflight <= 0 {
		p.Add(configfile.Flag("max-inflight"), "must be positive, got %d", c.MaxInflight)
	}
	if c.MaxKeyInflight < 0 {
		p.Add(configfile.Flag("max-key-inflight"), "must not be negative (0 is no bound), got %d", c.MaxKeyInflight)
	}
	for _, f := range c.TLS.Missing() {
		p.Add(configfile.Flag(f), "required when any of --tls-ca, --tls-cert, --tls-key is given")
	}
	if c.HTTPSCert != "" && c.HTTPSKey == "" {
		p.Add(configfile.Flag("https-key"), "required with --https-cert")
	}
	if c.HTTPSKey != "" && c.HTTPSCert == "" {
		p.Add(configfile.Flag("https-cert"), "required with --https-key")
	}
	for _, tp := range c.Tracing.Validate() {
		p.Add(configfile.Flag(tp.Flag), "%w", tp.Err)
	}
	// The components name their own keys (and tokenize its flag).
	p.Join(c.Breaker.Validate(), c.Scheduler.Validate(), c.KVIndex.Validate(), c.Tokenize.Validate(), c.Flow.Validate())
	return p.Err()
}

// Router is one router process's worth of components.
type Router struct {
	cfg   Config
	https *httpsCert   // nil: plain HTTP
	tls   *mtls.Source // nil: plain text (the operations port's callers are admins on loopback)
	log   *slog.Logger
	reg   *prometheus.Registry
	// connMetricsV is the listeners' connection metrics (connMetrics).
	connMetricsOnce sync.Once
	connMetricsV    *netlimit.Metrics
	watch           *watch.Client
	eps             *endpoint.Registry
	sched           *scheduler.Scheduler
	breakers        *breaker.Set[scheduler.Key]
	kv              *kvindex.Index
	tok             *tokenize.Client
	dir             *director.Director
	proxy           *proxy.Proxy
	handler         *api.Handler
	control         *controlAdapters
	quota           *quota.Quota
	flow            *flow.Controller
	room            *waitroom.Room
	demand          *demand.Demand
	capture         *capture.Writer // nil: no capture
	share           *flowshare.Share
	mux             *http.ServeMux
	draining        atomic.Bool
	ops             atomic.Pointer[opsServer] // set while --ops-addr is served
	tracing         *tracing.Provider         // off unless --otlp-traces-endpoint
}

// New builds a router; nothing runs until Run.
func New(cfg Config, log *slog.Logger) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	src, err := loadTLS(&cfg)
	if err != nil {
		return nil, err
	}
	var https *httpsCert
	if cfg.HTTPSCert != "" {
		if https, err = loadHTTPSCert(cfg.HTTPSCert, cfg.HTTPSKey, time.Now); err != nil {
			return nil, fmt.Errorf("router: %w", err)
		}
	}
	if cfg.ID == "" {
		host, err := os.Hostname()
		if err != nil {
			host = "router"
		}
		cfg.ID = host
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	r := &Router{cfg: cfg, https: https, tls: src, log: log, reg: reg}
	if r.tracing, err = tracing.New(context.Background(), cfg.Tracing, "llmgw-router"); err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	if err := r.buildTable(src); err != nil {
		return nil, err
	}
	if err := r.buildPipeline(src); err != nil {
		return nil, err
	}
	// The API port serves the API alone; /metrics, /sd/replicas and
	// /debug/... are the operations port's (ops.go) and 404 here.
	r.mux = http.NewServeMux()
	if https != nil {
		r.mux.Handle("/", closeChunked(r.handler)) // framing.go
	} else {
		r.mux.Handle("/", r.handler)
	}
	return r, nil
}

// buildTable builds what the routing table is made of: the KV index and
// the watch client that feeds it the control plane's state, and the
// endpoint registry over them that scrapes each routable replica's load.
func (r *Router) buildTable(src *mtls.Source) error {
	cfg := r.cfg
	wcfg := watch.DefaultConfig()
	wcfg.ClientID = cfg.ID
	wcfg.Addrs = cfg.Control
	// A watch stream's messages may be as large as a server sends (design §11).
	wcfg.DialOptions = append(wcfg.DialOptions, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(chunking.MaxMessageBytes)))
	wcfg.TLS = src
	if cfg.DataDir != "" {
		if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
			return fmt.Errorf("--data-dir: %w", err)
		}
		wcfg.StatePath = filepath.Join(cfg.DataDir, "router-state.bin")
	}
	kv, err := kvindex.New(cfg.KVIndex, r.reg)
	if err != nil {
		return fmt.Errorf("router: kv index: %w", err)
	}
	wcfg.KV = kv
	wc, err := watch.New(wcfg, r.log, r.reg)
	if err != nil {
		return fmt.Errorf("router: watch client: %w", err)
	}

	ecfg := endpoint.DefaultConfig()
	ecfg.ScrapeInterval = cfg.ScrapeInterval
	ecfg.StaleAfter = 3 * cfg.ScrapeInterval
	ecfg.ClientID = cfg.ID
	ecfg.TLS = src
	eps, err := endpoint.New(ecfg, wc, r.log, r.reg)
	if err != nil {
		return fmt.Errorf("router: endpoints: %w", err)
	}
	r.kv, r.watch, r.eps = kv, wc, eps
	return nil
}

// buildPipeline builds the request pipeline over the routing table (design
// §7.3): the scheduler and the breakers, the director over them (tier 2
// through the tokenizer and the KV index, cold adapters through the
// control plane), the proxy, and the HTTP handler that runs the two.
// The router owns each stage and closes it (Serve); the handler only runs
// them.
func (r *Router) buildPipeline(src *mtls.Source) error {
	cfg := r.cfg
	tok, err := tokenize.New(cfg.Tokenize, r.log, r.reg)
	if err != nil {
		return fmt.Errorf("router: tokenize: %w", err)
	}
	sched, err := scheduler.New(cfg.Scheduler, r.log, r.reg)
	if err != nil {
		return fmt.Errorf("router: scheduler: %w", err)
	}
	brs, err := breaker.NewSet(cfg.Breaker, func(k scheduler.Key) string { return k.ID }, r.reg)
	if err != nil {
		return fmt.Errorf("router: breakers: %w", err)
	}
	r.tok, r.sched, r.breakers = tok, sched, brs
	r.control = &controlAdapters{addrs: r.controlAddrs, tls: src, conns: map[string]*grpc.ClientConn{}}

	wc := r.watch
	aliases := func() map[string]*llmgwv1.Alias { return wc.Current().Aliases }
	r.dir = director.New(r.eps, sched, brs, r.reg,
		director.WithAliases(aliases, nil),
		director.WithKV(r.kv, tok, cfg.KVMinBlocks),
		director.WithKVCredit(cfg.KVIndex.Credit),
		director.WithAdapters(r.control, cfg.AdapterWait),
		director.WithAdapterQueue(cfg.AdapterQueue, nil),
		director.WithAdapterUse(r.control, cfg.ID, r.log))
	r.proxy = proxy.New(proxy.Config{ConnectTimeout: cfg.ConnectTimeout, FirstByteTimeout: cfg.FirstByteTimeout,
		MaxAttempts: proxy.DefaultConfig().MaxAttempts, ClientWriteTimeout: cfg.ClientWriteTimeout}, brs, r.reg)
	r.quota = quota.New(quota.Config{Router: cfg.ID}, func() map[string]*llmgwv1.Tenant { return wc.Current().Tenants },
		r.control, r.log, r.reg)
	r.flow, err = flow.New(cfg.Flow, registryLoads{r.eps}, r.log, r.reg, nil)
	if err != nil {
		return fmt.Errorf("router: flow control: %w", err)
	}
	r.room = waitroom.New(waitroom.Config{MaxBytes: cfg.HoldMaxBytes}, r.eps, r.reg)
	r.demand = demand.New(r.eps, r.room, nil)
	if cfg.Capture.Path != "" {
		if r.capture, err = capture.New(cfg.Capture, r.log, captureMetrics(r.reg), nil); err != nil {
			return fmt.Errorf("router: %w", err)
		}
	}
	r.share = flowshare.New(flowshare.Config{Router: cfg.ID, Interval: cfg.Flow.ReportInterval, Flow: cfg.Flow.Enabled},
		r.flow, r.demand, r.control, r.reg, r.log)
	acfg := api.Config{
		Quota:        r.quota,
		Flow:         r.flow,
		Tenants:      func() map[string]*llmgwv1.Tenant { return wc.Current().Tenants },
		MaxBodyBytes: cfg.MaxBodyBytes,
		Ready:        r.ready,
		// The keys of the state the watch client published last: a
		// revocation applies to the next request after it arrives.
		Keys:           func() *auth.Set { return wc.Current().APIKeys },
		RequireKey:     cfg.RequireAPIKey,
		KeysRequired:   func() bool { return wc.Current().Config.GetApiKeysRequired() },
		MaxKeyInflight: cfg.MaxKeyInflight,
		Hold:           r.room,
		Demand:         r.demand,
		Aliases:        aliases,
		SessionHeaders: append([]string{}, cfg.SessionHeaders...), // empty: none
	}
	if r.capture != nil {
		acfg.Capture = r.capture
	}
	if r.tracing.Enabled() {
		acfg.Tracer = r.tracing.TracerProvider()
	}
	r.handler = api.New(acfg, r.eps, r.dir, r.proxy, r.log, r.reg)
	return nil
}

// loadTLS loads cfg.TLS, nil when it is not given. The certificate must be
// a router's, and the router's id is the certificate's name (design §11:
// the identity is the certificate's): an --id naming another router is
// refused rather than reported under a name nobody can verify.
func loadTLS(cfg *Config) (*mtls.Source, error) {
	if !cfg.TLS.Enabled() {
		return nil, nil
	}
	src, err := mtls.Load(cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	id := src.Identity()
	if id.Role != mtls.RoleRouter {
		return nil, fmt.Errorf("router: --tls-cert %s is the certificate of %s; a router needs one of role router", cfg.TLS.Cert, id)
	}
	if cfg.ID == "" {
		cfg.ID = id.Name
	} else if cfg.ID != id.Name {
		return nil, fmt.Errorf("router: --id %s differs from the name in --tls-cert %s (%s): leave --id out, or give it %s", cfg.ID, cfg.TLS.Cert, id, id.Name)
	}
	return src, nil
}

// ready is the router's /readyz: it has a complete desired state to route
// from and is not shutting down.
func (r *Router) ready() bool { return !r.draining.Load() && r.eps.Synced() }

// Handler serves the router's HTTP API; for tests and for embedding.
func (r *Router) Handler() http.Handler { return r.mux }

// Run listens on HTTPAddr and serves until ctx is cancelled; see Serve.
func (r *Router) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", r.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("router: listen %s: %w", r.cfg.HTTPAddr, err)
	}
	return r.Serve(ctx, ln)
}

// Serve runs the router's API on ln, and its operations port on
// --ops-addr, until ctx is cancelled and returns once everything it
// started has stopped. The shutdown order keeps traffic flowing as long
// as possible, and the operations port answering longer still:
//  1. /readyz fails, so load balancers stop sending new requests;
//  2. the HTTP server stops accepting and waits up to ShutdownGrace for
//     in-flight requests (streams included) to finish;
//  3. past the grace, remaining requests are cancelled (which cancels their
//     engine requests) and their connections closed;
//  4. the director's adapter loads and their control-plane connections,
//     and the proxy's idle engine connections;
//  5. only then stop the endpoint scrapers, the watch client (which saves
//     the state a last time) and the forgetter: requests route from them
//     to the end;
//  6. the operations port.
func (r *Router) Serve(ctx context.Context, ln net.Listener) error {
	// Stalled clients' writes block soon enough to be found (unsent.go).
	ln = unsentListener{Listener: ln}
	if r.https == nil {
		// Requests framed two ways are refused below the server (framing.go).
		ln = framingListener{Listener: ln, maxHeader: r.cfg.MaxHeaderBytes}
	}
	var ops *opsServer
	if r.cfg.OpsAddr != "" {
		var err error
		if ops, err = r.startOps(); err != nil {
			_ = ln.Close()
			return err
		}
		r.ops.Store(ops)
	}
	defer ops.stop() // last: /metrics answers until the end
	bgCtx, stopBG := context.WithCancel(context.Background())
	reqCtx, cancelRequests := context.WithCancel(context.Background())
	defer cancelRequests()

	var bg sync.WaitGroup
	bg.Go(func() {
		if err := r.watch.Run(bgCtx); err != nil {
			r.log.Error("router: watch client stopped", "err", err)
		}
	})
	bg.Go(func() {
		if err := r.eps.Run(bgCtx); err != nil {
			r.log.Error("router: endpoint registry stopped", "err", err)
		}
	})

	bg.Go(func() { r.forget(bgCtx) })
	bg.Go(func() { _ = r.flow.Run(bgCtx) })
	bg.Go(func() { _ = r.room.Run(bgCtx) })
	bg.Go(func() { newGCTuner(r.cfg.GCMinHeap).run(bgCtx) })

	// The tenants' shares and usage: stopped after the last request has
	// settled, so its usage is in the last batch, and before the control
	// connections close.
	quotaCtx, stopQuota := context.WithCancel(context.Background())
	quotaDone := make(chan struct{})
	go func() {
		defer close(quotaDone)
		_ = r.quota.Run(quotaCtx)
	}()

	// The routers' queues (design §7.8) and the autoscaled models' demand
	// (§5.7) shared through the leader — with flow control off, only while
	// a model is autoscaled: stopped with the quota loop, before the
	// control connections close.
	shareDone := make(chan struct{})
	go func() {
		defer close(shareDone)
		_ = r.share.Run(quotaCtx)
	}()
	// The capture: stopped with the quota loop, after the last request
	// has recorded itself.
	captureDone := make(chan struct{})
	go func() {
		defer close(captureDone)
		if r.capture != nil {
			if err := r.capture.Run(quotaCtx); err != nil {
				r.log.Error("router: capture stopped", "err", err)
			}
		}
	}()

	var handlers sync.WaitGroup
	lim := newLimits(r.cfg, r.mux)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			handlers.Add(1)
			defer handlers.Done()
			lim.ServeHTTP(w, req)
		}),
		BaseContext:       func(net.Listener) context.Context { return reqCtx },
		ReadHeaderTimeout: r.cfg.ReadHeaderTimeout,
		IdleTimeout:       r.cfg.IdleTimeout,
		MaxHeaderBytes:    r.cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(r.log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	limited := r.limitConns(ln, srv)
	scheme := "http"
	if r.https != nil {
		// ServeTLS sets up HTTP/2 as Serve does for plain text; the TLS
		// handshake is bounded by ReadHeaderTimeout like the headers.
		srv.TLSConfig = r.https.tlsConfig()
		scheme = "https"
		go func() { serveErr <- srv.ServeTLS(limited, "", "") }()
	} else {
		go func() { serveErr <- srv.Serve(limited) }()
	}
	r.log.Info("router: serving", "addr", ln.Addr().String(), "scheme", scheme, "control", r.cfg.Control)

	var err error
	select {
	case <-ctx.Done():
	case err = <-serveErr:
		err = fmt.Errorf("router: serve: %w", err)
	}

	r.draining.Store(true)
	graceCtx, cancelGrace := context.WithTimeout(context.Background(), r.cfg.ShutdownGrace)
	if serr := srv.Shutdown(graceCtx); serr != nil {
		r.log.Warn("router: grace period over; cutting remaining requests", "err", serr)
		cancelRequests()
		_ = srv.Close()
	}
	cancelGrace()
	if err == nil {
		<-serveErr // http.ErrServerClosed
	}
	handlers.Wait()
	stopQuota() // flushes the usage metered last
	<-quotaDone
	<-shareDone
	<-captureDone
	r.dir.Close() // after the requests: it ends the adapter loads they waited on
	r.proxy.Close()
	r.control.close()
	r.tok.Close()

	stopBG()
	bg.Wait()
	// The last requests' spans, sent within a few seconds or lost.
	tctx, cancelT := context.WithTimeout(context.Background(), 5*time.Second)
	if terr := r.tracing.Shutdown(tctx); terr != nil {
		r.log.Warn("router: tracing", "err", terr)
	}
	cancelT()
	r.log.Info("router: stopped")
	return err
}

// forgetEvery is how often per-replica memory is checked against the
// routing table. Memory of a gone replica only costs a missed preference
// until then (the scheduler never picks a non-candidate), so this can be lazy.
const forgetEvery = time.Second

// forget drops the scheduler's memory and the breakers of replicas that are
// no longer routable (design §7.5 "Forget"), until ctx is cancelled.
func (r *Router) forget(ctx context.Context) {
	t := time.NewTicker(forgetEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		live := make(map[scheduler.Key]bool)
		for _, m := range r.eps.Models() {
			eps, _ := r.eps.Lookup(m.GetName())
			for _, e := range eps {
				live[director.Key(e)] = true
			}
		}
		keep := func(k scheduler.Key) bool { return live[k] }
		r.sched.Retain(keep)
		r.breakers.Retain(keep)
		// KV state goes with the placement, not with readiness: an engine
		// briefly unready keeps its cache, and the agent resets the set
		// itself when the engine restarts (design §7.5 step 2).
		st := r.watch.Current()
		r.kv.Retain(func(k kvindex.Replica) bool {
			rep := st.Replicas[k.ID]
			return rep != nil && rep.GetUid() == k.UID
		})
		// Speculative entries past their TTL: lookups skip them already;
		// this frees them and keeps the pending gauge true when idle.
		r.kv.Expire()
		// Per-replica series go with the placement too.
		r.handler.ForgetReplicas(func(id string) bool { return st.Replicas[id] != nil })
	}
}

// controlAddrs lists the control servers to ask: the configured ones,
// then those the watch stream announced.
func (r *Router) controlAddrs() []string {
	var learned []string
	for _, s := range r.watch.Current().Servers {
		learned = append(learned, s.GetGrpcAddr())
	}
	return addrs.Merge(r.cfg.Control, learned)
}

// controlAdapters calls AdapterService.EnsureAdapter on any control
// server (followers forward it to the leader), moving to the next one when
// a server is unreachable. Connections are dialled on first use and kept
// until close.
type controlAdapters struct {
	addrs func() []string
	// tls is the router's certificate source (nil: plain text); the peer
	// must hold a server certificate.
	tls *mtls.Source

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	ring  addrs.Ring
}

func (c *controlAdapters) EnsureAdapter(ctx context.Context, req *llmgwv1.EnsureAdapterRequest) (*llmgwv1.EnsureAdapterResponse, error) {
	list := c.addrs()
	var lastErr error
	for range list {
		conn, addr, err := c.conn(list)
		if err != nil {
			lastErr = err
			continue
		}
		resp, err := llmgwv1.NewAdapterServiceClient(conn).EnsureAdapter(ctx, req)
		if err == nil {
			return resp, nil
		}
		lastErr = fmt.Errorf("ensure adapter %s at %s: %w", req.GetAdapter(), addr, err)
		if ctx.Err() != nil || status.Code(err) != codes.Unavailable {
			return nil, lastErr
		}
	}
	return nil, lastErr
}

// ReportAdapterUse sends the router's adapter use to the next control
// server (followers forward it to the leader); the director sends again
// on failure.
func (c *controlAdapters) ReportAdapterUse(ctx context.Context, req *llmgwv1.AdapterUseReport) (*llmgwv1.AdapterUseReportResponse, error) {
	conn, _, err := c.conn(c.addrs())
	if err != nil {
		return nil, err
	}
	return llmgwv1.NewAdapterServiceClient(conn).ReportAdapterUse(ctx, req)
}

// Lease renews the router's shares of tenants' limits on the next control
// server (followers forward it to the leader).
func (c *controlAdapters) Lease(ctx context.Context, req *llmgwv1.LeaseRequest) (*llmgwv1.LeaseResponse, error) {
	conn, _, err := c.conn(c.addrs())
	if err != nil {
		return nil, err
	}
	return llmgwv1.NewQuotaServiceClient(conn).Lease(ctx, req)
}

// RecordUsage sends a usage batch to the next control server; a batch
// refused as malformed is marked quota.ErrRefused, so it is not sent again.
func (c *controlAdapters) RecordUsage(ctx context.Context, b *llmgwv1.RecordUsageCommand) (*llmgwv1.RecordUsageResponse, error) {
	conn, _, err := c.conn(c.addrs())
	if err != nil {
		return nil, err
	}
	resp, err := llmgwv1.NewQuotaServiceClient(conn).RecordUsage(ctx, b)
	if status.Code(err) == codes.InvalidArgument {
		return nil, fmt.Errorf("%w: %w", quota.ErrRefused, err)
	}
	return resp, err
}

// conn returns a connection to the next address in rotation.
func (c *controlAdapters) conn(list []string) (*grpc.ClientConn, string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	addr := c.ring.Next(list)
	if cc := c.conns[addr]; cc != nil {
		return cc, addr, nil
	}
	cc, err := grpc.NewClient(addr, mtls.DialOption(c.tls, mtls.RoleServer))
	if err != nil {
		return nil, addr, fmt.Errorf("dial %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, addr, nil
}

func (c *controlAdapters) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for addr, cc := range c.conns {
		_ = cc.Close()
		delete(c.conns, addr)
	}
}

// registryLoads is the endpoint registry as flow control reads it.
type registryLoads struct{ eps *endpoint.Registry }

func (l registryLoads) Loads(model string, dst []endpoint.Load) []endpoint.Load {
	eps, _ := l.eps.Lookup(model)
	for _, e := range eps {
		dst = append(dst, l.eps.LoadOf(e))
	}
	return dst
}

// validHeaderName reports whether s is an HTTP field name (RFC 9110 token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
