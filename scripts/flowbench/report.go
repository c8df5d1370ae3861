package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// report is every figure of a run, written as JSON, and the must-shows
// judged from them.
type report struct {
	Setup         setup           `json:"setup"`
	Capacity      *capacityResult `json:"capacity,omitempty"`
	Alone         *aloneResult    `json:"alone,omitempty"`
	Mixed         *mixedResult    `json:"mixed,omitempty"`
	Fair          *fairResult     `json:"fair,omitempty"`
	Heavy         *heavyResult    `json:"heavy,omitempty"`
	Cost          *costResult     `json:"cost,omitempty"`
	Lost          []lostRecord    `json:"lost"`
	ClassMismatch map[string]int  `json:"class_mismatch"`
	Verdicts      []verdict       `json:"verdicts"`
	Time          time.Time       `json:"time"`
}

type setup struct {
	Replicas           int    `json:"replicas"`
	GPU                string `json:"gpu"`
	ModelID            string `json:"model_id"`
	MaxNumSeqs         int    `json:"max_num_seqs"`
	MaxNumBatched      int    `json:"max_num_batched_tokens,omitempty"`
	EnginePriority     bool   `json:"engine_priority,omitempty"`
	MaxTokens          int    `json:"max_tokens"`
	PromptWords        int    `json:"prompt_words"`
	PromptTokens       int    `json:"prompt_tokens"`
	Flow               bool   `json:"flow"`
	ReplicaConcurrency int    `json:"replica_concurrency"`
	ClassFlags         bool   `json:"class_flags"`
	Seed               uint64 `json:"seed"`
}

// tenantResult is one tenant's requests in a phase.
type tenantResult struct {
	Sent      int            `json:"sent"`
	Served    int            `json:"served"`
	Queued    int            `json:"queued"` // served after waiting in a router's queue
	Refused   map[string]int `json:"refused"`
	Lost      int            `json:"lost"`
	OutTokens int            `json:"out_tokens"`
	TTFTp50ms float64        `json:"ttft_p50_ms"`
	TTFTp90ms float64        `json:"ttft_p90_ms"`
	TTFTp99ms float64        `json:"ttft_p99_ms"`
	// QueueMSp99 is the p99 of x-llmgw-queue-ms over the queued ones.
	QueueMSp99 float64 `json:"queue_ms_p99"`
}

func (t tenantResult) refusedTotal() int {
	n := 0
	for _, v := range t.Refused {
		n += v
	}
	return n
}

type capacityResult struct {
	RPS             float64        `json:"rps"`
	OutTokensPerSec float64        `json:"out_tokens_per_sec"`
	Concurrency     int            `json:"concurrency"`
	Given           bool           `json:"given,omitempty"`
	Cap             tenantResult   `json:"requests"`
	Engines         *engineFigures `json:"engines,omitempty"`
}

type aloneResult struct {
	RateRPS float64        `json:"rate_rps"`
	B       tenantResult   `json:"b"`
	Engines *engineFigures `json:"engines,omitempty"`
}

type inversionResult struct {
	Rounds       int     `json:"rounds"`
	FailedRounds int     `json:"failed_rounds"`
	MaxGapMS     float64 `json:"max_gap_ms"`
	// BatchDispatched, Strict and Conservative are counted from the
	// scraped rounds (countInversions).
	BatchDispatched float64 `json:"batch_dispatched"`
	Strict          float64 `json:"strict"`
	Conservative    float64 `json:"conservative"`
	// The routers' own counters over the phase, summed.
	RoutersOwn             float64 `json:"routers_inversions_total"`
	RoutersBatchDispatched float64 `json:"routers_batch_dispatched"`
	RoutersDropped         float64 `json:"routers_dropped"`
}

type mixedResult struct {
	BRateRPS             float64          `json:"b_rate_rps"`
	ARateRPS             float64          `json:"a_rate_rps"`
	B                    tenantResult     `json:"b"`
	A                    tenantResult     `json:"a"`
	BTTFTRatio           float64          `json:"b_ttft_p99_ratio"`
	FleetOutTokensPerSec float64          `json:"fleet_out_tokens_per_sec"`
	FleetShare           float64          `json:"fleet_share_of_capacity"`
	AShareByMinute       []float64        `json:"a_share_by_minute"`
	Inversions           *inversionResult `json:"inversions,omitempty"`
	Engines              *engineFigures   `json:"engines,omitempty"`
}

type fairResult struct {
	RateRPS      float64                 `json:"rate_rps"`
	JainByMinute []float64               `json:"jain_by_minute"`
	Tenants      map[string]tenantResult `json:"tenants"`
}

type heavyResult struct {
	HeavyRateRPS       float64                 `json:"heavy_rate_rps"`
	OtherRateRPS       float64                 `json:"other_rate_rps"`
	HeavyShare         float64                 `json:"heavy_share"`
	HeavyFairShare     float64                 `json:"heavy_fair_share"`
	HeavyShareByMinute []float64               `json:"heavy_share_by_minute"`
	Tenants            map[string]tenantResult `json:"tenants"`
}

type costRow struct {
	Router            string    `json:"router"`
	Flow              bool      `json:"flow"`
	Requests          int       `json:"requests"`
	Lost              int       `json:"lost"`
	CPUSeconds        float64   `json:"cpu_seconds"`
	WallSeconds       float64   `json:"wall_seconds"`
	SliceCPUmsPer1000 []float64 `json:"slice_cpu_ms_per_1000"`
	MeanCPUmsPer1000  float64   `json:"mean_cpu_ms_per_1000"`
	SDCPUmsPer1000    float64   `json:"sd_cpu_ms_per_1000"`
	TTFTp50ms         []float64 `json:"slice_ttft_p50_ms"`
	// IdleCPUmsPerSec is the router's CPU at rest before the slices;
	// the Net figures take it off each slice (its wall time × the rate).
	IdleCPUmsPerSec      float64   `json:"idle_cpu_ms_per_sec"`
	SliceNetCPUmsPer1000 []float64 `json:"slice_net_cpu_ms_per_1000"`
	MeanNetCPUmsPer1000  float64   `json:"mean_net_cpu_ms_per_1000"`
}

type costResult struct {
	RateRPS float64   `json:"rate_rps"`
	Rows    []costRow `json:"rows"`
}

type lostRecord struct {
	Phase  string `json:"phase"`
	Tenant string `json:"tenant"`
	Router int    `json:"router"`
	Code   int    `json:"code"`
	Why    string `json:"why"`
}

type verdict struct {
	Name   string `json:"name"`
	Pass   bool   `json:"pass"`
	Figure string `json:"figure"`
}

func (r *report) aloneB() tenantResult {
	if r.Alone == nil {
		return tenantResult{}
	}
	return r.Alone.B
}

// judge sets the verdicts from the figures; a phase not run is not
// judged.
func (r *report) judge() {
	r.Verdicts = nil
	add := func(name string, pass bool, format string, args ...any) {
		r.Verdicts = append(r.Verdicts, verdict{Name: name, Pass: pass, Figure: fmt.Sprintf(format, args...)})
	}
	if m := r.Mixed; m != nil {
		if r.Alone != nil {
			add("noisy neighbour: B's TTFT p99 ≤ 1.3 × alone", m.BTTFTRatio <= 1.3 && m.BTTFTRatio > 0,
				"%.0f ms against %.0f ms: × %.2f", m.B.TTFTp99ms, r.Alone.B.TTFTp99ms, m.BTTFTRatio)
		}
		add("noisy neighbour: 0 of B's requests refused", m.B.refusedTotal() == 0 && m.B.Lost == 0,
			"%d refused, %d lost of %d", m.B.refusedTotal(), m.B.Lost, m.B.Sent)
		add("work-conserving: fleet output ≥ 90 % of capacity", m.FleetShare >= 0.9,
			"%.0f of %.0f tok/s: %.1f %%", m.FleetOutTokensPerSec, r.Capacity.OutTokensPerSec, 100*m.FleetShare)
		low := 1.0
		for _, s := range m.AShareByMinute {
			low = min(low, s)
		}
		add("no starvation: A ≥ 1 % of the service every minute", len(m.AShareByMinute) > 0 && low >= 0.01,
			"lowest minute %.1f %%", 100*low)
		if inv := m.Inversions; inv != nil {
			add("inversions ≤ 0.1 % of batch dispatches (scraped, interactive waiting > 100 ms at either end of the interval)",
				share(inv.Conservative, inv.BatchDispatched) <= 0.001 && inv.BatchDispatched > 0,
				"%.0f of %.0f: %.3f %% (at the interval's end only: %.0f, %.3f %%)", inv.Conservative, inv.BatchDispatched,
				100*share(inv.Conservative, inv.BatchDispatched), inv.Strict, 100*share(inv.Strict, inv.BatchDispatched))
			add("inversions ≤ 0.1 % of batch dispatches (the routers' inversions_total)",
				share(inv.RoutersOwn, inv.RoutersBatchDispatched) <= 0.001 && inv.RoutersBatchDispatched > 0,
				"%.0f of %.0f: %.3f %%", inv.RoutersOwn, inv.RoutersBatchDispatched, 100*share(inv.RoutersOwn, inv.RoutersBatchDispatched))
		}
		reasons := m.A.Refused
		add("a queue bound hit gives 429 with the reason", len(reasons) > 0,
			"A refused %v, every 429 with x-llmgw-flow-reason and Retry-After (else counted lost)", reasons)
	}
	if f := r.Fair; f != nil {
		low := 1.0
		for _, j := range f.JainByMinute {
			low = min(low, j)
		}
		add("fairness: Jain's index ≥ 0.95 every minute", len(f.JainByMinute) > 0 && low >= 0.95, "lowest minute %.4f", low)
	}
	if h := r.Heavy; h != nil {
		add("fairness: a tenant sending 10 × more gets ≤ its share (× 1.1)", h.HeavyShare <= 1.1*h.HeavyFairShare,
			"%.1f %% against a max-min fair share of %.1f %%", 100*h.HeavyShare, 100*h.HeavyFairShare)
	}
	if c := r.Cost; c != nil && len(c.Rows) == 2 {
		on, off := c.Rows[0], c.Rows[1]
		// Within noise: the difference of the means under twice its
		// standard error, or under 5 % of flow off.
		se := math.Sqrt(sq(on.SDCPUmsPer1000)/float64(len(on.SliceCPUmsPer1000)) + sq(off.SDCPUmsPer1000)/float64(len(off.SliceCPUmsPer1000)))
		diff := on.MeanCPUmsPer1000 - off.MeanCPUmsPer1000
		add("no cost below saturation: CPU per request flow on vs off within noise", diff <= max(2*se, 0.05*off.MeanCPUmsPer1000),
			"%.0f vs %.0f ms per 1000 requests (%+.1f %%, 2 × standard error %.0f); at rest %.1f vs %.1f ms/s, less it %.0f vs %.0f",
			on.MeanCPUmsPer1000, off.MeanCPUmsPer1000, 100*share(diff, off.MeanCPUmsPer1000), 2*se,
			on.IdleCPUmsPerSec, off.IdleCPUmsPerSec, on.MeanNetCPUmsPer1000, off.MeanNetCPUmsPer1000)
	}
	add("0 requests lost", len(r.Lost) == 0, "%d lost", len(r.Lost))
}

func sq(x float64) float64 { return x * x }

// failed is the names of the must-shows that failed.
func (r *report) failed() []string {
	var out []string
	for _, v := range r.Verdicts {
		if !v.Pass {
			out = append(out, v.Name)
		}
	}
	return out
}

func (r *report) printLost() {
	if len(r.Lost) == 0 && len(r.ClassMismatch) == 0 {
		fmt.Println("every request accounted for: 0 lost, every served one in its tenant's class")
		return
	}
	why := map[string]int{}
	for _, l := range r.Lost {
		why[fmt.Sprintf("%s %s r%d: %s", l.Phase, l.Tenant, l.Router, l.Why)]++
	}
	keys := make([]string, 0, len(why))
	for k := range why {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	fmt.Printf("lost: %d\n", len(r.Lost))
	for _, k := range keys {
		fmt.Printf("  %d × %s\n", why[k], k)
	}
	for k, n := range r.ClassMismatch {
		fmt.Printf("served in another class than its tenant's: %d × %s\n", n, k)
	}
}

func (r *report) printVerdicts() {
	r.judge()
	fmt.Println("\n| must-show | pass | figure |")
	fmt.Println("|---|---|---|")
	for _, v := range r.Verdicts {
		fmt.Printf("| %s | %v | %s |\n", v.Name, v.Pass, v.Figure)
	}
}

func (r *report) write(path string) error {
	r.Time = time.Now().UTC()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	fmt.Println("figures in", path)
	return nil
}
