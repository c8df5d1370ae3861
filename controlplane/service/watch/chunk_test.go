package watch

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/chunking"
	"github.com/llmgw/llmgw/controlplane/ephemeral"
	"github.com/llmgw/llmgw/fsm"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// recordStream keeps the ephemeral events a watch sends.
type recordStream struct {
	grpc.ServerStream
	ctx context.Context
	mu  sync.Mutex
	eph []*llmgwv1.EphemeralUpdate
}

func (s *recordStream) Context() context.Context { return s.ctx }

func (s *recordStream) Send(e *llmgwv1.WatchEvent) error {
	if u := e.GetEphemeral(); u != nil {
		s.mu.Lock()
		s.eph = append(s.eph, u)
		s.mu.Unlock()
	}
	return nil
}

func (s *recordStream) got() []*llmgwv1.EphemeralUpdate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*llmgwv1.EphemeralUpdate(nil), s.eph...)
}

// largeCopy is a node's full copy of 4 replicas × 40 k blocks (1.3 MB).
func largeCopy() *llmgwv1.EphemeralUpdate {
	u := &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 1, Seq: 1, Full: true}
	for r := range 4 {
		b := &llmgwv1.KVBlocks{ReplicaId: fmt.Sprintf("m-%d", r), Uid: 1, Reset_: true}
		for i := range 40_000 {
			b.Stored = append(b.Stored, uint64(r)<<32|uint64(i))
		}
		u.Kv = append(u.Kv, b)
	}
	return u
}

// TestWatchChunksLargeUpdates: the first full copy and a later large
// update reach a client that asked for chunks within the smaller of both
// budgets, and whole to a client that did not ask (an older router) or
// from a server with no budget.
func TestWatchChunksLargeUpdates(t *testing.T) {
	for _, tc := range []struct {
		name          string
		server, asked int
		wantChunked   bool
	}{
		{"client asks, server's budget smaller", 64 << 10, 1 << 20, true},
		{"client asks, its budget smaller", 1 << 20, 64 << 10, true},
		{"older client", 64 << 10, 0, false},
		{"server without a budget", 0, 64 << 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eph := ephemeral.NewStore()
			eph.Apply(largeCopy())
			w := New(Config{HeartbeatInterval: time.Second, WatchWait: time.Second, WatchQueue: 16, ChunkBytes: tc.server},
				fsm.New(fsm.Config{}), eph, onePeer{}, NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stream := &recordStream{ctx: ctx}
			done := make(chan error, 1)
			go func() {
				done <- w.Watch(&llmgwv1.WatchRequest{ClientId: "r", MaxChunkBytes: uint32(tc.asked)}, stream)
			}()
			// A later update as large, a new session's full copy.
			later := largeCopy()
			later.Epoch = 2
			testkit.Wait(t, "the watch's first copy", func() bool {
				e, _, _ := eph.Held("n1")
				return e == 1 && len(stream.got()) > 0
			})
			eph.Apply(later)
			budget := min(tc.server, tc.asked)
			asm := chunking.NewAssembler(0)
			var whole []*llmgwv1.EphemeralUpdate
			seen := 0
			testkit.WaitErr(t, testkit.DefaultTimeout, "both copies whole", func() error {
				evs := stream.got()
				for _, u := range evs[seen:] {
					if u.GetChunks() > 1 != tc.wantChunked {
						t.Fatalf("update epoch %d sent as %d chunks; want chunked %v", u.Epoch, u.GetChunks(), tc.wantChunked)
					}
					if n := proto.Size(u); tc.wantChunked && n > budget {
						t.Fatalf("chunk of %d bytes, above the budget %d", n, budget)
					}
					out, err := asm.Add(u)
					if err != nil {
						t.Fatal(err)
					}
					if out != nil {
						whole = append(whole, out)
					}
				}
				seen = len(evs)
				if len(whole) < 2 {
					return fmt.Errorf("got %d whole updates of 2", len(whole))
				}
				return nil
			})
			for i, u := range whole {
				want := largeCopy()
				want.Epoch = uint64(i + 1)
				if !proto.Equal(u, want) {
					t.Fatalf("update %d differs from what was applied", i)
				}
			}
			cancel()
			<-done
		})
	}
}
