package fsm

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// setAdapterPlacement replaces one adapter's placement (design §7.6); an empty
// replica list deletes it. The leader decides where an adapter goes; the FSM
// only refuses what must never be recorded, whatever view the leader
// decided on: an adapter outside its model's catalog, a replica of another
// model, or more than max_loaded_adapters on one replica.
func (a *applier) setAdapterPlacement(p *llmgwv1.SetAdapterPlacementCommand) (any, error) {
	if p.Placement == nil {
		return nil, invalid("placement", "required")
	}
	in := p.Placement
	if in.Adapter == "" {
		return nil, invalid("placement.adapter", "required")
	}
	m, ok := a.f.models[in.Model]
	if !ok {
		return nil, fmt.Errorf("adapter %q of model %q: %w", in.Adapter, in.Model, ErrNotFound)
	}
	if !slices.ContainsFunc(m.Adapters, func(ad *llmgwv1.Adapter) bool { return ad.GetName() == in.Adapter }) {
		return nil, fmt.Errorf("adapter %q is not in model %q's catalog: %w", in.Adapter, m.Name, ErrNotFound)
	}
	if len(in.Replicas) == 0 {
		if _, ok := a.f.adapters[in.Adapter]; ok {
			a.dropPlacement(in.Adapter)
		}
		return nil, nil
	}
	if m.MaxLoadedAdapters == 0 {
		// Every adapter is loaded at start on every replica: nothing is
		// placed at run time.
		return nil, fmt.Errorf("adapter %q: model %q has max_loaded_adapters 0 (all loaded at start): %w", in.Adapter, m.Name, ErrConflict)
	}
	replicas := slices.Clone(in.Replicas)
	slices.Sort(replicas)
	for i, id := range replicas {
		if i > 0 && replicas[i-1] == id {
			return nil, invalid("placement.replicas", "%q is listed twice", id)
		}
		r, ok := a.f.replicas[id]
		if !ok {
			return nil, fmt.Errorf("adapter %q on replica %q: %w", in.Adapter, id, ErrNotFound)
		}
		if r.Model != m.Name {
			return nil, fmt.Errorf("adapter %q of model %q on replica %q of model %q: %w", in.Adapter, m.Name, id, r.Model, ErrConflict)
		}
		if n := a.f.adaptersOn(id, in.Adapter) + 1; n > int(m.MaxLoadedAdapters) {
			return nil, fmt.Errorf("adapter %q on replica %q: it would hold %d adapters, more than max_loaded_adapters %d: %w", in.Adapter, id, n, m.MaxLoadedAdapters, ErrConflict)
		}
	}
	out := &llmgwv1.AdapterPlacement{Model: m.Name, Adapter: in.Adapter, Replicas: replicas, Revision: a.index}
	a.f.adapters[out.Adapter] = out
	a.put(out)
	return proto.Clone(out), nil
}

// adaptersOn counts the placements naming replica id, other than adapter
// except's.
func (f *FSM) adaptersOn(id, except string) int {
	n := 0
	for name, p := range f.adapters {
		if name != except && slices.Contains(p.Replicas, id) {
			n++
		}
	}
	return n
}

func (a *applier) dropPlacement(adapter string) {
	p := a.f.adapters[adapter]
	delete(a.f.adapters, adapter)
	a.del(&llmgwv1.AdapterPlacement{Model: p.Model, Adapter: p.Adapter})
}

// setPlacementReplicas records p with replicas, or deletes it when none are
// left.
func (a *applier) setPlacementReplicas(p *llmgwv1.AdapterPlacement, replicas []string) {
	if len(replicas) == 0 {
		a.dropPlacement(p.Adapter)
		return
	}
	out := &llmgwv1.AdapterPlacement{Model: p.Model, Adapter: p.Adapter, Replicas: replicas, Revision: a.index}
	a.f.adapters[out.Adapter] = out
	a.put(out)
}

// dropReplicaFromPlacements takes a removed replica out of every placement,
// in the removing command, so no revision shows an adapter placed on a
// replica that does not exist.
func (a *applier) dropReplicaFromPlacements(id string) {
	for _, p := range sortedValues(a.f.adapters, func(p *llmgwv1.AdapterPlacement) string { return p.Adapter }) {
		if i := slices.Index(p.Replicas, id); i >= 0 {
			a.setPlacementReplicas(p, slices.Delete(slices.Clone(p.Replicas), i, i+1))
		}
	}
}

// fitAdapterPlacements brings model m's placements in line with a re-applied
// model in the same command: an adapter gone from the catalog loses its
// placement; max_loaded_adapters 0 (everything loaded at start) drops them
// all; a lower max_loaded_adapters drops, on each replica over it, the
// placements of the adapters last in name order. Deterministic, as
// everything here must be; the leader places again on demand.
func (a *applier) fitAdapterPlacements(m *llmgwv1.Model) {
	held := map[string]int{}
	for _, p := range sortedValues(a.f.adapters, func(p *llmgwv1.AdapterPlacement) string { return p.Adapter }) {
		if p.Model != m.Name {
			continue
		}
		inCatalog := slices.ContainsFunc(m.Adapters, func(ad *llmgwv1.Adapter) bool { return ad.GetName() == p.Adapter })
		if !inCatalog || m.MaxLoadedAdapters == 0 {
			a.dropPlacement(p.Adapter)
			continue
		}
		keep := make([]string, 0, len(p.Replicas))
		for _, id := range p.Replicas {
			if held[id] < int(m.MaxLoadedAdapters) {
				held[id]++
				keep = append(keep, id)
			}
		}
		if len(keep) != len(p.Replicas) {
			a.setPlacementReplicas(p, keep)
		}
	}
}

// AdapterPlacement returns a copy of the named adapter's placement.
func (f *FSM) AdapterPlacement(adapter string) (*llmgwv1.AdapterPlacement, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	p, ok := f.adapters[adapter]
	if !ok {
		return nil, false
	}
	return proto.Clone(p).(*llmgwv1.AdapterPlacement), true
}

// AdapterModel returns a copy of the model whose catalog lists adapter.
func (f *FSM) AdapterModel(adapter string) (*llmgwv1.Model, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	for _, m := range f.models {
		if slices.ContainsFunc(m.Adapters, func(ad *llmgwv1.Adapter) bool { return ad.GetName() == adapter }) {
			return proto.Clone(m).(*llmgwv1.Model), true
		}
	}
	return nil, false
}
