package cluster

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/llmgw/llmgw/controlplane/gossip"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Raft figures a server attaches to its ClusterStatus answer as gRPC
// headers, so the leader's autopilot can judge its health: how servers
// before ClusterStatusResponse's raft_last_* fields sent them. The
// AdminService sends both for one release, so an older leader still reads
// a newer server; the autopilot delegate reads the fields and falls back
// to these for an older server. Drop them one release after the fields.
const (
	HeaderLastIndex   = "llmgw-raft-last-index"
	HeaderLastTerm    = "llmgw-raft-last-term"
	HeaderLastContact = "llmgw-raft-last-contact-ms"
)

// autopilotDelegate is autopilot's view of the application: gossip says who
// is alive, each server's ClusterStatus says how far its log is.
type autopilotDelegate Cluster

func (d *autopilotDelegate) AutopilotConfig() *autopilot.Config {
	return &autopilot.Config{
		CleanupDeadServers:      d.cfg.CleanupDeadServers,
		LastContactThreshold:    max(200*time.Millisecond, d.cfg.HeartbeatTimeout/2),
		MaxTrailingLogs:         250,
		MinQuorum:               uint(d.cfg.BootstrapExpect),
		ServerStabilizationTime: d.cfg.ServerStabilizationTime,
	}
}

func (d *autopilotDelegate) NotifyState(st *autopilot.State) { d.autopilotState.Store(st) }

func (d *autopilotDelegate) FetchServerStats(ctx context.Context, servers map[raft.ServerID]*autopilot.Server) map[raft.ServerID]*autopilot.ServerStats {
	c := (*Cluster)(d)
	out := map[raft.ServerID]*autopilot.ServerStats{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id := range servers {
		if string(id) == c.cfg.NodeID {
			idx, term, _ := c.raft.LocalStats()
			mu.Lock()
			out[id] = &autopilot.ServerStats{LastIndex: idx, LastTerm: term}
			mu.Unlock()
			continue
		}
		m, ok := c.g.Member(string(id))
		if !ok || !m.Status.Live() {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, max(c.cfg.AutopilotInterval/2, 100*time.Millisecond))
			defer cancel()
			var hdr metadata.MD
			cs, err := llmgwv1.NewAdminServiceClient(c.pool.Conn(m.Meta.GRPC)).ClusterStatus(cctx, &llmgwv1.ClusterStatusRequest{}, grpc.Header(&hdr))
			if err != nil {
				return
			}
			st, ok := reportedStats(cs, hdr)
			if !ok {
				return
			}
			mu.Lock()
			out[id] = st
			mu.Unlock()
			c.recordHeard(id, st.LastContact, cs.StartedUnixMs)
		})
	}
	wg.Wait()
	return out
}

func (d *autopilotDelegate) KnownServers() map[raft.ServerID]*autopilot.Server {
	c := (*Cluster)(d)
	members := c.g.Snapshot()
	removed := c.removedServers()
	leader := raft.ServerID(c.raft.LeaderID())
	out := map[raft.ServerID]*autopilot.Server{}
	add := func(id, addr, version string, st autopilot.NodeStatus) {
		out[raft.ServerID(id)] = &autopilot.Server{
			ID: raft.ServerID(id), Name: id, Address: raft.ServerAddress(addr), NodeStatus: st,
			Version: version, RaftVersion: raft.ProtocolVersionMax, IsLeader: raft.ServerID(id) == leader,
			NodeType: autopilot.NodeVoter,
		}
	}
	for id, m := range members {
		st := autopilot.NodeUnknown
		switch m.Status {
		case gossip.StatusAlive, gossip.StatusSuspect:
			st = autopilot.NodeAlive
		case gossip.StatusDead:
			st = autopilot.NodeFailed
		case gossip.StatusLeft:
			st = autopilot.NodeLeft
		}
		if removed[id] {
			st = autopilot.NodeLeft
		}
		add(id, m.Meta.Raft, m.Meta.Version, st)
	}
	// A server in the configuration that gossip has not (yet) seen is
	// unknown, never "stale": autopilot would otherwise remove it the moment
	// a new leader's gossip view lags.
	for _, srv := range c.raft.Servers() {
		if _, ok := out[srv.ID]; !ok {
			add(string(srv.ID), string(srv.Address), "", autopilot.NodeUnknown)
		}
	}
	return out
}

// RemoveFailedServer removes a server gossip reports dead or left;
// autopilot has already kept the removal above MinQuorum. It must return
// at once, so the removal runs in a goroutine WhileLeading waits for.
func (d *autopilotDelegate) RemoveFailedServer(srv *autopilot.Server) {
	c := (*Cluster)(d)
	if srv.NodeStatus != autopilot.NodeFailed && srv.NodeStatus != autopilot.NodeLeft {
		return
	}
	c.removalsMu.Lock()
	defer c.removalsMu.Unlock()
	if c.removals == nil {
		return
	}
	c.removals.Go(func() {
		if err := c.raft.RemoveServer(string(srv.ID)); err != nil {
			c.log.Warn("autopilot: removing a failed server failed", "member", string(srv.ID), "err", err)
			return
		}
		c.log.Warn("autopilot: failed server removed from raft", "member", string(srv.ID), "status", string(srv.NodeStatus))
	})
}

// reportedStats is a server's Raft figures as its ClusterStatus answer
// reports them: the response's raft_last_* fields, or, from a server older
// than them (a rolling upgrade), the headers it sent instead. ok is false
// when it sent neither whole, or a figure that is not a number or is
// negative.
func reportedStats(cs *llmgwv1.ClusterStatusResponse, hdr metadata.MD) (*autopilot.ServerStats, bool) {
	if cs.RaftLastIndex != nil && cs.RaftLastTerm != nil && cs.RaftLastContactMs != nil {
		if cs.GetRaftLastContactMs() < 0 {
			return nil, false
		}
		return &autopilot.ServerStats{
			LastIndex: cs.GetRaftLastIndex(), LastTerm: cs.GetRaftLastTerm(),
			LastContact: time.Duration(cs.GetRaftLastContactMs()) * time.Millisecond,
		}, true
	}
	num := func(k string) int64 {
		v := hdr.Get(k)
		if len(v) == 0 {
			return -1
		}
		n, err := strconv.ParseInt(v[0], 10, 64)
		if err != nil {
			return -1
		}
		return n
	}
	idx, term, lc := num(HeaderLastIndex), num(HeaderLastTerm), num(HeaderLastContact)
	if idx < 0 || term < 0 || lc < 0 {
		return nil, false
	}
	return &autopilot.ServerStats{LastIndex: uint64(idx), LastTerm: uint64(term), LastContact: time.Duration(lc) * time.Millisecond}, true
}

// recordHeard notes that server id answered autopilot now, with its last
// contact and, when it said, its start time (Unix ms).
func (c *Cluster) recordHeard(id raft.ServerID, lastContact time.Duration, startedMs *int64) {
	h := heardFrom{at: c.now(), lastContact: lastContact}
	if startedMs != nil {
		h.started = time.UnixMilli(*startedMs)
	}
	c.heardMu.Lock()
	defer c.heardMu.Unlock()
	if c.heard == nil {
		c.heard = map[raft.ServerID]heardFrom{}
	}
	c.heard[id] = h
}

// lastHeard is server id's last answer to this leader's autopilot.
func (c *Cluster) lastHeard(id raft.ServerID) (heardFrom, bool) {
	c.heardMu.Lock()
	defer c.heardMu.Unlock()
	h, ok := c.heard[id]
	return h, ok
}

// forgetHeard drops every server's last answer: a new term's figures start
// from nothing.
func (c *Cluster) forgetHeard() {
	c.heardMu.Lock()
	defer c.heardMu.Unlock()
	c.heard = nil
}
