package agent

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/ephemeral"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The fakes of a leader that serves sessions: registrations commit at
// once, the node has no desired replicas, the plane and the session
// counts go nowhere.
type (
	leaderRaft struct{}
	noDesired  struct{}
	commits    struct{}
	noPlane    struct{}
	noSessions struct{}
	noPeers    struct{}
)

func (leaderRaft) IsLeader() bool         { return true }
func (leaderRaft) HasLeader() bool        { return true }
func (leaderRaft) LastContact() time.Time { return time.Time{} }
func (leaderRaft) NotLeader() error       { return nil }

func (noDesired) Node(string) (*llmgwv1.Node, bool)           { return nil, false }
func (noDesired) Replica(string) (*llmgwv1.Replica, bool)     { return nil, false }
func (noDesired) NodeDesired(string) *llmgwv1.DesiredReplicas { return &llmgwv1.DesiredReplicas{} }
func (noDesired) Applied() (uint64, <-chan struct{})          { return 0, nil }

func (commits) Propose(context.Context, llmgwv1.CommandType, proto.Message) (any, uint64, error) {
	return nil, 1, nil
}

func (noPlane) SessionStarted(string, uint64)               {}
func (noPlane) SessionEnded(string, uint64)                 {}
func (noPlane) Forward(*llmgwv1.EphemeralUpdate, time.Time) {}
func (noSessions) Started(string)                           {}
func (noSessions) Ended(string)                             {}
func (noPeers) Servers() []*llmgwv1.ControlServer           { return nil }
func (noPeers) LeaderAddr() (string, string, bool)          { return "c1", "", true }
func (noPeers) Conn(string) grpc.ClientConnInterface        { return nil }

// serveSessions serves an AgentService whose reports are held in st, on
// loopback, and returns a client of it and the metrics' registry.
func serveSessions(t *testing.T, st *ephemeral.Store) (llmgwv1.AgentServiceClient, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	svc := New(Config{Self: "c1", HeartbeatInterval: 20 * time.Millisecond, AgentTimeout: 10 * time.Second, ElectionTimeout: time.Second,
		RPCHoldTimeout: time.Second, ApplyTimeout: time.Second},
		Deps{Propose: commits{}, State: noDesired{}, Raft: leaderRaft{}, Peers: noPeers{}, Reports: st, Plane: noPlane{},
			Sessions: noSessions{}, Metrics: NewMetrics(reg)}, slog.New(slog.DiscardHandler))
	conn := serveLoopback(t, func(gs *grpc.Server) { llmgwv1.RegisterAgentServiceServer(gs, svc) })
	return llmgwv1.NewAgentServiceClient(conn), reg
}

// hello says hello as n1 with epoch and returns the stream and its first
// answer's error (nil: welcomed).
func hello(t *testing.T, c llmgwv1.AgentServiceClient, epoch uint64) (llmgwv1.AgentService_AttachClient, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := c.Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{
		Node: &llmgwv1.Node{Id: "n1", Address: "127.0.0.1", Gpus: 1}, Epoch: epoch}}}); err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err == nil && m.GetWelcome() == nil {
		t.Fatalf("first answer %v, want a welcome", m)
	}
	return st, err
}

// heldIn is the held epoch a refused stream's trailer carries, 0 without
// one.
func heldIn(st llmgwv1.AgentService_AttachClient) uint64 {
	v := st.Trailer().Get(heldEpochTrailer)
	if len(v) != 1 {
		return 0
	}
	n, _ := strconv.ParseUint(v[0], 10, 64)
	return n
}

// TestNewerSessionTellsItsEpoch: a hello older than the session held for
// its node is refused at once with ABORTED and the held epoch in the
// trailer, so the agent can go above it; a hello above it is welcomed;
// a session that a newer one supersedes is ended with the same answer.
func TestNewerSessionTellsItsEpoch(t *testing.T) {
	tests := []struct {
		name      string
		held      uint64 // 0: nothing held
		epoch     uint64
		welcomed  bool
		wantHeld  uint64
		wantCount float64 // llmgw_control_agent_hellos_refused_total{reason="newer_session"}
	}{
		{"nothing held", 0, 100, true, 0, 0},
		{"an older session held", 50, 100, true, 0, 0},
		{"the same epoch held (a retried hello)", 100, 100, true, 0, 0},
		{"a newer session held", 200, 100, false, 200, 1},
		{"above the newer session", 200, 201, true, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := ephemeral.NewStore()
			if tt.held > 0 {
				st.Apply(&llmgwv1.EphemeralUpdate{Node: "n1", Epoch: tt.held, Seq: 1, Full: true})
			}
			c, reg := serveSessions(t, st)
			stream, err := hello(t, c, tt.epoch)
			if (err == nil) != tt.welcomed {
				t.Fatalf("hello at epoch %d with %d held: %v, want welcomed %v", tt.epoch, tt.held, err, tt.welcomed)
			}
			if err != nil && status.Code(err) != codes.Aborted {
				t.Fatalf("refusal %v, want ABORTED", err)
			}
			if err != nil {
				if got := heldIn(stream); got != tt.wantHeld {
					t.Fatalf("trailer held epoch %d, want %d", got, tt.wantHeld)
				}
			}
			if got := testkit.Metric(t, reg, "llmgw_control_agent_hellos_refused_total", testkit.Labels{"reason": "newer_session"}); got != tt.wantCount {
				t.Fatalf("newer_session refusals %v, want %v", got, tt.wantCount)
			}
		})
	}

	t.Run("a session superseded while it runs", func(t *testing.T) {
		st := ephemeral.NewStore()
		c, _ := serveSessions(t, st)
		stream, err := hello(t, c, 100)
		if err != nil {
			t.Fatal(err)
		}
		// A newer session's full copy arrives (from the plane, or another
		// session here).
		st.Apply(&llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 300, Seq: 1, Full: true})
		for {
			_, err = stream.Recv()
			if err != nil {
				break
			}
		}
		if status.Code(err) != codes.Aborted || heldIn(stream) != 300 {
			t.Fatalf("the superseded session ended with %v, trailer held %d; want ABORTED with 300", err, heldIn(stream))
		}
	})
}
