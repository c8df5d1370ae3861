package watch

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/controlplane/ephemeral"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// stuckStream is a watch stream whose client stops reading at the first
// ephemeral event: Send blocks there until released.
type stuckStream struct {
	grpc.ServerStream
	ctx     context.Context
	stuck   chan struct{} // closed when Send blocks
	release chan struct{}
	blocked bool
}

func (s *stuckStream) Context() context.Context { return s.ctx }

func (s *stuckStream) Send(e *llmgwv1.WatchEvent) error {
	if e.GetEphemeral() != nil && !s.blocked {
		s.blocked = true
		close(s.stuck)
		<-s.release
	}
	return nil
}

// onePeer is a server list of this server alone.
type onePeer struct{}

func (onePeer) Servers() []*llmgwv1.ControlServer {
	return []*llmgwv1.ControlServer{{Id: "c1", Leader: true}}
}

// TestSlowWatcherIsDisconnected: a watcher that stops reading is ended with
// UNAVAILABLE once its queue overflows, and updates keep being accepted for
// everyone else meanwhile.
func TestSlowWatcherIsDisconnected(t *testing.T) {
	eph := ephemeral.NewStore()
	w := New(Config{HeartbeatInterval: 100 * time.Millisecond, WatchWait: 200 * time.Millisecond, WatchQueue: 2},
		fsm.New(fsm.Config{}), eph, onePeer{}, NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	eph.Apply(&llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 1, Seq: 1, Full: true})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := &stuckStream{ctx: ctx, stuck: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- w.Watch(&llmgwv1.WatchRequest{ClientId: "slow"}, stream) }()
	<-stream.stuck // blocked sending the full copy

	// A fast subscriber beside it sees every update.
	fast, _ := eph.Subscribe(16)
	defer fast.Close()
	for seq := uint64(2); seq <= 5; seq++ {
		if v := eph.Apply(&llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 1, Seq: seq}); v.String() != "accepted" {
			t.Fatalf("seq %d: %v", seq, v)
		}
	}
	if n := len(fast.Updates()); n != 4 {
		t.Fatalf("fast subscriber has %d updates, want 4", n)
	}
	close(stream.release)
	if err := <-done; status.Code(err) != codes.Unavailable {
		t.Fatalf("slow watcher ended with %v, want UNAVAILABLE", err)
	}
}
