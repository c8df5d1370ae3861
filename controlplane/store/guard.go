package store

import (
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// guard is raft's transport with one rule added on the receiving side
// (design §5.2 "Cluster identity"): a server that has state takes log
// entries, snapshots and leadership hand-overs only from a server of its
// own latest Raft configuration. Without it, a leader of another cluster
// — a fresh server started with --bootstrap by mistake, which had added
// this one to its own configuration — was followed at its higher term,
// and its AppendEntries cleared this server's log suffix. TLS cannot tell
// the two apart (both hold a server certificate of the CA); membership
// can. Raft itself already refuses votes from servers outside the
// configuration, so votes pass through.
//
// A server with no state (a fresh one being joined) takes anything: it is
// the leader's join path that admits it, and it has nothing to lose.
type guard struct {
	*raft.NetworkTransport
	out  chan raft.RPC
	done chan struct{}
	wg   sync.WaitGroup
	// members returns the ids and addresses of the latest configuration
	// and whether this server has state, given the sender's id (a cache
	// may re-read for an unknown one); nil until raft runs (setMembers).
	mu      sync.Mutex
	members func(sender raft.ServerID) (map[raft.ServerID]raft.ServerAddress, bool)
	// refused counts and logs a refusal.
	refused func(rpc, from, why string)
}

func newGuard(t *raft.NetworkTransport, refused func(rpc, from, why string)) *guard {
	g := &guard{NetworkTransport: t, out: make(chan raft.RPC), done: make(chan struct{}), refused: refused}
	g.wg.Go(g.forward)
	return g
}

// setMembers gives the guard its source of membership once raft exists.
func (g *guard) setMembers(f func(sender raft.ServerID) (map[raft.ServerID]raft.ServerAddress, bool)) {
	g.mu.Lock()
	g.members = f
	g.mu.Unlock()
}

// Consumer is what raft reads: the transport's RPCs, refused ones answered
// here.
func (g *guard) Consumer() <-chan raft.RPC { return g.out }

// SetHeartbeatHandler guards the transport's heartbeat fast path too: a
// heartbeat at a higher term would make this server follow the sender.
func (g *guard) SetHeartbeatHandler(cb func(rpc raft.RPC)) {
	if cb == nil {
		g.NetworkTransport.SetHeartbeatHandler(nil)
		return
	}
	g.NetworkTransport.SetHeartbeatHandler(func(rpc raft.RPC) {
		if g.admit(rpc) {
			cb(rpc)
		}
	})
}

// Close stops the forwarder, then the transport.
func (g *guard) Close() error {
	select {
	case <-g.done:
	default:
		close(g.done)
	}
	err := g.NetworkTransport.Close()
	g.wg.Wait()
	return err
}

func (g *guard) forward() {
	in := g.NetworkTransport.Consumer()
	for {
		select {
		case <-g.done:
			return
		case rpc := <-in:
			if !g.admit(rpc) {
				continue
			}
			select {
			case g.out <- rpc:
			case <-g.done:
				rpc.Respond(nil, raft.ErrTransportShutdown)
				return
			}
		}
	}
}

// admit reports whether rpc may reach raft, answering it with an error
// when it may not.
func (g *guard) admit(rpc raft.RPC) bool {
	var name string
	var h raft.RPCHeader
	var legacyAddr []byte
	switch req := rpc.Command.(type) {
	case *raft.AppendEntriesRequest:
		name, h, legacyAddr = "append_entries", req.RPCHeader, req.Leader //nolint:staticcheck // older peers set Leader alone
	case *raft.InstallSnapshotRequest:
		name, h, legacyAddr = "install_snapshot", req.RPCHeader, req.Leader //nolint:staticcheck // likewise
	case *raft.TimeoutNowRequest:
		name, h = "timeout_now", req.RPCHeader
	default:
		return true // votes: raft checks membership itself
	}
	g.mu.Lock()
	members := g.members
	g.mu.Unlock()
	if members == nil {
		return true
	}
	conf, hasState := members(raft.ServerID(h.ID))
	if !hasState || len(conf) == 0 {
		return true
	}
	if inConfiguration(conf, h, legacyAddr) {
		return true
	}
	from := string(h.ID)
	if from == "" {
		from = string(legacyAddr)
	}
	why := fmt.Sprintf("%s is not in this server's Raft configuration, and this server has state: it takes entries only from its own cluster's servers", from)
	g.refused(name, from, why)
	rpc.Respond(nil, fmt.Errorf("refused: %s", why))
	return false
}

// inConfiguration matches the sender by id, or by address for a peer
// that sends none.
func inConfiguration(conf map[raft.ServerID]raft.ServerAddress, h raft.RPCHeader, legacyAddr []byte) bool {
	if len(h.ID) > 0 {
		_, ok := conf[raft.ServerID(h.ID)]
		return ok
	}
	addr := h.Addr
	if len(addr) == 0 {
		addr = legacyAddr
	}
	for _, a := range conf {
		if string(a) == string(addr) && len(addr) > 0 {
			return true
		}
	}
	return false
}

// configCache serves the guard's membership reads: raft's configuration
// is read through its main loop, too slow for every heartbeat, so a read
// is reused for a short while; a sender not in the cached copy triggers
// one fresh read (a server just added is then found), at most once per
// refreshMin.
type configCache struct {
	read       func() (map[raft.ServerID]raft.ServerAddress, bool, error)
	now        func() time.Time
	ttl        time.Duration
	mu         sync.Mutex
	conf       map[raft.ServerID]raft.ServerAddress
	hasState   bool
	readAt     time.Time
	lastMissAt time.Time
}

const (
	guardConfigTTL = 2 * time.Second
	guardRefresh   = 200 * time.Millisecond
)

func (c *configCache) get(id raft.ServerID) (map[raft.ServerID]raft.ServerAddress, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	_, known := c.conf[id]
	stale := c.readAt.IsZero() || now.Sub(c.readAt) > c.ttl
	miss := !known && now.Sub(c.lastMissAt) > guardRefresh
	if stale || miss {
		if miss {
			c.lastMissAt = now
		}
		if conf, hasState, err := c.read(); err == nil {
			c.conf, c.hasState, c.readAt = conf, hasState, now
		}
	}
	return c.conf, c.hasState
}
