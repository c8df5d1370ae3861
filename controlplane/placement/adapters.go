package placement

import (
	"cmp"
	"errors"
	"slices"
	"time"
)

// ErrNoReplica means the model has no replica that can take an adapter now
// (none ready, or every one draining).
var ErrNoReplica = errors.New("no ready replica of the model to load the adapter on")

// ErrAllBusy means every replica holds max_loaded_adapters adapters and
// none of them is idle: nothing may be evicted, so the caller answers with
// a retry-after (the router's 503 Retry-After, design §7.6).
var ErrAllBusy = errors.New("every loaded adapter is busy; none is idle to evict")

// AdapterReplica is one replica of the adapter's model as the leader sees
// it.
type AdapterReplica struct {
	ID string
	// Ready: READY for this uid and not draining. Only ready replicas are
	// given an adapter they do not hold.
	Ready bool
	// Placed lists the adapters whose placement names this replica.
	Placed []string
}

// AdapterUse is what the replica's agent last reported of one adapter.
type AdapterUse struct {
	// Reported is false when the agent has said nothing of it yet: it is
	// being loaded, so it is not idle.
	Reported bool
	// Loading is true while the agent loads it (or waits for a slot to
	// load it in): someone is waiting for it.
	Loading bool
	// Loaded: the engine holds it, so evicting it frees a slot there.
	// Failed: its load failed, so it holds no slot in the engine, only one
	// in the placement. An adapter reported neither (nor Loading) is in
	// passing (being unloaded, or a state this code does not know) and is
	// not evicted.
	Loaded, Failed bool
	// Active is the requests for it running or waiting.
	Active uint32
	// LastUsed is when a request for it last ran, or when it was placed if
	// later (a freshly loaded adapter has had no chance to be used yet).
	LastUsed time.Time
}

// AdapterInputs is everything ChooseAdapterReplica reads.
type AdapterInputs struct {
	Adapter string
	// Max is the model's max_loaded_adapters, at least 1.
	Max int
	// Replicas of the model, in any order.
	Replicas []AdapterReplica
	// Use reports one placed adapter on one replica; nil reports nothing
	// (every adapter then counts as busy).
	Use func(replica, adapter string) AdapterUse
	// Now and MinIdle: an adapter is idle when nothing for it runs or
	// waits and it has not been used for MinIdle.
	Now     time.Time
	MinIdle time.Duration
}

// AdapterChoice is where an adapter goes.
type AdapterChoice struct {
	Replica string
	// Holds: Replica's placement already names the adapter; nothing to do.
	Holds bool
	// Evict, when set, is the adapter to remove from Replica's placement
	// before placing this one (routers stop sending it there first; the
	// agent unloads it once idle).
	Evict string
}

// ChooseAdapterReplica picks the replica for an adapter (design §7.6): one
// that already holds it; else a ready one with a free slot (fewer than Max
// placed; the fewest, then the lowest id); else an adapter on a ready
// replica is evicted: the least recently used idle LOADED one (ties by
// replica id, then adapter name), else the least recently placed FAILED one
// idle as long. A LOADED one goes first because a placement whose load
// failed is what its callers are being answered from (a bad path is not
// loaded again in a loop), and evicting it frees no engine slot; it is
// reused only when nothing loaded is idle. An adapter not LOADED nor FAILED
// (loading, waiting for a slot, being unloaded) is never evicted: that is
// what re-evicted placements that never loaded and made evictions
// outnumber loads. It never puts more than Max on a replica. It is pure: the leader
// commits the choice, and the FSM refuses one made on a stale view.
func ChooseAdapterReplica(in AdapterInputs) (AdapterChoice, error) {
	rs := slices.Clone(in.Replicas)
	slices.SortFunc(rs, func(a, b AdapterReplica) int { return cmp.Compare(a.ID, b.ID) })
	for _, r := range rs {
		if slices.Contains(r.Placed, in.Adapter) {
			return AdapterChoice{Replica: r.ID, Holds: true}, nil
		}
	}
	var free *AdapterReplica
	ready := 0
	for i := range rs {
		r := &rs[i]
		if !r.Ready {
			continue
		}
		ready++
		if len(r.Placed) < in.Max && (free == nil || len(r.Placed) < len(free.Placed)) {
			free = r
		}
	}
	if ready == 0 {
		return AdapterChoice{}, ErrNoReplica
	}
	if free != nil {
		return AdapterChoice{Replica: free.ID}, nil
	}
	// Two candidates: the best LOADED (tier 0) and the best FAILED (tier 1).
	var best [2]AdapterChoice
	var bestUsed [2]time.Time
	var found [2]bool
	for _, r := range rs {
		if !r.Ready {
			continue
		}
		names := slices.Clone(r.Placed)
		slices.Sort(names)
		for _, name := range names {
			if in.Use == nil {
				continue
			}
			u := in.Use(r.ID, name)
			if !u.Reported || u.Loading || u.Active > 0 || in.Now.Sub(u.LastUsed) < in.MinIdle {
				continue
			}
			tier := 0
			switch {
			case u.Loaded:
			case u.Failed:
				tier = 1
			default:
				continue
			}
			if !found[tier] || u.LastUsed.Before(bestUsed[tier]) {
				best[tier], bestUsed[tier], found[tier] = AdapterChoice{Replica: r.ID, Evict: name}, u.LastUsed, true
			}
		}
	}
	for tier := range best {
		if found[tier] {
			return best[tier], nil
		}
	}
	return AdapterChoice{}, ErrAllBusy
}
