package leader

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// roundsDesired counts placement rounds: each reads the state once.
type roundsDesired struct {
	*fakeDesired
	mu     sync.Mutex
	starts []time.Time
}

func (d *roundsDesired) State() *llmgwv1.State {
	d.mu.Lock()
	d.starts = append(d.starts, time.Now())
	d.mu.Unlock()
	return d.fakeDesired.State()
}

func (d *roundsDesired) rounds() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]time.Time(nil), d.starts...)
}

// TestPlacePaced: however many entries apply and reports arrive, Place
// runs at most one round per PlaceInterval, and the round after a burst
// sees all of it; a change that finds the loop idle past the interval is
// acted on at once (issue 30).
func TestPlacePaced(t *testing.T) {
	cfg := testConfig()
	cfg.PlaceInterval = 300 * time.Millisecond
	r := newRig(t, cfg, &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 1)}})
	d := &roundsDesired{fakeDesired: r.desired}
	r.l.state = d
	startPlace(t, r)
	testkit.Wait(t, "the first round", func() bool { return len(d.rounds()) == 1 })

	// A burst: 50 applied entries and 50 reports.
	for i := range 50 {
		r.desired.update(func(st *llmgwv1.State) { st.Nodes[0].Labels = map[string]string{"i": fmt.Sprint(i)} })
		report(r, status("x", uint64(i), ready))
	}
	testkit.Wait(t, "a round after the burst", func() bool { return len(d.rounds()) == 2 })
	// None more: the round read the burst's last entry. Shown over twice
	// the interval, in which a second round would have come.
	if err := testkit.Throughout(2*cfg.PlaceInterval, 0, func() error {
		if n := len(d.rounds()); n != 2 {
			return fmt.Errorf("%d rounds for one burst, want 1", n-1)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Idle past the interval: one change is acted on at once.
	changed := time.Now()
	r.desired.update(func(st *llmgwv1.State) { st.Models = append(st.Models, model("m", 1, 1)) })
	testkit.Wait(t, "m placed", func() bool { return len(r.desired.State().Replicas) == 1 })
	rounds := d.rounds()
	if gap := rounds[1].Sub(rounds[0]); gap < cfg.PlaceInterval-10*time.Millisecond {
		t.Errorf("the round after the burst came %v after the first, want at least the interval %v", gap, cfg.PlaceInterval)
	}
	if lag := rounds[2].Sub(changed); lag >= cfg.PlaceInterval {
		t.Errorf("an idle loop took %v to act on a change, want under the interval %v", lag, cfg.PlaceInterval)
	}
}

// gatedProposer holds every proposal until the test opens the gate, and
// records the most in flight at once and each kind's span.
type gatedProposer struct {
	next *fakeProposer
	gate chan struct{}

	mu             sync.Mutex
	inFlight, most int
	first, last    map[llmgwv1.CommandType]int // the order of start and end
	seq            int
}

func (p *gatedProposer) Propose(ctx context.Context, typ llmgwv1.CommandType, msg proto.Message) (any, uint64, error) {
	p.mu.Lock()
	p.inFlight++
	p.most = max(p.most, p.inFlight)
	p.seq++
	if _, ok := p.first[typ]; !ok {
		p.first[typ] = p.seq
	}
	p.mu.Unlock()
	<-p.gate
	res, rev, err := p.next.Propose(ctx, typ, msg)
	p.mu.Lock()
	p.inFlight--
	p.seq++
	p.last[typ] = p.seq
	p.mu.Unlock()
	return res, rev, err
}

func (p *gatedProposer) flying() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inFlight
}

// TestProposeInFlight: a round's decisions of one kind are proposed up to
// PlaceInFlight at once (Raft commits them together), every one of them;
// the kinds still go in order — every removal committed before a drain is
// proposed, every drain before a placement.
func TestProposeInFlight(t *testing.T) {
	cfg := testConfig()
	cfg.PlaceInFlight = 4
	st := &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 8), active("n2", 8)},
		Models: []*llmgwv1.Model{model("m", 10, 1), model("x", 1, 1)},
		Replicas: []*llmgwv1.Replica{replica("x-0", 1, "x", "n1", 0), replica("x-1", 2, "x", "n1", 1), replica("x-2", 3, "x", "n2", 0),
			draining(replica("x-3", 4, "x", "n2", 1)), draining(replica("x-4", 5, "x", "n2", 2))}}
	r := newRig(t, cfg, st)
	report(r, status("x-0", 1, ready), status("x-1", 2, ready), status("x-2", 3, ready), status("x-3", 4, stopped), status("x-4", 5, stopped))
	gp := &gatedProposer{next: r.prop, gate: make(chan struct{}), first: map[llmgwv1.CommandType]int{}, last: map[llmgwv1.CommandType]int{}}
	r.l.propose = gp
	done := make(chan bool, 1)
	go func() { done <- r.l.reconcileOnce(context.Background(), newTerm(r.clock.Now())) }()
	// Each kind's decisions are held until as many as may be are in
	// flight: the two removals, then the two drains, then four of the ten
	// placements; then the gate opens for good.
	started := func(typ llmgwv1.CommandType) bool {
		gp.mu.Lock()
		defer gp.mu.Unlock()
		_, ok := gp.first[typ]
		return ok
	}
	testkit.Wait(t, "both removals in flight", func() bool { return gp.flying() == 2 })
	gp.gate <- struct{}{}
	gp.gate <- struct{}{}
	testkit.Wait(t, "both drains in flight", func() bool {
		return started(llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_DRAINING) && gp.flying() == 2
	})
	gp.gate <- struct{}{}
	gp.gate <- struct{}{}
	testkit.Wait(t, "four placements in flight", func() bool { return gp.flying() == cfg.PlaceInFlight })
	close(gp.gate)
	if failed := <-done; failed {
		t.Fatal("reconcileOnce reported a failed decision; the fake refuses none")
	}
	const (
		remove = llmgwv1.CommandType_COMMAND_TYPE_REMOVE_REPLICA
		drain  = llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_DRAINING
		place  = llmgwv1.CommandType_COMMAND_TYPE_PLACE_REPLICA
	)
	count := map[llmgwv1.CommandType]int{}
	for _, p := range r.prop.proposed() {
		count[p.typ]++
	}
	if count[remove] != 2 || count[drain] != 2 || count[place] != 10 {
		t.Fatalf("proposed %v, want 2 removals, 2 drains (x has 3 for 1), 10 placements", count)
	}
	if gp.most != cfg.PlaceInFlight {
		t.Errorf("at most %d in flight, want %d", gp.most, cfg.PlaceInFlight)
	}
	if !(gp.last[remove] < gp.first[drain] && gp.last[drain] < gp.first[place]) {
		t.Errorf("kinds overlap: removals %d..%d, drains %d..%d, placements %d..%d",
			gp.first[remove], gp.last[remove], gp.first[drain], gp.last[drain], gp.first[place], gp.last[place])
	}
	ids := map[string]bool{}
	for _, r := range r.desired.State().Replicas {
		ids[r.Id] = true
	}
	for i := range 10 {
		if !ids[fmt.Sprintf("m-%d", i)] {
			t.Errorf("m-%d was not placed; replicas %v", i, ids)
		}
	}
}

// TestProposeInFlightStopsWithTheTerm: once the term's context ends, no
// further decision is proposed, and the round reports a failure.
func TestProposeInFlightStopsWithTheTerm(t *testing.T) {
	cfg := testConfig()
	cfg.PlaceInFlight = 2
	r := newRig(t, cfg, &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 8)}, Models: []*llmgwv1.Model{model("m", 8, 1)}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.prop.fail = func(proposal) error {
		cancel() // the term ends during the first proposals
		return fmt.Errorf("propose: %w", context.Canceled)
	}
	if !r.l.reconcileOnce(ctx, newTerm(r.clock.Now())) {
		t.Fatal("a round cut by the term's end reported no failure")
	}
	if n := len(r.prop.proposed()); n > cfg.PlaceInFlight+1 {
		t.Fatalf("%d proposals after the term ended, want at most %d (those already started)", n, cfg.PlaceInFlight+1)
	}
}

// TestUnplacedSaid: a model short of replicas has its reason in Unplaced
// and in the log at the default level, once per change rather than per
// round; once it fits the reason goes (and the log says so); a term's
// reasons end with it.
func TestUnplacedSaid(t *testing.T) {
	r := newRig(t, testConfig(), &llmgwv1.State{Nodes: []*llmgwv1.Node{active("dev", 2)}, Models: []*llmgwv1.Model{model("chat", 3, 1)}})
	term := newTerm(r.clock.Now())
	round := func() {
		t.Helper()
		if r.l.reconcileOnce(context.Background(), term) {
			t.Fatal("a decision failed")
		}
	}
	const placing = "1 of 3 replicas cannot be placed: each needs 1 GPU; matching nodes: dev (2 GPUs, 0 free: 2 held by 2 new of chat)"
	const placed = "1 of 3 replicas cannot be placed: each needs 1 GPU; matching nodes: dev (2 GPUs, 0 free: 2 held by chat-0, chat-1)"
	round()
	if got := r.l.Unplaced("chat"); got != placing {
		t.Fatalf("Unplaced(chat) = %q, want %q", got, placing)
	}
	for range 3 {
		round()
	}
	if got := r.l.Unplaced("chat"); got != placed {
		t.Fatalf("Unplaced(chat) = %q, want %q", got, placed)
	}
	logs := r.logs.String()
	if n := strings.Count(logs, `msg="replicas cannot be placed"`); n != 2 {
		t.Fatalf("the reason logged %d times over 4 rounds and 2 reasons, want 2:\n%s", n, logs)
	}
	if !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "chat-0, chat-1") {
		t.Fatalf("the log lacks the reason at WARN:\n%s", logs)
	}
	if got := r.l.Unplaced("other"); got != "" {
		t.Fatalf("Unplaced(other) = %q, want none", got)
	}

	// A node attaches: the model fits, its reason goes.
	r.desired.update(func(st *llmgwv1.State) { st.Nodes = append(st.Nodes, active("dev2", 2)) })
	round()
	if got := r.l.Unplaced("chat"); got != "" {
		t.Fatalf("Unplaced(chat) = %q after it fit", got)
	}
	if !strings.Contains(r.logs.String(), "no replica of the model is left unplaced") {
		t.Fatal("the log does not say the shortfall ended")
	}

	// A term's reasons end with it.
	r.desired.update(func(st *llmgwv1.State) { st.Models[0].Replicas = 9 })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.l.Place(ctx) }()
	testkit.Wait(t, "chat short again", func() bool { return r.l.Unplaced("chat") != "" })
	cancel()
	<-done
	if got := r.l.Unplaced("chat"); got != "" {
		t.Fatalf("Unplaced(chat) = %q after the term ended", got)
	}
}

// TestUnplacedConcurrent: Unplaced may be read while placement runs.
func TestUnplacedConcurrent(t *testing.T) {
	cfg := testConfig()
	cfg.PlaceInterval = time.Millisecond
	r := newRig(t, cfg, &llmgwv1.State{Nodes: []*llmgwv1.Node{active("dev", 1)}, Models: []*llmgwv1.Model{model("chat", 2, 1)}})
	startPlace(t, r)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			r.desired.update(func(st *llmgwv1.State) { st.Models[0].Replicas = uint32(2 + i%3) })
		}
	})
	testkit.Wait(t, "a reason", func() bool { return strings.Contains(r.l.Unplaced("chat"), "cannot be placed") })
	close(stop)
	wg.Wait()
}

// TestMarkedDownGraceStartsAtOnce: a node the leader marks DOWN is seen
// DOWN from that moment, so its replicas are rescheduled RescheduleAfter
// later by the leader's clock, however late the next round comes (rounds
// are paced; the round that marked it read the state from before).
func TestMarkedDownGraceStartsAtOnce(t *testing.T) {
	cfg := testConfig()
	st := &llmgwv1.State{
		Nodes:    []*llmgwv1.Node{active("n1", 1), active("n2", 1)},
		Models:   []*llmgwv1.Model{model("m", 1, 1)},
		Replicas: []*llmgwv1.Replica{replica("m-0", 1, "m", "n1", 0)},
	}
	r := newRig(t, cfg, st)
	report(r, status("m-0", 1, ready))
	r.sessions.detached["n1"] = t0
	term := newTerm(t0)
	r.clock.Add(cfg.NodeDownAfter)
	if r.l.reconcileOnce(context.Background(), term) {
		t.Fatal("a decision failed")
	}
	wantProposals(t, r.prop.proposed(), []proposal{nodeDown("n1")})
	r.prop.reset()
	r.clock.Add(cfg.RescheduleAfter)
	if r.l.reconcileOnce(context.Background(), term) {
		t.Fatal("a decision failed")
	}
	wantProposals(t, r.prop.proposed(), []proposal{remove("m-0", 1), place("m", "n2", 0)})
}
