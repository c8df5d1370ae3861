package integration

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// The drain and roll test of issue "Failover" (design §4 "Changes roll",
// §5.5): `llmgwctl node drain` and a model re-apply under two routers' chat
// load move replicas one at a time, a replacement ready before each old one
// drains, the agent stopping each draining engine once idle, and no client
// request fails.

// rollView is what the drain test reads of `llmgwctl replica list -o json`
// beyond replicaView: the draining mark and the model revision.
type rollView struct {
	ID            string      `json:"id"`
	UID           json.Number `json:"uid"`
	Model         string      `json:"model"`
	Node          string      `json:"node"`
	Draining      bool        `json:"draining"`
	ModelRevision json.Number `json:"model_revision"`
	// State is ready only for a status of this uid.
	State   string `json:"state"`
	Address string `json:"address"`
}

// serving: routers may choose it (ready for its uid, not draining).
func (r rollView) serving() bool {
	return !r.Draining && r.State == "ready" && r.Address != ""
}

func rollReplicas(addr, model string) ([]rollView, error) {
	out, err := ctlAt(addr, "replica", "list", "-o", "json")
	if err != nil {
		return nil, err
	}
	var list []rollView
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("decode replica list: %w", err)
	}
	var mine []rollView
	for _, r := range list {
		if r.Model == model {
			mine = append(mine, r)
		}
	}
	return mine, nil
}

// placementLife is one placement (id, uid) as the sampler saw it.
type placementLife struct {
	node                          string
	firstSeen, drainSeen, goneSee time.Time
}

// rollSampler lists the model's replicas through the cluster every few
// tens of ms: the fewest serving at any sample, the most draining at once,
// the most replacements not yet serving at once (placement starts one at a
// time), and each placement's life.
type rollSampler struct {
	stopc chan struct{}
	done  chan struct{}

	mu          sync.Mutex
	samples     int
	minServing  int
	maxDraining int
	maxStarting int
	lives       map[string]*placementLife // by id/uid
}

func sampleRoll(addr, model string) *rollSampler {
	s := &rollSampler{stopc: make(chan struct{}), done: make(chan struct{}), minServing: 1 << 30, lives: map[string]*placementLife{}}
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stopc:
				return
			case <-time.After(20 * time.Millisecond):
			}
			list, err := rollReplicas(addr, model)
			if err != nil {
				continue
			}
			now := time.Now()
			s.mu.Lock()
			s.samples++
			serving, draining, starting := 0, 0, 0
			seen := map[string]bool{}
			for _, r := range list {
				k := r.ID + "/" + string(r.UID)
				seen[k] = true
				l := s.lives[k]
				if l == nil {
					l = &placementLife{node: r.Node, firstSeen: now}
					s.lives[k] = l
				}
				if r.Draining {
					draining++
					if l.drainSeen.IsZero() {
						l.drainSeen = now
					}
				}
				if r.serving() {
					serving++
				} else if !r.Draining {
					starting++
				}
			}
			for k, l := range s.lives {
				if !seen[k] && l.goneSee.IsZero() {
					l.goneSee = now
				}
			}
			s.minServing = min(s.minServing, serving)
			s.maxDraining = max(s.maxDraining, draining)
			s.maxStarting = max(s.maxStarting, starting)
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *rollSampler) stop() {
	close(s.stopc)
	<-s.done
}

// reset starts a new phase: the counts start again, lives are kept.
func (s *rollSampler) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.minServing, s.maxDraining, s.maxStarting, s.samples = 1<<30, 0, 0, 0
}

// settle waits for two more samples, so the sampler has seen what the
// test just saw.
func (s *rollSampler) settle(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	from := s.samples
	s.mu.Unlock()
	if !eventually(10*time.Second, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.samples >= from+2
	}) {
		t.Fatalf("the replica sampler took no two samples within %v", within(10*time.Second))
	}
}

func (s *rollSampler) phase() (samples, minServing, maxDraining, maxStarting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples, s.minServing, s.maxDraining, s.maxStarting
}

// drains reports, for each placement that drained and left since from,
// the time from its drain mark to its removal, in the order they drained.
func (s *rollSampler) drains(from time.Time) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	type d struct {
		key  string
		at   time.Time
		took time.Duration
	}
	var ds []d
	for k, l := range s.lives {
		if !l.drainSeen.IsZero() && !l.goneSee.IsZero() && l.drainSeen.After(from) {
			ds = append(ds, d{k + "@" + l.node, l.drainSeen, l.goneSee.Sub(l.drainSeen)})
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].at.Before(ds[j].at) })
	var out []string
	for _, x := range ds {
		out = append(out, fmt.Sprintf("%s %s", x.key, x.took.Round(10*time.Millisecond)))
	}
	return out
}

// TestFailoverDrainAndRollUnderLoad: two replicas of chat on n1, a second
// agent n2 with room for both, which gets one of them (the spread rule,
// design §5.5), two routers carrying a steady chat load. `llmgwctl node
// drain n1` moves n1's replica to n2; after `node undrain n1` the spread
// rule moves one back, and a re-apply of chat with other extra_args rolls
// both, ending one on each node. In each, never fewer than 2 replicas
// serve, replacements start one at a time (two may drain at once: an old
// one may drain as soon as the count serves elsewhere, design §5.5), every
// placement is marked draining before it goes, every draining engine is
// stopped by its agent once idle (not by the control plane's 30 s drain
// timeout), and no client request fails. The time each took is logged for
// docs/benchmarks.md.
func TestFailoverDrainAndRollUnderLoad(t *testing.T) {
	c := startCluster(t, 3)
	c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	var addrs []string
	for _, s := range c.servers {
		addrs = append(addrs, s.grpc)
	}
	via := c.servers[0].grpc
	n1 := startAgentProc(t, "n1", addrs)
	applyModel(t, via, "chat", 2)
	waitServing(t, via, "chat", 2)
	s := sampleRoll(via, "chat") // from before n2 attaches: it sees every drain
	defer s.stop()
	n2 := startAgentProc(t, "n2", []string{addrs[1], addrs[2], addrs[0]})
	if !eventually(30*time.Second, func() bool {
		out, err := ctlAt(via, "node", "list")
		return err == nil && strings.Contains(out, "n2")
	}) {
		t.Fatalf("n2 not registered within %v", within(30*time.Second))
	}
	// onEach: one serving replica on each node, nothing else; rev, when
	// set, is a revision neither may have.
	onEach := func(rev string) func() bool {
		return func() bool {
			list, err := rollReplicas(via, "chat")
			if err != nil || len(list) != 2 || list[0].Node == list[1].Node {
				return false
			}
			for _, r := range list {
				if !r.serving() || (rev != "" && string(r.ModelRevision) == rev) {
					return false
				}
			}
			return true
		}
	}
	if !eventually(60*time.Second, onEach("")) {
		list, _ := rollReplicas(via, "chat")
		t.Fatalf("chat not spread over n1 and n2 within %v: %+v", within(60*time.Second), list)
	}
	r1 := startRouterProc(t, "r1", addrs...)
	r2 := startRouterProc(t, "r2", addrs[2], addrs[1], addrs[0])
	waitServing(t, via, "chat", 2, r1, r2)

	l := startLoad("chat", 2, r1, r2)
	l.carry(t, time.Second, 20, "before the drain")
	s.reset()

	// Drain n1: its replica moves to n2.
	drainStart := time.Now()
	if _, err := ctlAt(via, "node", "drain", "n1"); err != nil {
		t.Fatalf("node drain n1: %v", err)
	}
	moved := func(node string, rev string) func() bool {
		return func() bool {
			list, err := rollReplicas(via, "chat")
			if err != nil || len(list) != 2 {
				return false
			}
			for _, r := range list {
				if r.Node != node || !r.serving() || (rev != "" && string(r.ModelRevision) == rev) {
					return false
				}
			}
			return true
		}
	}
	if !eventually(60*time.Second, moved("n2", "")) {
		list, _ := rollReplicas(via, "chat")
		t.Fatalf("chat not moved to n2 within %v: %+v", within(60*time.Second), list)
	}
	drainTook := time.Since(drainStart)
	s.settle(t)
	samples, minServing, maxDraining, maxStarting := s.phase()
	drainDrains := s.drains(drainStart)
	t.Logf("node drain n1: n1's replica on n2 in %s (%d samples, min serving %d, max draining %d, max starting %d); per replica (drain mark → removed): %s",
		drainTook.Round(10*time.Millisecond), samples, minServing, maxDraining, maxStarting, strings.Join(drainDrains, ", "))
	if minServing < 2 || maxStarting > 1 || len(drainDrains) != 1 {
		t.Errorf("node drain: min serving %d (want 2), replacements starting at once %d (want at most 1), %d placements drained before removal (want 1)",
			minServing, maxStarting, len(drainDrains))
	}

	// Undrain n1: the spread rule moves one back. Then re-apply chat with
	// other extra_args: a roll of both.
	if _, err := ctlAt(via, "node", "undrain", "n1"); err != nil {
		t.Fatalf("node undrain n1: %v", err)
	}
	s.reset()
	if !eventually(60*time.Second, onEach("")) {
		list, _ := rollReplicas(via, "chat")
		t.Fatalf("chat not spread again over n1 and n2 within %v of the undrain: %+v", within(60*time.Second), list)
	}
	s.settle(t)
	if _, minServing, _, maxStarting := s.phase(); minServing < 2 || maxStarting > 1 {
		t.Errorf("spread after the undrain: min serving %d (want 2), replacements starting at once %d (want at most 1)", minServing, maxStarting)
	}
	list, err := rollReplicas(via, "chat")
	if err != nil || len(list) == 0 {
		t.Fatalf("replica list: %v", err)
	}
	oldRev := string(list[0].ModelRevision)
	s.reset()
	rollStart := time.Now()
	file := filepath.Join(t.TempDir(), "chat.yaml")
	writeFile(t, file, "name: chat\nengine: sim\nmodel: org/chat\nreplicas: 2\ngpus_per_replica: 1\n"+
		"extra_args: [\"--sim-decode-ms-per-token\", \"2\"]\n")
	if _, err := ctlAt(via, "model", "apply", "-f", file); err != nil {
		t.Fatalf("re-apply chat: %v", err)
	}
	if !eventually(60*time.Second, onEach(oldRev)) {
		list, _ := rollReplicas(via, "chat")
		t.Fatalf("chat not rolled within %v: %+v", within(60*time.Second), list)
	}
	rollTook := time.Since(rollStart)
	s.settle(t)
	samples, minServing, maxDraining, maxStarting = s.phase()
	rollDrains := s.drains(rollStart)
	t.Logf("re-apply chat: both replicas rolled in %s (%d samples, min serving %d, max draining %d, max starting %d); per replica (drain mark → removed): %s",
		rollTook.Round(10*time.Millisecond), samples, minServing, maxDraining, maxStarting, strings.Join(rollDrains, ", "))
	if minServing < 2 || maxStarting > 1 || len(rollDrains) != 2 {
		t.Errorf("roll: min serving %d (want 2), replacements starting at once %d (want at most 1), %d placements drained before removal (want 2)",
			minServing, maxStarting, len(rollDrains))
	}
	l.checkNoFailures(t, 100)

	// Every drained engine was stopped by its agent, idle, not left to the
	// control plane's timeout: as many as the sampler saw drain and go.
	d1, _ := testkit.Scrape(n1.http, "llmgw_agent_drains_total", nil)
	d2, _ := testkit.Scrape(n2.http, "llmgw_agent_drains_total", nil)
	if all := s.drains(time.Time{}); d1+d2 != float64(len(all)) || len(all) < 5 {
		t.Errorf("agents stopped %v draining engines (n1 %v, n2 %v); the sampler saw %d drained and removed (want 5 or more: spread, drain, spread back, roll of 2): %v",
			d1+d2, d1, d2, len(all), all)
	}
	for _, a := range []*controlServer{n1, n2} {
		if strings.Contains(a.output(), "still busy at the drain timeout") {
			t.Errorf("%s stopped a draining engine at its timeout rather than idle", a.id)
		}
	}
}
