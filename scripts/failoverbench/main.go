// Command failoverbench measures how long an llmgw control plane is without
// a leader after the leader dies (issue "Control-plane cluster", design §5.1):
// it starts a cluster of real `llmgw control` processes on loopback, then
// kills -9 the leader again and again, restarting it and waiting for full
// health before the next trial. For each kill it records
//
//   - time to a new leader: the first moment a survivor's ClusterStatus
//     names a leader other than the killed server, polled every --poll on
//     every survivor;
//   - time to the first committed write: ApplyModel sent to a survivor in a
//     loop (every --poll) from the kill until one succeeds.
//
// and prints p50, p99 and max of each with n. The target is p99 ≤ 1.5 s to a
// new leader with the 500 ms heartbeat and election timeouts (design §5.1).
//
// Run it with `make bench-failover` (BENCH_FLAGS=... passes flags).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// config is the benchmark's flags.
type config struct {
	llmgw            string
	servers          int
	trials           int
	poll             time.Duration
	heartbeatTimeout time.Duration
	electionTimeout  time.Duration
	// maxJitter is the most time waited at random before each kill, so kills
	// land at every phase of the leader's heartbeat.
	maxJitter   time.Duration
	giveUpAfter time.Duration
	seed        uint64
	jsonOut     bool
	keep        bool
}

func (c config) validate() error {
	switch {
	case c.servers < 3:
		return fmt.Errorf("--servers: must be at least 3, got %d", c.servers)
	case c.trials < 1:
		return fmt.Errorf("--trials: must be at least 1, got %d", c.trials)
	case c.poll <= 0:
		return fmt.Errorf("--poll: must be positive, got %s", c.poll)
	case c.heartbeatTimeout <= 0 || c.electionTimeout <= 0:
		return errors.New("--heartbeat-timeout, --election-timeout: must be positive")
	case c.giveUpAfter <= 0:
		return fmt.Errorf("--give-up-after: must be positive, got %s", c.giveUpAfter)
	}
	return nil
}

func main() {
	cfg := config{}
	flag.StringVar(&cfg.llmgw, "llmgw", "", "the llmgw binary (default: build ./cmd/llmgw into a temporary directory)")
	flag.IntVar(&cfg.servers, "servers", 3, "servers in the cluster")
	flag.IntVar(&cfg.trials, "trials", 100, "leader kills")
	flag.DurationVar(&cfg.poll, "poll", 10*time.Millisecond, "how often survivors are asked for the leader, and a write retried")
	flag.DurationVar(&cfg.heartbeatTimeout, "heartbeat-timeout", 500*time.Millisecond, "the servers' --heartbeat-timeout")
	flag.DurationVar(&cfg.electionTimeout, "election-timeout", 500*time.Millisecond, "the servers' --election-timeout")
	flag.DurationVar(&cfg.maxJitter, "max-jitter", 500*time.Millisecond, "longest random wait before each kill")
	flag.DurationVar(&cfg.giveUpAfter, "give-up-after", 30*time.Second, "a trial without a new leader or write for this long fails the run")
	flag.Uint64Var(&cfg.seed, "seed", 1, "seed of the random waits before kills")
	flag.BoolVar(&cfg.jsonOut, "json", false, "print the result as JSON")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the servers' data and logs (their directory is printed)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "failoverbench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, cfg, log)
	if res != nil {
		res.print(cfg.jsonOut)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "failoverbench:", err)
		os.Exit(1)
	}
}

// server is one `llmgw control` process, restartable with the same flags.
type server struct {
	id, grpc, logPath string
	args              []string
	cmd               *exec.Cmd
	done              chan error
	conn              *grpc.ClientConn
	admin             llmgwv1.AdminServiceClient
}

func (s *server) start(bin string) error {
	f, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	s.cmd = exec.Command(bin, s.args...)
	s.cmd.Stdout, s.cmd.Stderr = f, f
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.id, err)
	}
	s.done = make(chan error, 1)
	go func(cmd *exec.Cmd, done chan<- error) { done <- cmd.Wait() }(s.cmd, s.done)
	return nil
}

// kill is kill -9, waited for.
func (s *server) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// stop is SIGINT with a kill after a grace.
func (s *server) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

func (s *server) status(ctx context.Context, timeout time.Duration) (*llmgwv1.ClusterStatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return s.admin.ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{})
}

// freePort returns a loopback address nothing listens on right now.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// trial is one kill's figures.
type trial struct {
	Killed     string        `json:"killed"`
	NewLeader  string        `json:"new_leader"`
	ToLeader   time.Duration `json:"to_leader_ns"`
	ToWrite    time.Duration `json:"to_write_ns"`
	JitterWait time.Duration `json:"jitter_ns"`
}

func run(ctx context.Context, cfg config, log *slog.Logger) (*result, error) {
	dir, err := os.MkdirTemp("", "llmgw-failoverbench-")
	if err != nil {
		return nil, err
	}
	if cfg.keep {
		log.Info("servers' data and logs", "dir", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	if cfg.llmgw == "" {
		cfg.llmgw = filepath.Join(dir, "llmgw")
		build := exec.CommandContext(ctx, "go", "build", "-o", cfg.llmgw, "./cmd/llmgw")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return nil, fmt.Errorf("build llmgw (run from the repository root, or give --llmgw): %w", err)
		}
	}

	servers := make([]*server, cfg.servers)
	gossip := make([]string, cfg.servers)
	// A closed port may be handed out again at once: keep them distinct.
	seen := map[string]bool{}
	for i := range servers {
		addrs := make([]string, 4)
		for j := range addrs {
			for addrs[j] == "" || seen[addrs[j]] {
				if addrs[j], err = freePort(); err != nil {
					return nil, err
				}
			}
			seen[addrs[j]] = true
		}
		id := fmt.Sprintf("c%d", i+1)
		gossip[i] = addrs[2]
		servers[i] = &server{id: id, grpc: addrs[0], logPath: filepath.Join(dir, id+".log"),
			args: []string{"control", "--node-id", id, "--data-dir", filepath.Join(dir, id),
				"--grpc-addr", addrs[0], "--raft-addr", addrs[1], "--gossip-addr", addrs[2], "--http-addr", addrs[3],
				"--bootstrap-expect", strconv.Itoa(cfg.servers),
				"--heartbeat-timeout", cfg.heartbeatTimeout.String(), "--election-timeout", cfg.electionTimeout.String()}}
	}
	// Shutdown order: the servers (each waited for), then the clients.
	defer func() {
		for _, s := range servers {
			s.stop()
			if s.conn != nil {
				s.conn.Close()
			}
		}
	}()
	for i, s := range servers {
		others := slices.Delete(slices.Clone(gossip), i, i+1)
		s.args = append(s.args, "--join", strings.Join(others, ","))
		if s.conn, err = grpc.NewClient(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return nil, err
		}
		s.admin = llmgwv1.NewAdminServiceClient(s.conn)
		if err := s.start(cfg.llmgw); err != nil {
			return nil, err
		}
	}

	rng := rand.New(rand.NewPCG(cfg.seed, cfg.seed^0x9e3779b97f4a7c15))
	res := &result{Servers: cfg.servers, HeartbeatTimeout: cfg.heartbeatTimeout.String(), ElectionTimeout: cfg.electionTimeout.String()}
	writes := 0
	for n := 0; n < cfg.trials; n++ {
		leader, err := waitHealthy(ctx, servers, cfg.giveUpAfter)
		if err != nil {
			return res, fmt.Errorf("trial %d: before the kill: %w (logs in %s with --keep)", n+1, err, dir)
		}
		jitter := time.Duration(rng.Int64N(int64(cfg.maxJitter) + 1))
		if err := sleep(ctx, jitter); err != nil {
			return res, err
		}
		tr, err := killLeader(ctx, cfg, leader, servers, &writes)
		if err != nil {
			return res, fmt.Errorf("trial %d: %w", n+1, err)
		}
		tr.JitterWait = jitter
		res.Trials = append(res.Trials, tr)
		log.Info("trial", "n", n+1, "killed", tr.Killed, "new_leader", tr.NewLeader, "to_leader", tr.ToLeader, "to_write", tr.ToWrite)
		if err := leader.start(cfg.llmgw); err != nil {
			return res, err
		}
	}
	return res, nil
}

// waitHealthy waits until every server names the same leader and that
// leader's autopilot calls the cluster healthy with every server a voter.
func waitHealthy(ctx context.Context, servers []*server, timeout time.Duration) (*server, error) {
	deadline := time.Now().Add(timeout)
	var why string
	for {
		leader, w := healthy(ctx, servers)
		if leader != nil {
			return leader, nil
		}
		why = w
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("not healthy within %s: %s", timeout, why)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

func healthy(ctx context.Context, servers []*server) (*server, string) {
	var leaderID string
	for _, s := range servers {
		st, err := s.status(ctx, time.Second)
		if err != nil {
			return nil, fmt.Sprintf("%s: %v", s.id, err)
		}
		if st.Leader == "" || (leaderID != "" && st.Leader != leaderID) {
			return nil, fmt.Sprintf("%s: leader %q", s.id, st.Leader)
		}
		leaderID = st.Leader
	}
	for _, s := range servers {
		if s.id != leaderID {
			continue
		}
		st, err := s.status(ctx, time.Second)
		if err != nil {
			return nil, fmt.Sprintf("%s: %v", s.id, err)
		}
		if !st.Healthy || int(st.Voters) != len(servers) {
			return nil, fmt.Sprintf("leader %s: healthy %t, %d voters", s.id, st.Healthy, st.Voters)
		}
		return s, ""
	}
	return nil, fmt.Sprintf("leader %q is not one of the servers", leaderID)
}

// killLeader kills the leader and times the survivors' way back: the leader
// poll and the writer run side by side from the moment of the kill.
func killLeader(ctx context.Context, cfg config, leader *server, servers []*server, writes *int) (trial, error) {
	tr := trial{Killed: leader.id}
	var survivors []*server
	for _, s := range servers {
		if s != leader {
			survivors = append(survivors, s)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.giveUpAfter)
	defer cancel()

	t0 := time.Now()
	leader.kill()

	type written struct {
		at  time.Duration
		err error
	}
	wrote := make(chan written, 1)
	*writes++
	seq := *writes
	go func() {
		// The writer: one survivor, a write every poll until one commits.
		target := survivors[0]
		var last error
		for ctx.Err() == nil {
			cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := target.admin.ApplyModel(cctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{
				Name: "failoverbench", Engine: "sim", Model: "llmgw/failoverbench", GpusPerReplica: 1,
				Replicas: uint32(1 + seq%2),
			}})
			ccancel()
			if err == nil {
				wrote <- written{at: time.Since(t0)}
				return
			}
			last = err
			select {
			case <-ctx.Done():
			case <-time.After(cfg.poll):
			}
		}
		wrote <- written{err: fmt.Errorf("no write committed within %s: %w", cfg.giveUpAfter, last)}
	}()

	tick := time.NewTicker(cfg.poll)
	defer tick.Stop()
	var pollErr error
poll:
	for {
		for _, s := range survivors {
			st, err := s.status(ctx, cfg.poll*5)
			if err == nil && st.Leader != "" && st.Leader != leader.id {
				tr.ToLeader, tr.NewLeader = time.Since(t0), st.Leader
				break poll
			}
		}
		select {
		case <-ctx.Done():
			pollErr = fmt.Errorf("no new leader within %s", cfg.giveUpAfter)
			break poll
		case <-tick.C:
		}
	}
	w := <-wrote
	if pollErr != nil {
		return tr, pollErr
	}
	if w.err != nil {
		return tr, w.err
	}
	tr.ToWrite = w.at
	return tr, nil
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

// result is what the run prints.
type result struct {
	Servers          int     `json:"servers"`
	HeartbeatTimeout string  `json:"heartbeat_timeout"`
	ElectionTimeout  string  `json:"election_timeout"`
	Trials           []trial `json:"trials"`
}

// summary is nearest-rank percentiles of one figure.
type summary struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

func summarize(ds []time.Duration) summary {
	if len(ds) == 0 {
		return summary{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return summary{N: len(s), P50: rank(0.50), P99: rank(0.99), Max: s[len(s)-1]}
}

func (r *result) print(asJSON bool) {
	var toLeader, toWrite []time.Duration
	for _, t := range r.Trials {
		toLeader = append(toLeader, t.ToLeader)
		toWrite = append(toWrite, t.ToWrite)
	}
	l, w := summarize(toLeader), summarize(toWrite)
	if asJSON {
		out, _ := json.MarshalIndent(struct {
			*result
			ToLeader summary `json:"to_leader"`
			ToWrite  summary `json:"to_write"`
		}{r, l, w}, "", "  ")
		fmt.Println(string(out))
		return
	}
	fmt.Printf("%d servers, heartbeat %s, election %s, %d leader kills\n", r.Servers, r.HeartbeatTimeout, r.ElectionTimeout, len(r.Trials))
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURE\tN\tP50\tP99\tMAX")
	for _, row := range []struct {
		name string
		s    summary
	}{{"kill -> new leader", l}, {"kill -> first committed write", w}} {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", row.name, row.s.N, ms(row.s.P50), ms(row.s.P99), ms(row.s.Max))
	}
	tw.Flush()
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 0, 64) + " ms"
}
