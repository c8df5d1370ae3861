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

	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/ephemeral"
	"github.com/llmgw/llmgw/controlplane/plane"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Server is one control node. Create it with New, run it with Run; it is
// not reusable after Run returns.
type Server struct {
	cfg     Config
	log     *slog.Logger
	fsm     *fsm.FSM
	eph     *ephemeral.Store
	metrics *metrics
	// plane forwards the agents' updates this node owns to the other
	// control nodes and applies theirs (plan §5.4). Without gossip it has
	// no peers and only keeps this node's sessions.
	plane *plane.Plane
	// dropForward, set by tests, loses plane messages to a peer as a
	// network would.
	dropForward func(peer string, msg []byte) bool

	ready chan struct{}
	// fatalCh carries the first fatal error (an unknown command) to Run.
	fatalCh chan error

	// Set by Run before ready is closed; read-only afterwards.
	node     *raftNode
	grpcAddr string
	httpAddr string
	serving  atomic.Bool
	// leaderReady is true while this node leads and has passed the
	// Barrier that applies everything committed before its term.
	leaderReady atomic.Bool

	// gossip is nil when --gossip-addr is empty. conns reach the other
	// servers (forwarding, autopilot's checks).
	gossip *gossip
	conns  *connPool
	// bootstrapProblem is why --bootstrap-expect refuses to bootstrap (a
	// mismatched expectation), shown by /readyz; "" when none.
	bootstrapProblem atomic.Value
	// versionProblem is why the cluster refuses this server (its version
	// is below the cluster's minimum, plan §13.3), shown by /readyz.
	versionProblem atomic.Value
	// autopilotState is autopilot's last judgement while this node leads.
	autopilotState atomic.Pointer[autopilot.State]
	// removals tracks autopilot's removals of failed servers while leading.
	removalsMu sync.Mutex
	removals   *sync.WaitGroup
	// leaving is closed by a graceful Leave once this server is out of the
	// cluster: Run then stops, and the process exits (as Consul's does).
	leaving   chan struct{}
	leaveOnce sync.Once
	leaveMu   sync.Mutex // one Leave at a time

	sessionsMu sync.Mutex
	sessions   map[string]int       // node id -> attached sessions
	detachedAt map[string]time.Time // node id -> when its last session ended
	sessionSeq atomic.Uint64

	// adapterMu serializes the leader's adapter placement decisions: the
	// re-read of a placement under it is the single flight that loads each
	// cold adapter once (plan §7.6). placedAt is when this node placed each
	// adapter on a replica, so one just placed counts as recently used.
	adapterMu sync.Mutex
	placedAt  map[adapterKey]time.Time

	// now is the clock of every time-based judgement (node down, drain
	// timeout); tests replace it.
	now func() time.Time
}

// New checks cfg and prepares a server; it opens nothing until Run.
func New(cfg Config, logger *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		return nil, errors.New("controlplane: nil logger")
	}
	s := &Server{
		cfg:        cfg,
		log:        logger.With("node", cfg.NodeID),
		fsm:        fsm.New(fsm.Config{}),
		eph:        ephemeral.NewStore(),
		ready:      make(chan struct{}),
		fatalCh:    make(chan error, 1),
		sessions:   map[string]int{},
		detachedAt: map[string]time.Time{},
		now:        time.Now,
		conns:      newConnPool(),
		leaving:    make(chan struct{}),
		placedAt:   map[adapterKey]time.Time{},
	}
	s.bootstrapProblem.Store("")
	s.versionProblem.Store("")
	s.metrics = newMetrics(s)
	s.plane = plane.New(plane.Config{Self: cfg.NodeID, Tick: cfg.EphemeralTick, Now: func() time.Time { return s.now() }},
		s.eph, (*planeTransport)(s), plane.NewMetrics(s.metrics.reg), s.log.With("subsystem", "ephemeral-plane"))
	return s, nil
}

// Ready is closed once the node has a leader and serves gRPC and HTTP.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// GRPCAddr and HTTPAddr are the bound addresses (useful with port 0); valid
// once Ready is closed.
func (s *Server) GRPCAddr() string { return s.grpcAddr }
func (s *Server) HTTPAddr() string { return s.httpAddr }

// Run opens the stores, starts Raft, serves gRPC and HTTP and runs the
// leader loops until ctx is done or a fatal error occurs. It returns after
// everything it started has stopped. Shutdown order:
//  1. /readyz fails, so load balancers stop sending;
//  2. gRPC: streams are cancelled, then the server stops (agents and
//     routers move to another control node);
//  3. the leader loops (placement, membership, autopilot), the observer,
//     the ephemeral plane's senders, the bootstrapper and the background
//     join stop;
//  4. gossip shuts down without a leave: peers see this server dead, not
//     gone, so a restart does not shrink the cluster (a graceful leave is
//     the Leave RPC, which then ends Run);
//  5. Raft shuts down, then its transport and the Bolt store close, then
//     the connections to peers;
//  6. HTTP stops last, so /metrics and /healthz answer until the end.
func (s *Server) Run(ctx context.Context) (err error) {
	node, err := openRaft(s.cfg, s.fsm, s.log, s.metrics, s.fatal)
	if err != nil {
		return err
	}
	s.node = node
	grpcLis, err := net.Listen("tcp", s.cfg.GRPCAddr)
	if err != nil {
		node.close(s.log)
		return fmt.Errorf("listen --grpc-addr %s: %w", s.cfg.GRPCAddr, err)
	}
	httpLis, err := net.Listen("tcp", s.cfg.HTTPAddr)
	if err != nil {
		grpcLis.Close()
		node.close(s.log)
		return fmt.Errorf("listen --http-addr %s: %w", s.cfg.HTTPAddr, err)
	}
	s.grpcAddr, s.httpAddr = grpcLis.Addr().String(), httpLis.Addr().String()
	if s.cfg.GossipAddr != "" {
		s.gossip = newGossip(serverMeta{
			ID: s.cfg.NodeID, Version: s.cfg.Version, GRPC: s.grpcAddr, Raft: string(node.transport.LocalAddr()),
			HTTP: s.httpAddr, Expect: s.cfg.BootstrapExpect, Bootstrap: s.cfg.Bootstrap,
		}, s.log, s.now)
		s.gossip.plane = s.plane
		if err := s.gossip.start(s.cfg.GossipAddr, s.cfg.Gossip); err != nil {
			grpcLis.Close()
			httpLis.Close()
			node.close(s.log)
			return err
		}
	}

	// streams is cancelled first on shutdown: long-lived streams would hold
	// a graceful stop forever.
	streams, cancelStreams := context.WithCancel(context.Background())
	defer cancelStreams()
	gs := grpc.NewServer(
		grpc.ChainUnaryInterceptor(s.forwardUnary),
		// Clients detect a dead server by application heartbeats (plan
		// §5.6); their gRPC keepalives, if any, must not get them cut off.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, &ctxStream{ServerStream: ss, ctx: mergeDone(ss.Context(), streams)})
		}))
	llmgwv1.RegisterAgentServiceServer(gs, &agentService{s: s})
	llmgwv1.RegisterWatchServiceServer(gs, &watchService{s: s})
	llmgwv1.RegisterAdminServiceServer(gs, &adminService{s: s})
	llmgwv1.RegisterAdapterServiceServer(gs, &adapterService{s: s})
	hs := &http.Server{Handler: s.httpHandler(), ReadHeaderTimeout: 5 * time.Second}

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
	wg.Go(func() { s.observe(loops) })
	wg.Go(func() { s.leaderLoop(loops) })
	wg.Go(func() { s.waitReady(loops) })
	wg.Go(func() { s.plane.Run(loops) })
	if s.gossip != nil && len(s.cfg.Join) > 0 {
		wg.Go(func() { s.gossip.retryJoin(loops, s.cfg.Join, s.cfg.JoinRetryInterval) })
	}
	if s.gossip != nil {
		wg.Go(func() { s.watchMinVersion(loops, time.Second) })
	}
	if s.cfg.BootstrapExpect > 0 && !node.existing {
		wg.Go(func() { s.bootstrapLoop(loops) })
	}
	s.log.Info("control node running", "grpc_addr", s.grpcAddr, "http_addr", s.httpAddr, "raft_addr", s.cfg.RaftAddr, "gossip_addr", s.cfg.GossipAddr)

	select {
	case <-ctx.Done():
	case <-s.leaving:
		s.log.Info("stopping: left the cluster")
	case err = <-s.fatalCh:
		s.log.Error("stopping: fatal error", "err", err)
	case err = <-serveErr:
		s.log.Error("stopping: server failed", "err", err)
	}

	s.serving.Store(false)
	cancelStreams()
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		gs.Stop()
		<-stopped
	}
	stopLoops()
	wg.Wait()
	if s.gossip != nil {
		if gerr := s.gossip.shutdown(); gerr != nil {
			s.log.Error("gossip shutdown", "err", gerr)
		}
	}
	node.close(s.log)
	s.conns.close()
	shutCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if herr := hs.Shutdown(shutCtx); herr != nil {
		hs.Close()
	}
	httpWG.Wait()
	s.log.Info("control node stopped")
	return err
}

func (s *Server) fatal(err error) {
	select {
	case s.fatalCh <- err:
	default:
	}
}

// waitReady closes ready once a leader is known and, when that is this
// node, it has applied everything committed before its term.
func (s *Server) waitReady(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !s.hasLeader() || (s.isLeader() && !s.leaderReady.Load()) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	close(s.ready)
}

// observe counts leader changes from raft's observer.
func (s *Server) observe(ctx context.Context) {
	ch := make(chan raft.Observation, 16)
	obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	s.node.raft.RegisterObserver(obs)
	defer s.node.raft.DeregisterObserver(obs)
	for {
		select {
		case <-ctx.Done():
			return
		case o := <-ch:
			lo := o.Data.(raft.LeaderObservation)
			s.metrics.leaderChanges.Inc()
			s.log.Info("leader changed", "leader", string(lo.LeaderID), "leader_addr", string(lo.LeaderAddr))
		}
	}
}

func (s *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case !s.serving.Load():
			http.Error(w, "not serving gRPC", http.StatusServiceUnavailable)
		case s.versionProblem.Load().(string) != "":
			http.Error(w, "refused by the cluster: "+s.versionProblem.Load().(string), http.StatusServiceUnavailable)
		case s.bootstrapProblem.Load().(string) != "":
			http.Error(w, "bootstrap refused: "+s.bootstrapProblem.Load().(string), http.StatusServiceUnavailable)
		case !s.hasLeader():
			http.Error(w, "no raft leader", http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ready")
		}
	})
	return mux
}

// raftView, for the metrics.
func (s *Server) hasLeader() bool {
	_, id := s.node.raft.LeaderWithID()
	return id != ""
}
func (s *Server) isLeader() bool { return s.node.raft.State() == raft.Leader }
func (s *Server) lastContactSeconds() float64 {
	if s.isLeader() {
		return 0
	}
	lc := s.node.raft.LastContact()
	if lc.IsZero() {
		return 0
	}
	return time.Since(lc).Seconds()
}
func (s *Server) revision() uint64 { return s.fsm.Revision() }

// propose commits one command through Raft on the leader and returns what
// the FSM made of it and the revision it was applied at.
func (s *Server) propose(ctx context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error) {
	if s.node.raft.State() != raft.Leader {
		return nil, 0, s.notLeader()
	}
	if err := s.gate(ctx, t); err != nil {
		return nil, 0, err
	}
	b, err := fsm.NewCommand(t, payload)
	if err != nil {
		return nil, 0, err
	}
	timeout := s.cfg.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	start := time.Now()
	f := s.node.raft.Apply(b, timeout)
	if err := f.Error(); err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrRaftShutdown):
			// Refused before it entered the log: safe to retry elsewhere.
			return nil, 0, s.notLeader()
		case errors.Is(err, raft.ErrLeadershipLost):
			return nil, 0, fmt.Errorf("propose %s: %w", t, errOutcomeUnknown)
		}
		return nil, 0, fmt.Errorf("propose %s: %w", t, err)
	}
	s.metrics.commitSeconds.Observe(time.Since(start).Seconds())
	res, _ := f.Response().(applyResult)
	return res.value, f.Index(), res.err
}

func (s *Server) notLeader() error {
	addr, id := s.node.raft.LeaderWithID()
	e := &NotLeaderError{LeaderID: string(id), LeaderRaftAddr: string(addr)}
	if _, g, ok := s.leaderGRPC(); ok {
		e.LeaderGRPCAddr = g
	}
	return e
}

// servers is the list of control servers in the Raft configuration, with
// the client addresses gossip carries, for clients' failover (plan §5.6).
// Without gossip only this node's client addresses are known.
func (s *Server) servers() []*llmgwv1.ControlServer {
	_, leader := s.node.raft.LeaderWithID()
	self := &llmgwv1.ControlServer{
		Id: s.cfg.NodeID, GrpcAddr: s.grpcAddr, RaftAddr: string(s.node.transport.LocalAddr()),
		GossipAddr: s.cfg.GossipAddr, HttpAddr: s.httpAddr, Version: s.cfg.Version,
		Leader: string(leader) == s.cfg.NodeID,
	}
	if s.gossip != nil {
		self.GossipAddr = s.gossip.addr()
	}
	out := []*llmgwv1.ControlServer{self}
	for _, srv := range s.raftServers() {
		if string(srv.ID) == s.cfg.NodeID {
			self.Voter = srv.Suffrage == raft.Voter
			continue
		}
		cs := &llmgwv1.ControlServer{Id: string(srv.ID), RaftAddr: string(srv.Address), Leader: srv.ID == leader, Voter: srv.Suffrage == raft.Voter}
		if s.gossip != nil {
			if m, ok := s.gossip.memberByID(string(srv.ID)); ok {
				cs.GrpcAddr, cs.HttpAddr, cs.GossipAddr, cs.Version = m.meta.GRPC, m.meta.HTTP, m.gossipAddr, m.meta.Version
			}
		}
		out = append(out, cs)
	}
	return out
}

func (s *Server) sessionStarted(node string) {
	s.sessionsMu.Lock()
	defer s.sessionsMu.Unlock()
	s.sessions[node]++
	delete(s.detachedAt, node)
	s.metrics.agentSessions.Inc()
}

func (s *Server) sessionEnded(node string) {
	s.sessionsMu.Lock()
	defer s.sessionsMu.Unlock()
	if s.sessions[node]--; s.sessions[node] <= 0 {
		delete(s.sessions, node)
		s.detachedAt[node] = s.now()
	}
	s.metrics.agentSessions.Dec()
}

// detachedSince returns when node's last session ended, on this server or
// (as the ephemeral plane announced) on any other; ok is false while one is
// attached anywhere. A node never seen attached has no time.
func (s *Server) detachedSince(node string) (at time.Time, ok bool) {
	live, remoteEnd := s.plane.Live(node)
	s.sessionsMu.Lock()
	defer s.sessionsMu.Unlock()
	if s.sessions[node] > 0 || live {
		return time.Time{}, false
	}
	at = s.detachedAt[node]
	if remoteEnd.After(at) {
		at = remoteEnd
	}
	return at, true
}

// connected is every node with an agent session on any control node.
func (s *Server) connected() map[string]bool {
	remote := s.plane.LiveNodes()
	s.sessionsMu.Lock()
	defer s.sessionsMu.Unlock()
	out := make(map[string]bool, len(s.sessions)+len(remote))
	for n := range s.sessions {
		out[n] = true
	}
	for _, n := range remote {
		out[n] = true
	}
	return out
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
