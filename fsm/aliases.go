package fsm

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Model aliases (design §7.9). An alias is a name clients send as `model`
// that routers resolve, per request, to one of weighted targets — models
// or adapters — optionally sticky by the caller's API key or session, with
// an ordered fallback list taken when the chosen target refuses. It is how
// an operator splits traffic for a canary, or cuts a name over to another
// model, without a client change. The FSM holds it; the routers, which
// learn it from the watch stream, do all the resolving.
//
// Decisions where the design is silent:
//   - Aliases share the OpenAI "model" namespace with models and adapters
//     (design §4): an alias named like a model or adapter is refused, and
//     so is a model (or adapter) named like an alias (upsertModel asks
//     modelNameFree).
//   - Targets and fallbacks must name a model or an adapter when the alias
//     is applied (not another alias: resolution is one step, no chains or
//     loops), so a typo is refused at once. A model deleted later is not
//     refused because an alias names it — deleting a model must never
//     depend on aliases — and the alias is kept as it is: routers skip a
//     target or fallback that no longer exists, and re-applying the alias
//     asks the operator to drop it.
//   - An alias is replaced whole by an apply (create or replace): it is
//     small, and the file an operator applies is the whole of it.
//   - Weights are relative integers; at least one target must have weight
//     above 0. A target of weight 0 takes no new request (a sticky key on
//     it moves to the others) but stays listed, so shifting traffic off a
//     target and back is a weight change only.
//   - A fallback may also be a target: it is skipped when it is the target
//     that refused.

// AliasesVersion is the release that introduced PUT_ALIAS and
// DELETE_ALIAS. No release has been cut since tenants, so they ship with
// them (and the "old" build knows neither: TenantsVersion is empty there).
const AliasesVersion = TenantsVersion

// Bounds of an alias, so an entry and every router's copy stay small and
// the routers' per-request work (a hash per target) stays a few hashes.
const (
	MaxAliasTargets   = 16
	MaxAliasFallbacks = 8
	// MaxAliasWeight bounds one target's weight: weights are relative, so
	// a million leaves room for splits finer than 0.0001 %.
	MaxAliasWeight = 1_000_000
)

// The sticky modes of an alias.
const (
	// AliasStickyNone draws every request by weight.
	AliasStickyNone = ""
	// AliasStickyKey sends every request of one API key to one target (by
	// a hash of the key's name), so the caches of its target stay warm.
	AliasStickyKey = "key"
	// AliasStickySession does so per session (the X-Session-ID header).
	AliasStickySession = "session"
)

// ValidateAlias checks an alias's shape as an apply gives it: a name of
// the model-name shape, 1..MaxAliasTargets targets of that shape, each
// once, with weights up to MaxAliasWeight, at least one above 0; a known
// sticky mode; up to MaxAliasFallbacks fallbacks, each once; neither
// naming the alias itself. Field names are the alias file's spelling
// (targets[1].weight). Whether the names are models or adapters is the
// state's question (ValidateAliasNames). llmgwctl, the AdminService and
// Apply run it alike.
func ValidateAlias(a *llmgwv1.Alias) error {
	if a == nil {
		return invalid("alias", "required")
	}
	if err := checkName("name", a.GetName()); err != nil {
		return err
	}
	n := len(a.GetTargets())
	if n == 0 {
		return invalid("targets", "at least one target is required")
	}
	if n > MaxAliasTargets {
		return invalid("targets", "at most %d, got %d", MaxAliasTargets, n)
	}
	seen := map[string]bool{}
	var total uint64
	for i, t := range a.GetTargets() {
		field := fmt.Sprintf("targets[%d]", i)
		if err := checkName(field+".target", t.GetTarget()); err != nil {
			return err
		}
		if t.GetTarget() == a.GetName() {
			return invalid(field+".target", "an alias cannot name itself")
		}
		if seen[t.GetTarget()] {
			return invalid(field+".target", "%q is listed twice", t.GetTarget())
		}
		seen[t.GetTarget()] = true
		if t.GetWeight() > MaxAliasWeight {
			return invalid(field+".weight", "at most %d, got %d", MaxAliasWeight, t.GetWeight())
		}
		total += uint64(t.GetWeight())
	}
	if total == 0 {
		return invalid("targets", "at least one target must have a weight above 0")
	}
	switch a.GetSticky() {
	case AliasStickyNone, AliasStickyKey, AliasStickySession:
	default:
		return invalid("sticky", "must be %q, %q or empty, got %q", AliasStickyKey, AliasStickySession, a.GetSticky())
	}
	if n := len(a.GetFallbacks()); n > MaxAliasFallbacks {
		return invalid("fallbacks", "at most %d, got %d", MaxAliasFallbacks, n)
	}
	seen = map[string]bool{}
	for i, f := range a.GetFallbacks() {
		field := fmt.Sprintf("fallbacks[%d]", i)
		if err := checkName(field, f); err != nil {
			return err
		}
		if f == a.GetName() {
			return invalid(field, "an alias cannot name itself")
		}
		if seen[f] {
			return invalid(field, "%q is listed twice", f)
		}
		seen[f] = true
	}
	return nil
}

// ValidateAliasNames checks an alias against the models in desired
// state: its name is neither a model nor an adapter of one, and every
// target and fallback is one of them. The AdminService asks it of its own
// state to refuse without a log entry, Apply of the state it applies to.
func ValidateAliasNames(a *llmgwv1.Alias, models []*llmgwv1.Model) error {
	owner := map[string]string{} // a model's or adapter's name -> its model
	for _, m := range models {
		owner[m.GetName()] = m.GetName()
		for _, ad := range m.GetAdapters() {
			owner[ad.GetName()] = m.GetName()
		}
	}
	if o, ok := owner[a.GetName()]; ok {
		if o == a.GetName() {
			return invalid("name", "%q is a model; aliases share the model namespace", a.GetName())
		}
		return invalid("name", "%q is an adapter of model %q; aliases share the model namespace", a.GetName(), o)
	}
	for i, t := range a.GetTargets() {
		if _, ok := owner[t.GetTarget()]; !ok {
			return invalid(fmt.Sprintf("targets[%d].target", i), "%q is not a model or an adapter (apply the model first)", t.GetTarget())
		}
	}
	for i, f := range a.GetFallbacks() {
		if _, ok := owner[f]; !ok {
			return invalid(fmt.Sprintf("fallbacks[%d]", i), "%q is not a model or an adapter (apply the model first)", f)
		}
	}
	return nil
}

// putAlias creates or replaces an alias.
func (a *applier) putAlias(p *llmgwv1.PutAliasCommand) (any, error) {
	if err := ValidateAlias(p.GetAlias()); err != nil {
		return nil, err
	}
	models := sortedValues(a.f.models, func(m *llmgwv1.Model) string { return m.Name })
	if err := ValidateAliasNames(p.Alias, models); err != nil {
		return nil, err
	}
	al := proto.Clone(p.Alias).(*llmgwv1.Alias)
	al.Revision = a.index
	a.f.aliases[al.Name] = al
	a.put(al)
	return proto.Clone(al), nil
}

// deleteAlias removes an alias: routers answer its name 404 once the
// change reaches them.
func (a *applier) deleteAlias(p *llmgwv1.DeleteAliasCommand) (any, error) {
	if _, ok := a.f.aliases[p.GetName()]; !ok {
		return nil, fmt.Errorf("alias %q: %w", p.GetName(), ErrNotFound)
	}
	delete(a.f.aliases, p.Name)
	a.del(&llmgwv1.Alias{Name: p.Name})
	return nil, nil
}

// modelNameFree refuses a model, or an adapter of it, named like an
// alias: the names share one namespace (design §7.9).
func (a *applier) modelNameFree(m *llmgwv1.Model) error {
	if _, ok := a.f.aliases[m.GetName()]; ok {
		return invalid("name", "%q is an alias; models share the namespace with aliases (llmgwctl alias delete %s first)", m.GetName(), m.GetName())
	}
	for i, ad := range m.GetAdapters() {
		if _, ok := a.f.aliases[ad.GetName()]; ok {
			return invalid(fmt.Sprintf("adapters[%d].name", i), "%q is an alias; adapters share the namespace with aliases", ad.GetName())
		}
	}
	return nil
}

// Aliases returns copies of every alias, sorted by name.
func (f *FSM) Aliases() []*llmgwv1.Alias {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return cloneSorted(f.aliases, func(a *llmgwv1.Alias) string { return a.Name })
}

// Alias returns a copy of the named alias.
func (f *FSM) Alias(name string) (*llmgwv1.Alias, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	a, ok := f.aliases[name]
	if !ok {
		return nil, false
	}
	return proto.Clone(a).(*llmgwv1.Alias), true
}
