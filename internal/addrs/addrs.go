// Package addrs is how a client of the control plane chooses which server
// to talk to next.
//
// Agents, routers and llmgwctl are given a few control addresses and learn
// the whole list from the cluster (design §5.6). They use one server at a
// time and, when it fails, move on to the next in a fixed rotation rather
// than a random pick, so a client with N addresses tries every one of them
// within N attempts. The learned servers come first (they are the current
// cluster), then any configured address the cluster did not name (it may be
// a server the client's view has not caught up with).
//
// It imports only the standard library (design §3).
package addrs

// Merge returns the addresses of lists in order of first appearance, without
// empty strings or duplicates. Merge(learned, configured) is the rotation a
// client follows.
func Merge(lists ...[]string) []string {
	var out []string
	seen := map[string]bool{}
	for _, l := range lists {
		for _, a := range l {
			if a == "" || seen[a] {
				continue
			}
			seen[a] = true
			out = append(out, a)
		}
	}
	return out
}

// Ring walks a list of addresses in rotation. The list may change between
// calls (a client learns new servers); the ring keeps only its position. The
// zero value starts at the first address. It is not safe for concurrent use.
type Ring struct{ next int }

// Next returns the next address of list in rotation, or "" when list is
// empty.
func (r *Ring) Next(list []string) string {
	if len(list) == 0 {
		return ""
	}
	i := r.next % len(list)
	if i < 0 {
		i = 0
	}
	r.next = i + 1
	return list[i]
}

// StartAfter makes the ring's next address the one after addr in list (the
// first when addr is not there): a client that learned a new list right
// after losing addr does not start again with the server it just lost.
func (r *Ring) StartAfter(list []string, addr string) {
	r.next = 0
	for i, a := range list {
		if a == addr {
			r.next = i + 1
			return
		}
	}
}
