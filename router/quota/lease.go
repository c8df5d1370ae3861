package quota

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// callTimeout bounds each call to the control plane.
const callTimeout = 2 * time.Second

// flushOnStop bounds the last flush when the router stops.
const flushOnStop = 3 * time.Second

// Run renews the shares every Renew (and at once when a request met a
// scope without one), and flushes the metered usage every Flush, until
// ctx ends; then it flushes once more, within flushOnStop, so a router
// stopped in order loses none of its usage. It returns nil.
func (q *Quota) Run(ctx context.Context) error {
	renew := time.NewTicker(q.cfg.Renew)
	defer renew.Stop()
	flush := time.NewTicker(q.cfg.Flush)
	defer flush.Stop()
	flushed := make(chan struct{}, 1)
	flushing := false
	q.renew(ctx)
	for {
		select {
		case <-ctx.Done():
			stop, cancel := context.WithTimeout(context.Background(), flushOnStop)
			if !flushing {
				q.flush(stop)
			} else {
				<-flushed
				q.flush(stop)
			}
			cancel()
			return nil
		case <-renew.C:
			q.renew(ctx)
		case <-q.kick:
			q.renew(ctx)
		case <-flush.C:
			// A flush may wait on an election; renewals go on meanwhile.
			if !flushing {
				flushing = true
				go func() {
					q.flush(ctx)
					flushed <- struct{}{}
				}()
			}
		case <-flushed:
			flushing = false
		}
	}
}

// renew sends one claim per scope of every tenant the desired state
// defines, and applies the grants.
func (q *Quota) renew(ctx context.Context) {
	for name := range q.tenants() {
		q.tenantOf(name) // scopes for tenants not seen yet, so they are leased before their first request
	}
	sent := q.cfg.Now()
	req := &llmgwv1.LeaseRequest{Router: q.cfg.Router, Session: q.session}
	q.mu.RLock()
	ts := make([]*tenant, 0, len(q.state))
	for _, t := range q.state {
		ts = append(ts, t)
	}
	q.mu.RUnlock()
	defs := q.tenants()
	for _, t := range ts {
		t.mu.Lock()
		t.sync(defs[t.name])
		for _, s := range t.scopes {
			req.Claims = append(req.Claims, t.claim(s, sent))
		}
		t.mu.Unlock()
	}
	if len(req.Claims) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	resp, err := q.client.Lease(cctx, req)
	cancel()
	if err != nil {
		q.m.leaseFailures.Inc()
		q.log.Debug("quota: lease renewal failed; shares hold until their lease ends", "err", err)
		return
	}
	if resp.GetSettling() {
		q.m.leaseSettling.Inc()
		return
	}
	term := time.Duration(resp.GetTermMs()) * time.Millisecond
	for _, g := range resp.GetGrants() {
		k, ok := kindOf(g.GetScope().GetKind())
		if !ok {
			continue
		}
		q.mu.RLock()
		t := q.state[g.GetScope().GetTenant()]
		q.mu.RUnlock()
		if t == nil {
			continue
		}
		t.mu.Lock()
		for _, s := range t.scopes {
			if s.model == g.GetScope().GetModel() && s.kind == k {
				s.grant(g, sent, sent.Add(term))
			}
		}
		t.mu.Unlock()
	}
}

// claim is what the router says of s at a renewal: what it holds, the
// grant it holds, and its demand since the last claim (per minute).
func (t *tenant) claim(s *scope, now time.Time) *llmgwv1.ShareClaim {
	c := &llmgwv1.ShareClaim{Scope: &llmgwv1.Scope{Tenant: t.name, Model: s.model, Kind: s.kind.proto()}, GrantSeq: s.seq}
	switch {
	case s.kind.budget():
		s.budgetValid(now)
		pending := t.unflushed + t.inBatch
		if s.model != "" {
			pending = t.unflushedModel[s.model] + t.inBatchModel[s.model]
		}
		c.Held = ceil(max(0, s.remaining) + s.reserved + pending)
	default:
		c.Held = ceil(s.inForce(now))
	}
	if s.kind == kindConcurrency {
		c.Demand = ceil(max(s.peak, s.inflight))
		s.peak = s.inflight
	} else {
		per := now.Sub(s.claimed)
		if s.claimed.IsZero() || per < time.Second {
			per = time.Second
		}
		c.Demand = ceil(s.asked * float64(time.Minute) / float64(per))
		s.asked = 0
	}
	s.claimed = now
	return c
}

// grant applies a grant sent for a request made at sent, valid until
// expires: a rate's or concurrency's share replaces the one in force; a
// budget's is a slice added to what is left of the period's.
func (s *scope) grant(g *llmgwv1.ShareGrant, sent, expires time.Time) {
	if g.GetSeq() <= s.seq && s.granted {
		return // an answer older than one applied
	}
	if s.kind.budget() {
		s.budgetValid(sent) // slices already expired are void
	}
	s.granted, s.seq, s.expires = true, g.GetSeq(), expires
	s.fallback = float64(g.GetFallback())
	if g.GetLimit() > 0 {
		s.limit = g.GetLimit()
	}
	if s.kind.budget() {
		s.remaining += float64(g.GetShare())
		s.exhausted = g.GetShare() == 0 // nothing left to slice fleet-wide
		return
	}
	s.share = float64(g.GetShare())
}

func ceil(v float64) uint64 {
	if v <= 0 {
		return 0
	}
	if v >= 1<<63 {
		return 1 << 63
	}
	return uint64(v + 0.999999)
}

// newSession is this run's random number (the leader keys its
// accounting and the roll-up's cursor by router and session).
func newSession() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:]) | 1
}
