package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/llmgw/llmgw/vllm"
)

// ClosedLoop is a closed-loop benchmark run on the stepped engine in
// virtual time (SimulateClosedLoop): Concurrency clients each send a fresh
// prompt of InputTokens and take OutputTokens (ignore_eos), sending again
// when answered, until Requests have been sent.
type ClosedLoop struct {
	Concurrency, InputTokens, OutputTokens, Requests int
	// OutputTokensMin, when set, makes each request's output length a
	// uniform draw from [OutputTokensMin, OutputTokens] instead of
	// OutputTokens: a sweep run without --ignore-eos, whose requests stop at
	// their EOS, so equal clients do not finish in step.
	OutputTokensMin int
	// Seed draws the prompts' tokens and the API server's jitter.
	Seed uint64
	// Calibration, when set, replaces DefaultCalibration (fitting it).
	Calibration *Calibration
}

// ClosedLoopResult is what such a run measured, in the columns of vLLM's
// benchmark_serving: latencies in milliseconds.
type ClosedLoopResult struct {
	Concurrency       int
	Duration          time.Duration
	RequestsPerSecond float64
	OutputTokensPerS  float64
	TTFT, ITL, E2E    Percentiles
	Preemptions       int
}

// Percentiles of a latency, milliseconds.
type Percentiles struct{ P50, P90, P95, P99 float64 }

func percentiles(ms []float64) Percentiles {
	if len(ms) == 0 {
		return Percentiles{}
	}
	slices.Sort(ms)
	at := func(q float64) float64 {
		// Linear interpolation between closest ranks, as numpy.percentile.
		pos := q * float64(len(ms)-1)
		i := int(pos)
		if i+1 >= len(ms) {
			return ms[len(ms)-1]
		}
		return ms[i] + (pos-float64(i))*(ms[i+1]-ms[i])
	}
	return Percentiles{at(0.5), at(0.9), at(0.95), at(0.99)}
}

// SimulateClosedLoop runs the closed loop against the engine cfg describes
// (GPU timing) with a virtual clock: the scheduler, cache and roofline are
// the server's own, only time is not waited. Each request spends the
// calibration's RequestOverhead before the engine sees it, queueing for
// its RequestSerial part, as it does in the server (apiServer). It is how the calibration is fitted and the sweep predicted
// (scripts/simsweep).
func SimulateClosedLoop(cfg Config, run ClosedLoop) (ClosedLoopResult, error) {
	cfg.Derive()
	if err := cfg.Validate(); err != nil {
		return ClosedLoopResult{}, err
	}
	if cfg.TimingMode() != TimingGPU {
		return ClosedLoopResult{}, errors.New("closed loop: needs GPU timing (--sim-gpu)")
	}
	if run.Concurrency < 1 || run.Requests < 1 || run.InputTokens < 1 || run.OutputTokens < 1 {
		return ClosedLoopResult{}, fmt.Errorf("closed loop: %+v: every count must be at least 1", run)
	}
	if run.OutputTokensMin > run.OutputTokens {
		return ClosedLoopResult{}, fmt.Errorf("closed loop: output tokens min %d above max %d", run.OutputTokensMin, run.OutputTokens)
	}
	if run.InputTokens+run.OutputTokens > cfg.MaxModelLen {
		return ClosedLoopResult{}, fmt.Errorf("closed loop: %d+%d tokens exceed --max-model-len %d", run.InputTokens, run.OutputTokens, cfg.MaxModelLen)
	}
	e := newEngine(&cfg, nil)
	if run.Calibration != nil {
		e.gpu.cal = cfg.frontEnd(*run.Calibration, e.gpu.gpu)
	}
	e.api = newAPIServer(e.gpu.cal, run.Seed)
	epoch := time.Unix(0, 0)
	rng := rand.New(rand.NewPCG(run.Seed, 0x73696d))
	none := vllm.NoneHash("0")
	type req struct {
		sent   time.Duration
		enter  time.Duration
		seq    *gseq
		tokens []time.Duration
	}
	var now time.Duration
	var pending, live []*req
	sent := 0
	outputs := 0
	send := func(at time.Duration) error {
		out := run.OutputTokens
		if run.OutputTokensMin > 0 {
			out = run.OutputTokensMin + rng.IntN(run.OutputTokens-run.OutputTokensMin+1)
		}
		outputs += out
		all := make([]int, run.InputTokens+out)
		for i := range all {
			all[i] = rng.IntN(TokenEOT)
		}
		hashes, err := vllm.BlockHashes(none, all[:run.InputTokens], cfg.BlockSize, nil)
		if err != nil {
			return err
		}
		allHashes, err := vllm.BlockHashes(none, all, cfg.BlockSize, nil)
		if err != nil {
			return err
		}
		r := &req{sent: at, enter: e.api.enter(epoch.Add(at)).Sub(epoch),
			seq: &gseq{hashes: hashes, allHashes: allHashes, all: all, promptLen: run.InputTokens,
				maxTokens: out, cached: -1, notify: make(chan struct{}, 1)}}
		pending = append(pending, r)
		sent++
		return nil
	}
	for range min(run.Concurrency, run.Requests) {
		if err := send(0); err != nil {
			return ClosedLoopResult{}, err
		}
	}
	var ttft, itl, e2e []float64
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	done := 0
	for done < run.Requests {
		if len(e.run) == 0 && len(e.wait) == 0 && len(pending) > 0 {
			now = max(now, pending[0].enter)
		}
		for len(pending) > 0 && pending[0].enter <= now {
			r := pending[0]
			pending = pending[1:]
			e.wait = append(e.wait, r.seq)
			live = append(live, r)
		}
		items := e.scheduleStep(epoch.Add(now))
		if len(items) == 0 {
			if len(pending) == 0 {
				return ClosedLoopResult{}, errors.New("closed loop: nothing can be scheduled")
			}
			now = pending[0].enter
			continue
		}
		now += e.gpu.stepTime(work(items))
		e.finish(items)
		for i := 0; i < len(live); i++ {
			r := live[i]
			for len(r.tokens) < r.seq.generated {
				r.tokens = append(r.tokens, now)
			}
			if r.seq.state != seqFinished {
				continue
			}
			ttft = append(ttft, ms(r.tokens[0]-r.sent))
			for j := 1; j < len(r.tokens); j++ {
				itl = append(itl, ms(r.tokens[j]-r.tokens[j-1]))
			}
			e2e = append(e2e, ms(now-r.sent))
			live = slices.Delete(live, i, i+1)
			i--
			done++
			if sent < run.Requests {
				if err := send(now); err != nil {
					return ClosedLoopResult{}, err
				}
			}
		}
		slices.SortStableFunc(pending, func(a, b *req) int { return int(a.enter - b.enter) })
	}
	sec := now.Seconds()
	return ClosedLoopResult{Concurrency: run.Concurrency, Duration: now,
		RequestsPerSecond: float64(run.Requests) / sec,
		OutputTokensPerS:  float64(outputs) / sec,
		TTFT:              percentiles(ttft), ITL: percentiles(itl), E2E: percentiles(e2e),
		Preemptions: e.preemptions}, nil
}
