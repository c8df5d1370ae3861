package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// commitLog follows the leader's watch stream and notes when each replica
// change arrived: the leader's FSM applies an entry as it commits, and its
// watch sends the change at once, so this is when placement's decision
// committed — without the followers' lag (a follower learns of a commit
// with the leader's next append or heartbeat, up to a heartbeat interval
// later), which the agents' desired sets include when their session is on
// a follower.
type commitLog struct {
	mu      sync.Mutex
	changes []commit
}

// commit is one replica change as the leader applied it.
type commit struct {
	at       time.Time
	revision uint64
}

// follow watches the leader until ctx ends; the stream's end is an error
// (a step timed without it would be wrong).
func (c *commitLog) follow(ctx context.Context, w llmgwv1.WatchServiceClient) error {
	st, err := w.Watch(ctx, &llmgwv1.WatchRequest{ClientId: "fleetsim-commits"})
	if err != nil {
		return err
	}
	for {
		ev, err := st.Recv()
		if err != nil {
			return err
		}
		ch := ev.GetChange()
		if ch == nil || ch.GetReplica() == nil {
			continue
		}
		at := time.Now()
		c.mu.Lock()
		c.changes = append(c.changes, commit{at: at, revision: ch.Revision})
		c.mu.Unlock()
	}
}

// span is the first and last replica change after revision rev; ok is
// false when none came.
func (c *commitLog) span(rev uint64) (first, last time.Time, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.changes {
		if ch.revision <= rev {
			continue
		}
		if !ok {
			first = ch.at
		}
		last, ok = ch.at, true
	}
	return first, last, ok
}

// leader is the index (into fl.admin) of the server that leads now.
func (fl *fleet) leader(ctx context.Context) (int, error) {
	st, err := fl.admin[0].ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{})
	if err != nil {
		return 0, err
	}
	for i, p := range fl.servers {
		if p.name == st.Leader {
			return i, nil
		}
	}
	return 0, fmt.Errorf("leader %q is none of the servers", st.Leader)
}
