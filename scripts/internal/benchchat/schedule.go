package benchchat

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Arrivals is an open loop's schedule: Poisson arrivals at rate per
// second over d, as offsets from its start. The gaps are exponential with
// mean 1/rate, drawn from rng, so a seed fixes the schedule.
func Arrivals(rng *rand.Rand, rate float64, d time.Duration) []time.Duration {
	if rate <= 0 {
		return nil
	}
	var out []time.Duration
	t := 0.0
	for {
		t += rng.ExpFloat64() / rate
		at := time.Duration(t * float64(time.Second))
		if at >= d {
			return out
		}
		out = append(out, at)
	}
}

// Quantile is the q-quantile of ds (nearest rank; 0 for none). It sorts
// a copy.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(len(s)-1, max(0, i))]
}

// SleepUntil waits for at; false when ctx ended first.
func SleepUntil(ctx context.Context, at time.Time) bool {
	d := time.Until(at)
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
