package scheduler

// BreakerOpen drops replicas whose circuit breaker is open (design §7.4).
// A replica whose cooldown has passed is kept even while healthy peers
// remain: its probe is how it gets back into rotation, and a failed probe
// costs one retry before the first byte, never a client error. With every
// breaker open and none due, nothing is left and the client gets 503 with
// Retry-After — better than queueing on engines known to be failing.
func BreakerOpen() Filter { return breakerOpen{} }

type breakerOpen struct{}

func (breakerOpen) Name() string { return "breaker-open" }

func (breakerOpen) Filter(_ *Request, in, out []Candidate) []Candidate {
	for _, c := range in {
		if c.Breaker != BreakerCoolingDown {
			out = append(out, c)
		}
	}
	return out
}

// PoolPriority keeps the replicas with headroom — fewer than t waiting and
// KV use under c, with a fresh reading — so scorers choose among replicas
// that can start the request now. When none qualify it keeps all: a busy
// replica is still better than refusing the request.
func PoolPriority(t, c float64) Filter { return poolPriority{t, c} }

type poolPriority struct{ t, c float64 }

func (poolPriority) Name() string { return "pool-priority" }

func (p poolPriority) Filter(_ *Request, in, out []Candidate) []Candidate {
	n := len(out)
	for _, c := range in {
		if c.healthy(p.t, p.c) {
			out = append(out, c)
		}
	}
	if len(out) == n {
		return append(out, in...)
	}
	return out
}

func (c *Candidate) healthy(t, kv float64) bool {
	return !c.Saturated && c.Waiting < t && c.KVUsage < kv
}

// AdapterAffinity sends an adapter's requests to replicas that hold it
// (design §7.6): holders with headroom, else any holder, else every replica
// (which will load it on demand once placement exists). Requests for the
// base model pass untouched.
func AdapterAffinity(t, c float64) Filter { return adapterAffinity{t, c} }

type adapterAffinity struct{ t, c float64 }

func (adapterAffinity) Name() string { return "adapter-affinity" }

func (a adapterAffinity) Filter(r *Request, in, out []Candidate) []Candidate {
	if r.Adapter == "" {
		return append(out, in...)
	}
	n := len(out)
	for _, c := range in {
		if c.HasAdapter && c.healthy(a.t, a.c) {
			out = append(out, c)
		}
	}
	if len(out) > n {
		return out
	}
	for _, c := range in {
		if c.HasAdapter {
			out = append(out, c)
		}
	}
	if len(out) > n {
		return out
	}
	return append(out, in...)
}

// KVAffinity keeps a prefix on one replica (design §7.5 step 5): for a
// request tier 2 answered with a hit, the only candidate left is the
// prefix's primary — of the replicas holding the prompt's longest match and
// not hot by the KV guard (Config.KVImbalance), the one rendezvous hashing
// of the prompt's first chunk ranks highest (among holders of offload
// copies only, the prefix's live home first, then the holder home to the
// fewest live prefixes: offloadTie). When the primary is hot, the
// next holder is; when every holder is hot, or the prefix is new, or some
// candidate's KV state is untrusted, every candidate stays and the scorers
// decide as before — except that a new prefix is kept to the replicas home
// to the fewest live prefixes (place), and a request whose prompt could not
// be tokenized goes to its first chunk's home (home).
//
// Why one replica and not a score among holders: every request sent past a
// prefix's home copies it into another cache. Once a fleet's caches are
// near full those copies evict other prefixes, whose next requests miss and
// copy again — with 8 system prompts on 4 replicas of 256 blocks, spreading
// by score (a weighted P2C draw sends a few percent of requests past any
// finite score gap, and balancing among equal holders keeps every copy
// warm) left each prompt on 2–4 replicas and each replica with 3–6 of them
// where 2–3 fit. Why longest match, then rendezvous: every router sees the
// same index and the same candidates, so all of them pick the same primary
// without talking, and a copy that lost blocks stops being chosen, goes
// cold, and is the first thing its engine's LRU evicts.
func (s *Scheduler) KVAffinity() Filter { return kvAffinity{s.cfg.KVImbalance.imbalance(), s.homes, s} }

type kvAffinity struct {
	guard Imbalance
	homes *homes
	// s, when set, brings the cache-pressure rule (KVPressure).
	s *Scheduler
}

func (kvAffinity) Name() string { return "kv-affinity" }

func (f kvAffinity) Filter(r *Request, in, out []Candidate) []Candidate {
	q := r.KV
	if q == nil || len(in) < 2 {
		return append(out, in...)
	}
	var key uint64
	if len(r.Prefix) > 0 {
		key = r.Prefix[0]
	}
	if q.Fallback == KVTokenizeTimeout || q.Fallback == KVTokenizeError {
		return f.home(key, in, out)
	}
	if q.Fallback != "" || q.Total == 0 {
		return append(out, in...)
	}
	hot := f.guard.Hot(in)
	best := 0.0
	for i := range in {
		id := in[i].Key.ID
		if q.Untrusted[id] {
			return append(out, in...)
		}
		if hot == nil || !hot[i] {
			best = max(best, q.Credited(id))
		}
	}
	if !creditReaches(best, max(q.MinBlocks, 1)) {
		n := len(out)
		out = f.place(key, hot, in, out)
		if len(out) == n+1 {
			f.noteNewSession(r, q, out[n].Key)
		}
		return out
	}
	// Holders that tie at the best credit with none of it on the GPU hold
	// it only in offload tiers, which keep every prefix a replica ever
	// computed: among them the prefix stays on its live home, as a prefix
	// no one holds does (place), and without one goes to the holder home
	// to the fewest live prefixes, as place spreads new ones. Rendezvous
	// alone there would move each prefix, once its GPU copy is gone, to
	// its hash's choice among every replica that ever held it, piling
	// prefixes by hash where place spread them — for a prefix idle past
	// the homes window, a whole burst of it, on the replica of another
	// prefix that came back at the same time. A tie with GPU blocks stays
	// rendezvous's, so routers agree.
	t := offloadTie{key: key, q: q}
	if f.homes != nil && key != 0 {
		t.home, t.hasHome = f.homes.get(key)
	}
	j := -1
	for i := range in {
		if (hot == nil || !hot[i]) && q.Credited(in[i].Key.ID) == best &&
			(j < 0 || t.before(f.homes, &in[i], &in[j])) {
			j = i
		}
	}
	f.homes.set(key, in[j].Key)
	if c := f.pressureChoice(r, q, hot, in, j); c != j {
		return append(out, in[c])
	}
	return append(out, in[j])
}

// offloadTie orders the holders tied at a prefix's best credit.
type offloadTie struct {
	key     uint64
	q       *KVQuery
	home    Key
	hasHome bool
	counts  map[Key]int // the homes' counts, read at the first offload-only pair
}

// before orders two holders tied at the best credit. When neither holds
// any of the prompt on the GPU (offload copies only): the prefix's live
// home first, then the holder home to fewer live prefixes. Otherwise, and
// among equals, rendezvous hashing of key.
func (t *offloadTie) before(h *homes, a, b *Candidate) bool {
	if t.q.Matched[a.Key.ID] == 0 && t.q.Matched[b.Key.ID] == 0 {
		if t.hasHome {
			switch t.home {
			case a.Key:
				return true
			case b.Key:
				return false
			}
		}
		if h != nil && t.key != 0 {
			if t.counts == nil {
				t.counts = h.counts(t.key)
			}
			if ca, cb := t.counts[a.Key], t.counts[b.Key]; ca != cb {
				return ca < cb
			}
		}
	}
	return rank(t.key, a) > rank(t.key, b)
}

// home keeps, for a request the index could not answer because its
// prompt could not be tokenized in time, the primary tier 2 last chose for
// its first chunk (homes) when that is a candidate and not hot: the
// request most likely shares that prefix, and the tree's guess, with tier
// 1's stricter guard, would move it (and copy the prefix) whenever tier 2's
// affinity has made load lopsided. Without a live home, all stay.
func (f kvAffinity) home(key uint64, in, out []Candidate) []Candidate {
	if f.homes == nil || key == 0 {
		return append(out, in...)
	}
	k, ok := f.homes.get(key)
	if !ok {
		return append(out, in...)
	}
	hot := f.guard.Hot(in)
	for i := range in {
		if in[i].Key == k && (hot == nil || !hot[i]) {
			return append(out, in[i])
		}
	}
	return append(out, in...)
}

// place chooses, for a prefix no cool replica holds, the cool replica home
// to the fewest live prefixes (homes) — rendezvous hashing of the prefix
// breaking ties — and records it as the prefix's home at once, so the
// requests of a burst that follow it (before the engine's events tell the
// index where the prefix went) land there too, and the next new prefix
// goes elsewhere: with a few prefixes, rendezvous alone piles three on one
// replica and none on another. With no cool replica, all stay.
func (f kvAffinity) place(key uint64, hot []bool, in, out []Candidate) []Candidate {
	if f.homes == nil || key == 0 {
		return append(out, in...)
	}
	if k, ok := f.homes.get(key); ok {
		if i := indexOf(in, k); i >= 0 && (hot == nil || !hot[i]) {
			f.homes.set(key, k)
			return append(out, in[i])
		}
	}
	counts := f.homes.counts(key)
	j := -1
	for i := range in {
		if hot != nil && hot[i] {
			continue
		}
		if j < 0 || counts[in[i].Key] < counts[in[j].Key] ||
			(counts[in[i].Key] == counts[in[j].Key] && rank(key, &in[i]) > rank(key, &in[j])) {
			j = i
		}
	}
	if j < 0 {
		return append(out, in...)
	}
	f.homes.set(key, in[j].Key)
	return append(out, in[j])
}
