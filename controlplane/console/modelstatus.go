package console

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The models page's counts and reasons (design §5.7 "Saying why"): per
// model, AdminService.ModelStatus — the count placement works to, the
// replicas placed, ready and asleep, the leader's reason for the ones it
// cannot place, and for an autoscaled model the demand and the
// autoscaler's decisions — and a summary the console composes from it and
// the replica list, which says why whenever fewer replicas are ready than
// the count. AdminService has no call for every model's status at once, so
// the page makes one call per model: MaxStatusModels at most,
// StatusParallel at a time, all within the page's callTimeout. Tens of
// models cost tens of small calls to the leader every 2 s per open page.

// MaxStatusModels bounds the ModelStatus calls of one models page; the
// models past it are shown from the replica list alone, saying so.
const MaxStatusModels = 256

// StatusParallel is how many ModelStatus calls one page makes at a time.
const StatusParallel = 8

// maxWhyReplicas is how many replicas that are not ready a summary names;
// the rest are counted.
const maxWhyReplicas = 4

// maxMessageRunes bounds an agent's message quoted in a summary.
const maxMessageRunes = 160

// Model states of ModelSummary.State, as the page colours them.
const (
	// StateReady: every replica of the count is ready.
	StateReady = "ready"
	// StateIdle: the count is 0 (a model scaled to zero, or replicas: 0).
	StateIdle = "idle"
	// StateUnplaced: replicas of the count are not placed; Why holds the
	// leader's reason.
	StateUnplaced = "unplaced"
	// StateStarting: every replica is placed, and those not ready are
	// starting (loading, or waking from sleep).
	StateStarting = "starting"
	// StateNotReady: a placed replica is unhealthy, restarting, failed or
	// stopped.
	StateNotReady = "not_ready"
	// StateUnknown: ModelStatus failed and the count of an autoscaled
	// model is not known.
	StateUnknown = "unknown"
)

// ModelSummary is what the models page says of a model beside its
// replicas. Whenever Ready is below Desired, Why is not empty: a page that
// says "6 / 10 ready" and nothing else is what it exists to prevent
// (TestSummaryAlwaysSaysWhy).
type ModelSummary struct {
	// Desired is the count placement works to (ModelStatus's; for an
	// external model, its endpoints).
	Desired uint32 `json:"desired"`
	// Placed counts replicas placed and not draining, asleep or not; Ready
	// those serving; Asleep those put to sleep (their GPUs free).
	Placed uint32 `json:"placed"`
	Ready  uint32 `json:"ready"`
	Asleep uint32 `json:"asleep"`
	State  string `json:"state"`
	// Why says, in words, why fewer replicas are ready than Desired.
	Why string `json:"why,omitempty"`
	// Error is why ModelStatus gave nothing; the counts are then the
	// replica list's.
	Error string `json:"error,omitempty"`
}

// modelStatuses calls ModelStatus for each of models (the first
// MaxStatusModels), StatusParallel at a time. A model without an answer
// has its error instead.
func (c *Console) modelStatuses(ctx context.Context, models []*llmgwv1.Model) (map[string]*llmgwv1.ModelStatusResponse, map[string]error) {
	out := map[string]*llmgwv1.ModelStatusResponse{}
	errs := map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, StatusParallel)
	for i, m := range models {
		name := m.GetName()
		if i >= MaxStatusModels {
			mu.Lock()
			errs[name] = fmt.Errorf("not read: the page reads the status of %d models at most (llmgwctl model status %s)", MaxStatusModels, name)
			mu.Unlock()
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			st, err := c.admin.ModelStatus(ctx, &llmgwv1.ModelStatusRequest{Name: name})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[name] = err
				return
			}
			out[name] = st
		})
	}
	wg.Wait()
	return out, errs
}

// summarize composes model m's summary from its ModelStatus answer (nil
// when stErr says why not) and the replica list.
func summarize(m *llmgwv1.Model, st *llmgwv1.ModelStatusResponse, stErr error, views []*llmgwv1.ReplicaView) ModelSummary {
	var mine []*llmgwv1.ReplicaView
	for _, v := range views {
		if r := v.GetReplica(); r.GetModel() == m.GetName() && !r.GetDraining() {
			mine = append(mine, v)
		}
	}
	slices.SortFunc(mine, func(a, b *llmgwv1.ReplicaView) int {
		return strings.Compare(a.GetReplica().GetId(), b.GetReplica().GetId())
	})
	var s ModelSummary
	if st != nil {
		s.Desired, s.Placed, s.Ready, s.Asleep = st.GetDesired(), st.GetPlaced(), st.GetReady(), st.GetSleeping()
	} else {
		s.Desired = m.GetReplicas()
		for _, v := range mine {
			s.Placed++
			switch {
			case v.GetReplica().GetSleeping():
				s.Asleep++
			case phaseOf(v) == "ready":
				s.Ready++
			}
		}
		if stErr != nil {
			s.Error = stErr.Error()
		}
	}
	// An external model has one replica per endpoint; its replicas field
	// is the file's default, which placement does not read (design §5.5).
	if m.GetEngine() == "external" {
		s.Desired = uint32(len(m.GetEndpoints()))
	}
	notReady, starting := notReadyText(mine)
	if st == nil && m.GetAutoscale() != nil {
		// The count is the leader's: without its answer, say what is known.
		s.State = StateUnknown
		s.Why = "the autoscaler's count is unknown without the leader's model status"
		if notReady != "" {
			s.Why += "; " + notReady
		}
		return s
	}
	awake := s.Placed - min(s.Asleep, s.Placed)
	if s.Ready >= s.Desired {
		var parts []string
		s.State = StateReady
		if s.Desired == 0 {
			s.State = StateIdle
			parts = append(parts, "replicas: 0, no replica runs")
			if m.GetAutoscale() != nil {
				parts = append(parts[:0], "scaled to zero: a request is held by the routers while a replica starts")
			}
		}
		if awake > s.Desired {
			// The count dropped: placement drains the surplus (or puts it
			// to sleep) once idle, within its drain timeout.
			parts = append(parts, fmt.Sprintf("%d placed above the count, to be drained or put to sleep once idle", awake-s.Desired))
		}
		s.Why = strings.Join(parts, "; ")
		return s
	}
	var parts []string
	switch {
	case st.GetUnplacedReason() != "":
		s.State = StateUnplaced
		parts = append(parts, st.GetUnplacedReason())
	case awake < s.Desired:
		s.State = StateUnplaced
		if st != nil {
			parts = append(parts, fmt.Sprintf("%d of %d replicas not placed yet; the leader has not said why yet", s.Desired-awake, s.Desired))
		} else {
			parts = append(parts, fmt.Sprintf("%d of %d replicas not placed", s.Desired-awake, s.Desired))
		}
	}
	if notReady != "" {
		parts = append(parts, notReady)
		if s.State == "" {
			s.State = StateNotReady
			if starting {
				s.State = StateStarting
			}
		}
	}
	if len(parts) == 0 {
		// The leader counted before the replica list was read, and a
		// replica became ready in between.
		s.State = StateStarting
		parts = append(parts, fmt.Sprintf("%d of %d ready when the leader counted; every placed replica is ready now", s.Ready, s.Desired))
	}
	s.Why = strings.Join(parts, "; ")
	return s
}

// notReadyText names the replicas of mine that are awake and not ready,
// with their phase and the agent's message, and reports whether each is
// only on its way (starting, waking, or not reported yet).
func notReadyText(mine []*llmgwv1.ReplicaView) (string, bool) {
	var shown []string
	n := 0
	starting := true
	for _, v := range mine {
		r := v.GetReplica()
		if r.GetSleeping() {
			continue
		}
		phase := phaseOf(v)
		switch phase {
		case "ready":
			continue
		case "sleeping":
			phase = "waking" // asleep by its agent's report, awake by the count
		case "starting", "no status":
		default:
			starting = false
		}
		if n++; n > maxWhyReplicas {
			continue
		}
		text := r.GetId() + " " + phase
		if msg := strings.TrimSpace(v.GetStatus().GetMessage()); msg != "" && phase != "no status" {
			text += " (" + clip(msg, maxMessageRunes) + ")"
		}
		shown = append(shown, text)
	}
	if n == 0 {
		return "", false
	}
	text := fmt.Sprintf("%d placed, not ready yet: %s", n, strings.Join(shown, ", "))
	if n > maxWhyReplicas {
		text += fmt.Sprintf(" and %d more", n-maxWhyReplicas)
	}
	return text, starting
}

// phaseOf is a replica's phase as the page shows it: the agent's last
// report for this placement, or "no status" while there is none.
func phaseOf(v *llmgwv1.ReplicaView) string {
	st := v.GetStatus()
	if st == nil || st.GetUid() != v.GetReplica().GetUid() {
		return "no status"
	}
	return strings.ToLower(strings.TrimPrefix(st.GetPhase().String(), "REPLICA_PHASE_"))
}

// clip cuts s to n runes, marking the cut.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
