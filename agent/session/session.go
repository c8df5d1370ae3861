// Package session is the agent's side of the control-plane session (design
// §5.4, §5.6): one Attach stream to one control node at a time, failing
// over between them. On each it says hello, waits for the welcome, sends a
// full copy of the node's ephemeral data and then numbered deltas as the
// data changes, hands every desired set to the replicas, and ends the
// stream when the server falls silent.
//
// It sees the rest of the agent only through the interfaces below: the
// replica book, the KV hub and the adapter manager it reports, and the
// replica set it hands desired sets to.
package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/addrs"
	"github.com/llmgw/llmgw/internal/backoff"
	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Book is the replicas' latest statuses (a *replicas.Book): a full copy
// and then the changes since a version, with a token on Notify when
// something changed.
type Book interface {
	Snapshot() ([]*llmgwv1.ReplicaStatus, uint64)
	Since(from uint64) (upserted []*llmgwv1.ReplicaStatus, removed []string, version uint64)
	Notify() <-chan struct{}
}

// KV is the node's KV-cache mirrors (a *kv.Hub): Full on every full copy,
// Changes once FlushIn has passed after a Notify (design §7.5 step 2).
type KV interface {
	Full() []*llmgwv1.KVBlocks
	Changes() []*llmgwv1.KVBlocks
	Notify() <-chan struct{}
	FlushIn() (time.Duration, bool)
}

// Adapters is the LoRA adapters' states (an *adapters.Manager): Full on
// every full copy, Changes after a Notify.
type Adapters interface {
	Full() []*llmgwv1.AdapterStatus
	Changes() []*llmgwv1.AdapterStatus
	Notify() <-chan struct{}
}

// Replicas converges the node on a desired set (a *replicas.Set). Apply
// must not block on an engine: it is called from the session's loop.
type Replicas interface {
	Apply(d *llmgwv1.DesiredReplicas)
}

// Config is the session's part of the agent's configuration.
type Config struct {
	// NodeID names the node in every update.
	NodeID string
	// Control is the configured control addresses; the rotation also
	// holds the ones the control plane names (design §5.6).
	Control []string
	// EpochPath is the data dir's epoch file (datadir.NextEpoch).
	EpochPath string
	// HeartbeatInterval spaces heartbeats; three missed is a dead server.
	HeartbeatInterval time.Duration
	// ReconnectInitial doubles per failed session up to ReconnectMax,
	// with Jitter (nil: math/rand/v2).
	ReconnectInitial, ReconnectMax time.Duration
	Jitter                         func() float64
	// TLS is the agent's certificate source, nil in plain text.
	TLS *mtls.Source
	// Now is the clock of epochs, heartbeats and the reattach time; nil
	// means time.Now.
	Now func() time.Time
}

// Deps is what the session reports and drives.
type Deps struct {
	// Node describes the node in each hello; called per session, as the
	// agent's addresses are known only once it listens.
	Node     func() *llmgwv1.Node
	Book     Book
	KV       KV
	Adapters Adapters
	Replicas Replicas
}

// Client keeps the agent's session with the control plane. Create with
// New, run with Run (once).
type Client struct {
	cfg      Config
	deps     Deps
	log      *slog.Logger
	metrics  *metrics
	attached atomic.Bool
}

// New returns a client whose metrics (llmgw_agent_session*,
// llmgw_agent_reattach*, llmgw_agent_updates_sent_total, ...) are
// registered on reg. It starts nothing.
func New(cfg Config, deps Deps, logger *slog.Logger, reg prometheus.Registerer) (*Client, error) {
	if logger == nil {
		return nil, errors.New("session: nil logger")
	}
	if deps.Node == nil || deps.Book == nil || deps.KV == nil || deps.Adapters == nil || deps.Replicas == nil {
		return nil, errors.New("session: missing dependency")
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("session: metrics: %w", err)
	}
	return &Client{cfg: cfg, deps: deps, log: logger, metrics: m}, nil
}

// Attached reports whether a control node has welcomed the current session.
func (c *Client) Attached() bool { return c.attached.Load() }

func (c *Client) now() time.Time {
	if c.cfg.Now != nil {
		return c.cfg.Now()
	}
	return time.Now()
}

// Run keeps one session with the control plane up until ctx ends: it uses
// one address at a time, moves to the next on any failure, and waits a
// jittered, doubling delay between attempts, reset by every welcome
// (design §5.6). The rotation is the servers the control plane named, then
// any configured address it did not name. It returns once ctx has ended and
// the last session's goroutines have stopped.
func (c *Client) Run(ctx context.Context) {
	list := slices.Clone(c.cfg.Control)
	var ring addrs.Ring
	wait := backoff.New(c.cfg.ReconnectInitial, c.cfg.ReconnectMax, c.cfg.Jitter)
	var lostAt time.Time
	for {
		addr := ring.Next(list)
		c.metrics.attempts.Inc()
		learned, welcomed, err := c.runSession(ctx, addr, lostAt)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errSuperseded) {
			// The next epoch is above the session that held the node: it
			// wins, so there is no reason to wait longer than the first
			// delay.
			wait.Reset()
		}
		if welcomed {
			wait.Reset()
			lostAt = c.now()
			if len(learned) > 0 {
				list = addrs.Merge(learned, c.cfg.Control)
				ring.StartAfter(list, addr)
			}
		}
		delay := wait.Next()
		c.log.Warn("control session ended", "addr", addr, "err", err, "retry_in", delay)
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
