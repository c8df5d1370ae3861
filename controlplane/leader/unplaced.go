package leader

import (
	"maps"
	"slices"
	"sync"
)

// unplacedReasons holds, per model short of replicas, the latest reason in
// words from placement (placement.Plan.Unplaced; design §5.7 "Saying
// why"). It is this leader's, for its term: the ModelStatus RPC and the
// console read it through Leader.Unplaced, and the log says it once per
// change, not once per round.
type unplacedReasons struct {
	mu      sync.Mutex
	reasons map[string]string
}

func newUnplacedReasons() *unplacedReasons {
	return &unplacedReasons{reasons: map[string]string{}}
}

// set replaces the reasons with those of the latest round and returns
// the models whose reason is new or changed, and those no longer short,
// each sorted.
func (u *unplacedReasons) set(now map[string]string) (changed, cleared []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for m, why := range now {
		if u.reasons[m] != why {
			changed = append(changed, m)
		}
	}
	for m := range u.reasons {
		if _, ok := now[m]; !ok {
			cleared = append(cleared, m)
		}
	}
	u.reasons = maps.Clone(now)
	if u.reasons == nil {
		u.reasons = map[string]string{}
	}
	slices.Sort(changed)
	slices.Sort(cleared)
	return changed, cleared
}

func (u *unplacedReasons) get(model string) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.reasons[model]
}

// Unplaced says why model is short of replicas, in words ("2 of 10
// replicas cannot be placed: each needs 1 GPU; matching nodes: dev (8
// GPUs, 0 free: 8 held by chat-0..chat-7)"), as of this leader's latest
// placement round; "" when it is not short, or this server does not lead.
// Safe for concurrent use.
func (l *Leader) Unplaced(model string) string {
	return l.unplaced.get(model)
}
