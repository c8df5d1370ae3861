package sim

import (
	"testing"
	"time"
)

// TestClosedLoopJitterBreaksLockstep: equal clients whose requests all take
// exactly as long stay in step — every request of a level sees the same
// TTFT — while the API server's jitter lets them drift apart, as real
// clients do (docs/benchmarks.md "GPU-like simulator").
func TestClosedLoopJitterBreaksLockstep(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Model, cfg.GPU, cfg.GPUMemoryUtilization = "Qwen/Qwen2.5-0.5B-Instruct", "l4", 0.6
	for _, tc := range []struct {
		name     string
		jitter   time.Duration
		lockstep bool
	}{
		{"no jitter", 0, true},
		{"±1 ms of jitter", time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cal := DefaultCalibration
			cal.RequestSerial, cal.RequestJitter = 0, tc.jitter
			r, err := SimulateClosedLoop(cfg, ClosedLoop{Concurrency: 4, InputTokens: 256, OutputTokens: 32,
				Requests: 40, Seed: 1, Calibration: &cal})
			if err != nil {
				t.Fatal(err)
			}
			if got := r.TTFT.P99 == r.TTFT.P50; got != tc.lockstep {
				t.Errorf("TTFT p50 %.2f ms, p99 %.2f ms: lockstep %v, want %v", r.TTFT.P50, r.TTFT.P99, got, tc.lockstep)
			}
		})
	}
}

func TestClosedLoopIsDeterministic(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Model, cfg.GPU, cfg.GPUMemoryUtilization = "Qwen/Qwen2.5-0.5B-Instruct", "l4", 0.6
	run := ClosedLoop{Concurrency: 8, InputTokens: 256, OutputTokens: 32, Requests: 40, Seed: 3}
	a, err := SimulateClosedLoop(cfg, run)
	if err != nil {
		t.Fatal(err)
	}
	b, err := SimulateClosedLoop(cfg, run)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Errorf("same seed, different runs:\n%+v\n%+v", a, b)
	}
}
