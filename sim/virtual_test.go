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
			cal.RequestSerial, cal.RequestJitter, cal.RequestTail = 0, tc.jitter, 0
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

// TestClosedLoopTTFTUnderConcurrency is issue 32 in virtual time: Mistral-7B
// on an RTX 4090, closed loop. Decode-bound (32-token prompts, so four
// clients' prefills fit in one memory-bound step), four clients' TTFT p50 is
// within 1.3 × one client's: a request that arrives while the engine steps
// waits at most for the step under way and is prefilled in the next, beside
// the decodes. With the issue-18 front end (22 ms, longer than the 19 ms
// decode step) every re-entry of a closed loop landed just after a step
// began and waited almost a whole one (docs/benchmarks.md "Concurrency
// fidelity (issue 32)"). The published sweep's own shape (256 tokens in,
// output lengths that vary: no --ignore-eos) has TTFT p50 at 4 and 8
// clients within 10 % of each other, as the published table.
func TestClosedLoopTTFTUnderConcurrency(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Model, cfg.GPU, cfg.MaxModelLen = "mistralai/Mistral-7B-Instruct-v0.3", "rtx4090", 32768
	ttft := func(c, in, outMin int, seed uint64) float64 {
		t.Helper()
		r, err := SimulateClosedLoop(cfg, ClosedLoop{Concurrency: c, InputTokens: in, OutputTokens: 128,
			OutputTokensMin: outMin, Requests: 10 * c, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		return r.TTFT.P50
	}
	for seed := uint64(1); seed <= 3; seed++ {
		if one, four := ttft(1, 32, 0, seed), ttft(4, 32, 0, seed); four > 1.3*one {
			t.Errorf("seed %d, decode-bound: TTFT p50 %.1f ms at 4 clients, %.1f at 1: want at most 1.3 ×", seed, four, one)
		}
		if a, b := ttft(4, 256, 72, seed), ttft(8, 256, 72, seed); b > 1.1*a || a > 1.1*b {
			t.Errorf("seed %d, variable lengths: TTFT p50 %.1f ms at 4 clients, %.1f at 8: want within 10 %%", seed, a, b)
		}
	}
}
