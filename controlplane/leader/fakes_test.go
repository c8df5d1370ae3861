package leader

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The fakes below stand for what the leader consumes (leader.go's
// interfaces): the desired state with a tiny FSM behind the proposer, the
// agents' reports, the session table and the cluster. Each one is safe for
// concurrent use, as the real ones are: Place and EnsureAdapter read them
// from their own goroutines.

// t0 is the fake clock's start: a fixed instant, so expected times are
// exact.
var t0 = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

// fakeClock is the leader's clock (New's now), moved only by the test.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// fakeDesired is the replicated desired state: a State the test (or the
// fake proposer's apply) changes through update, which closes Applied's
// channel as the FSM does at every applied entry.
type fakeDesired struct {
	mu      sync.Mutex
	st      *llmgwv1.State
	rev     uint64
	uids    uint64 // the last uid given to a new replica
	applied chan struct{}
}

func newFakeDesired(st *llmgwv1.State) *fakeDesired {
	if st == nil {
		st = &llmgwv1.State{}
	}
	d := &fakeDesired{st: proto.Clone(st).(*llmgwv1.State), applied: make(chan struct{})}
	for _, r := range st.Replicas {
		d.uids = max(d.uids, r.Uid)
	}
	return d
}

func (d *fakeDesired) State() *llmgwv1.State {
	d.mu.Lock()
	defer d.mu.Unlock()
	return proto.Clone(d.st).(*llmgwv1.State)
}

func (d *fakeDesired) Applied() (uint64, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rev, d.applied
}

func (d *fakeDesired) AdapterModel(adapter string) (*llmgwv1.Model, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, m := range d.st.Models {
		if slices.ContainsFunc(m.Adapters, func(a *llmgwv1.Adapter) bool { return a.GetName() == adapter }) {
			return proto.Clone(m).(*llmgwv1.Model), true
		}
	}
	return nil, false
}

func (d *fakeDesired) AdapterPlacement(adapter string) (*llmgwv1.AdapterPlacement, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.st.AdapterPlacements {
		if p.Adapter == adapter {
			return proto.Clone(p).(*llmgwv1.AdapterPlacement), true
		}
	}
	return nil, false
}

func (d *fakeDesired) Tenant(name string) (*llmgwv1.Tenant, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, t := range d.st.Tenants {
		if t.Name == name {
			return proto.Clone(t).(*llmgwv1.Tenant), true
		}
	}
	return nil, false
}

func (d *fakeDesired) UsageTokens(tenant, model string, fromUnix int64) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var n uint64
	for _, r := range d.st.Usage {
		if r.Tenant == tenant && (model == "" || r.Model == model) && r.HourUnix >= fromUnix {
			n += r.Counts.GetInputTokens() + r.Counts.GetOutputTokens()
		}
	}
	return n
}

// update changes the state as one applied entry.
func (d *fakeDesired) update(fn func(st *llmgwv1.State)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fn(d.st)
	d.rev++
	d.st.Revision = d.rev
	close(d.applied)
	d.applied = make(chan struct{})
}

// apply is the little of the FSM the leader's commands need: new replicas
// get the next ordinal's id and a fresh uid, an empty adapter placement
// deletes it. It checks nothing: the leader's tests assert what it
// proposes, the FSM's own tests what it refuses.
func (d *fakeDesired) apply(typ llmgwv1.CommandType, msg proto.Message) (res any) {
	d.update(func(st *llmgwv1.State) {
		switch c := msg.(type) {
		case *llmgwv1.PlaceReplicaCommand:
			r := proto.Clone(c.Replica).(*llmgwv1.Replica)
			if st.NextOrdinal == nil {
				st.NextOrdinal = map[string]uint64{}
			}
			r.Id = r.Model + "-" + strconv.FormatUint(st.NextOrdinal[r.Model], 10)
			st.NextOrdinal[r.Model]++
			d.uids++
			r.Uid = d.uids
			st.Replicas = append(st.Replicas, r)
			res = proto.Clone(r)
		case *llmgwv1.RemoveReplicaCommand:
			st.Replicas = slices.DeleteFunc(st.Replicas, func(r *llmgwv1.Replica) bool { return r.Id == c.Id && r.Uid == c.Uid })
		case *llmgwv1.SetReplicaDrainingCommand:
			for _, r := range st.Replicas {
				if r.Id == c.Id && r.Uid == c.Uid {
					r.Draining = true
				}
			}
		case *llmgwv1.SetNodeStateCommand:
			for _, n := range st.Nodes {
				if n.Id == c.Id {
					n.State = c.State
				}
			}
		case *llmgwv1.SetModelScaleCommand:
			st.Scales = slices.DeleteFunc(st.Scales, func(s *llmgwv1.ModelScale) bool { return s.Model == c.Model })
			st.Scales = append(st.Scales, &llmgwv1.ModelScale{Model: c.Model, Replicas: c.Replicas, Reason: c.Reason})
		case *llmgwv1.SetAdapterPlacementCommand:
			p := proto.Clone(c.Placement).(*llmgwv1.AdapterPlacement)
			st.AdapterPlacements = slices.DeleteFunc(st.AdapterPlacements, func(o *llmgwv1.AdapterPlacement) bool { return o.Adapter == p.Adapter })
			if len(p.Replicas) > 0 {
				st.AdapterPlacements = append(st.AdapterPlacements, p)
				res = proto.Clone(p)
			}
		default:
			panic(fmt.Sprintf("fake FSM: command %v not modelled", typ))
		}
	})
	return res
}

// proposal is one command the leader proposed.
type proposal struct {
	typ llmgwv1.CommandType
	msg proto.Message
}

func (p proposal) String() string { return fmt.Sprintf("%v{%v}", p.typ, p.msg) }

// fakeProposer records every command the leader proposes, refuses those
// fail says to, and applies the rest to desired (when set) before
// returning, as the gate over the store does: Propose returns once the
// entry is applied. onApplied, when set, runs after a command is applied:
// an agent acting on it.
type fakeProposer struct {
	desired   *fakeDesired
	fail      func(proposal) error
	onApplied func(proposal)

	mu   sync.Mutex
	cmds []proposal
}

func (p *fakeProposer) Propose(_ context.Context, typ llmgwv1.CommandType, msg proto.Message) (any, uint64, error) {
	c := proposal{typ, proto.Clone(msg)}
	p.mu.Lock()
	p.cmds = append(p.cmds, c)
	p.mu.Unlock()
	if p.fail != nil {
		if err := p.fail(c); err != nil {
			return nil, 0, err
		}
	}
	var res any
	var rev uint64
	if p.desired != nil {
		res = p.desired.apply(typ, msg)
		rev, _ = p.desired.Applied()
	}
	if p.onApplied != nil {
		p.onApplied(c)
	}
	return res, rev, nil
}

// proposed returns a copy of the commands proposed so far.
func (p *fakeProposer) proposed() []proposal {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.cmds)
}

// reset forgets the commands proposed so far.
func (p *fakeProposer) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cmds = nil
}

// fakeReports are the agents' reports, by replica id; like the ephemeral
// plane, a report counts only for the replica's own uid.
type fakeReports struct {
	mu       sync.Mutex
	status   map[string]*llmgwv1.ReplicaStatus
	adapters map[string]map[string]*llmgwv1.AdapterStatus
	changed  chan struct{}
	// adapterReads counts AdaptersOf calls: a test waits for a round of
	// EnsureAdapter to have read the reports before it changes them.
	adapterReads atomic.Int64
}

func newFakeReports() *fakeReports {
	return &fakeReports{status: map[string]*llmgwv1.ReplicaStatus{},
		adapters: map[string]map[string]*llmgwv1.AdapterStatus{}, changed: make(chan struct{})}
}

func (f *fakeReports) StatusOf(r *llmgwv1.Replica) *llmgwv1.ReplicaStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.status[r.Id]
	if !ok || s.Uid != r.Uid {
		return nil
	}
	return proto.Clone(s).(*llmgwv1.ReplicaStatus)
}

func (f *fakeReports) AdaptersOf(r *llmgwv1.Replica) map[string]*llmgwv1.AdapterStatus {
	f.adapterReads.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]*llmgwv1.AdapterStatus{}
	for name, s := range f.adapters[r.Id] {
		if s.Uid == r.Uid {
			out[name] = proto.Clone(s).(*llmgwv1.AdapterStatus)
		}
	}
	return out
}

func (f *fakeReports) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

// setPhase reports replica id (of uid) in phase.
func (f *fakeReports) setPhase(id string, uid uint64, phase llmgwv1.ReplicaPhase) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status[id] = &llmgwv1.ReplicaStatus{ReplicaId: id, Uid: uid, Phase: phase}
	f.bump()
}

// setAdapter reports one adapter on replica id (of uid).
func (f *fakeReports) setAdapter(id string, uid uint64, s *llmgwv1.AdapterStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s = proto.Clone(s).(*llmgwv1.AdapterStatus)
	s.ReplicaId, s.Uid = id, uid
	if f.adapters[id] == nil {
		f.adapters[id] = map[string]*llmgwv1.AdapterStatus{}
	}
	f.adapters[id][s.Adapter] = s
	f.bump()
}

func (f *fakeReports) bump() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// fakeSessions: since when each node has had no agent session; a node
// missing from detached has one.
type fakeSessions struct {
	mu       sync.Mutex
	detached map[string]time.Time
}

func (s *fakeSessions) DetachedSince(node string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.detached[node]
	return at, ok
}

type fakeCluster struct{ visible bool }

func (c fakeCluster) SessionsVisible() bool { return c.visible }

// syncBuffer is a log sink the leader's goroutines and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// rig is a Leader over fakes, with the fakes at hand.
type rig struct {
	l        *Leader
	clock    *fakeClock
	desired  *fakeDesired
	prop     *fakeProposer
	reports  *fakeReports
	sessions *fakeSessions
	reg      *prometheus.Registry
	logs     *syncBuffer
}

// testConfig has every interval long, so nothing happens by time passing
// unless a test shortens it or moves the fake clock.
func testConfig() Config {
	return Config{
		ReconcileInterval: time.Hour,
		NodeDownAfter:     10 * time.Second,
		RescheduleAfter:   30 * time.Second,
		DrainTimeout:      time.Minute,
		AdapterMinIdle:    time.Minute,
		AdapterRetryAfter: 2 * time.Second,
		// One decision at a time, in the plan's order: the tests assert
		// the order (placement_test.go tests PlaceInFlight > 1).
		PlaceInFlight: 1,
	}
}

func newRig(t *testing.T, cfg Config, st *llmgwv1.State) *rig {
	t.Helper()
	r := &rig{clock: &fakeClock{now: t0}, desired: newFakeDesired(st), reports: newFakeReports(),
		sessions: &fakeSessions{detached: map[string]time.Time{}}, reg: prometheus.NewRegistry(), logs: &syncBuffer{}}
	r.prop = &fakeProposer{desired: r.desired}
	log := slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r.l = New(cfg, r.prop, r.desired, r.reports, r.sessions, fakeCluster{visible: true}, NewMetrics(r.reg), log, r.clock.Now)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("leader's log:\n%s", r.logs.String())
		}
	})
	return r
}

// wantProposals fails t unless got is want, command by command.
func wantProposals(t *testing.T, got, want []proposal) {
	t.Helper()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i].typ == want[i].typ && proto.Equal(got[i].msg, want[i].msg)
	}
	if !ok {
		t.Fatalf("proposed:\n  %s\nwant:\n  %s", list(got), list(want))
	}
}

func list(ps []proposal) string {
	if len(ps) == 0 {
		return "(nothing)"
	}
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, "\n  ")
}

// Builders for states: terse, so a table row reads as the fleet it is.

func node(id string, gpus uint32, state llmgwv1.NodeState) *llmgwv1.Node {
	return &llmgwv1.Node{Id: id, Gpus: gpus, State: state}
}

func active(id string, gpus uint32) *llmgwv1.Node {
	return node(id, gpus, llmgwv1.NodeState_NODE_STATE_ACTIVE)
}

func model(name string, replicas, gpus uint32) *llmgwv1.Model {
	return &llmgwv1.Model{Name: name, Engine: "vllm", Replicas: replicas, GpusPerReplica: gpus}
}

func replica(id string, uid uint64, model, node string, gpus ...uint32) *llmgwv1.Replica {
	return &llmgwv1.Replica{Id: id, Uid: uid, Model: model, Node: node, GpuIndices: gpus, Weight: 1}
}

func draining(r *llmgwv1.Replica) *llmgwv1.Replica {
	r.Draining = true
	return r
}

// Commands as the leader proposes them.

func place(model, node string, gpus ...uint32) proposal {
	return proposal{llmgwv1.CommandType_COMMAND_TYPE_PLACE_REPLICA,
		&llmgwv1.PlaceReplicaCommand{Replica: &llmgwv1.Replica{Model: model, Node: node, GpuIndices: gpus, Weight: 1}}}
}

func remove(id string, uid uint64) proposal {
	return proposal{llmgwv1.CommandType_COMMAND_TYPE_REMOVE_REPLICA, &llmgwv1.RemoveReplicaCommand{Id: id, Uid: uid}}
}

func drain(id string, uid uint64) proposal {
	return proposal{llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_DRAINING, &llmgwv1.SetReplicaDrainingCommand{Id: id, Uid: uid}}
}

func nodeDown(id string) proposal {
	return proposal{llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_STATE, &llmgwv1.SetNodeStateCommand{Id: id, State: llmgwv1.NodeState_NODE_STATE_DOWN}}
}

func setAdapter(model, adapter string, replicas ...string) proposal {
	return proposal{llmgwv1.CommandType_COMMAND_TYPE_SET_ADAPTER_PLACEMENT,
		&llmgwv1.SetAdapterPlacementCommand{Placement: &llmgwv1.AdapterPlacement{Model: model, Adapter: adapter, Replicas: replicas}}}
}
