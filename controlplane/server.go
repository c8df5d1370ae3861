package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/llmgw/llmgw/controlplane/autoscale"
	"github.com/llmgw/llmgw/controlplane/cluster"
	"github.com/llmgw/llmgw/controlplane/console"
	"github.com/llmgw/llmgw/controlplane/ephemeral"
	"github.com/llmgw/llmgw/controlplane/ephemeral/plane"
	"github.com/llmgw/llmgw/controlplane/ephemeral/sessions"
	"github.com/llmgw/llmgw/controlplane/flowview"
	"github.com/llmgw/llmgw/controlplane/gate"
	"github.com/llmgw/llmgw/controlplane/gossip"
	"github.com/llmgw/llmgw/controlplane/identity"
	"github.com/llmgw/llmgw/controlplane/leader"
	"github.com/llmgw/llmgw/controlplane/limits"
	"github.com/llmgw/llmgw/controlplane/logadapt"
	"github.com/llmgw/llmgw/controlplane/service"
	"github.com/llmgw/llmgw/controlplane/service/adapter"
	"github.com/llmgw/llmgw/controlplane/service/admin"
	"github.com/llmgw/llmgw/controlplane/service/agent"
	"github.com/llmgw/llmgw/controlplane/service/flow"
	"github.com/llmgw/llmgw/controlplane/service/quota"
	"github.com/llmgw/llmgw/controlplane/service/server"
	"github.com/llmgw/llmgw/controlplane/service/watch"
	"github.com/llmgw/llmgw/controlplane/store"
	"github.com/llmgw/llmgw/fsm"
	"github.com/llmgw/llmgw/internal/grpcstop"
	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/tracing"
	"github.com/llmgw/llmgw/internal/ttftbuckets"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Server is one control node. Create it with New, run it with Run; it is
// not reusable after Run returns.
type Server struct {
	cfg Config
	log *slog.Logger
	// tracing is the node's tracer provider (tracing.go), set by Run.
	tracing *tracing.Provider
	// started is when New ran: this server's uptime, for ClusterStatus and
	// autopilot's stable times (cluster.Config.Started).
	started  time.Time
	fsm      *fsm.FSM
	eph      *ephemeral.Store
	reg      *prometheus.Registry
	metrics  metrics
	plane    *plane.Plane
	sessions *sessions.Registry
	// tls is this server's certificate and CA (nil: plain text).
	tls     *mtls.Source
	limiter *limits.Limiter
	// flows is the routers' flow-control reports, held while this server
	// leads (design §7.8): emptied when a term starts and ends.
	flows *flowview.Table
	// conns bounds each listener's connections (listeners.go).
	conns serverListeners
	// ident is the cluster's identity as this server knows it (design
	// §5.2 "Cluster identity").
	ident *identity.Identity

	ready chan struct{}
	// fatalCh carries the first fatal error (an unknown command) to Run.
	fatalCh chan error
	serving atomic.Bool

	// Set by Run before anything it starts runs; read-only afterwards.
	store    *store.Store
	gossip   *gossip.Gossip  // nil without --gossip-addr
	keyring  *gossip.Keyring // nil without --gossip-key-file
	members  *cluster.Cluster
	grpcAddr string
	httpAddr string

	// now is the clock of every time-based judgement (node down, drain
	// timeout, tombstones); tests replace it before Run.
	now func() time.Time
	// dropForward, set by tests, loses plane messages to a peer as a
	// network would.
	dropForward func(peer string, msg []byte) bool
	// withoutServerService, set by tests, serves no ServerService, as a
	// server of an older release.
	withoutServerService bool
}

// metrics are the node's per-package metrics, all in one registry.
type metrics struct {
	store  *store.Metrics
	leader *leader.Metrics
	agent  *agent.Metrics
	watch  *watch.Metrics
	plane  *plane.Metrics
	authz  *service.AuthzMetrics
}

// New checks cfg and prepares a server; it opens nothing until Run.
func New(cfg Config, logger *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		return nil, errors.New("controlplane: nil logger")
	}
	src, err := loadTLS(cfg)
	if err != nil {
		return nil, err
	}
	log := logger.With("node", cfg.NodeID)
	ident, err := identity.Open(cfg.DataDir, log)
	if err != nil {
		return nil, err
	}
	s := &Server{
		ident:   ident,
		tls:     src,
		cfg:     cfg,
		log:     log,
		fsm:     fsm.New(fsm.Config{}),
		eph:     ephemeral.NewStore(),
		reg:     prometheus.NewRegistry(),
		ready:   make(chan struct{}),
		fatalCh: make(chan error, 1),
		now:     time.Now,
		started: time.Now(),
	}
	s.metrics = metrics{
		store:  store.NewMetrics(s.reg),
		leader: leader.NewMetrics(s.reg),
		agent:  agent.NewMetrics(s.reg),
		watch:  watch.NewMetrics(s.reg),
		plane:  plane.NewMetrics(s.reg),
		authz:  service.NewAuthzMetrics(s.reg),
	}
	s.plane = plane.New(plane.Config{Self: cfg.NodeID, Tick: cfg.EphemeralTick, Now: s.clock, ChunkBytes: chunkBytes(cfg.Limits)},
		s.eph, planeTransport{s}, s.metrics.plane, s.log.With("subsystem", "ephemeral-plane"))
	s.sessions = sessions.New(s.plane, s.clock, s.reg)
	s.limiter = limits.New(cfg.Limits.limiterConfig(), s.reg)
	s.flows = flowview.New(flowview.Config{Now: s.clock}, s.reg)
	s.conns = newServerListeners(cfg.Limits.Listeners, s.reg)
	return s, nil
}

// loadTLS loads cfg.TLS (nil without it) and checks that the certificate
// is this server's: role server, named as --node-id. The other servers
// verify exactly that before letting it into Raft (design §11), so a
// mismatch would only surface later as a server kept out.
func loadTLS(cfg Config) (*mtls.Source, error) {
	if !cfg.TLS.Enabled() {
		return nil, nil
	}
	src, err := mtls.Load(cfg.TLS)
	if err != nil {
		return nil, err
	}
	want := mtls.Identity{Role: mtls.RoleServer, Name: cfg.NodeID}
	if got := src.Identity(); got != want {
		return nil, fmt.Errorf("--tls-cert %s is the certificate of %s; this server needs one for %s (--node-id %s): make it with llmgwctl tls cert create --role server --name %s",
			cfg.TLS.Cert, got, want, cfg.NodeID, cfg.NodeID)
	}
	return src, nil
}

// clock is s.now, read at each call so tests may replace it before Run.
func (s *Server) clock() time.Time { return s.now() }

// chunkBytes is the chunk budget this node offers its peers (design §5.4
// "Chunks"); the build that plays the previous release in the upgrade test
// offers none, as that release did not assemble chunks.
func chunkBytes(l LimitsConfig) int {
	if asPreviousRelease {
		return 0
	}
	return l.EphemeralChunkBytes
}

// Ready is closed once the node has a leader and serves gRPC and HTTP.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// GRPCAddr and HTTPAddr are the bound addresses (useful with port 0); valid
// once Ready is closed.
func (s *Server) GRPCAddr() string { return s.grpcAddr }
func (s *Server) HTTPAddr() string { return s.httpAddr }

// Run opens the stores, starts Raft, serves gRPC and HTTP and runs the
// leader loops until ctx is done, a fatal error occurs or the server has
// left the cluster. It returns after everything it started has stopped.
// Shutdown order:
//  1. /readyz fails, so load balancers stop sending;
//  2. gRPC: streams are cancelled, then the server stops gracefully (at
//     most 2 s, then hard): agents and routers move to another control
//     node;
//  3. the loops stop and are waited for: the leader's (placement,
//     membership, autopilot), the leadership watch and the observer, the
//     ephemeral plane's senders, the bootstrapper, the --join retries and
//     the minimum-version watch;
//  4. gossip shuts down without a leave: peers see this server dead, not
//     gone, so a restart does not shrink the cluster (a graceful leave is
//     the Leave RPC, which then ends Run);
//  5. Raft shuts down, then its transport and the Bolt store close, then
//     the connections to peers;
//  6. HTTP stops last, so /metrics and /healthz answer until the end.
func (s *Server) Run(ctx context.Context) (err error) {
	tp, err := tracing.New(context.Background(), s.cfg.Tracing, "llmgw-control")
	if err != nil {
		return fmt.Errorf("control: %w", err)
	}
	s.tracing = tp
	defer func() { // after everything: the last calls' spans
		tctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if terr := tp.Shutdown(tctx); terr != nil {
			s.log.Warn("tracing", "err", terr)
		}
	}()
	st, err := store.Open(store.Config{
		NodeID: s.cfg.NodeID, DataDir: s.cfg.DataDir, RaftAddr: s.cfg.RaftAddr,
		Bootstrap: s.cfg.Bootstrap, BootstrapExpect: s.cfg.BootstrapExpect,
		HeartbeatTimeout: s.cfg.HeartbeatTimeout, ElectionTimeout: s.cfg.ElectionTimeout, LeaderLeaseTimeout: s.cfg.LeaderLeaseTimeout,
		ApplyTimeout: s.cfg.ApplyTimeout, Version: s.cfg.Version, ClientAddr: s.clientAddr, TLS: s.tls,
		ClusterID: s.ident.ID, Conns: s.conns.raft,
	}, s.fsm, s.metrics.store, s.log, s.fatal)
	if err != nil {
		return err
	}
	s.store = st
	grpcLis, err := net.Listen("tcp", s.cfg.GRPCAddr)
	if err != nil {
		st.Close()
		return fmt.Errorf("listen --grpc-addr %s: %w", s.cfg.GRPCAddr, err)
	}
	httpLis, err := net.Listen("tcp", s.cfg.HTTPAddr)
	if err != nil {
		grpcLis.Close()
		st.Close()
		return fmt.Errorf("listen --http-addr %s: %w", s.cfg.HTTPAddr, err)
	}
	s.grpcAddr, s.httpAddr = grpcLis.Addr().String(), httpLis.Addr().String()
	// Every listener bounded (design §11 "Limits"): gRPC's handshake by its
	// ConnectionTimeout (grpcServer) and the limiter, HTTP's by
	// ReadHeaderTimeout.
	grpcLis, httpLis = s.conns.grpc.Listen(grpcLis), s.conns.http.Listen(httpLis)
	var g cluster.Gossip // a nil interface without gossip
	if s.cfg.GossipAddr != "" {
		if s.keyring, err = gossip.OpenKeyring(s.cfg.DataDir, s.cfg.GossipKeyFile); err != nil {
			grpcLis.Close()
			httpLis.Close()
			st.Close()
			return err
		}
		// With TLS, gossip's TCP streams (joins, push/pull, reliable
		// sends) need a server certificate too; the keyring encrypts all of
		// it, UDP included (design §11).
		sec := gossip.Security{Keyring: s.keyring, TLS: s.tls, Conns: s.conns.gossip}
		s.gossip = gossip.New(gossip.Meta{
			ID: s.cfg.NodeID, Version: s.cfg.Version, GRPC: s.grpcAddr, Raft: st.RaftAddr(),
			HTTP: s.httpAddr, Expect: s.cfg.BootstrapExpect, Bootstrap: s.cfg.Bootstrap,
		}, s.plane, s.log, s.clock)
		// Before Start, so a server that knows its cluster announces it
		// in its first metadata.
		s.ident.OnAdopt(s.gossip.SetCluster)
		if err := s.gossip.Start(s.cfg.GossipAddr, s.cfg.Gossip, sec); err != nil {
			grpcLis.Close()
			httpLis.Close()
			st.Close()
			return err
		}
		g = s.gossip
	}
	pool := cluster.NewPool(s.tls, s.clientTracing()...)
	var verify cluster.VerifyServer // nil on plain text: gossip is trusted
	if s.tls != nil {
		verify = cluster.VerifyByTLS(s.tls)
	}
	// The gate reads membership's versions, and membership records
	// removals through the gate: the gate comes first, reading the
	// membership set just below.
	gated := gate.New(s.cfg.Version, st, s.fsm, membersVersions{s}, s.log)
	var removals cluster.Proposer = gated
	if asPreviousRelease {
		removals = nil // that release kept removals in gossip only
	}
	s.members = cluster.New(cluster.Config{
		NodeID: s.cfg.NodeID, Version: s.cfg.Version,
		GRPCAddr: s.grpcAddr, HTTPAddr: s.httpAddr, GossipAddr: s.cfg.GossipAddr,
		BootstrapExpect: s.cfg.BootstrapExpect, Bootstrap: s.cfg.Bootstrap, Join: s.cfg.Join, JoinRetryInterval: s.cfg.JoinRetryInterval,
		ServerStabilizationTime: s.cfg.ServerStabilizationTime, CleanupDeadServers: s.cfg.CleanupDeadServers,
		AutopilotInterval: s.cfg.AutopilotInterval, ReconcileInterval: s.cfg.ReconcileInterval,
		HeartbeatTimeout: s.cfg.HeartbeatTimeout, ApplyTimeout: s.cfg.ApplyTimeout, LeaveTimeout: s.cfg.LeaveTimeout,
		Verify: verify, Started: s.started,
	}, st, st.Raw(), g, s.fsm, removals, pool, s.log, s.clock)
	s.registerGauges()
	lead := leader.New(leader.Config{
		ReconcileInterval: s.cfg.ReconcileInterval, NodeDownAfter: s.cfg.NodeDownAfter,
		RescheduleAfter: s.cfg.RescheduleAfter, DrainTimeout: s.cfg.DrainTimeout,
		AdapterMinIdle: s.cfg.AdapterMinIdle, AdapterRetryAfter: s.cfg.AdapterRetryAfter,
		Autoscale: autoscale.Defaults{ScaleDownAfter: s.cfg.AutoscaleScaleDownAfter, Cooldown: s.cfg.AutoscaleCooldown, UpAfter: s.cfg.AutoscaleUpAfter},
		TTFTP90:   ttftbuckets.P90,
	}, gated, s.fsm, s.eph, s.sessions, s.members, s.metrics.leader, s.log, s.clock)

	// streams is cancelled first on shutdown: long-lived streams would hold
	// a graceful stop forever.
	streams, cancelStreams := context.WithCancel(context.Background())
	defer cancelStreams()
	gs := s.grpcServer(streams, gated, lead)
	cons, err := s.newConsole()
	if err != nil {
		grpcLis.Close()
		httpLis.Close()
		st.Close()
		return err
	}
	defer cons.close()
	if s.tls != nil {
		httpLis = console.Split(httpLis, s.tls.ServerConfig()) // HTTPS for the console beside plain /metrics
	}
	hs := &http.Server{Handler: s.httpHandler(cons.Console), ReadHeaderTimeout: httpReadHeaderTimeout,
		ConnState: s.conns.http.ConnState, ErrorLog: logadapt.NewHTTPErrorLog(s.log.With("subsystem", "http"))}

	loops, stopLoops := context.WithCancel(context.Background())
	defer stopLoops()
	var wg sync.WaitGroup
	serveErr := make(chan error, 2)
	wg.Go(func() {
		if err := gs.Serve(grpcLis); err != nil {
			serveErr <- fmt.Errorf("grpc: %w", err)
		}
	})
	var httpWG sync.WaitGroup
	httpWG.Go(func() {
		if err := hs.Serve(httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			serveErr <- fmt.Errorf("http: %w", err)
		}
	})
	s.serving.Store(true)
	wg.Go(func() { st.Observe(loops) })
	wg.Go(func() {
		// Each term: membership and autopilot beside placement; the term
		// ends only after both have stopped.
		st.RunLeadership(loops, func(term context.Context) {
			// The leased shares settle from here; until then, and after
			// the term, Lease answers settling.
			lead.Elected()
			defer lead.Resigned()
			// The routers' flow reports likewise: a new term starts with
			// none, and the routers report again within 250 ms.
			s.flows.Reset()
			defer s.flows.Reset()
			var membership sync.WaitGroup
			defer membership.Wait()
			membership.Go(func() { s.members.WhileLeading(term) })
			membership.Go(func() { lead.Autoscale(term, s.flows) })
			if err := identity.EnsureMinted(term, s.fsm, gated, s.ident, nil); err != nil && term.Err() == nil {
				s.log.Error("the cluster has no id and minting one failed; the next term tries again", "err", err)
			}
			lead.Place(term)
		})
	})
	wg.Go(func() {
		if err := s.ident.Run(loops, s.fsm); err != nil {
			s.fatal(err)
		}
	})
	wg.Go(func() { s.waitReady(loops) })
	wg.Go(func() { s.plane.Run(loops) })
	wg.Go(func() { s.members.Run(loops) })
	wg.Go(func() { cons.routers.Run(loops) })
	s.log.Info("control node running", "grpc_addr", s.grpcAddr, "http_addr", s.httpAddr, "raft_addr", s.cfg.RaftAddr, "gossip_addr", s.cfg.GossipAddr)

	select {
	case <-ctx.Done():
	case <-s.members.Left():
		s.log.Info("stopping: left the cluster")
	case err = <-s.fatalCh:
		s.log.Error("stopping: fatal error", "err", err)
	case err = <-serveErr:
		s.log.Error("stopping: server failed", "err", err)
	}

	s.serving.Store(false)
	cancelStreams()
	grpcstop.Stop(gs, 2*time.Second)
	stopLoops()
	wg.Wait()
	if s.gossip != nil {
		if gerr := s.gossip.Shutdown(); gerr != nil {
			s.log.Error("gossip shutdown", "err", gerr)
		}
	}
	st.Close()
	pool.Close()
	shutCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if herr := hs.Shutdown(shutCtx); herr != nil {
		hs.Close()
	}
	httpWG.Wait()
	s.log.Info("control node stopped")
	return err
}

// grpcServer is the node's gRPC server with its seven services: mutual TLS
// when configured, every call authorized by the caller's certificate
// before anything else (design §11), leader-only unary calls forwarded
// (package service), every stream ended when streams is.
func (s *Server) grpcServer(streams context.Context, gated *gate.Gate, lead *leader.Leader) *grpc.Server {
	fwd := service.NewForwarder(s.cfg.NodeID, s.cfg.RPCHoldTimeout, s.store, s.members)
	// A server certificate counts only for a server of this one's Raft
	// configuration (design §11, membership is the authority).
	authz := service.NewAuthorizer(service.AuthzConfig{
		Enabled: s.tls != nil, Self: s.cfg.NodeID, Members: service.NewConfigMembers(s.store, nil), Metrics: s.metrics.authz,
	}, s.log)
	unary := []grpc.UnaryServerInterceptor{authz.Unary, fwd.Unary}
	if asPreviousRelease {
		unary = append(unary, previousReleaseStatus)
	}
	gs := grpc.NewServer(append(append(s.cfg.Limits.grpcOptions(), s.serverTracing()...),
		grpc.Creds(mtls.ServerCredentials(s.tls)),
		// gRPC's default is 120 s for a connection's TLS handshake and
		// HTTP/2 preface; the listener's limiter closes it at the same
		// time.
		grpc.ConnectionTimeout(s.cfg.Limits.Listeners.HandshakeTimeout),
		grpc.ChainUnaryInterceptor(unary...),
		// Clients detect a dead server by application heartbeats (design
		// §5.6); their gRPC keepalives, if any, must not get them cut off.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainStreamInterceptor(authz.Stream, func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, &ctxStream{ServerStream: ss, ctx: mergeDone(ss.Context(), streams)})
		}, s.limiter.Stream))...)
	llmgwv1.RegisterAgentServiceServer(gs, agent.New(agent.Config{
		Self: s.cfg.NodeID, HeartbeatInterval: s.cfg.HeartbeatInterval, AgentTimeout: s.cfg.AgentTimeout,
		ElectionTimeout: s.cfg.ElectionTimeout, RPCHoldTimeout: s.cfg.RPCHoldTimeout, ApplyTimeout: s.cfg.ApplyTimeout,
		HelloForwardOnly: asPreviousRelease, Bounds: s.cfg.Limits.agentBounds(), ChunkBytes: chunkBytes(s.cfg.Limits),
	}, agent.Deps{
		Propose: gated, State: s.fsm, Raft: s.store, Peers: s.members, Reports: s.eph,
		Plane: s.plane, Sessions: s.sessions, Metrics: s.metrics.agent,
	}, s.log))
	llmgwv1.RegisterWatchServiceServer(gs, watch.New(watch.Config{
		HeartbeatInterval: s.cfg.HeartbeatInterval, WatchWait: s.cfg.WatchWait, WatchQueue: s.cfg.WatchQueue, ChunkBytes: chunkBytes(s.cfg.Limits),
	}, s.fsm, s.eph, s.members, s.metrics.watch, s.log))
	var kr server.Keyring // a nil interface without a keyring
	if s.keyring != nil {
		kr = s.keyring
	}
	serverSvc := server.New(gated, s.log).WithKeyring(s.cfg.NodeID, kr)
	llmgwv1.RegisterAdminServiceServer(gs, admin.New(s.cfg.NodeID, admin.Deps{
		Propose: gated, State: s.fsm, Raft: s.store, Peers: s.members, Membership: s.members,
		Reports: s.eph, Sessions: s.sessions, RestoreMaxBytes: uint64(s.cfg.Limits.SnapshotRestoreMaxBytes), Keyring: serverSvc,
		Started: s.started, Flows: s.flows, Scaling: lead,
	}, s.log))
	llmgwv1.RegisterAdapterServiceServer(gs, adapter.New(s.cfg.AdapterWaitMax, lead, s.log))
	if !asPreviousRelease && !s.withoutServerService {
		llmgwv1.RegisterServerServiceServer(gs, serverSvc)
	}
	if !asPreviousRelease {
		// The previous release had no tenants: its routers never call it.
		llmgwv1.RegisterQuotaServiceServer(gs, quota.New(lead, gated, func() string { return s.fsm.Config().GetMinVersion() }, s.log))
		// Nor flow control: its routers never report.
		llmgwv1.RegisterFlowServiceServer(gs, flow.New(s.flows, s.store, s.log))
	}
	return gs
}

// membersVersions is the gate's view of the servers' versions: the
// membership's, read at each check (the membership is created after the
// gate).
type membersVersions struct{ s *Server }

func (v membersVersions) ConfigVersions() map[string]string { return v.s.members.ConfigVersions() }

func (s *Server) fatal(err error) {
	select {
	case s.fatalCh <- err:
	default:
	}
}

// clientAddr is where clients reach server id (for the store's
// NotLeaderError); nothing before the membership exists.
func (s *Server) clientAddr(id string) (string, bool) {
	if s.members == nil {
		return "", false
	}
	return s.members.ClientAddr(id)
}

// waitReady closes ready once a leader is known and, when that is this
// node, it has applied everything committed before its term.
func (s *Server) waitReady(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !s.store.HasLeader() || (s.store.IsLeader() && !s.store.LeaderReady()) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	close(s.ready)
}

// planeTransport is the ephemeral plane's reach to the other servers:
// gossip's reliable send, or nobody without gossip. It reads s.gossip,
// which Run sets before the plane runs.
type planeTransport struct{ s *Server }

func (t planeTransport) Peers() []string {
	if t.s.gossip == nil {
		return nil
	}
	return t.s.gossip.Peers()
}

func (t planeTransport) Send(peer string, msg []byte) error {
	if t.s.dropForward != nil && t.s.dropForward(peer, msg) {
		return nil // lost, as a network would lose it
	}
	if t.s.gossip == nil {
		return cluster.ErrNoGossip
	}
	return t.s.gossip.Send(peer, msg)
}

// ctxStream replaces a stream's context so Run can end every stream.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c *ctxStream) Context() context.Context { return c.ctx }

// mergeDone returns a context of a that is also cancelled when b is done.
func mergeDone(a, b context.Context) context.Context {
	ctx, cancel := context.WithCancel(a)
	stop := context.AfterFunc(b, cancel)
	context.AfterFunc(ctx, func() { stop(); cancel() })
	return ctx
}
