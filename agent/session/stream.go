package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/agent/datadir"
	"github.com/llmgw/llmgw/chunking"
	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// errDeadServer ends a session whose server fell silent: three heartbeat
// intervals without a message (design §5.6; gRPC keepalive cannot go below
// 10 s, so the application notices first).
var errDeadServer = errors.New("control node missed three heartbeats")

// session is one Attach stream to one control node: what it has sent (the
// epoch, the last seq, the book version its reports reflect) and what it
// has heard (the welcome, the chunk budget, the servers named). Only the
// goroutine of runSession uses it; the dead-server timer sets dead.
type session struct {
	c      *Client
	addr   string
	lostAt time.Time
	log    *slog.Logger
	stream llmgwv1.AgentService_AttachClient

	// timer cancels the session's context, setting dead, once deadTimeout
	// passes without a message from the server.
	timer       *time.Timer
	deadTimeout time.Duration
	dead        atomic.Bool

	epoch     uint64
	seq, seen uint64
	// chunk is the server's chunk budget from its welcome: updates larger
	// than it go as chunks (design §5.4 "Chunks"). 0 — a server of a
	// release before chunks — takes every update whole.
	chunk    int
	welcomed bool
	learned  []string
	// superseded is set once a refusal's held epoch was taken (goAbove).
	superseded bool
}

// runSession runs one Attach stream to addr until it fails or ctx ends. It
// returns the control servers it learned and whether it was welcomed.
//
// Only this goroutine sends on the stream; one goroutine it owns receives,
// and is waited for before runSession returns.
func (c *Client) runSession(ctx context.Context, addr string, lostAt time.Time) (learned []string, welcomed bool, err error) {
	// With TLS the peer must hold a server certificate of this cluster's
	// CA, whatever address was dialed: a control address learned from the
	// plane or mistyped cannot take the agent's session (design §11).
	conn, err := grpc.NewClient(addr, mtls.DialOption(c.cfg.TLS, mtls.RoleServer), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(chunking.MaxMessageBytes)))
	if err != nil {
		return nil, false, fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// The dead-server timer covers the whole session, the attach included:
	// every message from the server rearms it.
	s := &session{c: c, addr: addr, lostAt: lostAt, deadTimeout: 3 * c.cfg.HeartbeatInterval}
	s.timer = time.AfterFunc(s.deadTimeout, func() { s.dead.Store(true); cancel() })
	defer s.timer.Stop()

	if err := s.attach(sctx, conn); err != nil {
		return nil, false, err
	}
	msgs, recvErr, recvDone := s.receive(sctx)
	defer func() {
		cancel()
		<-recvDone
	}()
	defer s.detach()
	err = s.loop(ctx, sctx, msgs, recvErr)
	if s.superseded {
		err = fmt.Errorf("%w: %w", errSuperseded, err)
	}
	return s.learned, s.welcomed, err
}

// attach opens the stream and says hello under a new epoch, listing the
// replicas the node runs.
func (s *session) attach(ctx context.Context, conn *grpc.ClientConn) error {
	stream, err := llmgwv1.NewAgentServiceClient(conn).Attach(ctx)
	if err != nil {
		return s.failed("attach", err)
	}
	s.stream = stream
	epoch, err := datadir.NextEpoch(s.c.cfg.EpochPath, s.c.now().UnixNano())
	if err != nil {
		return err
	}
	s.epoch = epoch
	running, _ := s.c.deps.Book.Snapshot()
	hello := &llmgwv1.AgentHello{Node: s.c.deps.Node(), Epoch: epoch, Running: running}
	if err := stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: hello}}); err != nil {
		return s.failed("hello", err)
	}
	s.log = s.c.log.With("addr", s.addr, "epoch", epoch)
	return nil
}

// receive starts the stream's one receiver: the server's messages come on
// msgs, the error that ended the stream on errs. It returns, closing done,
// when the stream fails or ctx ends.
func (s *session) receive(ctx context.Context) (msgs <-chan *llmgwv1.ControlMessage, errs <-chan error, done <-chan struct{}) {
	m := make(chan *llmgwv1.ControlMessage)
	e := make(chan error, 1)
	d := make(chan struct{})
	go func() {
		defer close(d)
		for {
			msg, err := s.stream.Recv()
			if err != nil {
				e <- err
				return
			}
			select {
			case m <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	return m, e, d
}

// loop serves the session until it fails or ctx ends: the server's
// messages, the changes of the node's data as deltas, and heartbeats.
// sctx is the session's context, ended by ctx or the dead-server timer.
func (s *session) loop(ctx, sctx context.Context, msgs <-chan *llmgwv1.ControlMessage, recvErr <-chan error) error {
	deps := s.c.deps
	hb := time.NewTicker(s.c.cfg.HeartbeatInterval)
	defer hb.Stop()
	// KV-cache changes go up when the hub's flush policy says (design §7.5
	// step 2): soon after a quiet engine's event, spaced under churn so a
	// busy engine's changes go as their net effect.
	kvFlush := time.NewTimer(time.Hour)
	kvFlush.Stop()
	defer kvFlush.Stop()
	for {
		var err error
		select {
		case <-sctx.Done():
			if s.dead.Load() {
				return s.failed("session", errDeadServer)
			}
			return ctx.Err()
		case err := <-recvErr:
			s.goAbove(err)
			return s.failed("receive", err)
		case m := <-msgs:
			err = s.handle(m)
		case <-deps.Book.Notify():
			err = s.sendDelta(s.bookChanges)
		case <-deps.KV.Notify():
			if d, ok := deps.KV.FlushIn(); ok {
				kvFlush.Reset(d)
			}
		case <-kvFlush.C:
			err = s.sendDelta(s.kvChanges)
		case <-deps.Adapters.Notify():
			err = s.sendDelta(s.adapterChanges)
		case <-hb.C:
			err = s.send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Heartbeat{
				Heartbeat: &llmgwv1.Heartbeat{UnixNano: s.c.now().UnixNano()}}})
		}
		if err != nil {
			return err
		}
	}
}

// handle acts on one message of the server; every message rearms the
// dead-server timer.
func (s *session) handle(m *llmgwv1.ControlMessage) error {
	s.timer.Reset(s.deadTimeout)
	switch b := m.GetBody().(type) {
	case *llmgwv1.ControlMessage_Welcome:
		return s.welcome(b.Welcome)
	case *llmgwv1.ControlMessage_Desired:
		s.log.Info("desired replicas", "revision", b.Desired.GetRevision(), "replicas", len(b.Desired.GetReplicas()))
		s.c.deps.Replicas.Apply(b.Desired)
	case *llmgwv1.ControlMessage_FullCopyRequest:
		s.c.metrics.fullRequests.Inc()
		s.log.Info("full copy requested", "reason", b.FullCopyRequest.GetReason())
		if s.welcomed {
			return s.sendFull()
		}
	case *llmgwv1.ControlMessage_Servers:
		if a := serverAddrs(b.Servers.GetServers()); len(a) > 0 {
			s.learned = a
		}
	case *llmgwv1.ControlMessage_Heartbeat:
	}
	return nil
}

// welcome marks the session attached, on the first welcome only, and
// sends the full copy every session starts with.
func (s *session) welcome(w *llmgwv1.Welcome) error {
	if s.welcomed {
		return nil
	}
	s.welcomed = true
	s.chunk = int(w.GetMaxChunkBytes())
	s.learned = serverAddrs(w.GetServers())
	m := s.c.metrics
	s.c.attached.Store(true)
	m.attached.Set(1)
	m.sessions.Inc()
	if !s.lostAt.IsZero() {
		m.reattaches.Inc()
		m.reattachSeconds.Observe(s.c.now().Sub(s.lostAt).Seconds())
	}
	s.log.Info("attached to control node", "session", w.GetSessionId(), "server", w.GetServerId())
	return s.sendFull()
}

// detach marks a welcomed session's end.
func (s *session) detach() {
	if s.welcomed {
		s.c.attached.Store(false)
		s.c.metrics.attached.Set(0)
	}
}

// sendFull sends every replica's status, and every replica's whole block
// set and adapter states as resets, numbered next: the control node at the
// other end may have just started or taken over.
func (s *session) sendFull() error {
	d := s.c.deps
	sts, ver := d.Book.Snapshot()
	s.seq++
	s.seen = ver
	s.c.metrics.updates.WithLabelValues("full").Inc()
	return s.sendUpdate(&llmgwv1.EphemeralUpdate{Node: s.c.cfg.NodeID, Epoch: s.epoch, Seq: s.seq, Full: true,
		Statuses: sts, Kv: d.KV.Full(), Adapters: d.Adapters.Full()})
}

// sendDelta sends the update changes returns, numbered next: the one path
// of the book's, the KV mirrors' and the adapters' changes. changes returns
// nil for no change, and nothing is sent. Before the welcome changes is not
// called: what changed waits in its source, and the welcome's full copy
// carries it.
func (s *session) sendDelta(changes func() *llmgwv1.EphemeralUpdate) error {
	if !s.welcomed {
		return nil
	}
	u := changes()
	if u == nil {
		return nil
	}
	s.seq++
	u.Node, u.Epoch, u.Seq = s.c.cfg.NodeID, s.epoch, s.seq
	s.c.metrics.updates.WithLabelValues("delta").Inc()
	return s.sendUpdate(u)
}

// bookChanges is the statuses upserted and the replicas removed since the
// last update.
func (s *session) bookChanges() *llmgwv1.EphemeralUpdate {
	ups, rm, ver := s.c.deps.Book.Since(s.seen)
	s.seen = ver
	if len(ups) == 0 && len(rm) == 0 {
		return nil
	}
	return &llmgwv1.EphemeralUpdate{Statuses: ups, RemovedReplicas: rm}
}

// kvChanges is the KV mirrors' net changes since the last update.
func (s *session) kvChanges() *llmgwv1.EphemeralUpdate {
	changes := s.c.deps.KV.Changes()
	if len(changes) == 0 {
		return nil
	}
	return &llmgwv1.EphemeralUpdate{Kv: changes}
}

// adapterChanges is the adapters' changed states since the last update.
func (s *session) adapterChanges() *llmgwv1.EphemeralUpdate {
	changes := s.c.deps.Adapters.Changes()
	if len(changes) == 0 {
		return nil
	}
	return &llmgwv1.EphemeralUpdate{Adapters: changes}
}

// sendUpdate sends an update whole, or as chunks when the server gave a
// chunk budget and the update is larger (design §5.4 "Chunks").
func (s *session) sendUpdate(u *llmgwv1.EphemeralUpdate) error {
	parts := []*llmgwv1.EphemeralUpdate{u}
	if s.chunk > 0 {
		parts = chunking.Split(u, s.chunk)
		if len(parts) > 1 {
			s.c.metrics.chunked.Inc()
		}
	}
	for _, p := range parts {
		if err := s.send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: p}}); err != nil {
			return err
		}
	}
	return nil
}

func (s *session) send(m *llmgwv1.AgentMessage) error {
	if err := s.stream.Send(m); err != nil {
		return s.failed("send", err)
	}
	return nil
}

// heldEpochTrailer is the trailer in which a control node that refuses a
// hello or ends a session because a newer session holds this node says
// that session's epoch; the control plane's name for it
// (controlplane/service/agent).
const heldEpochTrailer = "llmgw-held-epoch"

// maxHeldAhead bounds the held epoch this agent takes: control nodes take
// no epoch more than five minutes past their clock, so a held one is
// within that of this agent's clock plus their skew (a minute here, far
// above NTP's). One beyond is a broken clock or a server's lie, and taking
// it would get every later hello refused as too far ahead, for epochs only
// grow: it is ignored, and logged.
const maxHeldAhead = 6 * time.Minute

// errSuperseded marks a session that ended because a newer session of
// this node was held, once this agent's next epoch is above it: Run tries
// again after the first reconnect delay (reconnect_initial) rather than a
// grown one, for the next hello wins.
var errSuperseded = errors.New("a newer session of this node was held; the next epoch is above it")

// goAbove reads the held epoch of a refusal (ABORTED with the trailer)
// and persists it, so that the next session's epoch (NextEpoch) is above
// it and wins at once (design §5.4): a session opened with this node's
// certificate elsewhere, or this agent's own from before its data dir was
// lost, would otherwise hold the node until this agent's clock passed it.
func (s *session) goAbove(err error) {
	if status.Code(err) != codes.Aborted {
		return
	}
	v := s.stream.Trailer().Get(heldEpochTrailer)
	if len(v) != 1 {
		return
	}
	held, perr := strconv.ParseUint(v[0], 10, 64)
	if perr != nil || held <= s.epoch {
		return
	}
	if limit := uint64(s.c.now().Add(maxHeldAhead).UnixNano()); held > limit {
		s.c.metrics.superseded.WithLabelValues("ignored").Inc()
		s.log.Error("a control node holds a session of this node with an epoch far ahead of this agent's clock: ignored (check the clocks, and who holds this node's certificate)",
			"held_epoch", held, "limit", limit)
		return
	}
	if _, err := datadir.RaiseEpoch(s.c.cfg.EpochPath, held); err != nil {
		s.log.Error("could not persist the held epoch; the next session may be refused again", "held_epoch", held, "err", err)
		return
	}
	s.c.metrics.superseded.WithLabelValues("raised").Inc()
	s.log.Warn("a newer session of this node is held (another process with this node's certificate, or this agent's own before its data dir was lost?): the next session's epoch goes above it",
		"held_epoch", held)
	s.superseded = true
}

// failed wraps the error that ended the session with the operation and
// address, naming the dead server when the timer ended it.
func (s *session) failed(op string, err error) error {
	if s.dead.Load() {
		return fmt.Errorf("%s %s: %w", op, s.addr, errDeadServer)
	}
	return fmt.Errorf("%s %s: %w", op, s.addr, err)
}
