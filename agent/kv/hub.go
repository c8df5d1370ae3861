package kv

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Hub holds the mirrors of every engine on the node and is where the
// control session reads them. Listeners write to it; one session at a time
// reads it, with Full on every new session or full-copy request and Changes
// on every flush (design §7.5 step 2). Changes made while no session is up
// are not lost: the next session's full copy carries them.
//
// It is safe for concurrent use.
type Hub struct {
	log     *slog.Logger
	metrics *metrics

	mu      sync.Mutex
	mirrors map[string]*mirror // by replica id
}

// NewHub returns an empty hub whose metrics (llmgw_agent_kv_*) are
// registered on reg.
func NewHub(logger *slog.Logger, reg prometheus.Registerer) (*Hub, error) {
	if logger == nil {
		return nil, errors.New("kv: nil logger")
	}
	h := &Hub{log: logger, mirrors: map[string]*mirror{}}
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
func (h *Hub) Full() []*llmgwv1.KVBlocks {
	var out []*llmgwv1.KVBlocks
	for _, m := range h.list() {
		m.mu.Lock()
		if b := m.report(true); b != nil {
			out = append(out, b)
		}
		m.mu.Unlock()
	}
	return out
}

// Changes returns each replica's net change since the last Full or Changes
// (a reset where one is due), sorted by replica id; nil when nothing
// changed.
func (h *Hub) Changes() []*llmgwv1.KVBlocks {
	var out []*llmgwv1.KVBlocks
	for _, m := range h.list() {
		m.mu.Lock()
		if b := m.report(false); b != nil {
			out = append(out, b)
		}
		m.mu.Unlock()
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

// totals is what the gauges read at scrape time.
func (h *Hub) totals() (blocks, untrusted int) {
	for _, m := range h.list() {
		m.mu.Lock()
		blocks += len(m.held)
		if m.untrusted {
			untrusted++
		}
		m.mu.Unlock()
	}
	return blocks, untrusted
}
