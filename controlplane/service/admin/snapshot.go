package admin

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/service"
	"github.com/llmgw/llmgw/controlplane/snapfile"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// snapshotChunk is the size of the pieces a snapshot file travels in, well
// under gRPC's 4 MiB message limit.
const snapshotChunk = 256 << 10

// restoreIndexMargin is how far above Raft's last index a restored state's
// revision is put. Revisions must only grow (design §5.3: a client never
// moves backwards), and a watcher must see the restore as a jump it cannot
// cover with changes, so it takes a framed snapshot. raft.Restore labels the
// snapshot max(last index, meta index)+1, so a revision of last index +
// margin, with the same meta index, stays below every later entry even when
// writes land between reading the last index and the restore.
const restoreIndexMargin = 1000

// SnapshotSave streams the leader's state as a snapshot file (design
// §13.4). A follower relays the leader's stream, so an operator may ask any
// server.
func (a *Service) SnapshotSave(req *llmgwv1.SnapshotSaveRequest, stream llmgwv1.AdminService_SnapshotSaveServer) error {
	ctx := stream.Context()
	if !a.raft.IsLeader() && !service.IsForwarded(ctx) {
		_, addr, ok := a.peers.LeaderAddr()
		if !ok {
			return service.ToStatus(fmt.Errorf("snapshot save: %w", a.raft.NotLeader()))
		}
		in, err := llmgwv1.NewAdminServiceClient(a.peers.Conn(addr)).SnapshotSave(service.ForwardedContext(ctx, a.self), req)
		if err != nil {
			return service.ToStatus(fmt.Errorf("snapshot save: forward to the leader at %s: %w", addr, err))
		}
		for {
			c, err := in.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err // the leader's status, as it gave it
			}
			if err := stream.Send(c); err != nil {
				return err
			}
		}
	}
	if !a.raft.IsLeader() {
		return service.ToStatus(fmt.Errorf("snapshot save: %w", a.raft.NotLeader()))
	}
	body, err := a.state.Snapshot()
	if err != nil {
		return service.ToStatus(fmt.Errorf("snapshot save: %w", err))
	}
	var st llmgwv1.State
	if err := proto.Unmarshal(body, &st); err != nil {
		return service.ToStatus(fmt.Errorf("snapshot save: %w", err))
	}
	file := snapfile.Encode(st.Revision, body)
	for len(file) > 0 {
		n := min(len(file), snapshotChunk)
		if err := stream.Send(&llmgwv1.SnapshotChunk{Data: file[:n]}); err != nil {
			return err
		}
		file = file[n:]
	}
	a.log.Info("snapshot saved", "revision", st.Revision, "bytes", len(body))
	return nil
}

// SnapshotRestore replaces the cluster's desired state with a snapshot
// file's, through Raft's user restore on the leader: the leader installs it
// and every follower receives it as a snapshot. The file is checked whole
// first — header before the body (readRestore), checksum, format, and a
// trial restore into a scratch FSM — so a bad file is refused with nothing
// changed (raft panics if the FSM refuses a user restore, so nothing may be
// left for the real FSM to refuse).
//
// Nodes are the agents' registrations, not the operator's intent: those
// registered in the cluster now are kept as they are, and the file's other
// nodes are added (placement reschedules their replicas if they never come
// back). Models, replicas, cluster config and ordinals are the file's.
func (a *Service) SnapshotRestore(stream llmgwv1.AdminService_SnapshotRestoreServer) error {
	st, file, err := a.readRestore(stream)
	if err != nil {
		return err
	}
	ctx := stream.Context()
	if !a.raft.IsLeader() && !service.IsForwarded(ctx) {
		_, addr, ok := a.peers.LeaderAddr()
		if !ok {
			return service.ToStatus(fmt.Errorf("snapshot restore: %w", a.raft.NotLeader()))
		}
		out, err := llmgwv1.NewAdminServiceClient(a.peers.Conn(addr)).SnapshotRestore(service.ForwardedContext(ctx, a.self))
		if err != nil {
			return service.ToStatus(fmt.Errorf("snapshot restore: forward to the leader at %s: %w", addr, err))
		}
		for len(file) > 0 {
			n := min(len(file), snapshotChunk)
			if err := out.Send(&llmgwv1.SnapshotChunk{Data: file[:n]}); err != nil {
				break // CloseAndRecv returns the reason
			}
			file = file[n:]
		}
		resp, err := out.CloseAndRecv()
		if err != nil {
			return err
		}
		return stream.SendAndClose(resp)
	}
	if !a.raft.IsLeader() || !a.raft.LeaderReady() {
		return service.ToStatus(fmt.Errorf("snapshot restore: %w", a.raft.NotLeader()))
	}

	cur := a.state.State()
	merged := mergeRestore(st, cur)
	merged.Revision = a.raft.LastIndex() + restoreIndexMargin
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(merged)
	if err != nil {
		return service.ToStatus(fmt.Errorf("snapshot restore: %w", err))
	}
	// The merged state is checked like the file was: what raft hands the
	// FSM must not be refused.
	if err := fsm.New(fsm.Config{}).Restore(body); err != nil {
		return service.ToStatus(invalidSnapshot(err))
	}
	if err := a.raft.Restore(merged.Revision, body); err != nil {
		return service.ToStatus(fmt.Errorf("snapshot restore: %w", err))
	}
	rev := a.state.Revision()
	a.log.Warn("desired state replaced from a snapshot", "revision", rev, "snapshot_revision", st.Revision,
		"models", len(merged.Models), "replicas", len(merged.Replicas))
	return stream.SendAndClose(&llmgwv1.SnapshotRestoreResponse{Revision: rev})
}

// readRestore reads a restore's file from its stream header first (design
// §11 "Limits"): a stream that does not open with a valid header declaring
// at most the restore cap is refused after its first chunk, before any body
// is buffered (snapfile.Read), and the body buffer grows only with the
// bytes that arrive. It returns the file's state, checked, and the file to
// forward; errors are gRPC statuses.
func (a *Service) readRestore(stream llmgwv1.AdminService_SnapshotRestoreServer) (*llmgwv1.State, []byte, error) {
	r := &chunkReader{recv: stream.Recv}
	limit := a.restoreMax
	if limit == 0 {
		limit = snapfile.MaxBody
	}
	h, body, err := snapfile.Read(r, limit)
	if err != nil {
		if r.err != nil && !errors.Is(r.err, io.EOF) {
			return nil, nil, r.err // the stream's own failure, as gRPC gave it
		}
		return nil, nil, service.ToStatus(invalidSnapshot(err))
	}
	st, err := checkSnapshot(h, body)
	if err != nil {
		return nil, nil, service.ToStatus(invalidSnapshot(err))
	}
	return st, snapfile.Encode(h.Revision, body), nil
}

// chunkReader reads a stream of SnapshotChunks as bytes.
type chunkReader struct {
	recv func() (*llmgwv1.SnapshotChunk, error)
	buf  []byte
	err  error // the error recv returned, io.EOF at the end
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		c, err := r.recv()
		if err != nil {
			r.err = err
			return 0, err
		}
		r.buf = c.GetData()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// checkSnapshot restores a decoded snapshot file's body into a scratch FSM,
// returning its state.
func checkSnapshot(h snapfile.Header, body []byte) (*llmgwv1.State, error) {
	scratch := fsm.New(fsm.Config{})
	if err := scratch.Restore(body); err != nil {
		return nil, err
	}
	st := scratch.State()
	if st.Revision != h.Revision {
		return nil, fmt.Errorf("%w: header revision %d, state revision %d", snapfile.ErrCorrupt, h.Revision, st.Revision)
	}
	return st, nil
}

// mergeRestore is the state a restore installs: the file's, with the
// cluster's current node registrations kept (see SnapshotRestore).
func mergeRestore(file, cur *llmgwv1.State) *llmgwv1.State {
	out := proto.Clone(file).(*llmgwv1.State)
	out.Format = fsm.SnapshotFormat
	have := map[string]bool{}
	nodes := make([]*llmgwv1.Node, 0, len(cur.Nodes)+len(out.Nodes))
	for _, n := range cur.Nodes {
		have[n.Id] = true
		nodes = append(nodes, n)
	}
	for _, n := range out.Nodes {
		if !have[n.Id] {
			nodes = append(nodes, n)
		}
	}
	slices.SortFunc(nodes, func(a, b *llmgwv1.Node) int { return strings.Compare(a.Id, b.Id) })
	out.Nodes = nodes
	return out
}

// invalidSnapshot makes a refused file an InvalidArgument naming it.
func invalidSnapshot(err error) error {
	return &fsm.ValidationError{Field: "snapshot", Reason: err.Error()}
}
