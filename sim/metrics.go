package sim

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/vllm"
)

// metrics are the server's vLLM-named metrics, in a registry the server
// owns: two simulators in one process (llmgw dev) must not share series.
type metrics struct {
	reg              *prometheus.Registry
	prefixQueries    prometheus.Counter
	prefixHits       prometheus.Counter
	promptTokens     prometheus.Counter
	generationTokens prometheus.Counter
	requestSuccess   *prometheus.CounterVec
	ttft             prometheus.Histogram
	e2e              prometheus.Histogram
	queueTime        prometheus.Histogram
	// aborted is the simulator's own (llmgw_sim_ prefix, not a vLLM name):
	// requests the engine dropped unfinished, by reason — "client" when
	// the client went away or stopped reading a stream, "engine" when the
	// engine aborted it (a sleep in mode abort). vLLM counts a client's
	// abort nowhere: its vllm:request_success_total{finished_reason="abort"}
	// stays 0 for them (vllm-project/vllm#31503), and so does the
	// simulator's; tests read this counter instead.
	aborted *prometheus.CounterVec
}

// MetricSimAbortedRequests is the simulator's count of aborted requests,
// labelled by LabelAbortReason.
const (
	MetricSimAbortedRequests = "llmgw_sim_aborted_requests_total"
	LabelAbortReason         = "reason"
	AbortReasonClient        = "client"
	AbortReasonEngine        = "engine"
)

func newMetrics(cfg *Config, e *engine) *metrics {
	labels := prometheus.Labels{vllm.LabelModelName: cfg.ServedNames()[0], vllm.LabelEngine: "0"}
	reg := prometheus.NewRegistry()
	m := &metrics{
		reg: reg,
		prefixQueries: prometheus.NewCounter(prometheus.CounterOpts{Name: vllm.MetricPrefixCacheQueries,
			Help: "Prefix cache queries, in terms of number of queried tokens.", ConstLabels: labels}),
		prefixHits: prometheus.NewCounter(prometheus.CounterOpts{Name: vllm.MetricPrefixCacheHits,
			Help: "Prefix cache hits, in terms of number of cached tokens.", ConstLabels: labels}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: vllm.MetricPromptTokens,
			Help: "Number of prefill tokens processed.", ConstLabels: labels}),
		generationTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: vllm.MetricGenerationTokens,
			Help: "Number of generation tokens processed.", ConstLabels: labels}),
		requestSuccess: prometheus.NewCounterVec(prometheus.CounterOpts{Name: vllm.MetricRequestSuccess,
			Help: "Count of successfully processed requests.", ConstLabels: labels},
			[]string{vllm.LabelFinishedReason}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: vllm.MetricTimeToFirstToken,
			Help: "Histogram of time to first token in seconds.", ConstLabels: labels,
			Buckets: vllm.TimeToFirstTokenBuckets}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{Name: vllm.MetricE2ERequestLatency,
			Help: "Histogram of e2e request latency in seconds.", ConstLabels: labels,
			Buckets: vllm.RequestLatencyBuckets}),
		queueTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: vllm.MetricRequestQueueTime,
			Help: "Histogram of time spent in WAITING phase for request.", ConstLabels: labels,
			Buckets: vllm.RequestLatencyBuckets}),
		aborted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricSimAbortedRequests,
			Help:        "Requests aborted unfinished, by reason: client (went away or stopped reading) or engine (sleep in mode abort). The simulator's own metric.",
			ConstLabels: labels}, []string{LabelAbortReason}),
	}
	// The gauges read the engine when scraped, so they are always
	// consistent with one another and cost nothing between scrapes.
	gauge := func(name, help string, f func(engineStats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return f(e.stats()) })
	}
	cacheInfo := prometheus.NewGauge(prometheus.GaugeOpts{Name: vllm.MetricCacheConfigInfo,
		Help: "Information of the LLMEngine CacheConfig",
		ConstLabels: prometheus.Labels{
			vllm.LabelEngine:               "0",
			vllm.LabelCacheBlockSize:       strconv.Itoa(cfg.BlockSize),
			vllm.LabelCacheNumGPUBlocks:    strconv.Itoa(cfg.NumGPUBlocks),
			vllm.LabelCacheHashAlgo:        cfg.PrefixCachingHashAlgo,
			vllm.LabelCacheEnablePrefixing: pyBool(cfg.EnablePrefixCaching),
			// Another CacheConfig field vLLM labels the gauge with, str() of
			// the float as Python prints it.
			"gpu_memory_utilization": strconv.FormatFloat(cfg.GPUMemoryUtilization, 'g', -1, 64),
		}})
	cacheInfo.Set(1)
	reg.MustRegister(
		m.prefixQueries, m.prefixHits, m.promptTokens, m.generationTokens, m.requestSuccess,
		m.ttft, m.e2e, m.queueTime, cacheInfo, m.aborted,
		gauge(vllm.MetricNumRequestsRunning, "Number of requests in model execution batches.",
			func(s engineStats) float64 { return float64(s.Running) }),
		gauge(vllm.MetricNumRequestsWaiting, "Number of requests waiting to be processed.",
			func(s engineStats) float64 { return float64(s.Waiting) }),
		gauge(vllm.MetricKVCacheUsagePerc, "KV-cache usage. 1 means 100 percent usage.",
			func(s engineStats) float64 { return s.KVUsage }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: vllm.MetricNumPreemptions,
			Help: "Cumulative number of preemption from the engine.", ConstLabels: labels},
			func() float64 { return float64(e.stats().Preemptions) }),
	)
	// Pre-create the finished reasons so a scraper sees zeros, not absence.
	for _, r := range []string{vllm.FinishedStop, vllm.FinishedLength, vllm.FinishedAbort} {
		m.requestSuccess.WithLabelValues(r)
	}
	m.aborted.WithLabelValues(AbortReasonClient)
	m.aborted.WithLabelValues(AbortReasonEngine)
	return m
}

// pyBool renders a bool as Python's str() does, as vLLM's info labels are.
func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}
