package kv

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// metrics are the KV listener's and mirror's (design §9), on the agent's
// registry. Per-replica detail is in the logs; the counters say whether
// tier 2 can be trusted on this node at all.
type metrics struct {
	events         *prometheus.CounterVec
	batches        prometheus.Counter
	badBatches     prometheus.Counter
	gaps           prometheus.Counter
	replays        *prometheus.CounterVec
	resets         *prometheus.CounterVec
	mismatches     prometheus.Counter
	listenFailures prometheus.Counter
	framesRefused  prometheus.Counter
	overCap        prometheus.Counter
	lag            *prometheus.HistogramVec
}

// LagBuckets are the buckets of the KV event lag histograms, agent and
// router: 1 ms to 8 s, each √2 times the last.
var LagBuckets = prometheus.ExponentialBuckets(0.001, math.Sqrt2, 27)

// observeLag observes now minus the engine times an entry carries, by
// edge: "oldest" (the longest any change in it waited) and "newest". The
// engine's clock is its host's: on another host than the observer's the
// figure is off by the skew between the two clocks, and a negative
// difference (a clock ahead) counts as 0.
func observeLag(h *prometheus.HistogramVec, now time.Time, b *llmgwv1.KVBlocks) {
	for _, e := range []struct {
		edge string
		ns   int64
	}{{"oldest", b.GetOldestEventUnixNano()}, {"newest", b.GetNewestEventUnixNano()}} {
		if e.ns != 0 {
			h.WithLabelValues(e.edge).Observe(max(now.Sub(time.Unix(0, e.ns)).Seconds(), 0))
		}
	}
}

func newMetrics(reg prometheus.Registerer, h *Hub) (*metrics, error) {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmgw_agent_kv_events_total",
			Help: "KV-cache events received, by type (stored and removed count blocks; cleared and unknown count events)."},
			[]string{"type"}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_kv_batches_total",
			Help: "KV-event batches applied, live or replayed."}),
		badBatches: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_kv_bad_batches_total",
			Help: "KV-event messages that could not be parsed or decoded; each is treated as lost."}),
		gaps: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_kv_gaps_total",
			Help: "Sequence gaps seen in engines' KV-event streams."}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmgw_agent_kv_replays_total",
			Help: "Replays asked of engines, by result (repaired; complete: the engine's whole history, numbered from past 0; unrepairable; failed; current: a poll after a publisher connected found nothing missed; poll_failed: such a poll got no answer)."}, []string{"result"}),
		resets: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmgw_agent_kv_resets_total",
			Help: "Mirror resets, by reason (restart, cleared, untrusted)."}, []string{"reason"}),
		mismatches: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_kv_hash_mismatches_total",
			Help: "Blocks whose engine hash differs from the one derived from their tokens (an engine hashing another way)."}),
		listenFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_kv_listen_failures_total",
			Help: "KV-event sockets that could not be bound; those engines run without events."}),
		framesRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_kv_frames_refused_total",
			Help: "ZMTP frames refused on KV-event and replay sockets (over the size cap, or a malformed handshake); each closed its connection."}),
		overCap: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_kv_over_capacity_total",
			Help: "Times an engine's events would have held more blocks than its cache (num_gpu_blocks, or the agent's cap); each made the replica untrusted."}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "llmgw_agent_kv_event_lag_seconds",
			Help:    "Time from an engine's KV-event batch (its ts, on the engine's clock) to the agent's send of the change, by edge: the oldest and the newest batch a send carries.",
			Buckets: LagBuckets}, []string{"edge"}),
	}
	blocks := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "llmgw_agent_kv_blocks",
		Help: "Distinct KV-cache blocks held on the GPU in the mirrors of this node's engines."},
		func() float64 { b, _, _ := h.totals(); return float64(b) })
	offloaded := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "llmgw_agent_kv_offloaded_blocks",
		Help: "Distinct KV-cache blocks held in the offload tiers (CPU and storage, each counted) in the mirrors of this node's engines."},
		func() float64 { _, o, _ := h.totals(); return float64(o[offCPU] + o[offStorage]) })
	untrusted := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "llmgw_agent_kv_untrusted_replicas",
		Help: "Replicas whose KV state is untrusted after a gap replay could not close."},
		func() float64 { _, _, u := h.totals(); return float64(u) })
	for _, c := range []prometheus.Collector{m.events, m.batches, m.badBatches, m.gaps, m.replays, m.resets,
		m.mismatches, m.listenFailures, m.framesRefused, m.overCap, m.lag, blocks, offloaded, untrusted} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
