package leader

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/controlplane/placement"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// ErrUnknownAdapter is an EnsureAdapter for a name no model's catalog
// lists (the router's 404).
var ErrUnknownAdapter = errors.New("unknown adapter")

// EnsureAdapter places the adapter when no replica holds it, then waits up
// to wait (req.timeout_ms as capped) for an agent's report: LOADED on any placed replica, FAILED on
// every one, or the wait's end (LOADING with a retry-after). When no slot
// may be taken now — every loaded adapter busy, or a call for another of
// the model's adapters waiting longer (adapterQueue) — a call with
// req.queue waits in the model's queue until a slot frees, and one without
// answers at once with retry_after_ms and state UNSPECIFIED. result names
// the outcome for logs and metrics (loaded, failed, busy, timeout). Each
// round reads the desired state and the agents' reports afresh; it waits
// between rounds for either to change, and while queued also polls, since
// an adapter becomes idle by time passing. It must run on the leader.
func (l *Leader) EnsureAdapter(ctx context.Context, req *llmgwv1.EnsureAdapterRequest, wait time.Duration) (_ *llmgwv1.EnsureAdapterResponse, result string, err error) {
	adapter := req.GetAdapter()
	d := adapterDemand{Queue: req.GetQueue(), Waiting: int(req.GetWaiting())}
	if req.GetWaitingSinceUnixNano() > 0 {
		d.Since = time.Unix(0, req.GetWaitingSinceUnixNano())
	}
	start := time.Now()
	l.metrics.adapterWaiters.Inc()
	defer l.metrics.adapterWaiters.Dec()
	defer func() {
		if err == nil {
			l.metrics.adapterEnsure.WithLabelValues(result).Observe(time.Since(start).Seconds())
		}
	}()
	if d.Since.IsZero() {
		d.Since = l.now()
	}
	var qid uint64
	var qmodel string
	leave := func() {
		if qid != 0 {
			l.queue.leave(qmodel, qid)
			l.metrics.adapterQueued.Dec()
			qid = 0
		}
	}
	defer leave()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	poll := time.NewTicker(adapterQueuePoll)
	defer poll.Stop()
	queued := false
	for {
		_, applied := l.state.Applied()
		changed := l.reports.Changed()
		resp, result, slot, err := l.adapterRound(ctx, adapter, d)
		if err != nil || resp != nil {
			if resp != nil {
				resp.Queued = queued
			}
			return resp, result, err
		}
		var tick <-chan time.Time
		switch {
		case slot != "" && qid == 0:
			qmodel, qid, queued = slot, l.queue.join(slot, queuedCall{adapter: adapter, waiting: d.Waiting, since: d.Since}), true
			l.metrics.adapterQueued.Inc()
			tick = poll.C
		case slot != "":
			tick = poll.C
		default:
			leave()
		}
		select {
		case <-ctx.Done():
			return nil, "", ctx.Err()
		case <-timer.C:
			why := fmt.Sprintf("adapter %q is not loaded after %s", adapter, wait)
			if qid != 0 {
				why = fmt.Sprintf("adapter %q: no slot of model %q freed within %s (%d calls wait for one)", adapter, qmodel, wait, l.queue.length(qmodel))
			}
			return &llmgwv1.EnsureAdapterResponse{
				State:        llmgwv1.AdapterState_ADAPTER_STATE_LOADING,
				Reason:       why,
				RetryAfterMs: l.cfg.AdapterRetryAfter.Milliseconds(),
				Queued:       queued,
			}, "timeout", nil
		case <-applied:
		case <-changed:
		case <-tick:
		}
	}
}

// adapterQueuePoll is how often a queued call looks for a slot again: an
// adapter turns idle by time passing (adapter_min_idle), which no report
// announces.
const adapterQueuePoll = 100 * time.Millisecond

// adapterRound returns a final answer, or nil to wait for a change; slot,
// when set, is the model whose queue the call waits in for a slot.
func (l *Leader) adapterRound(ctx context.Context, adapter string, d adapterDemand) (_ *llmgwv1.EnsureAdapterResponse, result, slot string, _ error) {
	m, ok := l.state.AdapterModel(adapter)
	if !ok {
		return nil, "", "", fmt.Errorf("adapter %q: not in any model's catalog: %w", adapter, ErrUnknownAdapter)
	}
	replicas := l.modelReplicas(m.Name)
	if m.MaxLoadedAdapters == 0 {
		// Every adapter is loaded at start: a ready replica holds it.
		var ready []string
		for _, r := range replicas {
			if l.replicaReady(r) {
				ready = append(ready, r.Id)
			}
		}
		if len(ready) == 0 {
			return nil, "", "", nil
		}
		return &llmgwv1.EnsureAdapterResponse{State: llmgwv1.AdapterState_ADAPTER_STATE_LOADED, LoadedOn: ready}, "loaded", "", nil
	}
	if resp, result, wait := l.placedOutcome(adapter, replicas); resp != nil || wait {
		return resp, result, "", nil
	}
	resp, result, needSlot, err := l.placeAdapter(ctx, m, adapter, d)
	if needSlot {
		slot = m.Name
	}
	return resp, result, slot, err
}

// placedOutcome reads the agents' reports for the adapter's placement:
// LOADED anywhere answers; FAILED everywhere answers until its retry-after
// passes (then it is placed again, once per retry-after, never in a loop);
// anything else waits. No placement (or an expired failure) returns
// neither: the caller places it.
func (l *Leader) placedOutcome(adapter string, replicas map[string]*llmgwv1.Replica) (resp *llmgwv1.EnsureAdapterResponse, result string, wait bool) {
	p, ok := l.state.AdapterPlacement(adapter)
	if !ok {
		return nil, "", false
	}
	now := l.now()
	var loaded, reasons []string
	failed := 0
	var retryAt time.Time
	permanent := false
	for _, id := range p.Replicas {
		r, ok := replicas[id]
		if !ok {
			continue
		}
		st := l.reports.AdaptersOf(r)[adapter]
		switch st.GetState() {
		case llmgwv1.AdapterState_ADAPTER_STATE_LOADED:
			loaded = append(loaded, id)
		case llmgwv1.AdapterState_ADAPTER_STATE_FAILED:
			failed++
			reasons = append(reasons, id+": "+st.GetReason())
			if st.RetryAfterUnixNano == 0 {
				permanent = true
			} else if at := time.Unix(0, st.RetryAfterUnixNano); at.After(retryAt) {
				retryAt = at
			}
		}
	}
	if len(loaded) > 0 {
		return &llmgwv1.EnsureAdapterResponse{State: llmgwv1.AdapterState_ADAPTER_STATE_LOADED, LoadedOn: loaded}, "loaded", false
	}
	if failed == 0 || failed < len(p.Replicas) {
		return nil, "", true
	}
	if permanent || retryAt.After(now) {
		out := &llmgwv1.EnsureAdapterResponse{State: llmgwv1.AdapterState_ADAPTER_STATE_FAILED,
			Reason: fmt.Sprintf("adapter %q failed to load: %s", adapter, strings.Join(reasons, "; "))}
		if !permanent {
			out.RetryAfterMs = max(retryAt.Sub(now).Milliseconds(), 1)
		}
		return out, "failed", false
	}
	return nil, "", false
}

// placeAdapter is the single flight: under adapterMu it reads the placement
// again (another call may have placed it while this one waited for the
// lock), chooses a replica, evicts when it must, and commits. When nothing
// may be placed now it answers busy, or for a queuing caller returns
// needSlot to wait in the queue; otherwise the caller waits for the
// agent's report.
//
// Waiting requests are demand (design §7.6): only the head of the model's
// queue — the adapter whose requests have waited longest — takes a slot;
// and an adapter placed within adapter_min_idle counts as having a request
// (the ones it was placed for, which may still be on their way to it), so
// it is not evicted for the next in the queue before they reach it.
func (l *Leader) placeAdapter(ctx context.Context, m *llmgwv1.Model, adapter string, d adapterDemand) (_ *llmgwv1.EnsureAdapterResponse, _ string, needSlot bool, _ error) {
	l.adapterMu.Lock()
	defer l.adapterMu.Unlock()
	replicas := l.modelReplicas(m.Name)
	if resp, result, wait := l.placedOutcome(adapter, replicas); resp != nil || wait {
		return resp, result, false, nil
	}
	busy := func(why string) (*llmgwv1.EnsureAdapterResponse, string, bool, error) {
		if d.Queue {
			return nil, "", true, nil
		}
		return &llmgwv1.EnsureAdapterResponse{State: llmgwv1.AdapterState_ADAPTER_STATE_UNSPECIFIED,
			Reason: fmt.Sprintf("adapter %q: %s", adapter, why), RetryAfterMs: l.cfg.AdapterRetryAfter.Milliseconds()}, "busy", false, nil
	}
	if l.queue.ahead(m.Name, adapter, d.Since) {
		return busy(fmt.Sprintf("requests for other adapters of model %q have waited longer for a slot", m.Name))
	}
	if p, ok := l.state.AdapterPlacement(adapter); ok {
		// Every replica reported FAILED and the retry-after has passed:
		// remove it, so the agent forgets the failure, and place it anew.
		if _, _, err := l.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_ADAPTER_PLACEMENT, &llmgwv1.SetAdapterPlacementCommand{
			Placement: &llmgwv1.AdapterPlacement{Model: p.Model, Adapter: adapter}}); err != nil {
			return nil, "", false, fmt.Errorf("clear failed placement of adapter %q: %w", adapter, err)
		}
		l.metrics.adapterPlacements.WithLabelValues("retry").Inc()
	}
	st := l.state.State()
	now := l.now()
	in := placement.AdapterInputs{Adapter: adapter, Max: int(m.MaxLoadedAdapters), Now: now, MinIdle: l.cfg.AdapterMinIdle}
	placedOn := map[string][]string{}
	for _, p := range st.AdapterPlacements {
		for _, id := range p.Replicas {
			placedOn[id] = append(placedOn[id], p.Adapter)
		}
	}
	ids := make([]string, 0, len(replicas))
	for id := range replicas {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		in.Replicas = append(in.Replicas, placement.AdapterReplica{ID: id, Ready: l.replicaReady(replicas[id]), Placed: placedOn[id]})
	}
	in.Use = func(replica, name string) placement.AdapterUse {
		st := l.reports.AdaptersOf(replicas[replica])[name]
		if st == nil {
			return placement.AdapterUse{}
		}
		used := time.Unix(0, st.LastActiveUnixNano)
		active := st.Active
		if ru := l.use.of(name, replica, replicas[replica].GetUid(), now); ru.covered {
			// The routers' counts are exact and fresh; the agent's reading
			// of the engine is up to a second old, and on some engines
			// stuck busy (issue 27). It counts only when it says idle, for
			// the last use it saw; busy, it says nothing a router does not.
			if active > 0 {
				used = time.Time{}
			}
			active = ru.active
			if ru.last.After(used) {
				used = ru.last
			}
		}
		if at := l.placedAt[adapterKey{name, replica}]; at.After(used) {
			used = at
			if now.Sub(at) < l.cfg.AdapterMinIdle {
				active++ // the requests it was placed for
			}
		}
		return placement.AdapterUse{Reported: true, Loading: st.State == llmgwv1.AdapterState_ADAPTER_STATE_LOADING,
			Loaded: st.State == llmgwv1.AdapterState_ADAPTER_STATE_LOADED, Failed: st.State == llmgwv1.AdapterState_ADAPTER_STATE_FAILED,
			Active: active, LastUsed: used}
	}
	choice, err := placement.ChooseAdapterReplica(in)
	switch {
	case errors.Is(err, placement.ErrAllBusy), errors.Is(err, placement.ErrNoReplica):
		return busy(err.Error())
	case err != nil:
		return nil, "", false, err
	case choice.Holds:
		return nil, "", false, nil
	}
	if choice.Evict != "" {
		// Removed from the desired state first: routers stop sending it
		// there, and the agent unloads it once idle (design §7.6).
		old, _ := l.state.AdapterPlacement(choice.Evict)
		keep := slices.DeleteFunc(slices.Clone(old.GetReplicas()), func(id string) bool { return id == choice.Replica })
		if _, _, err := l.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_ADAPTER_PLACEMENT, &llmgwv1.SetAdapterPlacementCommand{
			Placement: &llmgwv1.AdapterPlacement{Model: m.Name, Adapter: choice.Evict, Replicas: keep}}); err != nil {
			return nil, "", false, fmt.Errorf("evict adapter %q from replica %s: %w", choice.Evict, choice.Replica, err)
		}
		delete(l.placedAt, adapterKey{choice.Evict, choice.Replica})
		l.metrics.adapterPlacements.WithLabelValues("evict").Inc()
		l.log.Info("adapter evicted", "model", choice.Evict, "replica", choice.Replica, "for", adapter)
	}
	if _, _, err := l.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_ADAPTER_PLACEMENT, &llmgwv1.SetAdapterPlacementCommand{
		Placement: &llmgwv1.AdapterPlacement{Model: m.Name, Adapter: adapter, Replicas: []string{choice.Replica}}}); err != nil {
		return nil, "", false, fmt.Errorf("place adapter %q on replica %s: %w", adapter, choice.Replica, err)
	}
	l.placedAt[adapterKey{adapter, choice.Replica}] = now
	l.metrics.adapterPlacements.WithLabelValues("place").Inc()
	l.log.Info("adapter placed", "model", adapter, "replica", choice.Replica, "waited", now.Sub(d.Since).Round(time.Millisecond), "waiting", d.Waiting)
	return nil, "", false, nil
}

// modelReplicas is the model's replicas by id.
func (l *Leader) modelReplicas(model string) map[string]*llmgwv1.Replica {
	out := map[string]*llmgwv1.Replica{}
	for _, r := range l.state.State().Replicas {
		if r.Model == model {
			out[r.Id] = r
		}
	}
	return out
}

// replicaReady: READY for this uid, and not draining.
func (l *Leader) replicaReady(r *llmgwv1.Replica) bool {
	return !r.Draining && l.reports.StatusOf(r).GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
}
