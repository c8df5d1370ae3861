package router

import (
	"encoding/json"
	"net/http"
)

// sdTargetGroup is one entry of Prometheus's HTTP service discovery
// (https://prometheus.io/docs/prometheus/latest/http_sd/): the targets to
// scrape and the labels every series scraped from them gets.
type sdTargetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// serveSD lists the engines this router can route to as a Prometheus HTTP
// service discovery target list (GET /sd/replicas), one group per replica,
// so a Prometheus scrapes every engine's own /metrics — vLLM's figures,
// which llmgw reads but does not re-export — although the engines' ports are
// dynamic and move when a replica does. Each target is labelled with its
// replica, model, node and engine; the list changes as the router's state
// does, which Prometheus polls at its refresh_interval. Only routable
// replicas are listed: a replica that is not ready has nothing worth
// scraping, and it returns to the list when it is ready again.
//
// Like /metrics it is on the operations port (ops.go), to scrapers and
// admins: it names engine addresses, which a scraper needs and API
// clients do not.
func (r *Router) serveSD(w http.ResponseWriter, _ *http.Request) {
	groups := []sdTargetGroup{}
	for _, m := range r.eps.Models() {
		eps, _ := r.eps.Lookup(m.GetName())
		for _, e := range eps {
			groups = append(groups, sdTargetGroup{
				Targets: []string{e.Address},
				Labels: map[string]string{
					"llmgw_replica": e.ReplicaID,
					"llmgw_model":   e.Model,
					"llmgw_node":    e.Node,
					"llmgw_engine":  m.GetEngine(),
				},
			})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(groups)
}
