package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/llmgw/llmgw/agent/datadir"
	"github.com/llmgw/llmgw/chunking"
	"github.com/llmgw/llmgw/internal/addrs"
	"github.com/llmgw/llmgw/internal/backoff"
	"github.com/llmgw/llmgw/internal/grpcsize"
	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// errDeadServer ends a session whose server fell silent: three heartbeat
// intervals without a message (design §5.6; gRPC keepalive cannot go below
// 10 s, so the application notices first).
var errDeadServer = errors.New("control node missed three heartbeats")

// runSessions keeps one session with the control plane up until ctx ends:
// it uses one address at a time, moves to the next on any failure, and waits
// a jittered, doubling delay between attempts, reset by every welcome
// (design §5.6). The rotation is the servers the control plane named, then
// any configured address it did not name.
func (a *Agent) runSessions(ctx context.Context) {
	list := slices.Clone(a.cfg.Control)
	var ring addrs.Ring
	wait := backoff.New(a.cfg.ReconnectInitial, a.cfg.ReconnectMax, a.cfg.Jitter)
	var lostAt time.Time
	for {
		addr := ring.Next(list)
		a.metrics.attempts.Inc()
		learned, welcomed, err := a.session(ctx, addr, lostAt)
		if ctx.Err() != nil {
			return
		}
		if welcomed {
			wait.Reset()
			lostAt = a.now()
			if len(learned) > 0 {
				list = addrs.Merge(learned, a.cfg.Control)
				ring.StartAfter(list, addr)
			}
		}
		delay := wait.Next()
		a.log.Warn("control session ended", "addr", addr, "err", err, "retry_in", delay)
		if !backoff.Sleep(ctx, delay) {
			return
		}
	}
}

func serverAddrs(servers []*llmgwv1.ControlServer) []string {
	var out []string
	for _, s := range servers {
		if s.GetGrpcAddr() != "" {
			out = append(out, s.GetGrpcAddr())
		}
	}
	return out
}

// session runs one Attach stream to addr until it fails or ctx ends. It
// returns the control servers it learned and whether it was welcomed.
//
// Only this goroutine sends on the stream; one goroutine it owns receives,
// and is waited for before session returns.
func (a *Agent) session(ctx context.Context, addr string, lostAt time.Time) (learned []string, welcomed bool, err error) {
	// With TLS the peer must hold a server certificate of this cluster's
	// CA, whatever address was dialed: a control address learned from the
	// plane or mistyped cannot take the agent's session (design §11).
	conn, err := grpc.NewClient(addr, mtls.DialOption(a.tls, mtls.RoleServer), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(grpcsize.MaxMessageBytes)))
	if err != nil {
		return nil, false, fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// The dead-server timer covers the whole session, the attach included:
	// every message from the server rearms it.
	deadTimeout := 3 * a.cfg.HeartbeatInterval
	var dead atomic.Bool
	timer := time.AfterFunc(deadTimeout, func() { dead.Store(true); cancel() })
	defer timer.Stop()
	failed := func(op string, err error) error {
		if dead.Load() {
			return fmt.Errorf("%s %s: %w", op, addr, errDeadServer)
		}
		return fmt.Errorf("%s %s: %w", op, addr, err)
	}

	stream, err := llmgwv1.NewAgentServiceClient(conn).Attach(sctx)
	if err != nil {
		return nil, false, failed("attach", err)
	}
	epoch, err := datadir.NextEpoch(a.epochPath, a.now().UnixNano())
	if err != nil {
		return nil, false, err
	}
	running, _ := a.book.snapshot()
	hello := &llmgwv1.AgentHello{Node: a.nodeInfo(), Epoch: epoch, Running: running}
	if err := stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: hello}}); err != nil {
		return nil, false, failed("hello", err)
	}
	log := a.log.With("addr", addr, "epoch", epoch)

	msgs := make(chan *llmgwv1.ControlMessage)
	recvErr := make(chan error, 1)
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-sctx.Done():
				return
			}
		}
	}()
	defer func() {
		cancel()
		<-recvDone
	}()
	defer func() {
		if welcomed {
			a.attached.Store(false)
			a.metrics.attached.Set(0)
		}
	}()

	var seq, seen uint64
	// chunk is the server's chunk budget from its welcome: updates larger
	// than it go as chunks (design §5.4 "Chunks"). 0 — a server of a
	// release before chunks — takes every update whole.
	chunk := 0
	send := func(m *llmgwv1.AgentMessage) error {
		if u := m.GetUpdate(); u != nil && chunk > 0 {
			parts := chunking.Split(u, chunk)
			if len(parts) > 1 {
				a.metrics.chunked.Inc()
			}
			for _, p := range parts {
				if err := stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: p}}); err != nil {
					return failed("send", err)
				}
			}
			return nil
		}
		if err := stream.Send(m); err != nil {
			return failed("send", err)
		}
		return nil
	}
	sendFull := func() error {
		sts, ver := a.book.snapshot()
		seq++
		seen = ver
		a.metrics.updates.WithLabelValues("full").Inc()
		// Every replica's whole block set, as resets: the control node
		// at the other end may have just started or taken over.
		return send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: &llmgwv1.EphemeralUpdate{
			Node: a.cfg.NodeID, Epoch: epoch, Seq: seq, Full: true, Statuses: sts, Kv: a.kv.Full(),
			Adapters: a.adapters.Full()}}})
	}
	hb := time.NewTicker(a.cfg.HeartbeatInterval)
	defer hb.Stop()
	// KV-cache changes go up when the hub's flush policy says (design §7.5
	// step 2): soon after a quiet engine's event, spaced under churn so a
	// busy engine's changes go as their net effect.
	kvFlush := time.NewTimer(time.Hour)
	kvFlush.Stop()
	defer kvFlush.Stop()
	for {
		select {
		case <-sctx.Done():
			if dead.Load() {
				return learned, welcomed, failed("session", errDeadServer)
			}
			return learned, welcomed, ctx.Err()
		case err := <-recvErr:
			return learned, welcomed, failed("receive", err)
		case m := <-msgs:
			timer.Reset(deadTimeout)
			switch b := m.GetBody().(type) {
			case *llmgwv1.ControlMessage_Welcome:
				if welcomed {
					continue
				}
				welcomed = true
				chunk = int(b.Welcome.GetMaxChunkBytes())
				learned = serverAddrs(b.Welcome.GetServers())
				a.attached.Store(true)
				a.metrics.attached.Set(1)
				a.metrics.sessions.Inc()
				if !lostAt.IsZero() {
					a.metrics.reattaches.Inc()
					a.metrics.reattachSeconds.Observe(a.now().Sub(lostAt).Seconds())
				}
				log.Info("attached to control node", "session", b.Welcome.GetSessionId(), "server", b.Welcome.GetServerId())
				if err := sendFull(); err != nil {
					return learned, welcomed, err
				}
			case *llmgwv1.ControlMessage_Desired:
				log.Info("desired replicas", "revision", b.Desired.GetRevision(), "replicas", len(b.Desired.GetReplicas()))
				a.replicas.apply(b.Desired)
			case *llmgwv1.ControlMessage_FullCopyRequest:
				a.metrics.fullRequests.Inc()
				log.Info("full copy requested", "reason", b.FullCopyRequest.GetReason())
				if welcomed {
					if err := sendFull(); err != nil {
						return learned, welcomed, err
					}
				}
			case *llmgwv1.ControlMessage_Servers:
				if s := serverAddrs(b.Servers.GetServers()); len(s) > 0 {
					learned = s
				}
			case *llmgwv1.ControlMessage_Heartbeat:
			}
		case <-a.book.notify:
			if !welcomed {
				// The full copy sent at the welcome carries it.
				continue
			}
			ups, rm, ver := a.book.since(seen)
			seen = ver
			if len(ups) == 0 && len(rm) == 0 {
				continue
			}
			seq++
			a.metrics.updates.WithLabelValues("delta").Inc()
			if err := send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: &llmgwv1.EphemeralUpdate{
				Node: a.cfg.NodeID, Epoch: epoch, Seq: seq, Statuses: ups, RemovedReplicas: rm}}}); err != nil {
				return learned, welcomed, err
			}
		case <-a.kv.Notify():
			if d, ok := a.kv.FlushIn(); ok {
				kvFlush.Reset(d)
			}
		case <-kvFlush.C:
			if !welcomed {
				// Changes wait in the mirrors; the welcome's full copy
				// carries them.
				continue
			}
			changes := a.kv.Changes()
			if len(changes) == 0 {
				continue
			}
			seq++
			a.metrics.updates.WithLabelValues("delta").Inc()
			if err := send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: &llmgwv1.EphemeralUpdate{
				Node: a.cfg.NodeID, Epoch: epoch, Seq: seq, Kv: changes}}}); err != nil {
				return learned, welcomed, err
			}
		case <-a.adapters.Notify():
			if !welcomed {
				// The welcome's full copy carries them.
				continue
			}
			changes := a.adapters.Changes()
			if len(changes) == 0 {
				continue
			}
			seq++
			a.metrics.updates.WithLabelValues("delta").Inc()
			if err := send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: &llmgwv1.EphemeralUpdate{
				Node: a.cfg.NodeID, Epoch: epoch, Seq: seq, Adapters: changes}}}); err != nil {
				return learned, welcomed, err
			}
		case <-hb.C:
			if err := send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Heartbeat{
				Heartbeat: &llmgwv1.Heartbeat{UnixNano: a.now().UnixNano()}}}); err != nil {
				return learned, welcomed, err
			}
		}
	}
}
