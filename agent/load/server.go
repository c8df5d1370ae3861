package load

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Snapshots is where the server takes what it streams: the Reader.
type Snapshots interface {
	// Latest returns the newest snapshot (never nil, never modified once
	// returned) and a channel closed once a newer one is published. Safe
	// for concurrent use.
	Latest() (*llmgwv1.LoadSnapshot, <-chan struct{})
}

// Server is LoadService (design §6): every subscriber gets the current
// snapshot at once, then each newer one. A subscriber that cannot keep up
// skips to the newest snapshot rather than queue old ones, and never slows
// the reader or another subscriber: each Subscribe call sends from its own
// gRPC stream goroutine and only ever waits on its own stream.
type Server struct {
	llmgwv1.UnimplementedLoadServiceServer
	src Snapshots
	log *slog.Logger

	closeOnce sync.Once
	closed    chan struct{}

	subscribers prometheus.Gauge
	sent        prometheus.Counter
}

// NewServer returns a server streaming from src. reg receives its metrics
// (it may be nil).
func NewServer(src Snapshots, log *slog.Logger, reg prometheus.Registerer) *Server {
	s := &Server{src: src, log: log, closed: make(chan struct{}),
		subscribers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_agent_load_subscribers",
			Help: "Routers subscribed to this agent's load snapshots.",
		}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_agent_load_snapshots_sent_total",
			Help: "Load snapshots sent, summed over subscribers.",
		}),
	}
	if reg != nil {
		reg.MustRegister(s.subscribers, s.sent)
	}
	return s
}

// Close ends every Subscribe call, present and future, so the gRPC server's
// GracefulStop does not wait on streams that never end by themselves. A
// Subscribe blocked in Send on a stuck client ends only when the stream is
// cut (grpc.Server.Stop).
func (s *Server) Close() { s.closeOnce.Do(func() { close(s.closed) }) }

// Subscribe streams snapshots until the client goes away or Close.
func (s *Server) Subscribe(req *llmgwv1.LoadSubscribeRequest, stream llmgwv1.LoadService_SubscribeServer) error {
	s.subscribers.Inc()
	defer s.subscribers.Dec()
	log := s.log.With("client", req.GetClientId())
	log.Debug("load subscriber joined")
	ctx := stream.Context()
	var last *llmgwv1.LoadSnapshot
	for {
		snap, changed := s.src.Latest()
		if snap != last {
			if err := stream.Send(snap); err != nil {
				log.Debug("load subscriber left", "err", err)
				return fmt.Errorf("send load snapshot: %w", err)
			}
			s.sent.Inc()
			last = snap
		}
		select {
		case <-ctx.Done():
			log.Debug("load subscriber left", "err", ctx.Err())
			return nil
		case <-s.closed:
			return nil
		case <-changed:
		}
	}
}
