package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"time"

	"github.com/hashicorp/raft"

	"github.com/llmgw/llmgw/controlplane/gossip"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The operators' verbs on servers (design §5.2): join, leave, members, and
// Raft's list-peers, remove-peer, transfer-leadership. The AdminService
// answers with them; the leader-only ones reach the leader through its
// forwarding. Their errors are complete ("remove peer "c4": ...") and
// wrap this package's sentinels, fsm.ValidationError or the store's
// NotLeaderError, which the services map to gRPC codes.

// CheckAddr checks that addr is host:port.
func CheckAddr(addr string) error {
	if addr == "" {
		return errors.New("required (host:port)")
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return fmt.Errorf("%q is not host:port", addr)
	}
	return nil
}

func errValidation(field, reason string) error {
	return &fsm.ValidationError{Field: field, Reason: reason}
}

// Join joins the gossip pool through the given addresses and reports how
// many answered; Raft membership follows (the leader adds this server, or
// the servers it reached, as non-voters). An explicit join also clears the
// removal of this server and of the servers at those addresses: it is how
// an operator brings back a server `raft remove-peer` took out.
func (c *Cluster) Join(addrs []string) (int, error) {
	if c.g == nil {
		return 0, fmt.Errorf("join: %w", ErrNoGossip)
	}
	if len(addrs) == 0 {
		return 0, fmt.Errorf("join: %w", errValidation("gossip_addrs", "at least one gossip address (host:port) is required"))
	}
	for _, addr := range addrs {
		if err := CheckAddr(addr); err != nil {
			return 0, fmt.Errorf("join: %w", errValidation("gossip_addrs", err.Error()))
		}
	}
	n, err := c.g.Join(addrs)
	if n == 0 && errors.Is(err, gossip.ErrForeignCluster) {
		c.log.Error("join refused: a server of another cluster", "addrs", addrs, "err", err)
		return 0, fmt.Errorf("join %v: %w: %w", addrs, ErrRefused, err)
	}
	if n == 0 {
		c.log.Warn("join failed", "addrs", addrs, "err", err)
		return 0, fmt.Errorf("join %v: none answered: %w (%w)", addrs, ErrUnreachable, err)
	}
	cleared := map[string]bool{c.cfg.NodeID: true}
	for id, m := range c.g.Snapshot() {
		for _, addr := range addrs {
			if sameAddr(m.GossipAddr, addr) {
				cleared[id] = true
			}
		}
	}
	// Cleared in gossip here; the leader copies a clear newer than the
	// replicated record into it (removals.go), and honours it meanwhile.
	removed := c.removedServers()
	for id := range cleared {
		if removed[id] {
			c.log.Info("removal cleared by an explicit join", "member", id)
		}
		c.g.SetRemoved(id, false)
	}
	c.log.Info("joined", "addrs", addrs, "contacted", n)
	return n, nil
}

func sameAddr(a, b string) bool {
	if a == b {
		return true
	}
	ah, ap, err1 := net.SplitHostPort(a)
	bh, bp, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || ap != bp {
		return false
	}
	if bh == "localhost" {
		bh = "127.0.0.1"
	}
	return ah == bh
}

// Members lists every server gossip has seen, as this server sees it, with
// why the cluster refuses it, if it does: its version or expectation, or,
// on the leader of a TLS cluster, its unverified certificate. Without gossip
// it is this server.
func (c *Cluster) Members() []*llmgwv1.Member {
	if c.g == nil {
		self := c.Servers()[0]
		return []*llmgwv1.Member{{
			Id: self.Id, GrpcAddr: self.GrpcAddr, RaftAddr: self.RaftAddr, Version: self.Version,
			Status: string(gossip.StatusAlive), BootstrapExpect: int32(c.cfg.BootstrapExpect),
		}}
	}
	ms := c.g.Snapshot()
	var out []*llmgwv1.Member
	for _, id := range gossip.SortedIDs(ms) {
		m := ms[id]
		refused := c.refusal(m.Meta)
		if refused == "" {
			refused = c.notCertifiedReason(id)
		}
		out = append(out, &llmgwv1.Member{
			Id: id, GossipAddr: m.GossipAddr, GrpcAddr: m.Meta.GRPC, RaftAddr: m.Meta.Raft,
			Version: m.Meta.Version, Status: string(m.Status), BootstrapExpect: int32(m.Meta.Expect),
			Refused: refused,
		})
	}
	return out
}

// Peers is the Raft configuration with autopilot's view of each server,
// sorted by id; only the leader answers.
func (c *Cluster) Peers() ([]*llmgwv1.RaftPeer, error) {
	if !c.raft.IsLeader() {
		return nil, fmt.Errorf("list peers: %w", c.raft.NotLeader())
	}
	st := c.autopilotState.Load()
	leader := c.raft.LeaderID()
	now := c.now()
	var out []*llmgwv1.RaftPeer
	for _, srv := range c.raft.Servers() {
		p := &llmgwv1.RaftPeer{Id: string(srv.ID), Address: string(srv.Address), Voter: srv.Suffrage == raft.Voter, Leader: string(srv.ID) == leader}
		if string(srv.ID) == c.cfg.NodeID {
			p.Version = c.cfg.Version
		} else if c.g != nil {
			if m, ok := c.g.Member(string(srv.ID)); ok {
				p.Version = m.Meta.Version
			}
		}
		if st != nil {
			if ss, ok := st.Servers[srv.ID]; ok {
				p.Healthy = ss.Health.Healthy
				p.LastIndex = ss.Stats.LastIndex
				p.LastContactMs = c.lastContact(srv.ID, now)
				if ss.Health.Healthy && !ss.Health.StableSince.IsZero() {
					p.StableSeconds = int64(c.stable(srv.ID, ss.Health.StableSince, now).Seconds())
				}
			}
		} else if p.Leader {
			// Without autopilot (no gossip: a one-server cluster such as
			// llmgw dev) only the leader's own figures are known; it has
			// been healthy, and so stable, since it started, where 0s
			// would read as just recovered.
			idx, _, _ := c.raft.LocalStats()
			p.Healthy, p.LastIndex = true, idx
			if !c.cfg.Started.IsZero() {
				p.StableSeconds = int64(c.stable(srv.ID, c.cfg.Started, now).Seconds())
			}
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Id < out[j].Id })
	return out, nil
}

// lastContact is how long ago, in milliseconds, the leader last heard from
// server id: 0 for itself; the server's own figure while autopilot reaches
// it; once it stops answering, the time since its last answer plus what it
// said then — autopilot keeps a silent server's last stats, which would show
// a dead server as just heard from. -1 when this leader never heard from it.
func (c *Cluster) lastContact(id raft.ServerID, now time.Time) int64 {
	if string(id) == c.cfg.NodeID {
		return 0
	}
	h, ok := c.lastHeard(id)
	if !ok {
		return -1
	}
	// Answers come every AutopilotInterval; one missed is not yet silence.
	if age := now.Sub(h.at); age > 2*max(c.cfg.AutopilotInterval, 100*time.Millisecond) {
		return (age + h.lastContact).Milliseconds()
	}
	return h.lastContact.Milliseconds()
}

// stable is how long server id has been healthy: autopilot's figure, but
// never more than the server's uptime — a server restarted within
// autopilot's health check keeps its old stable-since otherwise.
func (c *Cluster) stable(id raft.ServerID, since, now time.Time) time.Duration {
	started := c.cfg.Started
	if string(id) != c.cfg.NodeID {
		h, _ := c.lastHeard(id)
		started = h.started
	}
	if !started.IsZero() && started.After(since) {
		since = started
	}
	return max(now.Sub(since), 0)
}

// RemovePeer removes a server from Raft (on the leader) and tombstones it,
// so it is not added back when it shows up alive over gossip again: it
// comes back only through an explicit join. The tombstone is spread by
// gossip and, once every server can apply it, recorded in the replicated
// state, which keeps it across a restart of every server (removals.go).
// The leader cannot remove itself (transfer leadership first, or make it
// leave), nor the last voter.
func (c *Cluster) RemovePeer(ctx context.Context, id string) error {
	if id == "" {
		return fmt.Errorf("remove peer: %w", errValidation("id", "required"))
	}
	if !c.raft.IsLeader() {
		return fmt.Errorf("remove peer: %w", c.raft.NotLeader())
	}
	var found *raft.Server
	voters := 0
	for _, srv := range c.raft.Servers() {
		if srv.Suffrage == raft.Voter {
			voters++
		}
		if string(srv.ID) == id {
			found = &srv
		}
	}
	switch {
	case found == nil:
		return fmt.Errorf("remove peer %q: %w (see raft list-peers)", id, ErrNotPeer)
	case id == c.cfg.NodeID:
		return fmt.Errorf("remove peer %q: %w: it is the leader; transfer leadership first, or make it leave", id, ErrRefused)
	case found.Suffrage == raft.Voter && voters == 1:
		return fmt.Errorf("remove peer %q: %w: it is the last voter", id, ErrRefused)
	}
	if c.g != nil {
		// Without gossip membership is the operator's: no tombstone is
		// needed, and none is committed (it could open the gate).
		c.recordRemoval(ctx, id, true, c.g.SetRemoved(id, true))
	}
	if err := c.raft.RemoveServer(id); err != nil {
		return fmt.Errorf("remove peer %q: %w", id, err)
	}
	c.log.Warn("raft peer removed by an operator", "member", id)
	return nil
}

// TransferLeadership hands leadership to server to, or to the one Raft
// picks when to is "", and waits until the new leader is known; it returns
// the new leader's id. Only the leader answers; to naming the leader
// itself changes nothing.
func (c *Cluster) TransferLeadership(ctx context.Context, to string) (string, error) {
	if !c.raft.IsLeader() {
		return "", fmt.Errorf("transfer leadership: %w", c.raft.NotLeader())
	}
	if to == c.cfg.NodeID {
		return c.cfg.NodeID, nil
	}
	leader, err := c.transfer(ctx, to)
	if err != nil {
		return "", fmt.Errorf("transfer leadership: %w", err)
	}
	return leader, nil
}

// transfer moves leadership away from this node (to `to`, or to Raft's
// choice when empty) and returns the new leader's id.
func (c *Cluster) transfer(ctx context.Context, to string) (string, error) {
	var id, addr string
	if to != "" {
		var target *raft.Server
		for _, srv := range c.raft.Servers() {
			if string(srv.ID) == to {
				target = &srv
			}
		}
		if target == nil {
			return "", fmt.Errorf("to %q: %w (see raft list-peers)", to, ErrNotPeer)
		}
		if target.Suffrage != raft.Voter {
			return "", fmt.Errorf("to %q: %w: it is not a voter yet", to, ErrRefused)
		}
		id, addr = string(target.ID), string(target.Address)
	}
	if err := c.raft.TransferLeadership(id, addr); err != nil {
		return "", fmt.Errorf("%w: %w", ErrRefused, err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.LeaveTimeout)
	defer cancel()
	for {
		if id := c.raft.LeaderID(); id != "" && id != c.cfg.NodeID {
			c.log.Info("leadership transferred", "leader", id)
			return id, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for a new leader: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Leave makes this server leave the cluster gracefully (design §5.2), then
// closes Left so the node stops: a server that left is no longer a server.
// It returns the new leader when this server led. In order:
//  1. refuse when this is the last voter (the cluster would be gone);
//  2. a leader transfers leadership and waits for the new leader;
//  3. gossip Leave: every server sees it "left", so no leader adds it back;
//  4. the leader removes it from Raft (asked directly, and by its own
//     reconcile of left servers); this waits until the removal reaches this
//     server's configuration or LeaveTimeout passes.
func (c *Cluster) Leave(ctx context.Context) (newLeader string, err error) {
	if c.g == nil {
		return "", fmt.Errorf("leave: %w", ErrNoGossip)
	}
	c.leaveMu.Lock()
	defer c.leaveMu.Unlock()
	select {
	case <-c.leaving:
		return "", fmt.Errorf("leave: %w: this server has already left", ErrRefused)
	default:
	}
	voters, selfVoter := 0, false
	for _, srv := range c.raft.Servers() {
		if srv.Suffrage == raft.Voter {
			voters++
			selfVoter = selfVoter || string(srv.ID) == c.cfg.NodeID
		}
	}
	if selfVoter && voters == 1 {
		return "", fmt.Errorf("leave: %w: this server is the last voter; the cluster would be gone", ErrRefused)
	}
	if c.raft.IsLeader() {
		leader, err := c.transfer(ctx, "")
		if err != nil {
			return "", fmt.Errorf("leave: transfer leadership first: %w", err)
		}
		newLeader = leader
	}
	c.log.Info("leaving the cluster", "new_leader", newLeader)
	if err := c.g.Leave(c.cfg.LeaveTimeout); err != nil {
		c.log.Warn("gossip leave not confirmed", "err", err)
	}
	if err := c.removeSelfViaLeader(ctx); err != nil {
		c.log.Warn("removal from raft not confirmed; the leader removes left servers on its own", "err", err)
	}
	c.leaveOnce.Do(func() { close(c.leaving) })
	return newLeader, nil
}

// removeSelfViaLeader asks the leader to remove this server from Raft and
// waits until this server's configuration no longer has it.
func (c *Cluster) removeSelfViaLeader(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.LeaveTimeout)
	defer cancel()
	asked := false
	for {
		in := false
		for _, srv := range c.raft.Servers() {
			in = in || string(srv.ID) == c.cfg.NodeID
		}
		if !in {
			c.log.Info("removed from raft")
			return nil
		}
		if !asked {
			if _, addr, ok := c.LeaderAddr(); ok && !c.raft.IsLeader() {
				rctx, rcancel := context.WithTimeout(ctx, c.cfg.ApplyTimeout)
				_, err := llmgwv1.NewAdminServiceClient(c.pool.Conn(addr)).RemovePeer(ForwardedContext(rctx, c.cfg.NodeID), &llmgwv1.RemovePeerRequest{Id: c.cfg.NodeID})
				rcancel()
				asked = err == nil
				if err != nil {
					c.log.Debug("asking the leader to remove this server", "err", err)
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for removal from raft: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
