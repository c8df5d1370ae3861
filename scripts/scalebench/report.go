package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

type setup struct {
	GPUs        int    `json:"gpus"`
	GPU         string `json:"gpu"`
	ModelID     string `json:"model_id"`
	MaxNumSeqs  int    `json:"max_num_seqs"`
	PromptWords int    `json:"prompt_words"`
	MaxTokens   int    `json:"max_tokens"`
	SimArgs     string `json:"sim_args,omitempty"`
	Seed        uint64 `json:"seed"`
}

type zeroResult struct {
	Burst        int      `json:"burst"`
	Lost         int      `json:"lost"`
	Why          []string `json:"why,omitempty"`
	ColdStartMS  float64  `json:"cold_start_ms"`
	FirstTokenMS float64  `json:"first_token_ms"`
	TTFTP50MS    float64  `json:"ttft_p50_ms"`
	TTFTP99MS    float64  `json:"ttft_p99_ms"`
	HoldP50MS    float64  `json:"hold_p50_ms"`
	PeakQueue    float64  `json:"peak_engine_queue_first_10s"`
	Samples      int      `json:"engine_samples"`
	MaxNumSeqs   int      `json:"max_num_seqs"`
	Decisions    []string `json:"decisions,omitempty"`
}

type stepResult struct {
	CapacityRPS        float64       `json:"capacity_rps"`
	SLOMS              float64       `json:"ttft_p90_slo_ms"`
	Requests           int           `json:"requests"`
	Failed             int           `json:"failed"`
	FailedAfterDrop    int           `json:"failed_after_drop"`
	Why                []string      `json:"why,omitempty"`
	PeakReplicas       uint32        `json:"peak_replicas"`
	BackUnderSLOAfterS float64       `json:"ttft_p90_back_under_slo_after_s"`
	BackToMinAfterS    float64       `json:"back_to_min_after_s"`
	Steps              float64       `json:"steps"`
	TTFTP90ByWindowMS  []float64     `json:"ttft_p90_by_10s_ms"`
	Samples            []countSample `json:"counts"`
}

type flapResult struct {
	RPS     float64  `json:"rps"`
	Load    float64  `json:"load_replicas"`
	Minutes float64  `json:"minutes"`
	Actions float64  `json:"scale_actions"`
	Counts  []uint32 `json:"counts_seen"`
	Failed  int      `json:"failed"`
}

type shareResult struct {
	BRequests     int     `json:"b_requests"`
	BFailed       int     `json:"b_failed"`
	BPeak         uint32  `json:"b_peak_ready"`
	ASlept        bool    `json:"a_put_to_sleep"`
	PinCount      uint32  `json:"pinned_count"`
	PinMin        uint32  `json:"pinned_min_ready"`
	AWakeOK       bool    `json:"a_served_after"`
	AFirstTokenMS float64 `json:"a_first_token_ms"`
	AWakeMS       float64 `json:"a_simulated_wake_ms"`
}

type report struct {
	Setup       setup        `json:"setup"`
	CapacityRPS float64      `json:"capacity_rps,omitempty"`
	Zero        *zeroResult  `json:"zero,omitempty"`
	Step        *stepResult  `json:"step,omitempty"`
	Flap        *flapResult  `json:"flap,omitempty"`
	Share       *shareResult `json:"share,omitempty"`
	Verdicts    []verdict    `json:"verdicts"`
}

type verdict struct {
	MustShow string `json:"must_show"`
	Pass     bool   `json:"pass"`
	Figure   string `json:"figure"`
}

// judge fills the verdicts of the phases that ran.
func (r *report) judge() {
	r.Verdicts = nil
	add := func(what string, pass bool, format string, a ...any) {
		r.Verdicts = append(r.Verdicts, verdict{what, pass, fmt.Sprintf(format, a...)})
	}
	if z := r.Zero; z != nil {
		add("scale from zero: 0 lost", z.Lost == 0, "%d lost of %d", z.Lost, z.Burst)
		add("scale from zero: first token ≤ cold start + 1 s", z.FirstTokenMS > 0 && z.FirstTokenMS <= z.ColdStartMS+1000,
			"first token %.0f ms, cold start %.0f ms", z.FirstTokenMS, z.ColdStartMS)
		add("scale from zero: the new replica never above its max-num-seqs in its first 10 s", z.Samples > 0 && z.PeakQueue <= float64(z.MaxNumSeqs),
			"peak running + waiting %.0f of %d (%d samples)", z.PeakQueue, z.MaxNumSeqs, z.Samples)
	}
	if s := r.Step; s != nil {
		add("load step: replicas grow to meet the target", s.PeakReplicas >= 6, "peak %d replicas", s.PeakReplicas)
		add("load step: TTFT p90 back under the SLO within the high load", s.BackUnderSLOAfterS >= 0,
			"%.0f s after the step (SLO %.0f ms)", s.BackUnderSLOAfterS, s.SLOMS)
		add("load step: back to min after scale_down_after", s.BackToMinAfterS > 0, "%.0f s after the drop", s.BackToMinAfterS)
		add("load step: 0 failed requests during the scale-down", s.FailedAfterDrop == 0, "%d failed after the drop; %d of %d in the whole phase",
			s.FailedAfterDrop, s.Failed, s.Requests)
	}
	if s := r.Share; s != nil {
		add("sharing: a burst on b takes idle a's GPU (a asleep)", s.ASlept && s.BPeak >= 3, "a put to sleep: %v; b's peak %d ready", s.ASlept, s.BPeak)
		add("sharing: b's queue drains", s.BFailed == 0, "%d failed of %d", s.BFailed, s.BRequests)
		add("sharing: a wakes on its next request within the simulated wake + 1 s", s.AWakeOK && s.AFirstTokenMS <= s.AWakeMS+1000,
			"first token %.0f ms, wake %.0f ms", s.AFirstTokenMS, s.AWakeMS)
		add("sharing: a pinned model is never taken", s.PinMin == s.PinCount, "pinned ready at least %d of %d throughout", s.PinMin, s.PinCount)
	}
	if f := r.Flap; f != nil {
		add("no flapping: at most 1 scale action", f.Actions <= 1, "%.0f actions in %.0f minutes, counts %v", f.Actions, f.Minutes, f.Counts)
	}
}

func (r *report) failed() []string {
	var out []string
	for _, v := range r.Verdicts {
		if !v.Pass {
			out = append(out, v.MustShow)
		}
	}
	return out
}

func (r *report) printVerdicts() {
	fmt.Println("\n| must-show | pass | figure |\n|---|---|---|")
	for _, v := range r.Verdicts {
		fmt.Printf("| %s | %v | %s |\n", v.MustShow, v.Pass, v.Figure)
	}
}

func (r *report) write(path string) error {
	r.judge()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
