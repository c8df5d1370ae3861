package scheduler

import (
	"fmt"
	"math"
	"slices"
	"strings"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Names accepted in a model's profile and profile_overrides: the same lists
// as fsm's validation (the router may not import fsm, design §3), checked again
// here so a router never routes on a config it does not understand.
var (
	Profiles = []string{"chat", "batch", "long-context", "debug"}
	Scorers  = []string{"session", "queue", "kv", "inflight", "weight", "load", "prefix"}
	Pickers  = []string{"p2c", "max-score", "softmax", "round-robin"}
	KVScores = []string{KVScoreShare, KVScoreCost}
)

// Tier 2's scores (design §7.5 step 5), as profile_overrides.kv_score
// names them.
const (
	// KVScoreShare scores a replica by the share of the prompt's leading
	// blocks it holds.
	KVScoreShare = "share"
	// KVScoreCost scores it by the prefill it would cost: the prompt's
	// tokens it would still compute plus the prefill queued on it (see
	// costScores).
	KVScoreCost = "cost"
	// DefaultKVScore is the score a profile uses unless overridden.
	DefaultKVScore = KVScoreShare
)

// DefaultProfile is used for a model that names none, and in place of a
// model whose profile config is refused.
const DefaultProfile = "chat"

// Params are the thresholds the built-in profiles share (design §7.3).
type Params struct {
	// TargetWaiting is the queue a replica may have and still count as
	// having headroom (Queue, PoolPriority, AdapterAffinity).
	TargetWaiting float64
	// TargetInflight normalizes the Inflight scorer.
	TargetInflight float64
	// KVCeiling is the KV use past which a replica counts as full, in (0, 1].
	KVCeiling float64
	// SessionLoadFactor bounds session affinity: at least 1.
	SessionLoadFactor float64
	// KVScore is tier 2's score, KVScoreShare or KVScoreCost.
	KVScore string
	// Speculation lets tier 2 count this router's own recent sends as held
	// until the engine's events confirm them (kvindex.LookupPending).
	Speculation bool
	// KVQueueWeight weighs, in the cost score, the prefill already queued
	// on a replica against this prompt's own prefill there: 1 counts a
	// queued token as a token of this prompt's, which is what it costs the
	// prompt in time to first token on an engine that prefills in order.
	KVQueueWeight float64
	// KVAffinity sends a tier-2 hit to its prefix's primary holder only
	// (the KVAffinity filter), in the profiles that score prefixes. On by
	// default since the headroom filter comes after it: it took the hit
	// share from 0.62–0.78 to 0.89–0.95 of the ceiling and TTFT p90 to a
	// quarter to a half of tier 1's in issue 14's three scenarios
	// (docs/benchmarks.md "KV affinity after the headroom filter").
	KVAffinity bool
}

// DefaultParams are the seeds' starting values; `llmgwctl bench` is how to
// move them.
func DefaultParams() Params {
	return Params{TargetWaiting: 4, TargetInflight: 8, KVCeiling: 0.9, SessionLoadFactor: 1.25,
		KVScore: DefaultKVScore, Speculation: true, KVQueueWeight: 1, KVAffinity: true}
}

// ValidateOverrides checks a model's profile name and overrides, naming the
// field as the model file spells it.
func ValidateOverrides(profile string, o *llmgwv1.ProfileOverrides) error {
	if profile != "" && !slices.Contains(Profiles, profile) {
		return fmt.Errorf("profile: unknown profile %q (want one of %s)", profile, strings.Join(Profiles, ", "))
	}
	if o == nil {
		return nil
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"target_waiting", o.GetTargetWaiting()}, {"target_inflight", o.GetTargetInflight()}} {
		if !finite(f.v) || f.v < 0 {
			return fmt.Errorf("profile_overrides.%s: must be a finite number >= 0, got %v", f.name, f.v)
		}
	}
	if v := o.GetKvCeiling(); !finite(v) || v < 0 || v > 1 {
		return fmt.Errorf("profile_overrides.kv_ceiling: must be in (0, 1] (0 for the default), got %v", v)
	}
	if v := o.GetSessionLoadFactor(); !finite(v) || (v != 0 && v < 1) {
		return fmt.Errorf("profile_overrides.session_load_factor: must be at least 1 (0 for the default), got %v", v)
	}
	if v := o.GetKvQueueWeight(); !finite(v) || v < 0 {
		return fmt.Errorf("profile_overrides.kv_queue_weight: must be a finite number >= 0, got %v", v)
	}
	if k := o.GetKvScore(); k != "" && !slices.Contains(KVScores, k) {
		return fmt.Errorf("profile_overrides.kv_score: unknown score %q (want one of %s)", k, strings.Join(KVScores, ", "))
	}
	names := make([]string, 0, len(o.GetWeights()))
	for k := range o.GetWeights() {
		names = append(names, k)
	}
	slices.Sort(names) // the first error must not depend on map order
	for _, k := range names {
		if !slices.Contains(Scorers, k) {
			return fmt.Errorf("profile_overrides.weights.%s: unknown scorer %q (want one of %s)", k, k, strings.Join(Scorers, ", "))
		}
		if v := o.GetWeights()[k]; !finite(v) || v < 0 {
			return fmt.Errorf("profile_overrides.weights.%s: must be a finite number >= 0, got %v", k, v)
		}
	}
	if p := o.GetPicker(); p != "" && !slices.Contains(Pickers, p) {
		return fmt.Errorf("profile_overrides.picker: unknown picker %q (want one of %s)", p, strings.Join(Pickers, ", "))
	}
	return nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// Build returns the named built-in profile with o applied (nil: none).
func (s *Scheduler) Build(profile string, o *llmgwv1.ProfileOverrides) (*Profile, error) {
	if err := ValidateOverrides(profile, o); err != nil {
		return nil, err
	}
	p := DefaultParams()
	if v := o.GetTargetWaiting(); v > 0 {
		p.TargetWaiting = v
	}
	if v := o.GetTargetInflight(); v > 0 {
		p.TargetInflight = v
	}
	if v := o.GetKvCeiling(); v > 0 {
		p.KVCeiling = v
	}
	if v := o.GetSessionLoadFactor(); v > 0 {
		p.SessionLoadFactor = v
	}
	if k := o.GetKvScore(); k != "" {
		p.KVScore = k
	}
	if o != nil && o.Speculation != nil {
		p.Speculation = *o.Speculation
	}
	if v := o.GetKvQueueWeight(); v > 0 {
		p.KVQueueWeight = v
	}
	if o != nil && o.KvAffinity != nil {
		p.KVAffinity = *o.KvAffinity
	}
	var prof *Profile
	switch profile {
	case "", "chat":
		prof = s.Chat(p)
	case "batch":
		prof = s.Batch(p)
	case "long-context":
		prof = s.LongContext(p)
	case "debug":
		prof = s.Debug()
	}
	for _, name := range sortedKeys(o.GetWeights()) {
		prof.setWeight(name, o.GetWeights()[name], s.scorer(name, p))
	}
	if name := o.GetPicker(); name != "" {
		prof.Picker = s.picker(name)
	}
	prof.KVScore, prof.Speculation = p.KVScore, p.Speculation
	return prof, nil
}

func sortedKeys(m map[string]float64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// setWeight replaces a scorer's weight, adding the scorer when the profile
// lacks it, so an override can also bring a scorer in.
func (p *Profile) setWeight(name string, w float64, sc Scorer) {
	for i := range p.Scorers {
		if p.Scorers[i].Scorer.Name() == name {
			p.Scorers[i].Weight = w
			return
		}
	}
	p.Scorers = append(p.Scorers, WeightedScorer{sc, w})
}

func (s *Scheduler) scorer(name string, p Params) Scorer {
	switch name {
	case "session":
		return s.Session(p.SessionLoadFactor)
	case "queue":
		return Queue(p.TargetWaiting)
	case "kv":
		return KV(p.KVCeiling)
	case "inflight":
		return Inflight(p.TargetInflight)
	case "weight":
		return Weight()
	case "load":
		return s.Load(loadWindow)
	default: // "prefix"; names are validated first
		return s.prefixWith(p)
	}
}

// loadWindow is the batch profile's Load window, in seconds.
const loadWindow = 30

// softmaxTau is long-context's temperature: scores are in [0, 1], so 0.2
// makes a replica 0.2 ahead e times as likely.
const softmaxTau = 0.2

func (s *Scheduler) picker(name string) Picker {
	switch name {
	case "max-score":
		return MaxScore(s.cfg.Rand)
	case "softmax":
		return Softmax(softmaxTau, s.cfg.Rand)
	case "round-robin":
		return RoundRobin()
	default:
		return P2C(s.cfg.Rand)
	}
}

func (s *Scheduler) filters(p Params) []Filter {
	return []Filter{BreakerOpen(), PoolPriority(p.TargetWaiting, p.KVCeiling), AdapterAffinity(p.TargetWaiting, p.KVCeiling)}
}

// prefixFilters are filters plus, when p asks for it, tier 2's KV
// affinity: the profiles that score prefixes use them. With affinity the
// pool's headroom filter comes after it, not before: a primary with a few
// requests waiting, or its KV blocks mostly in use (a cache that holds two
// 1,300-token prompts and their requests is past 0.9 by design), is still
// where the request costs least — elsewhere it pays the whole prefill and
// copies the prefix into a cache it evicts another from. Dropping such
// primaries first sent a third of fits' requests past their prefix's home
// (docs/benchmarks.md "KV affinity after the headroom filter"); the KV
// guard is the backstop against a primary that is really overloaded, and
// the headroom filter still chooses whenever affinity keeps several.
func (s *Scheduler) prefixFilters(p Params) []Filter {
	if !p.KVAffinity {
		return s.filters(p)
	}
	return []Filter{BreakerOpen(), AdapterAffinity(p.TargetWaiting, p.KVCeiling), s.KVAffinity(),
		PoolPriority(p.TargetWaiting, p.KVCeiling)}
}

// Chat is for multi-turn conversations and agents: session affinity
// dominates, because a conversation's history is the prefix worth keeping.
// Prefix matching weighs less than the session: a session id is the
// client's statement that requests belong together, a prefix match only the
// router's guess.
func (s *Scheduler) Chat(p Params) *Profile {
	return &Profile{
		Name:        "chat",
		KVScore:     p.KVScore,
		Speculation: p.Speculation,
		Filters:     s.prefixFilters(p),
		Scorers: []WeightedScorer{
			{s.Session(p.SessionLoadFactor), 3},
			{Queue(p.TargetWaiting), 1},
			{KV(p.KVCeiling), 1},
			{Inflight(p.TargetInflight), 1},
			{Weight(), 0.5},
			{s.prefixWith(p), 2},
		},
		Picker: P2C(s.cfg.Rand),
	}
}

// Batch is for bulk work: throughput matters and TTFT does not, so the
// shortest queue outranks stickiness.
func (s *Scheduler) Batch(p Params) *Profile {
	return &Profile{
		Name:    "batch",
		Filters: s.filters(p),
		Scorers: []WeightedScorer{
			{Queue(p.TargetWaiting), 3},
			{KV(p.KVCeiling), 1},
			{s.Load(loadWindow), 1},
			{Inflight(p.TargetInflight), 1},
			{Weight(), 1},
		},
		Picker: MaxScore(s.cfg.Rand),
	}
}

// LongContext is for long prompts: KV pressure is the bottleneck, so the
// KV scorer dominates — and prefix matching earns most here, since a long
// prompt is mostly prefill and prefill is what a cache hit skips.
func (s *Scheduler) LongContext(p Params) *Profile {
	return &Profile{
		Name:        "long-context",
		KVScore:     p.KVScore,
		Speculation: p.Speculation,
		Filters:     s.prefixFilters(p),
		Scorers: []WeightedScorer{
			{KV(p.KVCeiling), 3},
			{s.Session(p.SessionLoadFactor), 2},
			{Queue(p.TargetWaiting), 1},
			{Inflight(p.TargetInflight), 1},
			{s.prefixWith(p), 3},
		},
		Picker: Softmax(softmaxTau, s.cfg.Rand),
	}
}

// Debug is round robin over healthy replicas: the baseline, and a way to
// take the scheduler out of a problem.
func (s *Scheduler) Debug() *Profile {
	return &Profile{Name: "debug", Filters: []Filter{BreakerOpen()}, Picker: RoundRobin()}
}

// ProfileFor returns m's profile, built once per desired-state version of
// the model (the watch state replaces a changed model's object). A profile
// or override the router refuses is logged and counted, and the model is
// routed with the default profile: refusing its traffic would punish users
// for an operator's typo that fsm should already have caught.
func (s *Scheduler) ProfileFor(m *llmgwv1.Model) *Profile {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.profiles[m]; p != nil {
		return p
	}
	p, err := s.Build(m.GetProfile(), m.GetProfileOverrides())
	if err != nil {
		s.log.Warn("scheduler: refusing the model's profile; routing with the default",
			"model", m.GetName(), "profile", DefaultProfile, "err", err)
		s.m.profileErrors.WithLabelValues(m.GetName()).Inc()
		p, _ = s.Build(DefaultProfile, nil)
	}
	if len(s.profiles) >= maxCachedProfiles {
		clear(s.profiles) // models that changed leave stale keys; rebuilding is cheap
	}
	s.profiles[m] = p
	return p
}

const maxCachedProfiles = 1024
