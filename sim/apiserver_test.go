package sim

import (
	"testing"
	"time"
)

func TestAPIServerSerializesAndJitters(t *testing.T) {
	ms := time.Millisecond
	t0 := time.Unix(1700000000, 0)
	tests := []struct {
		name    string
		cal     Calibration
		arrive  []time.Duration // after t0
		want    []time.Duration // entry, after t0; nil: only bounds checked
		lo, hi  time.Duration   // bounds of entry − arrival
		ordered bool
	}{
		{"fixed overhead, no queue", Calibration{RequestOverhead: 22 * ms},
			[]time.Duration{0, 0, 5 * ms}, []time.Duration{22 * ms, 22 * ms, 27 * ms}, 0, 0, false},
		// Three at once queue for the serialized millisecond; the fourth
		// comes after the queue has drained.
		{"serialized part queues", Calibration{RequestOverhead: 22 * ms, RequestSerial: 1 * ms},
			[]time.Duration{0, 0, 0, 10 * ms}, []time.Duration{22 * ms, 23 * ms, 24 * ms, 32 * ms}, 0, 0, false},
		{"jitter stays within ±", Calibration{RequestOverhead: 22 * ms, RequestJitter: 2 * ms},
			make([]time.Duration, 200), nil, 20 * ms, 24 * ms, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newAPIServer(tc.cal, 1)
			var spread time.Duration
			for i, at := range tc.arrive {
				got := a.enter(t0.Add(at)).Sub(t0)
				if tc.want != nil {
					if got != tc.want[i] {
						t.Errorf("request %d arriving at %v enters at %v, want %v", i, at, got, tc.want[i])
					}
					continue
				}
				if d := got - at; d < tc.lo || d > tc.hi {
					t.Errorf("request %d: overhead %v outside [%v, %v]", i, d, tc.lo, tc.hi)
				}
				spread = max(spread, got-at-tc.lo)
			}
			if tc.want == nil && spread < (tc.hi-tc.lo)/2 {
				t.Errorf("200 draws spread only %v of %v", spread, tc.hi-tc.lo)
			}
		})
	}
}

func TestAPIServerJitterIsSeeded(t *testing.T) {
	cal := Calibration{RequestOverhead: 22 * time.Millisecond, RequestJitter: 2 * time.Millisecond}
	t0 := time.Unix(1700000000, 0)
	a, b, c := newAPIServer(cal, 7), newAPIServer(cal, 7), newAPIServer(cal, 8)
	same := true
	for range 20 {
		x, y, z := a.enter(t0), b.enter(t0), c.enter(t0)
		if x != y {
			t.Fatalf("same seed, different overheads: %v, %v", x, y)
		}
		same = same && x == z
	}
	if same {
		t.Error("seeds 7 and 8 drew the same 20 overheads")
	}
}
