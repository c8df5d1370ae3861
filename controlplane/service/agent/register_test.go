package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/service"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fakeLeader is a leader's gRPC server that records how registrations
// reach it: ServerService.RegisterNode (when it serves it) or a replayed
// hello on a forwarded Attach.
type fakeLeader struct {
	llmgwv1.UnimplementedServerServiceServer
	llmgwv1.UnimplementedAgentServiceServer
	mu       sync.Mutex
	rpc      []*llmgwv1.RegisterNodeRequest
	hellos   []*llmgwv1.AgentHello
	unmarked int // hellos without the forwarded mark
}

func (f *fakeLeader) RegisterNode(_ context.Context, req *llmgwv1.RegisterNodeRequest) (*llmgwv1.RegisterNodeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rpc = append(f.rpc, req)
	return &llmgwv1.RegisterNodeResponse{Revision: 7, Node: req.Node}, nil
}

func (f *fakeLeader) Attach(stream llmgwv1.AgentService_AttachServer) error {
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.hellos = append(f.hellos, m.GetHello())
	if !service.IsForwarded(stream.Context()) {
		f.unmarked++
	}
	f.mu.Unlock()
	return stream.Send(&llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_Welcome{Welcome: &llmgwv1.Welcome{ServerId: "c1"}}})
}

// startFakeLeader serves f on loopback, with ServerService when
// serverService (a leader of this release) or without (an older one).
func startFakeLeader(t *testing.T, f *fakeLeader, serverService bool) *grpc.ClientConn {
	t.Helper()
	return serveLoopback(t, func(gs *grpc.Server) {
		llmgwv1.RegisterAgentServiceServer(gs, f)
		if serverService {
			llmgwv1.RegisterServerServiceServer(gs, f)
		}
	})
}

// serveLoopback serves the services register adds on loopback until the
// test ends, and returns a plain-text client connection to them.
func serveLoopback(t *testing.T, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	register(gs)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); gs.Stop(); <-done })
	return conn
}

type followerRaft struct{}

func (followerRaft) IsLeader() bool         { return false }
func (followerRaft) HasLeader() bool        { return true }
func (followerRaft) LastContact() time.Time { return time.Now() }
func (followerRaft) NotLeader() error       { return errors.New("not the leader") }

type leaderAt struct{ conn grpc.ClientConnInterface }

func (leaderAt) Servers() []*llmgwv1.ControlServer      { return nil }
func (leaderAt) LeaderAddr() (string, string, bool)     { return "c1", "leader:1", true }
func (l leaderAt) Conn(string) grpc.ClientConnInterface { return l.conn }

// TestRegisterOnLeader: a follower has the leader register its agent's node
// with ServerService.RegisterNode; a leader older than that RPC
// (UNIMPLEMENTED) gets the hello replayed instead, as does every leader
// from a build playing the previous release (HelloForwardOnly).
func TestRegisterOnLeader(t *testing.T) {
	node := &llmgwv1.Node{Id: "n1", Address: "10.0.0.1", Gpus: 2, Version: "v0.2.0"}
	tests := []struct {
		name          string
		serverService bool
		helloOnly     bool
		wantRPC       bool
	}{
		{"leader of this release: RegisterNode", true, false, true},
		{"older leader: UNIMPLEMENTED, then the hello", false, false, false},
		{"previous-release build: the hello only", true, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeLeader{}
			conn := startFakeLeader(t, f, tt.serverService)
			a := New(Config{Self: "c2", ApplyTimeout: 5 * time.Second, HelloForwardOnly: tt.helloOnly},
				Deps{Raft: followerRaft{}, Peers: leaderAt{conn}}, slog.New(slog.DiscardHandler))
			if err := a.registerOnLeader(context.Background(), node); err != nil {
				t.Fatalf("registerOnLeader: %v", err)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if tt.wantRPC {
				if len(f.rpc) != 1 || !proto.Equal(f.rpc[0].Node, node) || f.rpc[0].ServerId != "c2" || len(f.hellos) != 0 {
					t.Fatalf("RegisterNode calls %v, hellos %v; want one RegisterNode of %v from c2 and no hello", f.rpc, f.hellos, node)
				}
				return
			}
			if len(f.rpc) != 0 || len(f.hellos) != 1 || !proto.Equal(f.hellos[0].Node, node) || f.unmarked != 0 {
				t.Fatalf("RegisterNode calls %v, hellos %v (%d unmarked); want one forwarded hello of %v", f.rpc, f.hellos, f.unmarked, node)
			}
		})
	}
}
