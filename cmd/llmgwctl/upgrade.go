package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// upgradeCmd guides a rolling upgrade of the control plane (design §13.3):
// `check` says whether the next server may be restarted, `plan` prints
// the procedure with the exact commands for this cluster.
func (c *cli) upgradeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "upgrade", Short: "Rolling upgrade of the control plane: check the cluster, print the plan"}
	cmd.AddCommand(c.upgradeCheckCmd(), c.upgradePlanCmd())
	return cmd
}

// errNotReady is a check that did not pass: the exit status is non-zero so
// `until llmgwctl upgrade check; do sleep 2; done` waits for it.
var errNotReady = errors.New("not ready for the next step")

// upgradeServer is one server in a check or a plan.
type upgradeServer struct {
	ID        string `json:"id"`
	GRPCAddr  string `json:"grpc_addr"`
	Version   string `json:"version"`
	Voter     bool   `json:"voter"`
	Leader    bool   `json:"leader"`
	Healthy   bool   `json:"healthy"`
	LastIndex uint64 `json:"last_index"`
	// Lag is how many entries it is behind the leader's last index.
	Lag uint64 `json:"lag"`
	// Answered is whether the server itself answered just now; its index,
	// version and leader are then its own, not the leader's last reading.
	Answered bool `json:"answered"`
}

// reading is what one server says of itself when asked directly: fresher
// than autopilot's view, which the leader refreshes every interval and
// which may predate a restart.
type reading struct {
	version   string
	leader    string
	lastIndex uint64
}

// upgradeReport is `upgrade check`'s answer.
type upgradeReport struct {
	OK               bool            `json:"ok"`
	Problems         []string        `json:"problems"`
	Leader           string          `json:"leader"`
	Healthy          bool            `json:"healthy"`
	FailureTolerance int32           `json:"failure_tolerance"`
	MinVersion       string          `json:"min_version"`
	Versions         map[string]int  `json:"versions"`
	Servers          []upgradeServer `json:"servers"`
}

// assess is the check itself, pure: the leader's ClusterStatus (health and
// failure tolerance are autopilot's there), its peers, and how far behind
// the leader a server may be and still count as caught up.
func assess(st *llmgwv1.ClusterStatusResponse, peers []*llmgwv1.RaftPeer, fresh map[string]reading, maxLag uint64) upgradeReport {
	r := upgradeReport{Leader: st.Leader, Healthy: st.Healthy, FailureTolerance: st.FailureTolerance, MinVersion: st.MinVersion, Versions: map[string]int{}}
	addrs := map[string]string{}
	for _, s := range st.Servers {
		addrs[s.Id] = s.GrpcAddr
	}
	var leaderIndex uint64
	for _, p := range peers {
		if p.Leader {
			leaderIndex = p.LastIndex
			if f, ok := fresh[p.Id]; ok {
				leaderIndex = f.lastIndex
			}
		}
	}
	for _, p := range peers {
		u := upgradeServer{ID: p.Id, GRPCAddr: addrs[p.Id], Version: p.Version, Voter: p.Voter, Leader: p.Leader, Healthy: p.Healthy, LastIndex: p.LastIndex}
		f, answered := fresh[p.Id]
		if answered {
			u.Answered, u.Version, u.LastIndex = true, f.version, f.lastIndex
		}
		if leaderIndex > u.LastIndex {
			u.Lag = leaderIndex - u.LastIndex
		}
		r.Versions[orDash(u.Version)]++
		switch {
		case fresh != nil && !answered:
			r.Problems = append(r.Problems, fmt.Sprintf("%s does not answer", p.Id))
		case answered && f.leader != st.Leader:
			r.Problems = append(r.Problems, fmt.Sprintf("%s does not follow the leader %s yet (it sees %q)", p.Id, st.Leader, f.leader))
		case answered && p.Version != f.version:
			// The gate judges by the leader's gossip view: until it has
			// the new version, new commands would still be refused.
			r.Problems = append(r.Problems, fmt.Sprintf("the leader does not see %s's version %s yet (gossip says %s)", p.Id, orDash(f.version), orDash(p.Version)))
		case !p.Healthy:
			r.Problems = append(r.Problems, fmt.Sprintf("%s is not healthy (autopilot: no recent contact, or too far behind)", p.Id))
		case u.Lag > maxLag:
			r.Problems = append(r.Problems, fmt.Sprintf("%s is %d entries behind the leader (at most %d: --max-lag)", p.Id, u.Lag, maxLag))
		}
		if !p.Voter {
			r.Problems = append(r.Problems, fmt.Sprintf("%s is not a voter yet (autopilot promotes it once stable)", p.Id))
		}
		r.Servers = append(r.Servers, u)
	}
	sort.Slice(r.Servers, func(i, j int) bool { return r.Servers[i].ID < r.Servers[j].ID })
	switch {
	case st.Leader == "":
		r.Problems = append([]string{"no leader"}, r.Problems...)
	case !st.Healthy:
		r.Problems = append([]string{"autopilot reports the cluster unhealthy"}, r.Problems...)
	}
	if st.FailureTolerance < 1 {
		r.Problems = append(r.Problems, fmt.Sprintf("failure tolerance is %d: stopping any voter now would lose quorum", st.FailureTolerance))
	}
	r.OK = len(r.Problems) == 0
	return r
}

// leaderView reads what a check needs: ClusterStatus from the leader (the
// server --addr names may only estimate health) and the leader's peers.
func (c *cli) leaderView(ctx context.Context) (*llmgwv1.ClusterStatusResponse, []*llmgwv1.RaftPeer, map[string]reading, error) {
	var st *llmgwv1.ClusterStatusResponse
	var peers []*llmgwv1.RaftPeer
	fresh := map[string]reading{}
	creds, err := c.credentials()
	if err != nil {
		return nil, nil, nil, err
	}
	err = c.admin(ctx, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
		var err error
		if st, err = a.ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{}); err != nil {
			return fmt.Errorf("cluster status: %w", err)
		}
		if st.Leader == "" {
			return nil
		}
		lp, err := a.ListPeers(ctx, &llmgwv1.ListPeersRequest{})
		if err != nil {
			return fmt.Errorf("raft list-peers: %w", err)
		}
		peers = lp.Peers
		// Ask every server itself (the leader first): its own version,
		// leader and last index, as Nomad's upgrade scenario does.
		var leaderStatus *llmgwv1.ClusterStatusResponse
		for _, s := range st.Servers {
			if s.GrpcAddr == "" {
				continue
			}
			r, cs, err := askServer(ctx, s.GrpcAddr, creds)
			if err != nil || cs.ServerId != s.Id {
				continue
			}
			fresh[s.Id] = r
			if s.Id == st.Leader {
				leaderStatus = cs
			}
		}
		if leaderStatus != nil {
			leaderStatus.Servers = st.Servers
			st = leaderStatus
		}
		return nil
	})
	return st, peers, fresh, err
}

// askServer is one server's ClusterStatus, with the Raft figures it
// reports of itself.
func askServer(ctx context.Context, addr string, creds grpc.DialOption) (reading, *llmgwv1.ClusterStatusResponse, error) {
	conn, err := grpc.NewClient(addr, creds)
	if err != nil {
		return reading{}, nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var md metadata.MD
	cs, err := llmgwv1.NewAdminServiceClient(conn).ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{}, grpc.Header(&md))
	if err != nil {
		return reading{}, nil, err
	}
	r := reading{leader: cs.Leader, lastIndex: raftLastIndex(cs, md)}
	for _, s := range cs.Servers {
		if s.Id == cs.ServerId {
			r.version = s.Version
		}
	}
	return r, cs, nil
}

// raftLastIndex is the last log index a server reports of itself in its
// ClusterStatus: the response field, or for a server older than it (in a
// rolling upgrade) the llmgw-raft-last-index header it sent instead; 0
// when it sent neither. Drop the header fallback one release after the
// fields were added, with the servers' headers.
func raftLastIndex(cs *llmgwv1.ClusterStatusResponse, md metadata.MD) uint64 {
	if cs.RaftLastIndex != nil {
		return cs.GetRaftLastIndex()
	}
	if v := md.Get("llmgw-raft-last-index"); len(v) == 1 {
		n, _ := strconv.ParseUint(v[0], 10, 64)
		return n
	}
	return 0
}

func (c *cli) upgradeCheckCmd() *cobra.Command {
	var maxLag uint64
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Is the cluster ready for the next server's restart: leader, healthy, caught up, failure tolerance ≥ 1; versions and min version",
		Long: "Checks what design §13.3 asks before each step of a rolling upgrade: a leader, autopilot healthy, every\n" +
			"server a healthy voter within --max-lag entries of the leader, failure tolerance at least 1. Prints each\n" +
			"server's version and the cluster's minimum version. Exits non-zero when a step must wait.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, peers, fresh, err := c.leaderView(cmd.Context())
			if err != nil {
				return fmt.Errorf("upgrade check: %w", err)
			}
			r := assess(st, peers, fresh, maxLag)
			if c.output == "json" {
				if err := c.printJSON(r); err != nil {
					return err
				}
			} else if err := c.printReport(r); err != nil {
				return err
			}
			if !r.OK {
				return fmt.Errorf("upgrade check: %w: %s", errNotReady, strings.Join(r.Problems, "; "))
			}
			return nil
		},
	}
	cmd.Flags().Uint64Var(&maxLag, "max-lag", 16, "how many entries behind the leader a server may be and count as caught up")
	return cmd
}

func (c *cli) printReport(r upgradeReport) error {
	fmt.Fprintf(c.out, "leader:            %s\n", orDash(r.Leader))
	fmt.Fprintf(c.out, "healthy:           %t\n", r.Healthy)
	fmt.Fprintf(c.out, "failure tolerance: %d\n", r.FailureTolerance)
	fmt.Fprintf(c.out, "min version:       %s\n", orDash(r.MinVersion))
	vs := make([]string, 0, len(r.Versions))
	for v, n := range r.Versions {
		vs = append(vs, fmt.Sprintf("%s ×%d", v, n))
	}
	sort.Strings(vs)
	fmt.Fprintf(c.out, "versions:          %s\n\n", strings.Join(vs, ", "))
	rows := make([][]string, 0, len(r.Servers))
	for _, s := range r.Servers {
		role := "voter"
		switch {
		case s.Leader:
			role = "leader"
		case !s.Voter:
			role = "non-voter"
		}
		rows = append(rows, []string{s.ID, role, orDash(s.Version), strconv.FormatBool(s.Healthy), strconv.FormatUint(s.LastIndex, 10), strconv.FormatUint(s.Lag, 10)})
	}
	if err := c.printTable([]string{"ID", "ROLE", "VERSION", "HEALTHY", "LAST INDEX", "LAG"}, rows); err != nil {
		return err
	}
	if r.OK {
		_, err := fmt.Fprintln(c.out, "\nok: the next server may be upgraded")
		return err
	}
	_, err := fmt.Fprintf(c.out, "\nwait: %s\n", strings.Join(r.Problems, "; "))
	return err
}

// upgradeStep is one server's turn in the plan, with the commands to run.
type upgradeStep struct {
	Server   string   `json:"server"`
	Role     string   `json:"role"`
	Version  string   `json:"version"`
	Commands []string `json:"commands"`
}

// upgradePlan is `upgrade plan`'s answer.
type upgradePlan struct {
	Leader string        `json:"leader"`
	To     string        `json:"to,omitempty"`
	Steps  []upgradeStep `json:"steps"`
	// Skipped are servers already at --to or newer.
	Skipped []string `json:"skipped"`
	Notes   []string `json:"notes"`
}

// makePlan orders the upgrade (design §13.3): snapshot first; followers one
// at a time, by id; then leadership to the first upgraded server and the
// old leader last. Each step ends with the check that gates the next.
func makePlan(st *llmgwv1.ClusterStatusResponse, addr, to string) (upgradePlan, error) {
	if st.Leader == "" {
		return upgradePlan{}, errors.New("no leader: the cluster must be healthy before an upgrade (llmgwctl upgrade check)")
	}
	p := upgradePlan{Leader: st.Leader, To: to}
	servers := append([]*llmgwv1.ControlServer(nil), st.Servers...)
	sort.Slice(servers, func(i, j int) bool {
		if servers[i].Leader != servers[j].Leader {
			return !servers[i].Leader // the leader last
		}
		return servers[i].Id < servers[j].Id
	})
	ctl := func(at string, args ...string) string {
		return "llmgwctl --addr " + at + " " + strings.Join(args, " ")
	}
	// Commands that must reach the cluster while a server is down go to
	// one that is up: the first server not being restarted in that step.
	other := func(skip string) string {
		for _, s := range servers {
			if s.Id != skip && s.GrpcAddr != "" {
				return s.GrpcAddr
			}
		}
		return addr
	}
	p.Steps = append(p.Steps, upgradeStep{Server: "-", Role: "backup", Commands: []string{
		ctl(addr, "upgrade", "check"),
		ctl(addr, "snapshot", "save", "llmgw-before-upgrade.snap"),
		ctl(addr, "snapshot", "inspect", "llmgw-before-upgrade.snap"),
	}})
	firstUpgraded := ""
	for _, s := range servers {
		if to != "" && fsm.CompareVersions(s.Version, to) >= 0 {
			p.Skipped = append(p.Skipped, s.Id)
			if firstUpgraded == "" && !s.Leader {
				firstUpgraded = s.Id
			}
			continue
		}
		step := upgradeStep{Server: s.Id, Role: "follower", Version: s.Version}
		if s.Leader {
			step.Role = "leader"
			target := firstUpgraded
			if target == "" {
				target = "<an upgraded server>"
			}
			step.Commands = append(step.Commands, ctl(other(s.Id), "raft", "transfer-leadership", "--to", target),
				ctl(other(s.Id), "upgrade", "check"))
		}
		step.Commands = append(step.Commands,
			"# on "+s.Id+": stop `llmgw control` with SIGINT or SIGTERM (systemctl stop), never kill -9",
			"# on "+s.Id+": replace the llmgw binary; keep the flags and --data-dir",
			"# on "+s.Id+": start `llmgw control` again",
			"until "+ctl(other(s.Id), "upgrade", "check")+"; do sleep 2; done",
		)
		if !s.Leader && firstUpgraded == "" {
			firstUpgraded = s.Id
		}
		p.Steps = append(p.Steps, step)
	}
	p.Notes = []string{
		"one server at a time: start a step only after the previous one's check passes",
		"commands new in the upgraded release are refused (FAILED_PRECONDITION) until every server runs it; the first one commits the release as the cluster's minimum version, after which older servers are refused and a downgrade is no longer possible",
	}
	return p, nil
}

func (c *cli) upgradePlanCmd() *cobra.Command {
	var to string
	cmd := &cobra.Command{
		Use:   "plan [--to VERSION]",
		Short: "Print the rolling-upgrade procedure for this cluster with the exact commands",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var st *llmgwv1.ClusterStatusResponse
			if err := c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				var err error
				st, err = a.ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{})
				return err
			}); err != nil {
				return fmt.Errorf("upgrade plan: %w", err)
			}
			if to != "" {
				if _, err := fsm.ParseVersion(to); err != nil {
					return fmt.Errorf("upgrade plan: --to: %w", err)
				}
			}
			p, err := makePlan(st, c.addr, to)
			if err != nil {
				return fmt.Errorf("upgrade plan: %w", err)
			}
			if c.output == "json" {
				return c.printJSON(p)
			}
			fmt.Fprintf(c.out, "Rolling upgrade (design §13.3), leader %s; followers first, the leader last.\n", p.Leader)
			if len(p.Skipped) > 0 {
				fmt.Fprintf(c.out, "Already at %s or newer: %s\n", to, strings.Join(p.Skipped, ", "))
			}
			for i, s := range p.Steps {
				if s.Role == "backup" {
					fmt.Fprintf(c.out, "\n%d. Check the cluster and take a snapshot first:\n", i)
				} else {
					fmt.Fprintf(c.out, "\n%d. %s (%s, %s):\n", i, s.Server, s.Role, orDash(s.Version))
				}
				for _, line := range s.Commands {
					fmt.Fprintf(c.out, "     %s\n", line)
				}
			}
			fmt.Fprintln(c.out)
			for _, n := range p.Notes {
				fmt.Fprintf(c.out, "Note: %s.\n", n)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "the release being installed; servers already at it or newer are skipped")
	return cmd
}
