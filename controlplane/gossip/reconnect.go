package gossip

import (
	"context"
	"math/rand/v2"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/llmgw/llmgw/internal/backoff"
)

// Reconnect defaults (design §5.2). Serf, which Consul and Nomad run on
// memberlist, retries failed members every 30 s for 72 h; a control
// plane has three to seven servers, not thousands of members, so a
// failed server is retried far more often, and a healed partition is
// healthy again within seconds rather than half a minute. The window is
// Serf's.
const (
	DefaultReconnectInterval = 3 * time.Second
	DefaultReconnectTimeout  = 72 * time.Hour
)

// reconnectDialTimeout bounds the reachability check of one attempt: a
// dropped SYN (a partition still in force) costs that, not memberlist's
// stream timeout, and the loop's owner is never held longer than that
// when it stops.
const reconnectDialTimeout = time.Second

// reconnectInterval and reconnectTimeout are tune's values or the
// defaults.
func (t Config) reconnectInterval() time.Duration {
	if t.ReconnectInterval > 0 {
		return t.ReconnectInterval
	}
	return DefaultReconnectInterval
}

func (t Config) reconnectTimeout() time.Duration {
	if t.ReconnectTimeout > 0 {
		return t.ReconnectTimeout
	}
	return DefaultReconnectTimeout
}

// reconnectPlan says, of the members ms as this server's table has them,
// which failed ones to retry now and which to forget: a member dead (not
// left: an operator's leave is final) for longer than timeout is reaped;
// one dead for less is retried unless keep says no (a server removed from
// Raft is not brought back). failedAt is when each member was last seen
// to fail. Both lists are sorted, for the logs and the tests.
func reconnectPlan(ms map[string]Member, failedAt map[string]time.Time, now time.Time, timeout time.Duration, self string, keep func(id string) bool) (retry, reap []string) {
	for id, m := range ms {
		if id == self || m.Status != StatusDead {
			continue
		}
		if at, ok := failedAt[id]; ok && now.Sub(at) > timeout {
			reap = append(reap, id)
			continue
		}
		if keep != nil && !keep(id) {
			continue
		}
		if m.GossipAddr == "" {
			continue
		}
		retry = append(retry, id)
	}
	sort.Strings(retry)
	sort.Strings(reap)
	return retry, reap
}

// Reconnect retries the servers this member sees failed until ctx ends,
// and returns once its attempts have stopped (design §5.2). Memberlist
// alone does not heal a partition longer than its dead timeout: each
// side declares the other dead and neither probes, gossips to (past
// GossipToTheDeadTime) nor pushes state to a dead member again, so after
// the network heals Raft is back at once but gossip stays split until an
// operator joins by hand. This is Serf's reconnect, on the members this
// package tracks:
//   - every ReconnectInterval (drawn with jitter from [interval/2,
//     interval), so servers do not retry in step) each failed member is
//     retried: a TCP dial of its gossip address bounded by a second, then,
//     if it answers, a push/pull join. The first exchange may only make
//     each side refute the other's "dead" with a higher incarnation (an
//     "alive" of the incarnation a server holds as dead is ignored); the
//     refutations then travel by gossip, or, when the member is not alive
//     shortly after, by a second join;
//   - a member that left is never retried (the operator's leave is
//     final), nor one keep refuses (package cluster refuses servers
//     removed from Raft: a gossip tombstone or the replicated
//     SET_SERVER_REMOVED record);
//   - a member failed for longer than ReconnectTimeout is reaped: dropped
//     from this table, as Serf reaps, so Members stops listing it; it is
//     tracked again should it ever come back.
func (g *Gossip) Reconnect(ctx context.Context, keep func(id string) bool) {
	interval := g.tune.reconnectInterval()
	for {
		if !backoff.Sleep(ctx, backoff.Draw(interval, rand.Float64)) {
			return
		}
		g.reconnectRound(ctx, keep)
	}
}

// reconnectRound makes one attempt on every failed member, concurrently,
// and reaps the members past the window; it returns when every attempt
// has.
func (g *Gossip) reconnectRound(ctx context.Context, keep func(id string) bool) {
	g.mu.Lock()
	ms := make(map[string]Member, len(g.members))
	for id, m := range g.members {
		ms[id] = *m
	}
	failedAt := make(map[string]time.Time, len(g.failedAt))
	for id, at := range g.failedAt {
		failedAt[id] = at
	}
	g.mu.Unlock()
	retry, reap := reconnectPlan(ms, failedAt, g.now(), g.tune.reconnectTimeout(), g.self.ID, func(id string) bool {
		return !g.Removed(id) && (keep == nil || keep(id))
	})
	for _, id := range reap {
		g.reap(id, failedAt[id])
	}
	var wg sync.WaitGroup
	for _, id := range retry {
		wg.Go(func() { g.reconnectOne(ctx, id, ms[id].GossipAddr) })
	}
	wg.Wait()
}

// reconnectOne is one attempt on a failed member (see Reconnect).
func (g *Gossip) reconnectOne(ctx context.Context, id, addr string) {
	g.reconnectAttempts.Add(1)
	dctx, cancel := context.WithTimeout(ctx, reconnectDialTimeout)
	conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	cancel()
	if err != nil {
		return // still unreachable: the next round tries again
	}
	_ = conn.Close()
	live := func() bool { m, ok := g.Member(id); return ok && m.Status.Live() }
	for try := 1; try <= 2; try++ {
		if _, err := g.Join([]string{addr}); err != nil {
			g.log.Debug("gossip reconnect failed", "member", id, "gossip_addr", addr, "err", err)
			return
		}
		// The other side refutes after it has answered: give its
		// refutation a moment to arrive (by its gossip, now that it sees
		// this server alive) before carrying it by a second join.
		if waitUntil(ctx, reconnectSettle, live) {
			g.reconnects.Add(1)
			g.log.Info("gossip reconnected a failed server", "member", id, "gossip_addr", addr, "joins", try)
			return
		}
	}
}

// reconnectSettle is how long an attempt waits, after a join, for the
// member to be alive before it joins again.
const reconnectSettle = 300 * time.Millisecond

// waitUntil polls cond every 20 ms for up to d; false when d passed, or
// ctx ended, first.
func waitUntil(ctx context.Context, d time.Duration, cond func() bool) bool {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	end := time.NewTimer(d)
	defer end.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		case <-end.C:
			return cond()
		case <-t.C:
		}
	}
	return true
}

// reap forgets a member failed since at, past the reconnect window.
func (g *Gossip) reap(id string, at time.Time) {
	g.mu.Lock()
	m, ok := g.members[id]
	if !ok || m.Status != StatusDead || !g.failedAt[id].Equal(at) {
		g.mu.Unlock()
		return // it came back, or failed again, meanwhile
	}
	delete(g.members, id)
	delete(g.failedAt, id)
	g.mu.Unlock()
	g.log.Warn("gossip reaped a server failed for longer than the reconnect window", "member", id, "failed_at", at, "reconnect_timeout", g.tune.reconnectTimeout())
	g.notify()
}

// ReconnectStats are the reconnect loop's counters: attempts made on
// failed members, and those that brought one back.
func (g *Gossip) ReconnectStats() (attempts, reconnected uint64) {
	return g.reconnectAttempts.Load(), g.reconnects.Load()
}
