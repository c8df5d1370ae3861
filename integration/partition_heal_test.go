package integration

import (
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/mtls"
)

// healPartition is how long TestPartitionHeal cuts a server off: the
// issue's 30 s with LLMGW_SOAK=1 (make soak), else 12 s.
func healPartition() time.Duration {
	if soak() {
		return 30 * time.Second
	}
	return 12 * time.Second
}

// healGossip is the servers' gossip tuning in TestPartitionHeal. The soak
// keeps memberlist's LAN timings, under which a 3-server pool declares a
// silent member dead after up to 6 × 4·log10(3) probe intervals (about
// 11.5 s; seen 11-15 s on a loaded machine), well inside the 30 s cut.
// The 12 s cut halves the probe interval and the suspicion multiplier, so
// the deaths come within about 3 s and the cut still outlasts them by
// several seconds: what heals it is then the reconnect loop, not
// memberlist's suspicion window (the test checks that both sides declared
// the other dead). The reconnect interval is the default (3 s) in both.
func healGossip() string {
	if soak() {
		return ""
	}
	return "gossip:\n  probe_interval: 500ms\n  suspicion_mult: 2\n"
}

// healedWithin is the bound: healthy this soon after the heal, with
// no operator action.
const healedWithin = 10 * time.Second

// TestPartitionHeal cuts the leader, then a follower, off from the other
// two servers (iptables, as TestFailoverPartitionAgentServer does) for
// healPartition, heals, and requires the cluster healthy within
// healedWithin of the heal with no operator action (design §5.2): every
// server lists every server alive, `cluster status` says healthy with
// failure tolerance 1 on every server. Memberlist alone never contacts a
// member it declared dead again, so before gossip's reconnect loop both
// sides stayed dead to each other for good (the issue: minutes, until a
// manual `llmgwctl join`). During the follower's cut a model is applied
// (its replica placed on an agent attached to the majority): after the
// heal every server's own view (replica list is a local read) has it ready
// with its address, which only the ephemeral plane's resync over healed
// gossip gives the cut server.
//
// Servers run with the default reconnect interval
// (gossip.reconnect_interval, 3 s); see healGossip for memberlist's.
//
// The cluster runs in plain text and, as operators deploy it, on mutual
// TLS with a gossip key: there every stream between servers (gossip's
// push/pull, Raft, the leader's autopilot questions) is a TLS connection
// that must be made again after the heal.
func TestPartitionHeal(t *testing.T) {
	iptablesOrSkip(t)
	hosts := partitionHosts()
	for _, h := range hosts {
		l, err := net.Listen("tcp", h+":0")
		if err != nil {
			t.Skipf("loopback address %s is not usable: %v", h, err)
		}
		l.Close()
	}
	t.Run("plain", func(t *testing.T) { partitionHealOn(t, hosts, nil) })
	t.Run("tls", func(t *testing.T) {
		p := newPKI(t)
		keyPath, _ := keyFile(t)
		partitionHealOn(t, hosts, func(s *controlServer) []string {
			s.ctlArgs = p.flags(mtls.RoleAdmin, "ops")
			return append(p.flags(mtls.RoleServer, s.id), "--gossip-key-file", keyPath)
		})
	})
}

// partitionHealOn is TestPartitionHeal on a cluster of servers on hosts,
// each with own's flags (nil: none).
func partitionHealOn(t *testing.T, hosts []string, own func(s *controlServer) []string) {
	// As in TestFailoverPartitionAgentServer: a loaded machine must not
	// end the agent's session for silence.
	cfg := filepath.Join(t.TempDir(), "control.yaml")
	writeFile(t, cfg, "agent_timeout: 10s\n"+healGossip())
	c := startClusterOnAs(t, hosts, own, "--config", cfg)
	c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	if took, _, why := c.waitHealthy(formTimeout); why != "" {
		t.Fatalf("the cluster is not healthy %v after forming: %s", took, why)
	}

	// The leader's partition.
	leader := c.waitLeader(c.servers, formTimeout)
	took := c.partitionAndHeal(t, leader, nil)
	t.Logf("partition of the leader %s for %v: healthy %v after the heal", leader.id, healPartition(), took.Round(10*time.Millisecond))

	cutBefore := leader
	leader = c.waitLeader(c.servers, formTimeout)
	follower := without(c.servers, leader, cutBefore)[0]
	if own != nil {
		// The follower's partition alone: the replica's part below is the
		// plain run's (its agent and calls would need certificates of
		// their own, and it tests the ephemeral plane, not TLS).
		took = c.partitionAndHeal(t, follower, nil)
		t.Logf("partition of the follower %s for %v: healthy %v after the heal", follower.id, healPartition(), took.Round(10*time.Millisecond))
		return
	}

	// A follower's partition, with a model applied meanwhile.
	majority := without(c.servers, follower)
	var ctl []string
	for _, s := range majority {
		ctl = append(ctl, s.grpc)
	}
	startAgentProc(t, "n1", ctl, "--heartbeat-interval", "2s")
	applyModel(t, leader.grpc, "before", 1)
	for _, s := range c.servers {
		waitReadyOn(t, s, "before", 1, 90*time.Second)
	}
	took = c.partitionAndHeal(t, follower, func() {
		applyModel(t, leader.grpc, "during", 1)
		waitReadyOn(t, leader, "during", 1, healPartition())
	})
	t.Logf("partition of the follower %s for %v: healthy %v after the heal", follower.id, healPartition(), took.Round(10*time.Millisecond))
	healed := time.Now()
	for _, s := range c.servers {
		waitReadyOn(t, s, "during", 1, healedWithin)
	}
	t.Logf("the replica applied during the partition is ready with its address on every server %v after the cluster was healthy",
		time.Since(healed).Round(10*time.Millisecond))
}

// partitionAndHeal cuts s off for healPartition, running during (if any)
// meanwhile; it checks that the others declared s dead and s them (else
// the cut proved nothing), heals, and fails the test unless the cluster is
// healthy within healedWithin of the heal. It returns how long that took.
func (c *cluster) partitionAndHeal(t *testing.T, s *controlServer, during func()) time.Duration {
	t.Helper()
	p := cut(t, c, s)
	others := without(c.servers, s)
	if !eventually(healPartition(), func() bool {
		for _, o := range others {
			if st, err := o.memberStatus(); err != nil || st[s.id] != "dead" {
				return false
			}
		}
		st, err := s.memberStatus()
		if err != nil {
			return false
		}
		for _, o := range others {
			if st[o.id] != "dead" {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("gossip did not declare %s and the others dead to each other within %v of the cut", s.id, within(healPartition()))
	}
	t.Logf("%s and the others saw each other dead %v into the cut", s.id, time.Since(p.at).Round(10*time.Millisecond))
	if during != nil {
		during()
	}
	if rest := healPartition() - time.Since(p.at); rest > 0 {
		time.Sleep(rest) // the partition's length is the scenario, not a wait for a condition
	}
	p.heal()
	took, gossipTook, why := c.waitHealthy(healedWithin)
	if why != "" {
		t.Fatalf("after a %v partition of %s the cluster is not healthy within %v of the heal, with no operator action: %s",
			healPartition(), s.id, within(healedWithin), why)
	}
	t.Logf("after the heal: gossip whole on every server in %v, healthy in %v", gossipTook.Round(10*time.Millisecond), took.Round(10*time.Millisecond))
	return took
}

// waitHealthy waits up to within(d) until every server lists every server
// alive and says the cluster is healthy with failure tolerance 1 under an
// agreed leader; it returns how long it waited, how long until gossip
// alone was whole (every server listing every server alive: the reconnect
// loop's part, before autopilot's) and, on failure, what was last seen not
// to hold ("" on success).
func (c *cluster) waitHealthy(d time.Duration) (took, gossipTook time.Duration, why string) {
	start := time.Now()
	gossipTook = -1
	ok := eventually(d, func() bool {
		var gossip []string
		gossip, why = c.unhealthy()
		if len(gossip) == 0 && gossipTook < 0 {
			gossipTook = time.Since(start)
		}
		return why == ""
	})
	if !ok {
		return time.Since(start), gossipTook, why
	}
	return time.Since(start), gossipTook, ""
}

// unhealthy is why the cluster is not healthy on every server ("" when it
// is), and of that the servers' gossip views that are not whole.
func (c *cluster) unhealthy() (gossip []string, why string) {
	leaders := map[string]bool{}
	var rest []string
	for _, s := range c.servers {
		ms, err := s.memberStatus()
		if err != nil {
			gossip = append(gossip, fmt.Sprintf("%s: members: %v", s.id, err))
			continue
		}
		for _, o := range c.servers {
			if ms[o.id] != "alive" {
				gossip = append(gossip, fmt.Sprintf("%s lists %s %q", s.id, o.id, ms[o.id]))
			}
		}
		st, err := s.status()
		if err != nil {
			rest = append(rest, fmt.Sprintf("%s: cluster status: %v", s.id, err))
			continue
		}
		leaders[st.Leader] = true
		if !st.Healthy || st.FailureTolerance != 1 {
			rest = append(rest, fmt.Sprintf("%s: healthy %v, failure tolerance %d", s.id, st.Healthy, st.FailureTolerance))
		}
	}
	if len(leaders) != 1 || leaders[""] {
		rest = append(rest, fmt.Sprintf("leaders seen %v", leaders))
	}
	all := append(slices.Clone(gossip), rest...)
	sort.Strings(all)
	return gossip, strings.Join(all, "; ")
}

// waitReadyOn waits up to within(d) until s's own view (replica list is a
// local read, not forwarded) has n replicas of model ready, each with its
// address.
func waitReadyOn(t *testing.T, s *controlServer, model string, n int, d time.Duration) {
	t.Helper()
	var last string
	if !eventually(d, func() bool {
		list, err := clusterReplicas(s.grpc)
		if err != nil {
			last = err.Error()
			return false
		}
		ready, seen := 0, []string{}
		for _, r := range list {
			if r.Replica.Model != model {
				continue
			}
			st := "no status"
			if r.Status != nil {
				st = r.Status.Phase + " at " + r.Status.Address
			}
			seen = append(seen, r.Replica.ID+": "+st)
			if r.ready() {
				ready++
			}
		}
		last = strings.Join(seen, ", ")
		return ready == n
	}) {
		t.Fatalf("%s does not list %d replica(s) of %s ready with an address within %v: %s", s.id, n, model, within(d), last)
	}
}
