package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/chunking"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// serverConfig is the servers' config file: the one limit a fleet on one
// loopback address needs raised (every fake agent dials from 127.0.0.1).
const serverConfig = "max_agent_sessions_per_address: 4096\n"

func run(ctx context.Context, cfg config, log *slog.Logger) (*result, error) {
	dir, err := os.MkdirTemp("", "llmgw-fleetsim-")
	if err != nil {
		return nil, err
	}
	if cfg.keep {
		log.Info("processes' data and logs", "dir", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	if cfg.llmgw == "" {
		if cfg.llmgw, err = build(ctx, dir); err != nil {
			return nil, err
		}
	}
	res := &result{Started: time.Now().UTC().Format(time.RFC3339), Config: cfg.public(), LoadBefore: loadAvg()}
	defer func() { res.LoadAfter = loadAvg() }()
	for _, n := range cfg.replicas {
		f, err := runFleet(ctx, cfg, log, filepath.Join(dir, fmt.Sprintf("fleet-%d", n)), n)
		if f != nil {
			res.Fleets = append(res.Fleets, f)
		}
		if err != nil {
			return res, fmt.Errorf("fleet of %d replicas: %w", n, err)
		}
	}
	return res, nil
}

// build builds llmgw from the tree with the pprof overlay (proc.go).
func build(ctx context.Context, dir string) (string, error) {
	overlayFile := filepath.Join(dir, "zz_fleetsim_pprof.go")
	if err := os.WriteFile(overlayFile, []byte(pprofOverlay), 0o644); err != nil {
		return "", err
	}
	target, err := filepath.Abs(filepath.Join("cmd", "llmgw", "zz_fleetsim_pprof.go"))
	if err != nil {
		return "", err
	}
	ov, _ := json.Marshal(map[string]map[string]string{"Replace": {target: overlayFile}})
	ovPath := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ovPath, ov, 0o644); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "llmgw")
	cmd := exec.CommandContext(ctx, "go", "build", "-overlay", ovPath, "-o", bin, "./cmd/llmgw")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build llmgw (run from the repository root, or give --llmgw): %w", err)
	}
	return bin, nil
}

// fleet is one fleet size's processes and clients.
type fleet struct {
	cfg     config
	log     *slog.Logger
	dir     string
	bin     string
	hc      *http.Client
	seen    map[string]bool
	servers []*proc
	grpc    []string // the servers' gRPC addresses
	conns   []*grpc.ClientConn
	admin   []llmgwv1.AdminServiceClient
	routers []*proc
	agents  []*fakeAgent
	// expected is the (block, replica) entries every router's index holds
	// once it has every agent's copy; replicas the replicas placed.
	expected, replicas int
}

func runFleet(ctx context.Context, cfg config, log *slog.Logger, dir string, replicas int) (*fleetResult, error) {
	log = log.With("fleet", replicas)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	fl := &fleet{cfg: cfg, log: log, dir: dir, seen: map[string]bool{},
		hc: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	defer fl.close()
	res := &fleetResult{Replicas: replicas, ReplicasPerAgent: cfg.perAgent, BlocksPerReplica: cfg.blocks, Routers: cfg.routers}
	var err error
	if fl.bin = cfg.llmgw; fl.bin == "" {
		return nil, errors.New("no llmgw binary")
	}
	if err := fl.startServers(); err != nil {
		return res, err
	}
	if err := fl.waitHealthy(ctx); err != nil {
		return res, err
	}
	for range cfg.routers {
		if _, err := fl.addRouter(); err != nil {
			return res, err
		}
	}
	for _, r := range fl.routers {
		if err := fl.waitReady(ctx, r); err != nil {
			return res, err
		}
	}
	if err := sleep(ctx, 2*time.Second); err != nil {
		return res, err
	}
	base, err := fl.settled(ctx)
	if err != nil {
		return res, err
	}

	// The fleet: agents attach, the model is applied, every router fills.
	t0 := time.Now()
	agentCtx, stopAgents := context.WithCancel(ctx)
	var agentsWG sync.WaitGroup
	defer func() { stopAgents(); agentsWG.Wait() }()
	n := (replicas + cfg.perAgent - 1) / cfg.perAgent
	res.Agents = n
	for i := range n {
		a := &fakeAgent{id: fmt.Sprintf("fleet-node-%04d", i), replicas: cfg.perAgent, blocks: cfg.blocks, flush: cfg.flush,
			conn: fl.conns[i%len(fl.conns)], seed: uint64(replicas)<<32 | uint64(i), reps: map[string]*fakeReplica{}}
		fl.agents = append(fl.agents, a)
		agentsWG.Go(func() { a.run(agentCtx) })
	}
	if err := fl.waitFor(ctx, "every fake node registered", func() (bool, string) {
		nodes, err := fl.admin[0].ListNodes(ctx, &llmgwv1.ListRequest{})
		if err != nil {
			return false, err.Error()
		}
		return len(nodes.GetNodes()) >= n, fmt.Sprintf("%d of %d nodes", len(nodes.GetNodes()), n)
	}); err != nil {
		return res, err
	}
	res.RegisterSeconds = time.Since(t0).Seconds()
	model := &llmgwv1.Model{
		Name: "fleet", Engine: "sim", Model: "fleetsim/fake", Replicas: uint32(replicas), GpusPerReplica: 1,
		NodeSelector: map[string]string{fleetLabel: "1"}, KvEvents: true,
	}
	// The leader's watch times placement's commits (commits.go), until the
	// scale steps are done: the KV sweep's updates are not for it.
	li, err := fl.leader(ctx)
	if err != nil {
		return res, err
	}
	commits := &commitLog{}
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan error, 1)
	go func() { watchDone <- commits.follow(watchCtx, llmgwv1.NewWatchServiceClient(fl.conns[li])) }()
	endWatch := func() error {
		stopWatch()
		if err := <-watchDone; !isCanceled(err) {
			return fmt.Errorf("the leader's watch ended: %w", err)
		}
		return nil
	}
	applyStart := time.Now()
	fl.mark(applyStart)
	applied, err := fl.admin[li].ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: model})
	if err != nil {
		_ = endWatch()
		return res, fmt.Errorf("apply model: %w", err)
	}
	if err := fl.waitFor(ctx, "every replica placed and known to every server", func() (bool, string) {
		got := 0
		for _, a := range fl.agents {
			got += int(a.desired.Load())
		}
		if got < replicas {
			return false, fmt.Sprintf("agents hold %d of %d desired replicas", got, replicas)
		}
		for i, c := range fl.admin {
			l, err := c.ListReplicas(ctx, &llmgwv1.ListRequest{})
			if err != nil {
				return false, err.Error()
			}
			if len(l.GetReplicas()) < replicas {
				return false, fmt.Sprintf("server %d lists %d of %d replicas", i+1, len(l.GetReplicas()), replicas)
			}
		}
		return true, ""
	}); err != nil {
		return res, err
	}
	res.PlaceSeconds = time.Since(t0).Seconds()
	if _, last, ok := fl.changedSince(applyStart); ok {
		res.ApplyToPlacedSeconds = last.Sub(applyStart).Seconds()
	}
	if _, last, ok := commits.span(applied.Revision); ok {
		res.ApplyToCommittedSeconds = last.Sub(applyStart).Seconds()
	}
	log.Info("placed", "replicas", replicas, "register_s", res.RegisterSeconds, "apply_to_committed_s", res.ApplyToCommittedSeconds,
		"apply_to_placed_s", res.ApplyToPlacedSeconds)
	if cfg.scaleSteps > 0 {
		steps, err := fl.scale(ctx, li, commits, model, replicas, cfg.scaleSteps, false)
		res.ScaleSteps = steps
		if err == nil && cfg.placeOnly && cfg.scaleRate > 0 {
			// Again with every agent reporting at each flush: the
			// leader's placement loop is woken by reports all along.
			for _, a := range fl.agents {
				a.live.Store(true)
				a.setRate(cfg.scaleRate / float64(len(fl.agents)))
			}
			if err = sleep(ctx, cfg.warmup); err == nil {
				steps, err = fl.scale(ctx, li, commits, model, replicas, cfg.scaleSteps, true)
				res.ScaleSteps = append(res.ScaleSteps, steps...)
			}
			for _, a := range fl.agents {
				a.setRate(0)
			}
		}
		if err != nil {
			_ = endWatch()
			return res, err
		}
	}
	if err := endWatch(); err != nil {
		return res, err
	}
	if cfg.placeOnly {
		return res, nil
	}
	fl.replicas, fl.expected = 0, 0
	for _, a := range fl.agents {
		d := int(a.desired.Load())
		fl.replicas += d
		fl.expected += (d-1)*cfg.blocks + 1 // the probe carrier holds one block
	}
	res.Entries = fl.expected
	t1 := time.Now()
	for _, a := range fl.agents {
		a.live.Store(true)
	}
	for _, r := range fl.routers {
		if err := fl.waitIndex(ctx, r); err != nil {
			return res, err
		}
	}
	res.FirstIndexSeconds = time.Since(t1).Seconds()
	log.Info("fleet up", "agents", n, "replicas", fl.replicas, "entries", fl.expected, "place_s", res.PlaceSeconds, "index_s", res.FirstIndexSeconds)

	// Idle, then the sweep.
	idle, err := fl.point(ctx, 0, fmt.Sprintf("%d-idle", replicas))
	if err != nil {
		return res, err
	}
	res.Idle = idle
	loaded, err := fl.settled(ctx)
	if err != nil {
		return res, err
	}
	res.derive(base, loaded)
	for _, rate := range cfg.rates {
		p, err := fl.point(ctx, rate, fmt.Sprintf("%d-%g", replicas, rate))
		if err != nil {
			return res, err
		}
		p.perKEvents(idle)
		res.Points = append(res.Points, p)
		log.Info("point", "rate", rate, "sent_rate", p.SentRate, "lag_event_p99_ms", p.LagFromEvent.P99, "lag_send_p99_ms", p.LagFromSend.P99,
			"control_cores", p.ControlCores, "router_cores", p.RouterCores, "router_updates_s", p.RouterUpdatesPerSec, "harness_cores", p.HarnessCores,
			"overflows", p.WatchOverflows, "reconnects", p.RouterReconnects, "lost", p.Lost, "entries_ok", p.EntriesOK, "load", p.LoadAvg)
		if p.LagFromEvent.P99 > float64(cfg.lagLimit)/float64(time.Millisecond) {
			break
		}
	}

	// Fan-out: routers added one at a time at a fixed rate, from a plane
	// that has caught up with the sweep's last point.
	if cfg.addRouters > 0 {
		for _, a := range fl.agents {
			a.setRate(0)
		}
		caught := time.Now()
		res.CaughtUp = true
		for _, r := range fl.routers {
			if err := fl.waitIndex(ctx, r); err != nil {
				// Kept as a finding: the index did not heal by itself.
				log.Warn("after the sweep, at rate 0", "err", err)
				res.CaughtUp = false
			}
		}
		// The sets keep their size, so an exact index may still be
		// seconds behind: wait until probes are back under the limit.
		if err := fl.waitFor(ctx, "the lag back under --lag-limit after the sweep", func() (bool, string) {
			samples, _ := (&prober{hc: fl.hc, routers: fl.routerAddrs(), poll: cfg.probePoll, timeout: cfg.probeTimeout,
				interval: cfg.probeInterval, seq: uint64(time.Now().UnixNano()/int64(time.Millisecond)) & (1<<40 - 1)}).window(ctx, fl.agents, 2*time.Second)
			p := newPoint(0, snap{}, snap{}, samples, cfg.probeTimeout)
			return p.Lost == 0 && p.LagFromEvent.P99 <= float64(cfg.lagLimit)/float64(time.Millisecond), fmt.Sprintf("lag p99 %.0f ms", p.LagFromEvent.P99)
		}); err != nil {
			log.Warn("after the sweep, at rate 0", "err", err)
			res.CaughtUp = false
		}
		res.CatchUpSeconds = time.Since(caught).Seconds()
		before, err := fl.point(ctx, cfg.fanoutRate, fmt.Sprintf("%d-fanout-%d", replicas, len(fl.routers)))
		if err != nil {
			return res, err
		}
		var rc []float64
		for _, r := range before.Routers {
			rc = append(rc, r.Cores)
		}
		res.Fanout = append(res.Fanout, fanoutStep{Routers: len(fl.routers), ControlCores: before.ControlCores, LagFromEvent: before.LagFromEvent,
			RouterLagP99: before.RouterLagP99, RouterCores: rc})
		for range cfg.addRouters {
			r, err := fl.addRouter()
			if err != nil {
				return res, err
			}
			start := time.Now()
			if err := fl.waitReady(ctx, r); err != nil {
				return res, err
			}
			ready := time.Since(start)
			if err := fl.waitIndex(ctx, r); err != nil {
				return res, err
			}
			full := time.Since(start)
			p, err := fl.point(ctx, cfg.fanoutRate, fmt.Sprintf("%d-fanout-%d", replicas, len(fl.routers)))
			if err != nil {
				return res, err
			}
			u := p.Routers[len(p.Routers)-1]
			var rc []float64
			for _, r := range p.Routers {
				rc = append(rc, r.Cores)
			}
			res.Fanout = append(res.Fanout, fanoutStep{Routers: len(fl.routers), ControlCores: p.ControlCores, LagFromEvent: p.LagFromEvent,
				DeltaCores:   p.ControlCores - res.Fanout[len(res.Fanout)-1].ControlCores,
				RouterLagP99: p.RouterLagP99, RouterCores: rc,
				ReadySeconds: ready.Seconds(), FullCopySeconds: full.Seconds(), NewRouterRSSMB: u.RSSMB, NewRouterHeapMB: u.HeapMB})
			log.Info("router added", "routers", len(fl.routers), "full_copy_s", full.Seconds(), "control_cores", p.ControlCores)
		}
	}
	return res, nil
}

// mark starts a step at the agents: their firstAt and lastAt then tell
// when the step changed their desired sets.
func (fl *fleet) mark(at time.Time) {
	for _, a := range fl.agents {
		a.markAt.Store(at.UnixNano())
	}
}

// changedSince is the first and the last change of any agent's desired
// set since the mark at since; ok is false when none changed.
func (fl *fleet) changedSince(since time.Time) (first, last time.Time, ok bool) {
	for _, a := range fl.agents {
		f, l := a.firstAt.Load(), a.lastAt.Load()
		if f < since.UnixNano() {
			continue
		}
		if !ok || f < first.UnixNano() {
			first = time.Unix(0, f)
		}
		if !ok || l > last.UnixNano() {
			last = time.Unix(0, l)
		}
		ok = true
	}
	return first, last, ok
}

// scale applies the model steps times at one replica fewer and back at n,
// timing each step at the leader and the agents (scaleStep). A drained
// replica is removed once its agent reports it stopped, at once when the
// agents are not live (nothing reported: nothing runs), at the agent's
// next flush when they are.
func (fl *fleet) scale(ctx context.Context, leader int, commits *commitLog, m *llmgwv1.Model, n, steps int, live bool) ([]scaleStep, error) {
	var out []scaleStep
	for range steps {
		for _, to := range []int{n - 1, n} {
			kind := "up"
			if to < n {
				kind = "down"
			}
			start := time.Now()
			fl.mark(start)
			m.Replicas = uint32(to)
			res, err := fl.admin[leader].ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: m})
			if err != nil {
				return out, fmt.Errorf("scale %s to %d: apply model: %w", kind, to, err)
			}
			applied := time.Since(start)
			if err := fl.waitFor(ctx, fmt.Sprintf("scale %s to %d replicas", kind, to), func() (bool, string) {
				got, draining := 0, 0
				for _, a := range fl.agents {
					got += int(a.desired.Load())
					draining += int(a.draining.Load())
				}
				return got == to && draining == 0, fmt.Sprintf("agents hold %d desired replicas (%d draining), want %d", got, draining, to)
			}); err != nil {
				return out, err
			}
			first, last, _ := fl.changedSince(start)
			st := scaleStep{Kind: kind, Live: live, ApplyMs: msSince(start, start.Add(applied)), FirstMs: msSince(start, first), DoneMs: msSince(start, last)}
			if c1, c2, ok := commits.span(res.Revision); ok {
				st.CommitFirstMs, st.CommitDoneMs = msSince(start, c1), msSince(start, c2)
			}
			out = append(out, st)
			fl.log.Info("scale step", "kind", kind, "live", live, "replicas", to, "apply_ms", st.ApplyMs, "commit_first_ms", st.CommitFirstMs,
				"commit_done_ms", st.CommitDoneMs, "agent_first_ms", st.FirstMs, "agent_done_ms", st.DoneMs)
		}
	}
	return out, nil
}

func isCanceled(err error) bool {
	return errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled
}

func msSince(from, to time.Time) float64 { return math.Round(to.Sub(from).Seconds()*1e4) / 10 }

// startServers starts the 3 control servers.
func (fl *fleet) startServers() error {
	cfgFile := filepath.Join(fl.dir, "control.yaml")
	if err := os.WriteFile(cfgFile, []byte(serverConfig), 0o644); err != nil {
		return err
	}
	const n = 3
	addrs := make([][]string, n)
	for i := range addrs {
		a, err := fl.cfg.ports.free(5, fl.seen)
		if err != nil {
			return err
		}
		addrs[i] = a
	}
	hb := fl.cfg.heartbeatTimeout.String()
	for i := range n {
		var join []string
		for j := range n {
			if j != i {
				join = append(join, addrs[j][2])
			}
		}
		id := fmt.Sprintf("c%d", i+1)
		p := &proc{name: id, httpAddr: addrs[i][3], opsAddr: addrs[i][3], pprofAddr: addrs[i][4], logPath: filepath.Join(fl.dir, id+".log"),
			args: []string{"control", "--config", cfgFile, "--node-id", id, "--data-dir", filepath.Join(fl.dir, id),
				"--grpc-addr", addrs[i][0], "--raft-addr", addrs[i][1], "--gossip-addr", addrs[i][2], "--http-addr", addrs[i][3],
				"--bootstrap-expect", strconv.Itoa(n), "--join", strings.Join(join, ","),
				"--heartbeat-timeout", hb, "--election-timeout", hb}}
		conn, err := grpc.NewClient(addrs[i][0], grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(chunking.MaxMessageBytes)))
		if err != nil {
			return err
		}
		fl.servers = append(fl.servers, p)
		fl.grpc = append(fl.grpc, addrs[i][0])
		fl.conns = append(fl.conns, conn)
		fl.admin = append(fl.admin, llmgwv1.NewAdminServiceClient(conn))
		if err := p.start(fl.bin); err != nil {
			return err
		}
	}
	return nil
}

// addRouter starts one more router; router i lists the servers from
// server i on, so the watch streams spread over them.
func (fl *fleet) addRouter() (*proc, error) {
	a, err := fl.cfg.ports.free(3, fl.seen)
	if err != nil {
		return nil, err
	}
	i := len(fl.routers)
	ctl := append(slices.Clone(fl.grpc[i%len(fl.grpc):]), fl.grpc[:i%len(fl.grpc)]...)
	id := fmt.Sprintf("r%d", i+1)
	p := &proc{name: id, httpAddr: a[0], opsAddr: a[2], pprofAddr: a[1], logPath: filepath.Join(fl.dir, id+".log"),
		args: []string{"router", "--id", id, "--control", strings.Join(ctl, ","), "--http-addr", a[0], "--ops-addr", a[2],
			"--data-dir", filepath.Join(fl.dir, id), "--scrape-interval", "1h"}}
	fl.routers = append(fl.routers, p)
	return p, p.start(fl.bin)
}

func (fl *fleet) close() {
	for _, r := range fl.routers {
		r.stop()
	}
	for _, s := range fl.servers {
		s.stop()
	}
	for _, c := range fl.conns {
		c.Close()
	}
	fl.hc.CloseIdleConnections()
}

// waitFor polls cond every 100 ms until it holds, a process dies or the
// setup timeout passes; the error says what did not happen and why.
func (fl *fleet) waitFor(ctx context.Context, what string, cond func() (bool, string)) error {
	deadline := time.Now().Add(fl.cfg.setupTimeout)
	for {
		ok, why := cond()
		if ok {
			return nil
		}
		for _, p := range append(slices.Clone(fl.servers), fl.routers...) {
			if dead, err := p.exited(); dead {
				if err == nil {
					err = errors.New("exit status 0")
				}
				return fmt.Errorf("%s: %s exited (%w); its log is %s (--keep keeps it)", what, p.name, err, p.logPath)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s: %s", what, fl.cfg.setupTimeout, why)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

func (fl *fleet) waitHealthy(ctx context.Context) error {
	return fl.waitFor(ctx, "a healthy 3-server cluster", func() (bool, string) {
		leader := ""
		for i, c := range fl.admin {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := c.ClusterStatus(cctx, &llmgwv1.ClusterStatusRequest{})
			cancel()
			if err != nil {
				return false, fmt.Sprintf("c%d: %v", i+1, err)
			}
			if st.Leader == "" || (leader != "" && st.Leader != leader) {
				return false, fmt.Sprintf("c%d: leader %q", i+1, st.Leader)
			}
			leader = st.Leader
			if st.Voters != int32(len(fl.admin)) {
				return false, fmt.Sprintf("c%d: %d voters", i+1, st.Voters)
			}
		}
		return true, ""
	})
}

func (fl *fleet) waitReady(ctx context.Context, r *proc) error {
	return fl.waitFor(ctx, r.name+" ready", func() (bool, string) {
		resp, err := fl.hc.Get("http://" + r.httpAddr + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, "readyz " + resp.Status
	})
}

// waitIndex waits until router r's index holds every replica and exactly
// the fleet's entries.
func (fl *fleet) waitIndex(ctx context.Context, r *proc) error {
	return fl.waitFor(ctx, r.name+"'s index full", func() (bool, string) {
		m, err := scrape(ctx, fl.hc, r.opsAddr, []string{"llmgw_router_kvindex_entries", "llmgw_router_kvindex_replicas"})
		if err != nil {
			return false, err.Error()
		}
		e, n := int(m["llmgw_router_kvindex_entries"]), int(m["llmgw_router_kvindex_replicas"])
		return e == fl.expected && n == fl.replicas, fmt.Sprintf("%d of %d entries, %d of %d replicas", e, fl.expected, n, fl.replicas)
	})
}

// snap is every process's usage at one moment, and the harness's own CPU.
type snap struct {
	servers, routers []usage
	self             time.Duration
	events           int64
	sessions         int64
	at               time.Time
}

func (fl *fleet) snapshot(ctx context.Context) (snap, error) {
	s := snap{at: time.Now()}
	for _, p := range fl.servers {
		u, err := p.snapshot(ctx, fl.hc)
		if err != nil {
			return s, err
		}
		s.servers = append(s.servers, u)
	}
	for _, p := range fl.routers {
		u, err := p.snapshot(ctx, fl.hc)
		if err != nil {
			return s, err
		}
		s.routers = append(s.routers, u)
	}
	var err error
	if s.self, err = readStat("self"); err != nil {
		return s, err
	}
	for _, a := range fl.agents {
		s.events += a.events.Load()
		s.sessions += a.sessions.Load()
	}
	return s, nil
}

func (fl *fleet) routerAddrs() []string {
	out := make([]string, len(fl.routers))
	for i, r := range fl.routers {
		out[i] = r.opsAddr // /debug/kvindex is on the operations port
	}
	return out
}

// settled is a snapshot after a garbage collection in every process (the
// harness build's /debug/pprof/heap?gc=1), so heap in use is the live
// heap rather than whatever garbage the last cycle left: the memory
// figures per replica and per entry come from two of these.
func (fl *fleet) settled(ctx context.Context) (snap, error) {
	for _, p := range append(slices.Clone(fl.servers), fl.routers...) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.pprofAddr+"/debug/pprof/heap?gc=1", nil)
		if err != nil {
			return snap{}, err
		}
		resp, err := fl.hc.Do(req)
		if err != nil {
			return snap{}, fmt.Errorf("%s: force a GC: %w", p.name, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return fl.snapshot(ctx)
}

// point sets the rate, warms up, and measures one window: usage from
// /proc and /metrics at its ends, the probes' lag in between.
func (fl *fleet) point(ctx context.Context, rate float64, label string) (*point, error) {
	for _, a := range fl.agents {
		a.setRate(rate / float64(len(fl.agents)))
	}
	if err := sleep(ctx, fl.cfg.warmup); err != nil {
		return nil, err
	}
	pr := &prober{hc: fl.hc, routers: fl.routerAddrs(), poll: fl.cfg.probePoll, timeout: fl.cfg.probeTimeout, interval: fl.cfg.probeInterval,
		seq: uint64(time.Now().UnixNano()/int64(time.Millisecond)) & (1<<40 - 1)}
	var profiles sync.WaitGroup
	if fl.cfg.profileDir != "" {
		fl.profile(ctx, &profiles, label)
	}
	a, err := fl.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	samples, skipped := pr.window(ctx, fl.agents, fl.cfg.window)
	b, err := fl.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	profiles.Wait()
	p := newPoint(rate, a, b, samples, fl.cfg.probeTimeout)
	p.LoadAvg = loadAvg()
	p.Skipped = skipped
	p.EntriesOK = true
	for _, u := range b.routers {
		if int(u.metrics["llmgw_router_kvindex_entries"]) != fl.expected {
			p.EntriesOK = false
		}
	}
	return p, nil
}

// profile fetches a CPU profile of every server and the first router over
// the window, into the profile directory.
func (fl *fleet) profile(ctx context.Context, wg *sync.WaitGroup, label string) {
	secs := max(1, int(fl.cfg.window/time.Second)-1)
	for _, p := range append(slices.Clone(fl.servers), fl.routers[0]) {
		wg.Go(func() {
			path := filepath.Join(fl.cfg.profileDir, fmt.Sprintf("%s-%s.pprof", label, p.name))
			if err := fetchProfile(ctx, p.pprofAddr, secs, path); err != nil {
				fl.log.Warn("cpu profile", "proc", p.name, "err", err)
			}
		})
	}
}

func fetchProfile(ctx context.Context, addr string, secs int, path string) error {
	hc := &http.Client{Timeout: time.Duration(secs+30) * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, secs), nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// loadAvg is /proc/loadavg's three averages, as uptime prints them.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
