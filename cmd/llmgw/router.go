package main

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/llmgw/llmgw/router"
)

// newRouterCmd wires `llmgw router`: values come from the defaults, then
// --config's YAML file (keys as the flags, with underscores), then the flags
// given; then Run until SIGINT or SIGTERM.
func newRouterCmd() *cobra.Command {
	cfg := router.DefaultConfig()
	var configFile string
	cmd := &cobra.Command{
		Use:   "router",
		Short: "Serve the OpenAI API, routing each request by its model's scheduling profile: to the replica that holds its prefix unless that one is too busy",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile != "" {
				if err := loadUnderFlags(cmd.Flags(), configFile, &cfg); err != nil {
					return err
				}
			}
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			r, err := router.New(cfg, log)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			return r.Run(ctx)
		},
	}
	bindRouterFlags(cmd.Flags(), &cfg, &configFile)
	return cmd
}

// bindRouterFlags binds the router's flags to cfg and --config to
// configFile. Each flag's key in the configuration file is its name with
// underscores.
func bindRouterFlags(f *pflag.FlagSet, cfg *router.Config, configFile *string) {
	f.StringVar(configFile, "config", "", "YAML configuration file (keys as the flags, with underscores); flags override it")
	f.StringVar(&cfg.ID, "id", cfg.ID, "router id reported to the control plane (default: host name)")
	f.StringSliceVar(&cfg.Control, "control", cfg.Control, "control servers' gRPC addresses, host:port[,...]")
	f.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, "address for the OpenAI API, /healthz and /readyz")
	f.StringVar(&cfg.OpsAddr, "ops-addr", cfg.OpsAddr, "address for the operations port: /metrics, /sd/replicas, /debug/kvindex (and /debug/pprof/ with --pprof); beyond loopback only with TLS, to admin and scraper certificates (off when empty)")
	f.BoolVar(&cfg.Pprof, "pprof", cfg.Pprof, "serve Go profiles (/debug/pprof/) on --ops-addr, to admins")
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory keeping the last state, to route while the control plane is down")
	f.Int64Var(&cfg.GCMinHeap, "gc-min-heap", cfg.GCMinHeap, "heap size in bytes the garbage collector lets the router reach before collecting, however little is live (fewer collections under load; 0: Go's own pacing, GOGC)")
	f.Int64Var(&cfg.MaxBodyBytes, "max-body-bytes", cfg.MaxBodyBytes, "largest request body accepted")
	f.DurationVar(&cfg.ScrapeInterval, "scrape-interval", cfg.ScrapeInterval, "how often each replica's /metrics is read")
	f.DurationVar(&cfg.ConnectTimeout, "connect-timeout", cfg.ConnectTimeout, "timeout for connecting to an engine")
	f.DurationVar(&cfg.FirstByteTimeout, "first-byte-timeout", cfg.FirstByteTimeout, "timeout for an engine's response headers")
	f.DurationVar(&cfg.ReadHeaderTimeout, "read-header-timeout", cfg.ReadHeaderTimeout, "longest wait for a request's headers")
	f.DurationVar(&cfg.BodyTimeout, "body-timeout", cfg.BodyTimeout, "longest wait for a request's whole body (408 past it)")
	f.DurationVar(&cfg.IdleTimeout, "idle-timeout", cfg.IdleTimeout, "how long a kept-alive connection may wait for its next request")
	f.DurationVar(&cfg.ClientWriteTimeout, "client-write-timeout", cfg.ClientWriteTimeout, "longest a write of an answer to a client may block; past it the client counts as gone and its engine request is cancelled (a client that stopped reading a stream)")
	f.StringSliceVar(&cfg.SessionHeaders, "session-headers", cfg.SessionHeaders, "request headers naming a session for session affinity, the first present winning (X-Session-ID, Claude Code's and the Codex CLI's)")
	f.IntVar(&cfg.MaxHeaderBytes, "max-header-bytes", cfg.MaxHeaderBytes, "largest request headers accepted, in bytes (431 beyond)")
	f.IntVar(&cfg.MaxHeaderCount, "max-header-count", cfg.MaxHeaderCount, "most request header fields accepted (431 beyond)")
	f.IntVar(&cfg.MaxConnections, "max-connections", cfg.MaxConnections, "most client connections open at once; past it the oldest idle one is closed to make room, or the new one if none is idle (0: no cap)")
	f.IntVar(&cfg.MaxConnsPerAddr, "max-conns-per-addr", cfg.MaxConnsPerAddr, "most client connections from one IP address (IPv6: /64); past it that address's oldest idle one is closed, or the new one (0: no cap)")
	f.IntVar(&cfg.MaxInflight, "max-inflight", cfg.MaxInflight, "most requests served at once (503 with Retry-After beyond)")
	f.IntVar(&cfg.MaxKeyInflight, "max-key-inflight", cfg.MaxKeyInflight, "most requests one API key (or, without keys, one client address) has in flight, uploads included (429 with Retry-After beyond; 0: no bound)")
	f.DurationVar(&cfg.ShutdownGrace, "shutdown-grace", cfg.ShutdownGrace, "how long in-flight requests may finish after SIGTERM")
	f.DurationVar(&cfg.Tokenize.Budget, "tokenize-budget", cfg.Tokenize.Budget, "how long tier-2 prefix routing may wait for /tokenize before falling back to tier 1")
	f.IntVar(&cfg.KVMinBlocks, "kv-min-blocks", cfg.KVMinBlocks, "fewest leading KV blocks a replica must hold to be preferred by tier 2")
	f.DurationVar(&cfg.AdapterWait, "adapter-wait", cfg.AdapterWait, "how long a request for a cold LoRA adapter waits, in its model's queue, for a slot and the load (503 Retry-After past it)")
	f.StringVar(&cfg.Capture.Path, "capture-path", cfg.Capture.Path, "record a trace of the traffic, without text, to this file for llmgwctl bench --replay (rotated past capture_max_bytes, capture_max_files kept)")
	f.IntVar(&cfg.AdapterQueue, "adapter-queue", cfg.AdapterQueue, "most requests waiting for cold LoRA adapters per model (503 Retry-After past it)")
	f.BoolVar(&cfg.RequireAPIKey, "require-api-key", cfg.RequireAPIKey, "refuse requests without a valid API key even while the cluster has none (keys are required once any exists)")
	// Security (design §11).
	f.StringVar(&cfg.TLS.CA, "tls-ca", cfg.TLS.CA, "CA certificate (PEM); with --tls-cert and --tls-key, the router reaches control servers and agents only over mutual TLS")
	f.StringVar(&cfg.TLS.Cert, "tls-cert", cfg.TLS.Cert, "this router's certificate (PEM), role router; its name is the router's --id")
	f.StringVar(&cfg.TLS.Key, "tls-key", cfg.TLS.Key, "the private key of --tls-cert (PEM)")
	f.BoolVar(&cfg.Insecure, "insecure", cfg.Insecure, "allow --http-addr beyond loopback without TLS (anyone on the network could pose as a control server or agent)")
	f.StringVar(&cfg.HTTPSCert, "https-cert", cfg.HTTPSCert, "serve the API over HTTPS with this certificate (PEM; a web certificate for clients, re-read when renewed)")
	f.StringVar(&cfg.HTTPSKey, "https-key", cfg.HTTPSKey, "the private key of --https-cert (PEM)")
	traceFlags(f, &cfg.Tracing, "a span per request, with its stages, joined by the engines'", "the router starts", "a request's")
	traceTLSFlags(f, &cfg.Tracing)
}
