package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"
)

// Percentile returns the p-th percentile (0 ≤ p ≤ 100) of sorted samples by
// the nearest-rank method: always one of the samples, never an
// interpolation, so a p99 is a latency somebody actually saw. It is 0 for no
// samples (JSON has no NaN).
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	return sorted[min(max(rank, 1), n)-1]
}

// Summary describes one latency distribution, in seconds.
type Summary struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Mean  float64 `json:"mean"`
	Max   float64 `json:"max"`
}

// summarize sorts xs in place and describes it.
func summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	sort.Float64s(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return Summary{
		Count: len(xs),
		P50:   Percentile(xs, 50),
		P90:   Percentile(xs, 90),
		P99:   Percentile(xs, 99),
		Mean:  sum / float64(len(xs)),
		Max:   xs[len(xs)-1],
	}
}

// Report is one run's result: one target, or several behind the round-robin
// client. The JSON names are the stable interface for scripts.
type Report struct {
	Label    string `json:"label"`
	Target   string `json:"target"`
	Workload string `json:"workload"`
	// Seed is the workload's seed; Settings the run's workload and load
	// in the words of its flags.
	Seed     uint64 `json:"seed"`
	Settings string `json:"settings,omitempty"`
	// Requests counts every request sent, failed ones included.
	Requests     int            `json:"requests"`
	Errors       int            `json:"errors"`
	ErrorsByKind map[string]int `json:"errors_by_kind"`
	// DurationSeconds runs from the first request sent to the last finished.
	DurationSeconds float64 `json:"duration_seconds"`
	// ThroughputRPS counts successful requests per second.
	ThroughputRPS float64 `json:"throughput_rps"`
	// OutputTokensPerSecond counts completion tokens of successful requests.
	OutputTokensPerSecond float64 `json:"output_tokens_per_second"`
	PromptTokens          int     `json:"prompt_tokens"`
	CachedTokens          int     `json:"cached_tokens"`
	CompletionTokens      int     `json:"completion_tokens"`
	// CacheHitShare is Σ cached_tokens / Σ prompt_tokens over successful
	// requests: the share of prefill the prefix cache saved (0..1).
	CacheHitShare float64 `json:"cache_hit_share"`
	// CacheHitCeiling is the hit share an ideal router with unbounded
	// caches would reach on the run's own requests (each block a miss only
	// the first time it is sent), from the engines' tokenization, and
	// HitOverCeiling is CacheHitShare over it; absent when no engine could
	// tokenize. BlockSize is the block the ceiling was counted in.
	CacheHitCeiling *float64 `json:"cache_hit_ceiling,omitempty"`
	HitOverCeiling  *float64 `json:"hit_over_ceiling,omitempty"`
	BlockSize       int      `json:"block_size,omitempty"`
	// CacheNotReset lists the engines whose cache a reset was asked of
	// but that serve no POST /reset_prefix_cache: the run ran on whatever
	// they held (table: "cache not reset").
	CacheNotReset []string `json:"cache_not_reset,omitempty"`
	// CachesReset says the engines' prefix caches were emptied before the
	// run. WarmCacheTokens are tokens the engines reported cached that no
	// other request of the run was sent with before the request's first
	// token — a cache warmed before the run — and
	// WarmStart is set when they pass 5 % of the run's unavoidable misses.
	CachesReset     bool    `json:"caches_reset"`
	WarmCacheTokens int     `json:"warm_cache_tokens"`
	WarmStart       bool    `json:"warm_start"`
	TTFT            Summary `json:"ttft_seconds"`
	ITL             Summary `json:"itl_seconds"`
	E2E             Summary `json:"e2e_seconds"`
	// Replicas counts requests per X-Llmgw-Replica, and ReplicaMaxOverMean
	// is the busiest replica's count over the mean: 1 is an even spread.
	Replicas           map[string]int `json:"replicas"`
	ReplicaMaxOverMean float64        `json:"replica_max_over_mean"`
	// Decisions are the routers' own counts of session and prefix
	// decisions taken during the run (summed over its targets), from their
	// /metrics; absent when a target's could not be read.
	Decisions Decisions `json:"router_decisions,omitempty"`

	// TTFTQuantiles are the sorted TTFT samples, thinned to at most
	// cdfPoints evenly spaced ranks: the chart's CDF, kept in the JSON so
	// `llmgwctl bench summarize` can draw it from saved runs.
	TTFTQuantiles []float64 `json:"ttft_quantiles_seconds,omitempty"`
}

// cdfPoints bounds TTFTQuantiles: enough for a smooth curve, small enough
// for a JSON of many runs.
const cdfPoints = 500

// thin keeps at most n evenly spaced ranks of sorted xs, the last included.
func thin(xs []float64, n int) []float64 {
	if len(xs) <= n {
		return slices.Clone(xs)
	}
	out := make([]float64, n)
	for i := range n {
		out[i] = xs[(i+1)*len(xs)/n-1]
	}
	return out
}

// Summarize turns a run's samples into its report. Latencies come from
// successful requests only: a fast 503 is not a fast answer.
func Summarize(label, target, workload string, samples []Sample) Report {
	r := Report{
		Label: label, Target: target, Workload: workload,
		Requests:     len(samples),
		ErrorsByKind: map[string]int{},
		Replicas:     map[string]int{},
	}
	var ttft, itl, e2e []float64
	var first, last time.Duration
	for i, s := range samples {
		if i == 0 || s.Start < first {
			first = s.Start
		}
		last = max(last, s.Start+s.E2E)
		if s.Replica != "" {
			r.Replicas[s.Replica]++
		}
		if !s.OK() {
			r.Errors++
			r.ErrorsByKind[s.ErrKind]++
			continue
		}
		r.PromptTokens += s.PromptTokens
		r.CachedTokens += s.CachedTokens
		r.CompletionTokens += s.CompletionTokens
		if s.TTFT > 0 {
			ttft = append(ttft, s.TTFT.Seconds())
		}
		for _, d := range s.ITL {
			itl = append(itl, d.Seconds())
		}
		e2e = append(e2e, s.E2E.Seconds())
	}
	r.DurationSeconds = (last - first).Seconds()
	if r.DurationSeconds > 0 {
		r.ThroughputRPS = float64(r.Requests-r.Errors) / r.DurationSeconds
		r.OutputTokensPerSecond = float64(r.CompletionTokens) / r.DurationSeconds
	}
	if r.PromptTokens > 0 {
		r.CacheHitShare = float64(r.CachedTokens) / float64(r.PromptTokens)
	}
	r.TTFT, r.ITL, r.E2E = summarize(ttft), summarize(itl), summarize(e2e)
	r.TTFTQuantiles = thin(ttft, cdfPoints)
	if len(r.Replicas) > 0 {
		total, most := 0, 0
		for _, n := range r.Replicas {
			total += n
			most = max(most, n)
		}
		r.ReplicaMaxOverMean = float64(most) / (float64(total) / float64(len(r.Replicas)))
	}
	return r
}

// replicaNames returns the report's replicas, busiest first.
func (r Report) replicaNames() []string {
	names := make([]string, 0, len(r.Replicas))
	for n := range r.Replicas {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		if d := r.Replicas[b] - r.Replicas[a]; d != 0 {
			return d
		}
		if a < b {
			return -1
		}
		return 1
	})
	return names
}

// Arrivals draws the gaps of a Poisson process: exponential inter-arrival
// times with mean 1/rate. The source is injected so tests can check the law
// without a clock, and runs with one seed arrive alike. Not safe for
// concurrent use; the open loop draws from one goroutine.
type Arrivals struct {
	rng  *rand.Rand
	rate float64
}

// NewArrivals returns arrivals at rate per second (rate > 0) drawn from src.
func NewArrivals(src rand.Source, rate float64) *Arrivals {
	return &Arrivals{rng: rand.New(src), rate: rate}
}

// Next returns the time until the next arrival.
func (a *Arrivals) Next() time.Duration {
	return time.Duration(a.rng.ExpFloat64() / a.rate * float64(time.Second))
}
