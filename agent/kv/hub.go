package kv

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Hub holds the mirrors of every engine on the node and is where the
// control session reads them. Listeners write to it; one session at a time
// reads it, with Full on every new session or full-copy request and Changes
// on every flush (design §7.5 step 2): after Notify, once FlushIn has
// passed (FlushPolicy). Changes made while no session is up are not lost:
// the next session's full copy carries them.
//
// It is safe for concurrent use.
type Hub struct {
	log     *slog.Logger
	metrics *metrics
	pacer   *pacer
	now     func() time.Time

	mu      sync.Mutex
	mirrors map[string]*mirror // by replica id
}

// NewHub returns an empty hub whose metrics (llmgw_agent_kv_*) are
// registered on reg, flushing by DefaultFlushPolicy.
func NewHub(logger *slog.Logger, reg prometheus.Registerer) (*Hub, error) {
	return NewHubWith(logger, reg, DefaultFlushPolicy(), time.Now)
}

// NewHubWith is NewHub with a flush policy and a clock (for the flush
// timing and the lag metric).
func NewHubWith(logger *slog.Logger, reg prometheus.Registerer, flush FlushPolicy, now func() time.Time) (*Hub, error) {
	if logger == nil {
		return nil, errors.New("kv: nil logger")
	}
	p, err := newPacer(flush, now)
	if err != nil {
		return nil, err
	}
	h := &Hub{log: logger, mirrors: map[string]*mirror{}, pacer: p, now: now}
	m, err := newMetrics(reg, h)
	if err != nil {
		return nil, fmt.Errorf("kv: metrics: %w", err)
	}
	h.metrics = m
	return h, nil
}

// Full returns every replica's whole block set, each as a reset, sorted by
// replica id: what a full ephemeral update carries. What it returns counts
// as reported: the next Changes starts from it.
func (h *Hub) Full() []*llmgwv1.KVBlocks { return h.reports(true) }

// Changes returns each replica's net change since the last Full or Changes
// (a reset where one is due), sorted by replica id; nil when nothing
// changed.
func (h *Hub) Changes() []*llmgwv1.KVBlocks { return h.reports(false) }

// Notify wakes the session at the first change after a report: it should
// then wait FlushIn and call Changes.
func (h *Hub) Notify() <-chan struct{} { return h.pacer.notify }

// FlushIn is how long until the pending changes are due to be sent (0:
// now), and false when none are pending.
func (h *Hub) FlushIn() (time.Duration, bool) { return h.pacer.flushIn() }

// reports takes every mirror's report, and observes the lag from each
// one's engine events to now (llmgw_agent_kv_event_lag_seconds).
func (h *Hub) reports(full bool) []*llmgwv1.KVBlocks {
	at := h.pacer.taking()
	var out []*llmgwv1.KVBlocks
	for _, m := range h.list() {
		m.mu.Lock()
		if b := m.report(full); b != nil {
			out = append(out, b)
		}
		m.mu.Unlock()
	}
	if len(out) > 0 {
		h.pacer.sent(at)
	}
	now := h.now()
	for _, b := range out {
		observeLag(h.metrics.lag, now, b)
	}
	return out
}

// Blocks returns the canonical hashes held for a replica, sorted, and
// whether its state is untrusted; ok is false for a replica without a
// listener.
func (h *Hub) Blocks(replicaID string) (blocks []uint64, untrusted, ok bool) {
	h.mu.Lock()
	m := h.mirrors[replicaID]
	h.mu.Unlock()
	if m == nil {
		return nil, false, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.blocks(), m.untrusted, true
}

func (h *Hub) list() []*mirror {
	h.mu.Lock()
	out := make([]*mirror, 0, len(h.mirrors))
	for _, m := range h.mirrors {
		out = append(out, m)
	}
	h.mu.Unlock()
	slices.SortFunc(out, func(a, b *mirror) int { return strings.Compare(a.replicaID, b.replicaID) })
	return out
}

func (h *Hub) add(m *mirror) {
	h.mu.Lock()
	h.mirrors[m.replicaID] = m
	h.mu.Unlock()
}

// drop forgets m unless another listener has taken its replica id since.
func (h *Hub) drop(m *mirror) {
	h.mu.Lock()
	if h.mirrors[m.replicaID] == m {
		delete(h.mirrors, m.replicaID)
	}
	h.mu.Unlock()
}

// totals is what the gauges read at scrape time: distinct blocks on the
// GPU and in each offload tier, untrusted replicas.
func (h *Hub) totals() (blocks int, off [numOff]int, untrusted int) {
	for _, m := range h.list() {
		m.mu.Lock()
		blocks += len(m.held)
		for i := range off {
			off[i] += len(m.off[i].held)
		}
		if m.untrusted {
			untrusted++
		}
		m.mu.Unlock()
	}
	return blocks, off, untrusted
}
