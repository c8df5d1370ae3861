package service

import (
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Membership is what the Authorizer needs of the Raft store (design §11,
// "membership is the authority"): whether a server id belongs to this
// server's cluster.
type Membership interface {
	// Member reports whether id is a server of this server's latest Raft
	// configuration. hasState is false while this server has no Raft
	// state (a fresh server, waiting to be joined or bootstrapped): it
	// then trusts any server certificate, as the Raft transport's guard
	// does, for the leader's join path reaches it before it is a member,
	// and it holds nothing to steal.
	Member(id string) (member, hasState bool)
}

// RaftConfig is the Raft store as ConfigMembers reads it (package store).
type RaftConfig interface {
	// Servers is the latest configuration; nil when it cannot be read.
	Servers() []raft.Server
	// LastIndex is the index of the last entry in this server's log: 0
	// while it has no state.
	LastIndex() uint64
}

// ConfigMembers answers Member from the Raft configuration, cached: raft
// serves its configuration through its main loop, too slow a path for
// every call a server forwards. A copy is reused for configTTL; a caller
// not in it triggers one fresh read, at most once per configRefresh, so a
// server just added is found at its first call while a stranger's calls
// cost one read each 200 ms. The same trade as the Raft guard's
// (controlplane/store/guard.go): a removed server keeps its powers for at
// most configTTL.
type ConfigMembers struct {
	raft RaftConfig
	now  func() time.Time

	mu         sync.Mutex
	ids        map[string]bool
	hasState   bool
	readAt     time.Time
	lastMissAt time.Time
}

const (
	configTTL     = 2 * time.Second
	configRefresh = 200 * time.Millisecond
)

// NewConfigMembers reads r's configuration on the clock now (nil:
// time.Now).
func NewConfigMembers(r RaftConfig, now func() time.Time) *ConfigMembers {
	if now == nil {
		now = time.Now
	}
	return &ConfigMembers{raft: r, now: now}
}

// Member implements Membership.
func (c *ConfigMembers) Member(id string) (member, hasState bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	stale := c.readAt.IsZero() || now.Sub(c.readAt) > configTTL
	miss := !c.ids[id] && now.Sub(c.lastMissAt) > configRefresh
	if stale || miss {
		if miss {
			c.lastMissAt = now
		}
		c.read(now)
	}
	return c.ids[id], c.hasState
}

// read refreshes the copy; a configuration that cannot be read (raft
// shutting down) keeps the last one.
func (c *ConfigMembers) read(now time.Time) {
	servers := c.raft.Servers()
	if servers == nil && !c.readAt.IsZero() {
		return
	}
	ids := make(map[string]bool, len(servers))
	for _, s := range servers {
		ids[string(s.ID)] = true
	}
	c.ids, c.readAt = ids, now
	// A server that has state but no configuration (it cannot be read,
	// or raft has none yet) has nobody to compare with: like the guard,
	// it trusts server certificates until it has one.
	c.hasState = c.raft.LastIndex() > 0 && len(ids) > 0
}
