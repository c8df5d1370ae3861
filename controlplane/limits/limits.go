package limits

import (
	"context"
	"net"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Kind is a kind of capped stream.
type Kind string

// The capped streams, by gRPC method.
const (
	Watch  Kind = "watch"
	Attach Kind = "attach"
)

// methods maps a stream's full method name to its kind.
var methods = map[string]Kind{
	llmgwv1.WatchService_Watch_FullMethodName:  Watch,
	llmgwv1.AgentService_Attach_FullMethodName: Attach,
}

// Cap is the concurrent streams of one kind a caller may hold, and the
// setting that sets it (named in the refusal, so an operator who meets it
// knows what to raise).
type Cap struct {
	Max     int
	Setting string
}

// Config sets the caps; a Max of 0 means no cap.
type Config struct {
	// PerIdentity caps callers with a verified certificate identity.
	PerIdentity map[Kind]Cap
	// PerAddress caps plain-text callers by IP address.
	PerAddress map[Kind]Cap
}

// Limiter counts streams per caller and kind. Safe for concurrent use.
type Limiter struct {
	cfg     Config
	open    *prometheus.GaugeVec
	refused *prometheus.CounterVec

	mu    sync.Mutex
	count map[key]int
}

type key struct {
	kind   Kind
	caller string
}

// New returns a Limiter and registers its metrics with reg:
// llmgw_control_streams_open{kind} and
// llmgw_control_streams_refused_total{kind,by}.
func New(cfg Config, reg prometheus.Registerer) *Limiter {
	l := &Limiter{
		cfg: cfg,
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmgw_control_streams_open", Help: "Capped streams (watch, attach) open on this node.",
		}, []string{"kind"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_control_streams_refused_total",
			Help: "Streams refused because their caller held its cap of that kind, by kind and by what the caller was counted as (identity or address).",
		}, []string{"kind", "by"}),
		count: map[key]int{},
	}
	reg.MustRegister(l.open, l.refused)
	return l
}

// Caller is who a call counts against: "identity", the certificate identity
// (ok false for a server, which is not capped), or "address", the peer's IP.
func Caller(ctx context.Context) (by, caller string, ok bool) {
	if id, ok := mtls.FromContext(ctx); ok {
		return "identity", id.String(), id.Role != mtls.RoleServer
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "address", "unknown", true
	}
	host, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		host = p.Addr.String()
	}
	return "address", host, true
}

// Acquire takes one stream of kind for the caller of ctx, or answers
// RESOURCE_EXHAUSTED naming the cap and its setting. The release it returns
// must be called once, when the stream ends.
func (l *Limiter) Acquire(ctx context.Context, kind Kind) (release func(), err error) {
	by, caller, capped := Caller(ctx)
	c := l.cfg.PerAddress[kind]
	if by == "identity" {
		c = l.cfg.PerIdentity[kind]
	}
	k := key{kind: kind, caller: caller}
	l.mu.Lock()
	defer l.mu.Unlock()
	if capped && c.Max > 0 && l.count[k] >= c.Max {
		l.refused.WithLabelValues(string(kind), by).Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "%s already holds %d %s streams on this control node, the cap (%s)", caller, c.Max, kind, c.Setting)
	}
	l.count[k]++
	l.open.WithLabelValues(string(kind)).Inc()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.count[k]--; l.count[k] <= 0 {
				delete(l.count, k)
			}
			l.open.WithLabelValues(string(kind)).Dec()
		})
	}, nil
}

// Stream is the interceptor: capped methods hold their stream for as long
// as the handler runs; other methods pass.
func (l *Limiter) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	kind, ok := methods[info.FullMethod]
	if !ok {
		return h(srv, ss)
	}
	release, err := l.Acquire(ss.Context(), kind)
	if err != nil {
		return err
	}
	defer release()
	return h(srv, ss)
}
