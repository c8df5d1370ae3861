package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/llmgw/llmgw/router/kvindex"
)

// The KV index's debug listing is paged so that no answer grows with the
// index: at 1 M blocks one replica's hashes were 21 MB a request, and ten
// requests at once took the router from 170 to 476 MB.
const (
	// maxDebugReplicas is the most replica statuses a page lists (some
	// 200 KB of JSON).
	maxDebugReplicas = 1000
	// maxDebugHashes is the most block hashes a page lists (some 210 KB).
	maxDebugHashes = 10_000
)

// debugKVIndex serves the precise KV index read-only on the operations
// port, for operators and the exactness tests (ops.go):
//
//   - GET /debug/kvindex: its size and the status of each replica (no
//     hashes), a page of at most ?limit= (1000) replicas after ?after=ID,
//     with "next" — the id to ask after — when more follow. A scraper's.
//   - GET /debug/kvindex?replica=ID: that replica's status and its block
//     hashes (the low 64 bits, as KVBlocks and vLLM's int events carry
//     them), sorted, a page of at most ?limit= (10,000) greater than
//     ?after=HASH, with "next" when more follow; 404 when the index holds
//     nothing for it. ?tier=cpu or ?tier=storage lists that offload
//     tier's hashes instead of the GPU's (design §7.5 "Offload tiers"). An admin's only: a hash is what a prompt's blocks
//     hash to, so whoever can hash a guess learns whether a user sent it.
func (r *Router) debugKVIndex(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	id := q.Get("replica")
	if id == "" {
		limit, err := pageLimit(q.Get("limit"), maxDebugReplicas)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		list, more := r.kv.ReplicasPage(q.Get("after"), limit)
		page := struct {
			Size     kvindex.Size     `json:"size"`
			Replicas []kvindex.Status `json:"replicas"`
			Next     string           `json:"next,omitempty"`
		}{Size: r.kv.Size(), Replicas: list}
		if more {
			page.Next = list[len(list)-1].ID
		}
		writeDebugJSON(w, http.StatusOK, page)
		return
	}
	if !r.allowed(w, req, accessAdmin) {
		return
	}
	limit, err := pageLimit(q.Get("limit"), maxDebugHashes)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var after uint64
	first := q.Get("after") == ""
	if !first {
		if after, err = strconv.ParseUint(q.Get("after"), 10, 64); err != nil {
			http.Error(w, fmt.Sprintf("after=%q: want a block hash, a decimal uint64", q.Get("after")), http.StatusBadRequest)
			return
		}
	}
	var (
		st     kvindex.Status
		hashes []uint64
		more   bool
		ok     bool
	)
	switch tier := q.Get("tier"); tier {
	case "", "gpu":
		st, hashes, more, ok = r.kv.BlocksPage(id, after, first, limit)
	case "cpu", "storage":
		t := map[string]kvindex.Tier{"cpu": kvindex.TierCPU, "storage": kvindex.TierStorage}[tier]
		st, ok = r.kv.Status(id)
		var all []uint64
		if ok {
			all, ok = r.kv.TierBlocks(id, t)
		}
		if !first {
			i, found := slices.BinarySearch(all, after)
			if found {
				i++
			}
			all = all[i:]
		}
		hashes, more = all[:min(limit, len(all))], len(all) > limit
	default:
		http.Error(w, fmt.Sprintf("tier=%q: want gpu, cpu or storage", tier), http.StatusBadRequest)
		return
	}
	if !ok {
		writeDebugJSON(w, http.StatusNotFound, map[string]string{"error": "no kv state for replica " + id})
		return
	}
	page := struct {
		kvindex.Status
		Hashes []uint64 `json:"hashes"`
		Next   *uint64  `json:"next,omitempty"`
	}{Status: st, Hashes: hashes}
	if more {
		page.Next = &hashes[len(hashes)-1]
	}
	writeDebugJSON(w, http.StatusOK, page)
}

// pageLimit reads ?limit=, max when absent; a number outside 1..max is an
// error.
func pageLimit(s string, max int) (int, error) {
	if s == "" {
		return max, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > max {
		return 0, fmt.Errorf("limit=%q: want 1 to %d", s, max)
	}
	return n, nil
}

func writeDebugJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
