// Package agent is the node agent (design §6): it holds one session with the
// control plane at a time (failing over between control nodes, design §5.6),
// runs the replicas the control plane places on its node through the engine
// drivers and supervisors, and streams what it sees of them back as numbered
// ephemeral updates (design §5.4).
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/llmgw/llmgw/agent/adapters"
	"github.com/llmgw/llmgw/agent/datadir"
	"github.com/llmgw/llmgw/agent/kv"
	"github.com/llmgw/llmgw/agent/load"
	"github.com/llmgw/llmgw/agent/replicas"
	"github.com/llmgw/llmgw/agent/session"
	"github.com/llmgw/llmgw/internal/grpcstop"
	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Agent is one node's agent: the wiring of its parts — the control
// session (package agent/session), the replica set (agent/replicas), the
// KV hub (agent/kv), the adapter manager (agent/adapters), the load reader
// and LoadService (agent/load) — and its HTTP and gRPC listeners. Create
// with New, run with Run (once).
type Agent struct {
	cfg      Config
	log      *slog.Logger
	reg      *prometheus.Registry
	kv       *kv.Hub
	adapters *adapters.Manager
	replicas *replicas.Set
	session  *session.Client
	// tls is the agent's certificate source, nil in plain text.
	tls *mtls.Source
	// conns bounds each listener's connections (listeners.go).
	conns agentListeners

	mu       sync.Mutex
	httpAddr string
	grpcAddr string
}

// New checks cfg and returns an agent, its parts built; it starts nothing
// and writes no file.
func New(cfg Config, logger *slog.Logger) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		return nil, errors.New("agent: nil logger")
	}
	log := logger.With("node", cfg.NodeID)
	src, err := loadTLS(cfg)
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: log, reg: newRegistry(), tls: src}
	a.conns = newAgentListeners(a.reg)
	if a.kv, err = kv.NewHub(log, a.reg); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	acfg := adapters.DefaultConfig()
	acfg.Now = cfg.Now
	if a.adapters, err = adapters.New(acfg, log, a.reg); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if a.replicas, err = replicas.New(cfg.replicasConfig(), a.kv, a.adapters, log, a.reg); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.session, err = session.New(cfg.sessionConfig(src), session.Deps{Node: a.nodeInfo, Book: a.replicas.Book(),
		KV: a.kv, Adapters: a.adapters, Replicas: a.replicas}, log, a.reg)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	return a, nil
}

// loadTLS loads cfg.TLS, nil when it is not given, and refuses a
// certificate that is not this node's agent certificate: a control server
// lets an agent attach only as the node its certificate names (design §11),
// so any other certificate would be refused there on every attempt — better
// said once, at start, naming the flag.
func loadTLS(cfg Config) (*mtls.Source, error) {
	if !cfg.TLS.Enabled() {
		return nil, nil
	}
	src, err := mtls.Load(cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	want := mtls.Identity{Role: mtls.RoleAgent, Name: cfg.NodeID}
	if id := src.Identity(); id != want {
		return nil, fmt.Errorf("agent: --tls-cert %s is the certificate of %s, but this agent is %s (--node-id %s): give it a certificate of role agent named %s",
			cfg.TLS.Cert, id, want, cfg.NodeID, cfg.NodeID)
	}
	return src, nil
}

// HTTPAddr is the address the agent's HTTP server listens on, once Run has
// opened it ("" before).
func (a *Agent) HTTPAddr() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.httpAddr
}

// GRPCAddr is the LoadService address routers are told, once Run has
// opened it: the advertise address with the port bound ("" before).
func (a *Agent) GRPCAddr() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.grpcAddr
}

// Attached reports whether a control node has welcomed the current session.
func (a *Agent) Attached() bool { return a.session.Attached() }

func (a *Agent) nodeInfo() *llmgwv1.Node {
	return &llmgwv1.Node{
		Id:            a.cfg.NodeID,
		Address:       a.cfg.AdvertiseAddr,
		Gpus:          uint32(a.cfg.GPUs),
		Labels:        a.cfg.Labels,
		Version:       a.cfg.Version,
		State:         llmgwv1.NodeState_NODE_STATE_ACTIVE,
		AgentHttpAddr: a.HTTPAddr(),
		AgentGrpcAddr: a.GRPCAddr(),
	}
}

// Run runs the agent until ctx is cancelled and returns once everything it
// started has stopped. At start it re-adopts the engines an earlier agent
// left running (see replicas.Set.Start). Shutdown order: the control session ends first (the
// control node sees the agent leave); then the adapter manager, so no load
// or unload is sent to an engine being stopped or handed over; then the engines are stopped with
// StopEnginesOnExit, or left running for the next agent otherwise, each
// replica's KV listener closing after its engine's supervisor; then the
// load reader, so routers watch stopping engines' readings age into
// "saturated" rather than lose them; then LoadService (its streams are
// ended, then the gRPC server stops); the HTTP server goes last, so
// /metrics and /healthz answer while everything else stops.
func (a *Agent) Run(ctx context.Context) error {
	if err := os.MkdirAll(a.cfg.logDir(), 0o755); err != nil {
		return fmt.Errorf("agent: data dir: %w", err)
	}
	ports, err := datadir.LoadPorts(filepath.Join(a.cfg.DataDir, "ports.json"), a.cfg.PortRange.Start, a.cfg.PortRange.End)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	web, err := a.startHTTP()
	if err != nil {
		return err
	}
	loads, stopLoad, err := a.startLoad()
	if err != nil {
		web.close()
		return err
	}

	a.log.Info("agent running", "http", a.HTTPAddr(), "grpc", a.GRPCAddr(), "control", a.cfg.Control)

	// Before the first session, so its hello lists the adopted engines.
	a.replicas.Start(ctx, ports, loads)

	adaptersCtx, stopAdapters := context.WithCancel(context.Background())
	adaptersDone := make(chan struct{})
	go func() { defer close(adaptersDone); _ = a.adapters.Run(adaptersCtx) }()

	a.session.Run(ctx)

	stopAdapters()
	<-adaptersDone
	a.replicas.Stop(!a.cfg.StopEnginesOnExit)

	stopLoad()

	if err := web.shutdown(); err != nil {
		return fmt.Errorf("agent: http server: %w", err)
	}
	a.log.Info("agent stopped")
	return nil
}

// httpServer is the agent's HTTP listener being served.
type httpServer struct {
	srv  *http.Server
	done chan error
}

// startHTTP opens the HTTP listener and serves handler on it.
func (a *Agent) startHTTP() (*httpServer, error) {
	ln, err := net.Listen("tcp", a.cfg.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("agent: --http-addr: %w", err)
	}
	a.mu.Lock()
	a.httpAddr = ln.Addr().String()
	a.mu.Unlock()
	h := &httpServer{srv: &http.Server{Handler: a.handler(), ReadHeaderTimeout: httpReadHeaderTimeout, ConnState: a.conns.http.ConnState},
		done: make(chan error, 1)}
	go func() { h.done <- h.srv.Serve(a.conns.http.Listen(ln)) }()
	return h, nil
}

// close stops the server at once, for a start that failed.
func (h *httpServer) close() {
	h.srv.Close()
	<-h.done
}

// shutdown stops the server gracefully, within 5 s, and returns what
// ended it, if not the shutdown.
func (h *httpServer) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := h.srv.Shutdown(ctx)
	if serr := <-h.done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

func (a *Agent) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.session.Attached() {
			http.Error(w, "not attached to a control node", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	// The engine's last lines, for `llmgwctl replica logs` (design §6).
	// They may hold prompts (vLLM's request log prints them), and this
	// listener is plain HTTP with no caller identity, so beyond loopback
	// they are served only under --insecure (design §11): /metrics and the
	// probes stay open to scrapers, the engines' output does not.
	mux.HandleFunc("GET /v1/replicas/{id}/logs", func(w http.ResponseWriter, r *http.Request) {
		if !a.cfg.Insecure && !fromLoopback(r) {
			http.Error(w, "engine logs are served to loopback only (they may hold prompts); run the agent with --insecure to serve them to the network", http.StatusForbidden)
			return
		}
		lines, ok := a.replicas.Logs(r.PathValue("id"))
		if !ok {
			http.Error(w, "no such replica on this node", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"replica": r.PathValue("id"), "lines": lines})
	})
	return mux
}

// startLoad opens the gRPC listener, starts the load reader and serves
// LoadService (design §6 "Load snapshots"). It returns the reader, which
// judges draining engines idle, and a func that stops them in order and
// waits: the reader, then every subscriber stream, then the server —
// gracefully, or cut after a grace if a stuck router holds a send.
func (a *Agent) startLoad() (loads *load.Reader, stop func(), err error) {
	ln, err := net.Listen("tcp", a.cfg.GRPCAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("agent: --grpc-addr: %w", err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	a.mu.Lock()
	a.grpcAddr = net.JoinHostPort(a.cfg.AdvertiseAddr, port)
	a.mu.Unlock()
	if host, _, _ := net.SplitHostPort(a.cfg.GRPCAddr); mtls.IsLoopback(host) && !mtls.IsLoopback(a.cfg.AdvertiseAddr) {
		a.log.Warn("LoadService listens on loopback but is advertised to routers on another address",
			"grpc_addr", a.cfg.GRPCAddr, "advertised", a.GRPCAddr())
	}

	lcfg := load.DefaultConfig()
	lcfg.Node = a.cfg.NodeID
	lcfg.Interval = a.cfg.LoadInterval
	lcfg.Now = a.cfg.Now
	// Engines are read directly, never through a proxy, and an external
	// engine through its endpoint guard (design §6 "External engines").
	lt := http.DefaultTransport.(*http.Transport).Clone()
	lt.Proxy, lt.DialContext = nil, a.replicas.DialEngine
	lcfg.Client = &http.Client{Timeout: lcfg.ReadTimeout, Transport: lt}
	reader, err := load.NewReader(lcfg, a.replicas, a.log, a.reg)
	if err != nil {
		ln.Close()
		return nil, nil, fmt.Errorf("agent: %w", err)
	}
	readerCtx, stopReader := context.WithCancel(context.Background())
	readerDone := make(chan struct{})
	go func() { defer close(readerDone); _ = reader.Run(readerCtx) }()

	lsrv := load.NewServer(reader, a.log, a.reg)
	gsrv := grpc.NewServer(append(serverOptions(a.tls, loadCallers), grpc.ConnectionTimeout(loadHandshakeTimeout))...)
	llmgwv1.RegisterLoadServiceServer(gsrv, lsrv)
	grpcDone := make(chan struct{})
	go func() {
		defer close(grpcDone)
		if err := gsrv.Serve(a.conns.load.Listen(ln)); err != nil {
			a.log.Error("LoadService server ended", "err", err)
		}
	}()
	return reader, func() {
		stopReader()
		<-readerDone
		lsrv.Close()
		grpcstop.Stop(gsrv, 5*time.Second)
		<-grpcDone
	}, nil
}

// fromLoopback reports whether r came from a loopback address.
func fromLoopback(r *http.Request) bool { return mtls.IsLoopback(r.RemoteAddr) }
