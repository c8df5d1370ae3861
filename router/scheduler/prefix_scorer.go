package scheduler

// Prefix decisions, as counted in llmgw_prefix_decisions_total{decision}.
const (
	// DecisionHit: the tree named a candidate for the prompt's prefix.
	DecisionHit = "hit"
	// DecisionMiss: no remembered prefix among the candidates; placed by
	// rendezvous hashing of the prompt's first chunk.
	DecisionMiss = "miss"
	// DecisionLoadOverride: load was lopsided, so prefix affinity was
	// silenced for this request (the imbalance guard).
	DecisionLoadOverride = "load_override"
	// DecisionNoPrompt: the request had no text to match (a prompt under
	// one chunk, or token ids only).
	DecisionNoPrompt = "no_prompt"
)

// Tier-2 decisions, as counted in llmgw_kv_decisions_total{decision}: the
// three the index itself took, then the reasons it could not answer (set
// by whoever fills KVQuery.Fallback), each of which hands the request to
// tier 1.
const (
	// KVHit: some candidate holds at least MinBlocks leading blocks.
	KVHit = "hit"
	// KVMiss: no candidate holds MinBlocks; tier 1 places the request.
	KVMiss = "miss"
	// KVLoadOverride: the imbalance guard silenced the index.
	KVLoadOverride = "load_override"
	// KVUntrusted: some candidates' KV state is untrusted (events lost
	// beyond replay); those are scored by tier 1, the rest by the index.
	KVUntrusted = "untrusted"

	KVNoData          = "no_data"          // no candidate has reported KV state yet
	KVTokenizeTimeout = "tokenize_timeout" // /tokenize over budget
	KVTokenizeError   = "tokenize_error"   // /tokenize failed
	KVMultimodal      = "multimodal"       // images or audio: not hashable by the router
	KVUnsupported     = "unsupported"      // a prompt shape tier 2 does not read
	KVShortPrompt     = "short_prompt"     // under one full block
)

// Prefix steers a request to the replica that has prefilled its prompt's
// prefix: from tier 2's KVQuery when the request carries an answer (plan
// §7.5 tier 2), else from the approximate tree (tier 1).
//
// A scorer rather than a filter on purpose: as a rule, a popular system
// prompt would send everything to one replica — a fine hit rate and an
// unusable p99. As one voice among several, the load scorers can outvote
// it, and the imbalance guard silences it outright when load is lopsided.
func (s *Scheduler) Prefix() Scorer { return s.prefixWith(DefaultParams()) }

// prefixWith is the Prefix scorer with p's tier-2 score.
func (s *Scheduler) prefixWith(p Params) Scorer {
	return &prefixScorer{s: s, cost: p.KVScore == KVScoreCost, queueWeight: p.KVQueueWeight}
}

type prefixScorer struct {
	s *Scheduler
	// cost: tier 2 scores by costScores rather than by shares.
	cost        bool
	queueWeight float64
}

func (*prefixScorer) Name() string { return "prefix" }

func (p *prefixScorer) Score(r *Request, cands []Candidate, out []float64) {
	if q := r.KV; q != nil {
		if q.Fallback == "" && q.Total > 0 {
			d := p.scoreKV(r, q, cands, out)
			p.s.m.kv.WithLabelValues(d).Inc()
			if d != KVMiss {
				return
			}
			// Nobody holds the prefix by the index — but the index hears of
			// a cached prefix a flush interval (250 ms) after the engine
			// cached it, so the tree, which learnt of the send at once, still
			// keeps a burst of one prefix together and routers agreeing.
			clear(out)
		} else {
			p.s.m.kv.WithLabelValues(q.Fallback).Inc()
		}
	}
	p.s.m.prefix.WithLabelValues(p.decide(r, cands, out)).Inc()
}

func (p *prefixScorer) decide(r *Request, cands []Candidate, out []float64) string {
	if len(r.Prefix) == 0 {
		return DecisionNoPrompt
	}
	// The guard first: a hit on a replica that cannot start the request soon
	// is still the wrong place for it.
	if p.s.cfg.Imbalance.Imbalanced(cands) {
		return DecisionLoadOverride
	}
	if k, depth := p.s.tree.Match(r.Prefix, func(k Key) bool { return indexOf(cands, k) >= 0 }); depth > 0 {
		out[indexOf(cands, k)] = 1
		return DecisionHit
	}
	if i := Rendezvous(r.Prefix[0], cands, nil); i >= 0 {
		out[i] = 1
	}
	return DecisionMiss
}

// scoreKV scores from the index (design §7.5 step 5): the share of the
// prompt's blocks each replica holds, so replicas sharing a system prompt
// score alike and the one also holding this conversation scores higher.
// The guard comes first; a best match under MinBlocks is a miss (a shared
// BOS block or chat header says nothing about the conversation). Untrusted
// candidates are scored by the tree, as a share of the prompt's chunks, so
// they compete on the same scale rather than being shunned or favoured.
// With the cost score (Params.KVScore), the trusted candidates' shares are
// replaced by costScores once a hit is established.
func (p *prefixScorer) scoreKV(r *Request, q *KVQuery, cands []Candidate, out []float64) string {
	// The guard spares the index where it can: the replicas that make load
	// lopsided get no prefix score, and the others keep theirs. Only when
	// no cool replica holds the prefix is the index silenced. Tier 1's guard
	// silences the tree outright, since the tree's memory of a send is a
	// guess at what a replica holds; the index's answer is exact, so a cool
	// replica holding the prefix is worth its hit.
	hot := p.s.cfg.Imbalance.Hot(cands)
	// bestPending: how many of the best match's blocks were pending —
	// the fewest among replicas tied for it, so a hit counts as
	// speculative only when confirmed blocks alone would not have made it.
	best, bestPending, untrusted := 0.0, 0, false
	for i := range cands {
		id := cands[i].Key.ID
		if hot != nil && hot[i] {
			continue
		}
		if q.Untrusted[id] {
			untrusted = true
			continue
		}
		m := q.Credited(id)
		switch pend := q.Pending[id]; {
		case m > best:
			best, bestPending = m, pend
		case m == best:
			bestPending = min(bestPending, pend)
		}
		out[i] = m / float64(q.Total)
	}
	if !creditReaches(best, max(q.MinBlocks, 1)) {
		clear(out)
		if hot != nil {
			return KVLoadOverride // only hot replicas hold it: load decides
		}
		if !untrusted {
			return KVMiss
		}
	} else {
		if bestPending > 0 {
			p.s.m.kvSpecHits.Inc()
		}
		if p.cost {
			p.costScores(q, cands, out)
			for i := range out {
				if hot != nil && hot[i] {
					out[i] = 0
				}
			}
		}
	}
	if untrusted && len(r.Prefix) > 0 {
		isUntrusted := func(k Key) bool {
			i := indexOf(cands, k)
			return q.Untrusted[k.ID] && i >= 0 && (hot == nil || !hot[i])
		}
		if k, depth := p.s.tree.Match(r.Prefix, isUntrusted); depth > 0 {
			out[indexOf(cands, k)] = min(float64(depth)/float64(len(r.Prefix)), 1)
		}
	}
	if untrusted {
		return KVUntrusted
	}
	return KVHit
}

// costScores replaces the trusted candidates' shares with a score by
// cost, as NVIDIA Dynamo's KV router chooses (design §7.5 step 5): the
// prefill a replica would spend before this prompt's first token,
//
//	cost = own + KVQueueWeight × queued
//	own    = prompt tokens − credited blocks × block size
//	queued = max(this router's prefill sent there without a first byte yet,
//	             the engine's waiting requests × the mean own cost)
//
// own is the prompt's prefill there; queued the prefill ahead of it — this
// router's exact record, or the agents' load where other routers' (or a
// stale record's) requests wait there too. score = 1 − cost / the highest
// cost, so the cheapest replica scores up to 1, replicas alike score alike
// and the other scorers decide between them.
func (p *prefixScorer) costScores(q *KVQuery, cands []Candidate, out []float64) {
	bs := max(q.BlockSize, 1)
	tokens := max(q.Tokens, q.Total*bs)
	var sum float64
	n := 0
	for i := range cands {
		id := cands[i].Key.ID
		if q.Untrusted[id] {
			continue
		}
		out[i] = max(float64(tokens)-q.Credited(id)*float64(bs), 0)
		sum += out[i]
		n++
	}
	if n == 0 {
		return
	}
	mean, top := sum/float64(n), 0.0
	for i := range cands {
		id := cands[i].Key.ID
		if q.Untrusted[id] {
			continue
		}
		queued := q.Queued[id]
		if !cands[i].Saturated {
			queued = max(queued, cands[i].Waiting*mean)
		}
		out[i] += p.queueWeight * queued
		top = max(top, out[i])
	}
	for i := range cands {
		if q.Untrusted[cands[i].Key.ID] {
			continue
		}
		if top > 0 {
			out[i] = 1 - out[i]/top
		} else {
			out[i] = 1
		}
	}
}

func (p *prefixScorer) Observe(r *Request, chosen *Candidate) {
	if len(r.Prefix) > 0 {
		p.s.tree.Observe(r.Prefix, chosen.Key)
	}
}
