package placement

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Saying why (design §5.7): a model short of replicas gets a sentence an
// operator can act on — which nodes match, how many GPUs each has free
// for it and what holds the rest, which nodes match but are not active,
// and which do not match the selector. `replicas: 10` on an 8-GPU node
// once answered "applied" and showed "6 / 10 ready" with an empty
// message. The sentence is bounded (listNodes, listHolders name a few
// and count the rest), so a fleet of thousands still gives a line, and it
// depends only on the state, so the leader can tell when it changes.

const (
	// maxNodesNamed and maxHoldersNamed bound a reason: the nodes named
	// in each list, and the holders (runs of replicas, new replicas of a
	// model) named per node.
	maxNodesNamed   = 3
	maxHoldersNamed = 4
)

// whyUnplaced says why unplaced of m's want replicas fit on no node, after
// this round's placements (nodes as Reconcile left them). unplaced 0
// means the one missing is the replacement of a replica that must move.
func whyUnplaced(m *llmgwv1.Model, unplaced, want int, nodes map[string]*nodeFree) string {
	var b strings.Builder
	if unplaced > 0 {
		fmt.Fprintf(&b, "%d of %d replicas cannot be placed", unplaced, want)
	} else {
		b.WriteString("a replica that must move (node draining, selector, size or revision changed) cannot be replaced, so it stays")
	}
	fmt.Fprintf(&b, ": each needs %d GPU%s", m.GpusPerReplica, plural(int(m.GpusPerReplica)))
	match, inactive, other := sortNodes(m, nodes)
	if len(match) == 0 {
		b.WriteString("; " + noneMatch(m, nodes))
	} else {
		descs := make([]string, 0, min(len(match), maxNodesNamed))
		for _, nf := range match[:min(len(match), maxNodesNamed)] {
			descs = append(descs, describeNode(nf, m.Name))
		}
		b.WriteString("; matching nodes: " + strings.Join(descs, ", ") + more(len(match)-len(descs), "node"))
	}
	writeOthers(&b, m, inactive, other)
	return b.String()
}

// whyNoOwner says why unowned of an external model's endpoints have no
// replica: no ACTIVE node matching the selector owns them (GPUs do not
// count).
func whyNoOwner(m *llmgwv1.Model, unowned int, nodes map[string]*nodeFree) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d endpoints have no owner", unowned, len(m.Endpoints))
	_, inactive, other := sortNodes(m, nodes)
	b.WriteString(": " + noneMatch(m, nodes))
	writeOthers(&b, m, inactive, other)
	return b.String()
}

// sortNodes splits the nodes for m: ACTIVE and matching the selector
// (most GPUs free for m first, then by id), matching but not ACTIVE, and
// not matching (both by id).
func sortNodes(m *llmgwv1.Model, nodes map[string]*nodeFree) (match, inactive, other []*nodeFree) {
	for _, id := range slices.Sorted(maps.Keys(nodes)) {
		nf := nodes[id]
		switch {
		case !Matches(nf.node, m.NodeSelector):
			other = append(other, nf)
		case nf.node.State != llmgwv1.NodeState_NODE_STATE_ACTIVE:
			inactive = append(inactive, nf)
		default:
			match = append(match, nf)
		}
	}
	slices.SortStableFunc(match, func(a, b *nodeFree) int { return cmp.Compare(b.avail(m.Name), a.avail(m.Name)) })
	return match, inactive, other
}

func noneMatch(m *llmgwv1.Model, nodes map[string]*nodeFree) string {
	switch {
	case len(nodes) == 0:
		return "no node has registered"
	case len(m.NodeSelector) > 0:
		return "no active node matches the selector " + selector(m.NodeSelector)
	}
	return "no node is active"
}

// writeOthers adds the matching nodes that are not ACTIVE and, for a model
// with a selector, the nodes that do not match it.
func writeOthers(b *strings.Builder, m *llmgwv1.Model, inactive, other []*nodeFree) {
	if len(inactive) > 0 {
		descs := make([]string, 0, min(len(inactive), maxNodesNamed))
		for _, nf := range inactive[:min(len(inactive), maxNodesNamed)] {
			descs = append(descs, fmt.Sprintf("%s (%s)", nf.node.Id, stateWord(nf.node.State)))
		}
		label := "; nodes not active: "
		if len(m.NodeSelector) > 0 {
			label = "; matching but not active: "
		}
		b.WriteString(label + strings.Join(descs, ", ") + more(len(inactive)-len(descs), "node"))
	}
	if len(other) > 0 && len(m.NodeSelector) > 0 {
		ids := make([]string, 0, min(len(other), maxNodesNamed))
		for _, nf := range other[:min(len(other), maxNodesNamed)] {
			ids = append(ids, nf.node.Id)
		}
		fmt.Fprintf(b, "; nodes not matching the selector %s: %s%s", selector(m.NodeSelector), strings.Join(ids, ", "), more(len(other)-len(ids), "node"))
	}
}

// describeNode is "dev (8 GPUs, 0 free: 8 held by chat-0..chat-7)": the GPUs
// free for a new replica of model, and what holds the others.
func describeNode(nf *nodeFree, model string) string {
	free := nf.avail(model)
	s := fmt.Sprintf("%s (%d GPU%s, %d free", nf.node.Id, nf.node.Gpus, plural(int(nf.node.Gpus)), free)
	if h := listHolders(nf, model); h != "" && int(nf.node.Gpus) > free {
		s += fmt.Sprintf(": %d held by %s", int(nf.node.Gpus)-free, h)
	}
	return s + ")"
}

// listHolders names what holds the node's GPUs that model may not take:
// the awake replicas and model's own sleeping ones, as runs of ordinals
// ("chat-0..chat-7"), then this round's new replicas per model ("2 new of
// chat"), at most maxHoldersNamed items, then how many more replicas.
func listHolders(nf *nodeFree, model string) string {
	type run struct {
		model string
		end   int64 // the last ordinal
		ids   []string
	}
	var runs []run
	hs := slices.Clone(nf.holders)
	slices.SortFunc(hs, func(a, b *llmgwv1.Replica) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(ordinal(a.Id, a.Model), ordinal(b.Id, b.Model)), cmp.Compare(a.Id, b.Id))
	})
	for _, r := range hs {
		if r.Sleeping && r.Model != model {
			continue // its GPUs are free to model
		}
		o := ordinal(r.Id, r.Model)
		if n := len(runs); n > 0 && runs[n-1].model == r.Model && o >= 0 && runs[n-1].end >= 0 && o == runs[n-1].end+1 {
			runs[n-1].end = o
			runs[n-1].ids = append(runs[n-1].ids, r.Id)
			continue
		}
		runs = append(runs, run{model: r.Model, end: o, ids: []string{r.Id}})
	}
	var items []string
	left := 0
	for _, r := range runs {
		if len(items) == maxHoldersNamed {
			left += len(r.ids)
			continue
		}
		switch len(r.ids) {
		case 1:
			items = append(items, r.ids[0])
		case 2:
			items = append(items, r.ids[0]+", "+r.ids[1])
		default:
			items = append(items, r.ids[0]+".."+r.ids[len(r.ids)-1])
		}
	}
	for _, name := range slices.Sorted(maps.Keys(nf.added)) {
		n := nf.added[name]
		if len(items) == maxHoldersNamed {
			left += n
			continue
		}
		items = append(items, fmt.Sprintf("%d new of %s", n, name))
	}
	return strings.Join(items, ", ") + more(left, "replica")
}

// more is " and 3 more nodes", or "" for none.
func more(n int, what string) string {
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf(" and %d more %s%s", n, what, plural(n))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// selector is "{gpu: a100, zone: b}", keys sorted.
func selector(sel map[string]string) string {
	parts := make([]string, 0, len(sel))
	for _, k := range slices.Sorted(maps.Keys(sel)) {
		parts = append(parts, k+": "+sel[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func stateWord(s llmgwv1.NodeState) string {
	switch s {
	case llmgwv1.NodeState_NODE_STATE_DRAINING:
		return "draining"
	case llmgwv1.NodeState_NODE_STATE_DOWN:
		return "down"
	}
	return "not active"
}
