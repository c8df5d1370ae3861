package controlplane

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// watchService serves the routers' merged watch stream (plan §5.3).
type watchService struct {
	llmgwv1.UnimplementedWatchServiceServer
	s *Server
}

// Watch sends, in order: the desired state after from_revision (changes and
// a mark, or a framed snapshot when from_revision is 0 or older than the
// change log), the servers list, a full ephemeral copy per node, then live
// changes, ephemeral deltas exactly as the agents sent them, and
// heartbeats.
//
// A slow watcher never blocks the others: desired state is read from the
// FSM's change log at the watcher's own pace, and ephemeral updates wait in
// a bounded per-watcher queue; a watcher that fills it is disconnected
// (UNAVAILABLE) and resumes from its revision.
func (w *watchService) Watch(req *llmgwv1.WatchRequest, stream llmgwv1.WatchService_WatchServer) error {
	s := w.s
	ctx := stream.Context()
	if err := w.waitFor(ctx, req.FromRevision); err != nil {
		return err
	}
	// Subscribe before reading the desired state, so no ephemeral update
	// falls between the copies and the deltas.
	sub, copies := s.eph.Subscribe(s.cfg.WatchQueue)
	defer sub.Close()
	s.metrics.watchers.Inc()
	defer s.metrics.watchers.Dec()
	log := s.log.With("client", req.ClientId)
	log.Debug("watch started", "from_revision", req.FromRevision)

	sent := req.FromRevision
	var err error
	if sent, err = w.sendDesired(stream, sent, req.FromRevision == 0); err != nil {
		return err
	}
	lastServers := s.servers()
	if err := stream.Send(&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Servers{Servers: &llmgwv1.ServerList{Servers: lastServers}}}); err != nil {
		return err
	}
	for _, c := range copies {
		if err := stream.Send(&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Ephemeral{Ephemeral: c}}); err != nil {
			return err
		}
	}
	hb := time.NewTicker(s.cfg.HeartbeatInterval)
	defer hb.Stop()
	for {
		_, applied := s.fsm.Applied()
		if sent, err = w.sendDesired(stream, sent, false); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-applied:
		case u := <-sub.Updates():
			// An agent reports a placement only after it was applied: send
			// the desired state first, so a router never gets a status for
			// a uid it cannot know yet (and would drop as an old one).
			if sent, err = w.sendDesired(stream, sent, false); err != nil {
				return err
			}
			if err := stream.Send(&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Ephemeral{Ephemeral: u}}); err != nil {
				return err
			}
		case <-sub.Overflowed():
			s.metrics.watchOverflows.Inc()
			log.Warn("watcher fell behind; disconnecting it so it resumes", "revision", sent)
			return status.Error(codes.Unavailable, "watch: fell behind on ephemeral updates; resume from your revision")
		case now := <-hb.C:
			if cur := s.servers(); !serversEqual(cur, lastServers) {
				lastServers = cur
				if err := stream.Send(&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Servers{Servers: &llmgwv1.ServerList{Servers: cur}}}); err != nil {
					return err
				}
			}
			if err := stream.Send(&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Heartbeat{Heartbeat: &llmgwv1.Heartbeat{UnixNano: now.UnixNano()}}}); err != nil {
				return err
			}
		}
	}
}

// waitFor waits until the FSM has applied rev, up to WatchWait: a client
// that saw rev elsewhere must not see this node go backwards.
func (w *watchService) waitFor(ctx context.Context, rev uint64) error {
	timer := time.NewTimer(w.s.cfg.WatchWait)
	defer timer.Stop()
	for {
		cur, applied := w.s.fsm.Applied()
		if cur >= rev {
			return nil
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-timer.C:
			return status.Errorf(codes.Unavailable, "watch: this server is at revision %d, behind the requested %d; try another server", cur, rev)
		case <-applied:
		}
	}
}

// sendDesired brings the client from revision sent to the FSM's current
// one, and returns the revision the client now has. It sends the changes
// and a mark, or — when asked, or when the change log no longer reaches
// back to sent — a framed snapshot.
func (w *watchService) sendDesired(stream llmgwv1.WatchService_WatchServer, sent uint64, snapshot bool) (uint64, error) {
	s := w.s
	cur := s.fsm.Revision()
	var changes []*llmgwv1.Change
	if !snapshot {
		var ok bool
		changes, ok = s.fsm.ChangesSince(sent)
		snapshot = !ok
	}
	if snapshot {
		return w.sendSnapshot(stream)
	}
	if cur <= sent && len(changes) == 0 {
		return sent, nil
	}
	for _, c := range changes {
		if err := stream.Send(&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Change{Change: c}}); err != nil {
			return sent, err
		}
		cur = max(cur, c.Revision)
	}
	// Every change up to cur was in the log when it was read after cur, so
	// the client is current to cur even if the last entries changed nothing.
	if err := stream.Send(&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Mark{Mark: &llmgwv1.RevisionMark{Revision: cur}}}); err != nil {
		return sent, err
	}
	return cur, nil
}

func (w *watchService) sendSnapshot(stream llmgwv1.WatchService_WatchServer) (uint64, error) {
	st := w.s.fsm.State()
	w.s.metrics.watchSnapshots.Inc()
	events := make([]*llmgwv1.WatchEvent, 0, 3+len(st.Models)+len(st.Nodes)+len(st.Replicas)+len(st.AdapterPlacements))
	events = append(events, &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_SnapshotBegin{SnapshotBegin: &llmgwv1.SnapshotBegin{Revision: st.Revision}}})
	put := func(c *llmgwv1.Change) {
		c.Revision, c.Op = st.Revision, llmgwv1.ChangeOp_CHANGE_OP_PUT
		events = append(events, &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Change{Change: c}})
	}
	for _, m := range st.Models {
		put(&llmgwv1.Change{Object: &llmgwv1.Change_Model{Model: m}})
	}
	for _, n := range st.Nodes {
		put(&llmgwv1.Change{Object: &llmgwv1.Change_Node{Node: n}})
	}
	for _, r := range st.Replicas {
		put(&llmgwv1.Change{Object: &llmgwv1.Change_Replica{Replica: r}})
	}
	for _, p := range st.AdapterPlacements {
		put(&llmgwv1.Change{Object: &llmgwv1.Change_AdapterPlacement{AdapterPlacement: p}})
	}
	put(&llmgwv1.Change{Object: &llmgwv1.Change_Config{Config: st.Config}})
	events = append(events, &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_SnapshotEnd{SnapshotEnd: &llmgwv1.SnapshotEnd{Revision: st.Revision}}})
	for _, e := range events {
		if err := stream.Send(e); err != nil {
			return 0, err
		}
	}
	return st.Revision, nil
}

func serversEqual(a, b []*llmgwv1.ControlServer) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}
