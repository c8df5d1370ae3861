package director

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/scheduler"
)

// AdapterUseReporter sends this router's requests in flight per adapter
// and replica to the control plane (AdapterService.ReportAdapterUse on
// any control server, which forwards it to the leader). It is called by
// one goroutine at a time.
type AdapterUseReporter interface {
	ReportAdapterUse(ctx context.Context, r *llmgwv1.AdapterUseReport) (*llmgwv1.AdapterUseReportResponse, error)
}

// WithAdapterUse makes the director count its requests in flight per
// adapter and replica and report them through rep as router (its id), so
// the leader evicts only adapters no router is using (design §7.6); log
// receives the reports' failures.
func WithAdapterUse(rep AdapterUseReporter, router string, log *slog.Logger) Option {
	return func(o *options) { o.use = &useOptions{rep: rep, router: router, log: log} }
}

type useOptions struct {
	rep    AdapterUseReporter
	router string
	log    *slog.Logger
}

// The pace of the reports. A change is sent at once unless one went out
// within useMinGap (then at the end of it: a burst costs one report per
// gap, not one per request) — but at once when a request waits for it;
// the whole is sent again every useKeepalive regardless, as the leader
// keeps a report only 3 s. A failed report is sent again after useRetry,
// doubling to useKeepalive.
const (
	useMinGap    = 25 * time.Millisecond
	useKeepalive = time.Second
	useRetry     = 100 * time.Millisecond
	useTimeout   = 2 * time.Second
)

// useAnswerWait bounds how long a request for an adapter this router has
// not used lately waits for the control plane to acknowledge it before it
// is sent (adapterUse.acquire): routers never block traffic on the
// control plane for longer (design §5.6), and not at all while reports
// fail.
const useAnswerWait = 200 * time.Millisecond

// useRetain is how long an adapter's use on a replica stays in the
// reports once its last request ended: the leader reads the last use for
// adapter_min_idle and for the least recently used, and the agents' own
// readings are enough for uses older than this.
const useRetain = time.Minute

// maxReportUses bounds a report (the control plane refuses more than
// 4096): the uses with requests in flight first, then the most recent.
const maxReportUses = 1024

// useKey is one adapter on one replica incarnation.
type useKey struct {
	adapter string
	rep     scheduler.Key
}

// useCount is a key's requests in flight and when the last one ended,
// and the same as the control plane last acknowledged them.
type useCount struct {
	n    int
	last time.Time

	ackedN    int
	ackedLast time.Time
}

// adapterUse counts this router's requests in flight per adapter and
// replica and reports them (design §7.6). A request counts from the
// moment its attempt is chosen until its answer has been passed on in
// full (or the attempt failed, or the client left): always at least as
// long as the engine has it, so a count of 0 means the engine has nothing
// of this router's for the adapter.
//
// A count alone would leave a race: the leader may decide an eviction
// while a report of a new request is on its way. So a request for an
// adapter the leader does not already hold busy on this router's word —
// none in flight there that it acknowledged, nor a use it acknowledged
// within half its adapter_min_idle — is sent only once the report counting
// it is acknowledged (at most useAnswerWait). The leader keeps reports and
// commits evictions under one lock, so the request then either was in
// view of every eviction decision or follows its commit (and the table's
// change then sends the next ones elsewhere).
type adapterUse struct {
	rep     AdapterUseReporter
	router  string
	session uint64
	models  Models
	log     *slog.Logger
	now     func() time.Time
	m       *adapterMetrics

	// The reports run from the first request counted until close: a
	// router that never served an adapter has nothing to report, and one
	// built but never run starts nothing.
	start  sync.Once
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	uses    map[useKey]*useCount
	changed chan struct{}
	// urgent: a request waits for the next report's answer.
	urgent bool
	// minIdle is the leader's adapter_min_idle from its last answer (0
	// before any).
	minIdle time.Duration
	// taken is the seq of the last report whose uses were read, acked of
	// the last one answered; answered is closed at every answer or
	// failure; failing: the last report failed, and nobody waits.
	taken, acked uint64
	answered     chan struct{}
	failing      bool
}

func newAdapterUse(o *useOptions, models Models, m *adapterMetrics) *adapterUse {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on Linux; a zero session is redrawn below
	session := binary.LittleEndian.Uint64(b[:])
	if session == 0 {
		session = uint64(time.Now().UnixNano())
	}
	log := o.log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &adapterUse{rep: o.rep, router: o.router, session: session, models: models, log: log, now: time.Now,
		m: m, ctx: ctx, cancel: cancel, uses: map[useKey]*useCount{}, changed: make(chan struct{}, 1),
		answered: make(chan struct{})}
}

// close stops the reports and waits for the last one.
func (u *adapterUse) close() {
	if u == nil {
		return
	}
	u.cancel()
	u.wg.Wait()
}

// useHold is one attempt's count on its adapter and replica.
type useHold struct {
	u *adapterUse
	k useKey
}

// acquire counts a request for adapter on e until its hold is released.
// When the control plane does not already hold the adapter busy there on
// this router's word, it returns once the report counting the request is
// acknowledged, or after useAnswerWait, or when ctx ends.
func (u *adapterUse) acquire(ctx context.Context, adapter string, e *endpoint.Endpoint) *useHold {
	k := useKey{adapter: adapter, rep: Key(e)}
	now := u.now()
	u.mu.Lock()
	c := u.uses[k]
	if c == nil {
		c = &useCount{}
		u.uses[k] = c
	}
	told := c.ackedN > 0 || (u.minIdle > 0 && now.Before(c.ackedLast.Add(u.minIdle/2)))
	c.n++
	c.last = now
	wait := !told && !u.failing
	target, answered := u.taken+1, u.answered
	if wait {
		u.urgent = true
	}
	u.mu.Unlock()
	u.m.useInflight.Inc()
	u.start.Do(func() { u.wg.Go(u.run) })
	u.signal()
	if wait {
		u.m.useWaits.WithLabelValues(u.awaitAnswer(ctx, target, answered)).Inc()
	}
	return &useHold{u: u, k: k}
}

// awaitAnswer waits until report target is answered, and says how the
// wait ended: answered, failed (reports fail: nobody waits), timeout
// (useAnswerWait), or client_gone.
func (u *adapterUse) awaitAnswer(ctx context.Context, target uint64, answered <-chan struct{}) string {
	timer := time.NewTimer(useAnswerWait)
	defer timer.Stop()
	for {
		select {
		case <-answered:
		case <-timer.C:
			return "timeout"
		case <-ctx.Done():
			return "client_gone"
		}
		u.mu.Lock()
		done, failing := u.acked >= target, u.failing
		answered = u.answered
		u.mu.Unlock()
		switch {
		case done:
			return "answered"
		case failing:
			return "failed"
		}
	}
}

func (h *useHold) release() {
	u := h.u
	u.mu.Lock()
	if c := u.uses[h.k]; c != nil && c.n > 0 {
		c.n--
		c.last = u.now()
	}
	u.mu.Unlock()
	u.m.useInflight.Dec()
	u.signal()
}

func (u *adapterUse) signal() {
	select {
	case u.changed <- struct{}{}:
	default:
	}
}

// holdSlot is a plan's current attempt's hold: taken by the request's
// goroutine, released by it or, when the request ends without Done, by
// its context's end (another goroutine), whichever comes first.
type holdSlot struct{ p atomic.Pointer[useHold] }

func (s *holdSlot) set(h *useHold) { s.release(); s.p.Store(h) }

func (s *holdSlot) release() {
	if h := s.p.Swap(nil); h != nil {
		h.release()
	}
}

// run sends a report at each change (at most one per useMinGap), every
// useKeepalive while some model loads adapters on demand, and again soon
// after a failure, until close.
func (u *adapterUse) run() {
	keepalive := time.NewTicker(useKeepalive)
	defer keepalive.Stop()
	var seq uint64
	var last time.Time
	var retry <-chan time.Time
	failing := false
	backoff := useRetry
	for {
		select {
		case <-u.ctx.Done():
			return
		case <-u.changed:
			// Within useMinGap of the last report, wait for its end, or
			// for a request that waits for the report.
			for wait := useMinGap - u.now().Sub(last); wait > 0 && !u.isUrgent(); wait = useMinGap - u.now().Sub(last) {
				select {
				case <-u.ctx.Done():
					return
				case <-time.After(wait):
				case <-u.changed:
				}
			}
		case <-keepalive.C:
			if !u.wanted() {
				continue
			}
		case <-retry:
		}
		retry = nil
		seq++
		last = u.now()
		err := u.send(seq, last)
		switch {
		case err == nil:
			u.m.useReports.WithLabelValues("ok").Inc()
			if failing {
				u.log.Info("router: adapter use reported again")
			}
			failing, backoff = false, useRetry
		case u.ctx.Err() != nil:
			return
		default:
			u.failed()
			u.m.useReports.WithLabelValues("error").Inc()
			if !failing {
				// Once per outage: the leader then judges from the agents'
				// readings alone once this router's last report expires.
				u.log.Warn("router: reporting adapter use failed; retrying", "err", err)
			}
			failing = true
			retry = time.After(backoff)
			backoff = min(2*backoff, useKeepalive)
		}
	}
}

// wanted says whether reports are worth sending: some model loads its
// adapters on demand, or this router has adapter use to report.
func (u *adapterUse) wanted() bool {
	u.mu.Lock()
	n := len(u.uses)
	u.mu.Unlock()
	if n > 0 {
		return true
	}
	for _, m := range u.models.Models() {
		if m.GetMaxLoadedAdapters() > 0 && len(m.GetAdapters()) > 0 {
			return true
		}
	}
	return false
}

func (u *adapterUse) isUrgent() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.urgent
}

// send sends report seq and, once answered, records what the control
// plane now holds of each use, and wakes the requests waiting for it.
func (u *adapterUse) send(seq uint64, now time.Time) error {
	ctx, cancel := context.WithTimeout(u.ctx, useTimeout)
	defer cancel()
	uses := u.snapshot(now, seq)
	resp, err := u.rep.ReportAdapterUse(ctx, &llmgwv1.AdapterUseReport{Router: u.router, Session: u.session, Seq: seq,
		SentUnixNano: now.UnixNano(), Uses: uses})
	if err != nil {
		return err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.acked, u.failing = seq, false
	u.minIdle = time.Duration(resp.GetMinIdleMs()) * time.Millisecond
	for _, s := range uses {
		k := useKey{adapter: s.GetAdapter(), rep: scheduler.Key{ID: s.GetReplicaId(), UID: s.GetUid(), Incarnation: s.GetIncarnation()}}
		if c := u.uses[k]; c != nil {
			c.ackedN, c.ackedLast = int(s.GetActive()), time.Unix(0, s.GetLastActiveUnixNano())
		}
	}
	close(u.answered)
	u.answered = make(chan struct{})
	return nil
}

// failed notes a failed report: the requests waiting for one go on.
func (u *adapterUse) failed() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.failing = true
	close(u.answered)
	u.answered = make(chan struct{})
}

// snapshot is report seq's uses, forgetting those idle for useRetain;
// bounded by maxReportUses, those in flight first, then the most recent.
func (u *adapterUse) snapshot(now time.Time, seq uint64) []*llmgwv1.AdapterStatus {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.taken, u.urgent = seq, false
	type use struct {
		k useKey
		c useCount
	}
	list := make([]use, 0, len(u.uses))
	for k, c := range u.uses {
		if c.n == 0 && now.Sub(c.last) >= useRetain {
			delete(u.uses, k)
			continue
		}
		list = append(list, use{k, *c})
	}
	if len(list) > maxReportUses {
		slices.SortFunc(list, func(a, b use) int {
			if c := cmp.Compare(min(b.c.n, 1), min(a.c.n, 1)); c != 0 {
				return c
			}
			return b.c.last.Compare(a.c.last)
		})
		list = list[:maxReportUses]
	}
	out := make([]*llmgwv1.AdapterStatus, len(list))
	for i, x := range list {
		last := x.c.last
		if x.c.n > 0 {
			last = now
		}
		out[i] = &llmgwv1.AdapterStatus{ReplicaId: x.k.rep.ID, Uid: x.k.rep.UID, Incarnation: x.k.rep.Incarnation,
			Adapter: x.k.adapter, Active: uint32(x.c.n), LastActiveUnixNano: last.UnixNano()}
	}
	return out
}
