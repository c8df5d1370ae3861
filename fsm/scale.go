package fsm

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Elastic capacity in the replicated state (design §5.7): the autoscaler's
// count per model and a replica's sleep.

// Bounds of an autoscale spec: a count the placement loop and the GPUs of
// any fleet this control plane runs can hold, and targets a person could
// mean.
const (
	MaxAutoscaleReplicas = 1000
	maxScaleReason       = 1024
	maxTTFTSLOMillis     = 600_000
	maxScaleSeconds      = 86_400
	maxHeld              = 1_000_000
)

// ScaleVersion is the release that introduced SET_MODEL_SCALE and
// SET_REPLICA_SLEEPING. No release has been cut since the tenants: the
// "old" build knows neither.
const ScaleVersion = TenantsVersion

// checkAutoscale is an autoscale spec's rules, at the entry points only
// (validateApplied's comment says why).
func checkAutoscale(m *llmgwv1.Model) error {
	// The agent passes --enable-sleep-mode (and vLLM's dev mode, whose
	// endpoints it calls) exactly when autoscale.sleep asks for it.
	if m.Engine == "vllm" || m.Engine == "sim" {
		for i, arg := range m.ExtraArgs {
			if flag, _, _ := strings.Cut(arg, "="); strings.ReplaceAll(flag, "_", "-") == "--enable-sleep-mode" {
				return invalid(fmt.Sprintf("extra_args[%d]", i), "--enable-sleep-mode is set by llmgw: use autoscale.sleep")
			}
		}
	}
	a := m.GetAutoscale()
	if a == nil {
		return nil
	}
	switch {
	case m.Engine == "external":
		return invalid("autoscale", "not for engine \"external\": llmgw runs nothing for it")
	case a.Max < 1 || a.Max > MaxAutoscaleReplicas:
		return invalid("autoscale.max", "must be in 1..%d, got %d", MaxAutoscaleReplicas, a.Max)
	case a.Min > a.Max:
		return invalid("autoscale.min", "%d is above autoscale.max %d", a.Min, a.Max)
	case a.TargetWaiting < 0:
		return invalid("autoscale.target_waiting", "must not be negative, got %v", a.TargetWaiting)
	case a.TargetKvUsage < 0 || a.TargetKvUsage > 1:
		return invalid("autoscale.target_kv_usage", "must be in 0..1, got %v", a.TargetKvUsage)
	case a.TtftP90SloMs > maxTTFTSLOMillis:
		return invalid("autoscale.ttft_p90_slo_ms", "must be at most %d, got %d", maxTTFTSLOMillis, a.TtftP90SloMs)
	case a.TargetWaiting == 0 && a.TargetKvUsage == 0 && a.TtftP90SloMs == 0:
		return invalid("autoscale", "needs a target: target_waiting, target_kv_usage or ttft_p90_slo_ms")
	case a.ScaleDownAfterS > maxScaleSeconds:
		return invalid("autoscale.scale_down_after_s", "must be at most %d, got %d", maxScaleSeconds, a.ScaleDownAfterS)
	case a.CooldownS > maxScaleSeconds:
		return invalid("autoscale.cooldown_s", "must be at most %d, got %d", maxScaleSeconds, a.CooldownS)
	case a.HoldTimeoutS > maxScaleSeconds:
		return invalid("autoscale.hold_timeout_s", "must be at most %d, got %d", maxScaleSeconds, a.HoldTimeoutS)
	case a.MaxHeld > maxHeld:
		return invalid("autoscale.max_held", "must be at most %d, got %d", maxHeld, a.MaxHeld)
	case a.Sleep && m.Engine != "vllm" && m.Engine != "sim":
		return invalid("autoscale.sleep", "needs vLLM's sleep mode: engine vllm or sim, not %q", m.Engine)
	case m.Replicas < a.Min || m.Replicas > a.Max:
		return invalid("replicas", "%d is outside autoscale's %d..%d: with autoscale it is the count the model starts at", m.Replicas, a.Min, a.Max)
	}
	return nil
}

// ClampScale is n within m's autoscale bounds (n itself without autoscale).
func ClampScale(m *llmgwv1.Model, n uint32) uint32 {
	a := m.GetAutoscale()
	if a == nil {
		return n
	}
	return min(max(n, a.Min), a.Max)
}

func (a *applier) setModelScale(p *llmgwv1.SetModelScaleCommand) (any, error) {
	m, ok := a.f.models[p.Model]
	if !ok {
		return nil, fmt.Errorf("model %q: %w", p.Model, ErrNotFound)
	}
	as := m.GetAutoscale()
	switch {
	case as == nil:
		return nil, invalid("model", "%q has no autoscale", p.Model)
	case p.ModelRevision != m.Revision:
		return nil, invalid("model_revision", "%d: model %q is at revision %d; decide again on it", p.ModelRevision, p.Model, m.Revision)
	case p.Replicas < as.Min || p.Replicas > as.Max:
		return nil, invalid("replicas", "%d is outside model %q's autoscale %d..%d", p.Replicas, p.Model, as.Min, as.Max)
	case len(p.Reason) > maxScaleReason:
		return nil, invalid("reason", "longer than %d bytes", maxScaleReason)
	}
	s := &llmgwv1.ModelScale{Model: p.Model, Replicas: p.Replicas, Reason: p.Reason,
		DecidedUnixMs: a.at * 1000, Revision: a.index}
	a.f.scales[p.Model] = s
	return proto.Clone(s), nil
}

func (a *applier) setReplicaSleeping(p *llmgwv1.SetReplicaSleepingCommand) (any, error) {
	r, ok := a.f.replicas[p.Id]
	if !ok || r.Uid != p.Uid || r.Sleeping == p.Sleeping {
		return nil, nil
	}
	if p.Sleeping && !a.f.models[r.Model].GetAutoscale().GetSleep() {
		return nil, invalid("sleeping", "model %q does not sleep (autoscale.sleep)", r.Model)
	}
	if !p.Sleeping {
		// A sleeper's GPUs may have gone to another model meanwhile
		// (placement gives them out): it wakes only on GPUs nobody awake
		// holds, or two engines would share one.
		for _, id := range a.f.index.onNode(r.Node) {
			o := a.f.replicas[id]
			if o == nil || o.Id == r.Id || o.Sleeping {
				continue
			}
			for _, g := range o.GpuIndices {
				if slices.Contains(r.GpuIndices, g) {
					return nil, fmt.Errorf("wake %s: GPU %d of node %s is held by %s: %w", r.Id, g, r.Node, o.Id, ErrConflict)
				}
			}
		}
	}
	r = proto.Clone(r).(*llmgwv1.Replica)
	r.Sleeping = p.Sleeping
	r.Revision = a.index
	a.f.putReplica(r)
	a.put(r)
	return proto.Clone(r), nil
}

// Scale returns a copy of model's autoscaler count, nil when it has none.
func (f *FSM) Scale(model string) *llmgwv1.ModelScale {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if s := f.scales[model]; s != nil {
		return proto.Clone(s).(*llmgwv1.ModelScale)
	}
	return nil
}

// scaleState is the scales for a snapshot, sorted by model.
func (f *FSM) scaleState() []*llmgwv1.ModelScale {
	out := make([]*llmgwv1.ModelScale, 0, len(f.scales))
	for _, s := range f.scales {
		out = append(out, proto.Clone(s).(*llmgwv1.ModelScale))
	}
	slices.SortFunc(out, func(a, b *llmgwv1.ModelScale) int {
		if a.Model < b.Model {
			return -1
		}
		if a.Model > b.Model {
			return 1
		}
		return 0
	})
	return out
}

func (f *FSM) restoreScales(st *llmgwv1.State) {
	for _, s := range st.Scales {
		f.scales[s.Model] = s
	}
}

// MaxNumSeqs is the --max-num-seqs m's extra_args give its engines (the
// last one, as argparse keeps), and whether they give one: a replica's
// batch capacity (design §5.7).
func MaxNumSeqs(m *llmgwv1.Model) (uint32, bool) {
	args, err := ParseEngineArgs(m.GetExtraArgs())
	if err != nil {
		return 0, false
	}
	var n uint32
	var ok bool
	for _, a := range args {
		if a.Long && a.Name == "max-num-seqs" && len(a.Values) == 1 {
			if v, err := strconv.ParseUint(a.Values[0], 10, 32); err == nil && v > 0 {
				n, ok = uint32(v), true
			}
		}
	}
	return n, ok
}

// EffectiveReplicas is the count placement works to for m in st (design
// §5.7): the autoscaler's, or replicas while it has decided nothing, within
// the spec's bounds; replicas for a model without autoscale.
func EffectiveReplicas(st *llmgwv1.State, m *llmgwv1.Model) uint32 {
	if m.GetAutoscale() == nil {
		return m.GetReplicas()
	}
	for _, s := range st.GetScales() {
		if s.Model == m.Name {
			return ClampScale(m, s.Replicas)
		}
	}
	return ClampScale(m, m.GetReplicas())
}
