// Package endpoint is the router's view of the replicas it may send
// requests to (design §7.2): which replicas are routable per model, where they
// listen, and how loaded each is — by the engine's own gauges, streamed by
// each node's agent (design §6 "Load snapshots") or, for an agent that serves
// no snapshots, scraped by the router itself — and by the router's own count
// of requests in flight.
package endpoint

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/watch"
)

// Endpoint is one routable replica incarnation. An Endpoint is replaced, not
// changed, when the replica restarts or moves, so per-replica state (load,
// in-flight) is never carried over to another engine (design §4 "Identity").
type Endpoint struct {
	ReplicaID   string
	UID         uint64
	Incarnation uint64
	Model       string
	Node        string
	// Address is the engine's host:port, from the agent's status.
	Address string
	Weight  float64
	// KVCacheBlocks is how many KV-cache blocks the engine holds
	// (num_gpu_blocks, from the agent's status); 0 when it has not said.
	KVCacheBlocks uint64
	// RoutableSince is when this router first saw the incarnation
	// routable, on the registry's clock: how the waiting room tells a
	// replica that has just loaded (design §5.7). Zero for one already
	// routable in the first complete state the router received, whose
	// age it cannot know (a restarted router does not take a fleet that
	// has served for hours for a fresh one).
	RoutableSince time.Time

	reading  atomic.Pointer[timedReading]
	inflight atomic.Int64
}

// timedReading is a reading and when it was taken, on the router's clock;
// past staleAfter it counts as saturated. Scrapes use the registry's
// StaleAfter, snapshots a few of their agent's intervals.
type timedReading struct {
	Reading
	at         time.Time
	staleAfter time.Duration
}

type key struct {
	id          string
	uid, incarn uint64
	addr        string
}

func (e *Endpoint) key() key { return key{e.ReplicaID, e.UID, e.Incarnation, e.Address} }

// Acquire counts a request sent to the endpoint; the caller must call the
// returned func exactly once when the request ends.
func (e *Endpoint) Acquire() (release func()) {
	e.inflight.Add(1)
	var once sync.Once
	return func() { once.Do(func() { e.inflight.Add(-1) }) }
}

// Inflight is the number of this router's requests running on the endpoint.
func (e *Endpoint) Inflight() int64 { return e.inflight.Load() }

// Load is an endpoint's load as a scheduler sees it.
type Load struct {
	Reading
	Inflight int64
	// Saturated is set when there is no reading younger than the registry's
	// StaleAfter: an engine that cannot answer its metrics is taken to be
	// too busy to answer requests (design §7.2).
	Saturated bool
}

// Config configures a Registry.
type Config struct {
	// ScrapeInterval is how often each routable replica's /metrics is read
	// when its node's agent streams no load snapshots.
	ScrapeInterval time.Duration
	// StaleAfter is the age past which a scraped reading counts as
	// saturated.
	StaleAfter time.Duration
	// StaleIntervals is how many of its agent's intervals a snapshot
	// reading stays fresh (design §7.2 "a few intervals").
	StaleIntervals int
	// SubscribeInitial doubles per failed subscription up to SubscribeMax,
	// with jitter, between attempts to reach an agent's LoadService.
	SubscribeInitial, SubscribeMax time.Duration
	// ClientID names the router to agents.
	ClientID string
	// TLS, when set, is the router's certificate source for LoadService:
	// each agent dialed must present the agent certificate of the node it
	// serves (design §11). Nil is plain text.
	TLS *mtls.Source
	// Jitter returns a value in [0, 1); nil means math/rand/v2.
	Jitter func() float64
	// Client does the scrapes; its timeout should not exceed ScrapeInterval.
	Client *http.Client
	// Now is the clock; nil uses time.Now.
	Now func() time.Time
}

// DefaultConfig scrapes every 200 ms and trusts a reading for three
// intervals, scraped or streamed.
func DefaultConfig() Config {
	return Config{ScrapeInterval: 200 * time.Millisecond, StaleAfter: 600 * time.Millisecond,
		StaleIntervals: 3, SubscribeInitial: 100 * time.Millisecond, SubscribeMax: 5 * time.Second}
}

// Validate names the bad field.
func (c Config) Validate() error {
	if c.ScrapeInterval <= 0 {
		return fmt.Errorf("--scrape-interval: must be positive, got %s", c.ScrapeInterval)
	}
	if c.StaleAfter < c.ScrapeInterval {
		return fmt.Errorf("stale-after: %s is shorter than the scrape interval %s", c.StaleAfter, c.ScrapeInterval)
	}
	if c.StaleIntervals < 1 {
		return fmt.Errorf("stale-intervals: must be at least 1, got %d", c.StaleIntervals)
	}
	if c.SubscribeInitial <= 0 || c.SubscribeMax < c.SubscribeInitial {
		return fmt.Errorf("subscribe backoff: initial %s must be positive and at most max %s", c.SubscribeInitial, c.SubscribeMax)
	}
	return nil
}

// Source is where the registry learns the cluster: the watch client.
type Source interface {
	// Current returns the latest state; never nil, never mutated.
	Current() *watch.State
	// Changed is closed once a newer state than Current's is published.
	Changed() <-chan struct{}
}

// view is one immutable routing table.
type view struct {
	state *watch.State
	// sorted is state's models sorted by name, made once per view: every
	// request reads it (director's resolve), so it must not be made per call.
	sorted []*llmgwv1.Model
	models map[string][]*Endpoint // routable endpoints by model, sorted by replica id
	all    []*Endpoint
	// byNode indexes routable endpoints by node and replica id, for
	// applying a node's load snapshot.
	byNode map[string]map[string]*Endpoint
	// adapters resolves adapter names to their model (design §7.6).
	adapters map[string]AdapterRef
	// holds lists, per endpoint of a model with max_loaded_adapters > 0,
	// the adapters it holds (see Holds).
	holds map[*Endpoint]map[string]bool
	// maxModelLen is, per model, the least context length its routable
	// replicas report (see MaxModelLen).
	maxModelLen map[string]uint32
	// changed is closed when a newer view replaces this one.
	changed chan struct{}
}

// AdapterRef is what an adapter name in a request's `model` stands for.
type AdapterRef struct {
	// Model is the base model's name.
	Model string
	// Index is the adapter's position in the model's adapter list: the id
	// llama.cpp knows it by (its --lora flags are given in this order).
	Index int
}

// Registry turns the watch state into routable endpoints and keeps their
// load readings fresh. Lookup, Models, LoadOf are safe for concurrent use;
// Run is called once.
type Registry struct {
	cfg Config
	src Source
	log *slog.Logger
	now func() time.Time

	cur atomic.Pointer[view]

	// subs are the LoadService subscriptions by node id; only Run's
	// goroutine changes the map, scrapes read the published copy.
	subs      map[string]*subscription
	subsView  atomic.Pointer[map[string]*subscription]
	subsGroup sync.WaitGroup

	scrapes       *prometheus.CounterVec
	ready         prometheus.Gauge
	subscriptions prometheus.Gauge
	snapshots     prometheus.Counter
	readingAge    prometheus.Histogram
}

// New builds a registry from src's current state. reg receives its metrics
// (it may be nil).
func New(cfg Config, src Source, log *slog.Logger, reg prometheus.Registerer) (*Registry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.ScrapeInterval}
	}
	r := &Registry{cfg: cfg, src: src, log: log, now: cfg.Now}
	if r.now == nil {
		r.now = time.Now
	}
	r.scrapes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_router_scrapes_total",
		Help: "Engine /metrics scrapes, by result (ok, error).",
	}, []string{"result"})
	r.ready = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "llmgw_router_routable_replicas",
		Help: "Replicas the router may send requests to.",
	})
	r.subscriptions = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "llmgw_router_load_subscriptions",
		Help: "Agents whose load snapshots the router subscribes to.",
	})
	r.snapshots = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "llmgw_router_load_snapshots_total",
		Help: "Load snapshots received from agents.",
	})
	r.readingAge = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "llmgw_router_load_reading_age_seconds",
		Help:    "Age of each engine reading in a load snapshot when it arrives (the agent's clock, scrape to send).",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
	})
	if reg != nil {
		reg.MustRegister(r.scrapes, r.ready, r.subscriptions, r.snapshots, r.readingAge)
	}
	r.subs = map[string]*subscription{}
	r.subsView.Store(&map[string]*subscription{})
	r.cur.Store(&view{changed: make(chan struct{})})
	r.rebuild(src.Current())
	return r, nil
}

// Routable reports whether a replica may receive traffic (design §5.3): it is
// in desired state, neither draining nor marked to sleep (design §5.7: the
// agent puts it to sleep once what it runs has ended), its model exists,
// and its latest status for the same uid is READY with an address.
func Routable(st *watch.State, rep *llmgwv1.Replica) (*llmgwv1.ReplicaStatus, bool) {
	if rep.GetDraining() || rep.GetSleeping() || st.Models[rep.GetModel()] == nil {
		return nil, false
	}
	s := st.Status(rep)
	if s == nil || s.GetUid() != rep.GetUid() || s.GetPhase() != llmgwv1.ReplicaPhase_REPLICA_PHASE_READY || s.GetAddress() == "" {
		return nil, false
	}
	return s, true
}

// rebuild computes the routing table for st, keeping the Endpoint objects
// (and their readings and in-flight counts) of replicas that did not change.
func (r *Registry) rebuild(st *watch.State) {
	prevView := r.cur.Load()
	old := make(map[key]*Endpoint)
	for _, e := range prevView.all {
		old[e.key()] = e
	}
	// A replica new since a complete state was seen has just become
	// routable; before one, the router cannot tell.
	var since time.Time
	if prevView.state != nil && prevView.state.Synced {
		since = r.now()
	}
	v := &view{state: st, models: make(map[string][]*Endpoint), byNode: make(map[string]map[string]*Endpoint),
		adapters: adapterRefs(st), holds: map[*Endpoint]map[string]bool{}, changed: make(chan struct{}),
		sorted: sortedModels(st), maxModelLen: map[string]uint32{}}
	unknownLen := map[string]bool{}
	for _, rep := range st.Replicas {
		s, ok := Routable(st, rep)
		if !ok {
			continue
		}
		if n := s.GetMaxModelLen(); n == 0 {
			unknownLen[rep.GetModel()] = true
		} else if cur, seen := v.maxModelLen[rep.GetModel()]; !seen || n < cur {
			v.maxModelLen[rep.GetModel()] = n
		}
		e := &Endpoint{
			ReplicaID: rep.GetId(), UID: rep.GetUid(), Incarnation: s.GetIncarnation(),
			Model: rep.GetModel(), Node: rep.GetNode(), Address: s.GetAddress(), Weight: rep.GetWeight(),
			KVCacheBlocks: s.GetKvCacheBlocks(), RoutableSince: since,
		}
		if prev := old[e.key()]; prev != nil {
			e = prev
		}
		v.models[e.Model] = append(v.models[e.Model], e)
		v.all = append(v.all, e)
		if v.byNode[e.Node] == nil {
			v.byNode[e.Node] = map[string]*Endpoint{}
		}
		v.byNode[e.Node][e.ReplicaID] = e
		if h := heldAdapters(st, rep, e); h != nil {
			v.holds[e] = h
		}
	}
	for m := range unknownLen {
		delete(v.maxModelLen, m)
	}
	for _, eps := range v.models {
		slices.SortFunc(eps, func(a, b *Endpoint) int { return strings.Compare(a.ReplicaID, b.ReplicaID) })
	}
	prev := r.cur.Swap(v)
	close(prev.changed)
	r.ready.Set(float64(len(v.all)))
}

// adapterRefs indexes every model's adapters by name. Adapter names are
// unique across models (the control plane refuses a clash); a model of
// the same name wins, so an adapter can never shadow a model.
func adapterRefs(st *watch.State) map[string]AdapterRef {
	out := map[string]AdapterRef{}
	for _, m := range st.Models {
		for i, a := range m.GetAdapters() {
			if st.Models[a.GetName()] == nil {
				out[a.GetName()] = AdapterRef{Model: m.GetName(), Index: i}
			}
		}
	}
	return out
}

// heldAdapters is what a routable replica of a model with
// max_loaded_adapters > 0 holds: adapters still placed on it (an eviction
// removes the placement first, so routers stop sending before the agent
// unloads) and reported LOADED by this very incarnation — placed is not
// loaded (design §7.6). Nil for other models.
func heldAdapters(st *watch.State, rep *llmgwv1.Replica, e *Endpoint) map[string]bool {
	m := st.Models[rep.GetModel()]
	if !loadsOnDemand(m) {
		return nil
	}
	held := map[string]bool{}
	for _, a := range m.GetAdapters() {
		p := st.Placements[a.GetName()]
		if p == nil || p.GetModel() != m.GetName() || !slices.Contains(p.GetReplicas(), rep.GetId()) {
			continue
		}
		s := st.AdapterStatus(rep, a.GetName())
		if s.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_LOADED && s.GetUid() == e.UID && s.GetIncarnation() == e.Incarnation {
			held[a.GetName()] = true
		}
	}
	return held
}

// loadsOnDemand reports whether m's replicas hold only the adapters placed
// on them. With max_loaded_adapters 0 every replica loads every adapter at
// start, and llama.cpp always does.
func loadsOnDemand(m *llmgwv1.Model) bool {
	return m.GetMaxLoadedAdapters() > 0 && m.GetEngine() != "llamacpp" && len(m.GetAdapters()) > 0
}

// Adapter resolves an adapter name to its base model; false when no model
// in desired state lists it.
func (r *Registry) Adapter(name string) (AdapterRef, bool) {
	ref, ok := r.cur.Load().adapters[name]
	return ref, ok
}

// Holds reports whether e can serve adapter now. For a model whose
// replicas load adapters on demand it is what the agent reported LOADED
// on e's incarnation and is still placed there; for the others every
// routable replica holds every adapter of its model.
func (r *Registry) Holds(e *Endpoint, adapter string) bool {
	v := r.cur.Load()
	ref, ok := v.adapters[adapter]
	if !ok || ref.Model != e.Model || v.state == nil {
		return false
	}
	if loadsOnDemand(v.state.Models[e.Model]) {
		return v.holds[e][adapter] // an endpoint gone from the table holds nothing
	}
	return true
}

// Changed returns a channel closed once the routing table is rebuilt from
// a newer state: what a request waiting for an adapter to load waits on.
func (r *Registry) Changed() <-chan struct{} { return r.cur.Load().changed }

// Lookup returns the routable endpoints of a model and whether the model
// exists in desired state. The slice must not be modified.
func (r *Registry) Lookup(model string) (eps []*Endpoint, known bool) {
	v := r.cur.Load()
	if v.state == nil {
		return nil, false
	}
	_, known = v.state.Models[model]
	return v.models[model], known
}

// Models returns the models in desired state, sorted by name. The slice
// is shared by every caller until the state changes: do not modify it.
func (r *Registry) Models() []*llmgwv1.Model { return r.cur.Load().sorted }

func sortedModels(st *watch.State) []*llmgwv1.Model {
	if st == nil {
		return nil
	}
	out := make([]*llmgwv1.Model, 0, len(st.Models))
	for _, m := range st.Models {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b *llmgwv1.Model) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}

// MaxModelLen is the longest prompt plus completion, in tokens, that every
// routable replica of model accepts, as their engines' own model cards say
// (ReplicaStatus.max_model_len): the least of them, so a client sizing its
// requests by it gets no 400 from whichever replica it lands on. False when
// no replica is routable or one of them did not say (llama.cpp's card
// has no such field): a guess could be too long for that one.
func (r *Registry) MaxModelLen(model string) (int, bool) {
	n, ok := r.cur.Load().maxModelLen[model]
	return int(n), ok
}

// Synced reports whether the registry has a complete desired state to route
// from (the router's readiness).
func (r *Registry) Synced() bool {
	v := r.cur.Load()
	return v.state != nil && v.state.Synced
}

// LoadOf returns e's load now.
func (r *Registry) LoadOf(e *Endpoint) Load {
	l := Load{Inflight: e.Inflight(), Saturated: true}
	if rd := e.reading.Load(); rd != nil {
		l.Reading = rd.Reading
		l.Saturated = r.now().Sub(rd.at) > rd.staleAfter
	}
	return l
}

// Run follows the source, keeps one load subscription per node with
// routable replicas and an agent address, and scrapes every other routable
// endpoint each ScrapeInterval, until ctx is cancelled. It returns after
// every subscription and scrape it started has ended: scrapes first (they
// run inline), then the subscriptions, cancelled together and waited for.
func (r *Registry) Run(ctx context.Context) error {
	defer r.stopSubs()
	t := time.NewTicker(r.cfg.ScrapeInterval)
	defer t.Stop()
	changed := r.src.Changed()
	r.rebuild(r.src.Current())
	r.syncSubs(ctx)
	r.scrapeAll(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			changed = r.src.Changed()
			r.rebuild(r.src.Current())
			r.syncSubs(ctx)
		case <-t.C:
			r.scrapeAll(ctx)
		}
	}
}

// scrapeAll reads the metrics of every endpoint whose agent streams no
// fresh snapshots of it, concurrently, and waits for all; the client's timeout
// bounds the round.
func (r *Registry) scrapeAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, e := range r.cur.Load().all {
		// A node's stream covers the replicas its snapshots carry; one
		// it leaves out (an external engine its agent cannot read) is
		// scraped here, so it is not taken to be saturated for ever
		// (flow control would hold its requests, design §7.8).
		if r.covered(e.Node) && !r.LoadOf(e).Saturated {
			continue
		}
		wg.Go(func() {
			rd, err := r.scrape(ctx, e)
			if err != nil {
				r.scrapes.WithLabelValues("error").Inc()
				r.log.Debug("endpoint: scrape failed", "replica", e.ReplicaID, "model", e.Model, "err", err)
				return
			}
			r.scrapes.WithLabelValues("ok").Inc()
			e.reading.Store(&timedReading{Reading: rd, at: r.now(), staleAfter: r.cfg.StaleAfter})
		})
	}
	wg.Wait()
}

func (r *Registry) scrape(ctx context.Context, e *Endpoint) (Reading, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.Address+"/metrics", nil)
	if err != nil {
		return Reading{}, fmt.Errorf("scrape %s: %w", e.Address, err)
	}
	resp, err := r.cfg.Client.Do(req)
	if err != nil {
		return Reading{}, fmt.Errorf("scrape %s: %w", e.Address, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Reading{}, fmt.Errorf("scrape %s: status %d", e.Address, resp.StatusCode)
	}
	rd, err := parseLoad(resp.Body)
	if err != nil {
		return Reading{}, fmt.Errorf("scrape %s: %w", e.Address, err)
	}
	return rd, nil
}

// SetReading records a reading taken at the registry's now; for tests of
// code that schedules on loads.
func (r *Registry) SetReading(e *Endpoint, rd Reading) {
	e.reading.Store(&timedReading{Reading: rd, at: r.now(), staleAfter: r.cfg.StaleAfter})
}
