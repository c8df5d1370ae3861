package admin

import (
	"cmp"
	"context"
	"slices"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// ListAdapters joins each adapter a model declares with its placement
// (where the leader wants it held) and what the model's replicas report of
// it. A replica reporting an adapter its placement no longer names is
// listed too: that is an adapter being unloaded, which an operator wants to
// see as much as a loaded one.
func (a *Service) ListAdapters(_ context.Context, req *llmgwv1.ListRequest) (*llmgwv1.ListAdaptersResponse, error) {
	st, err := a.read(req)
	if err != nil {
		return nil, err
	}
	placed := map[string][]string{}
	for _, p := range st.AdapterPlacements {
		placed[p.Model+"\x00"+p.Adapter] = p.Replicas
	}
	// reported[model][adapter] is every replica's status of that adapter.
	reported := map[string]map[string][]*llmgwv1.AdapterStatus{}
	for _, r := range st.Replicas {
		for name, s := range a.reports.AdaptersOf(r) {
			if reported[r.Model] == nil {
				reported[r.Model] = map[string][]*llmgwv1.AdapterStatus{}
			}
			reported[r.Model][name] = append(reported[r.Model][name], s)
		}
	}
	out := &llmgwv1.ListAdaptersResponse{Revision: st.Revision}
	for _, m := range st.Models {
		for _, ad := range m.Adapters {
			statuses := reported[m.Name][ad.Name]
			slices.SortFunc(statuses, func(x, y *llmgwv1.AdapterStatus) int { return cmp.Compare(x.ReplicaId, y.ReplicaId) })
			out.Adapters = append(out.Adapters, &llmgwv1.AdapterView{
				Model: m.Name, Adapter: ad.Name, Path: ad.Path,
				PlacedOn: placed[m.Name+"\x00"+ad.Name], Statuses: statuses,
			})
		}
	}
	slices.SortFunc(out.Adapters, func(x, y *llmgwv1.AdapterView) int {
		return cmp.Or(cmp.Compare(x.Model, y.Model), cmp.Compare(x.Adapter, y.Adapter))
	})
	return out, nil
}
