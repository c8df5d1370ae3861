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
