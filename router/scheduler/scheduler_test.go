package scheduler

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLeastLoaded(t *testing.T) {
	fresh := func(w, r float64, in int64) Candidate { return Candidate{Waiting: w, Running: r, Inflight: in} }
	sat := func(in int64) Candidate { return Candidate{Saturated: true, Inflight: in} }
	tests := []struct {
		name  string
		cands []Candidate
		draw  int // what the injected IntN returns
		want  int
		ties  int // n passed to IntN; 0 when no draw is expected
	}{
		{"none", nil, 0, -1, 0},
		{"one", []Candidate{fresh(9, 9, 9)}, 0, 0, 0},
		{"fewest waiting+running", []Candidate{fresh(3, 1, 0), fresh(0, 2, 0), fresh(1, 4, 0)}, 0, 1, 0},
		{"own in-flight counts", []Candidate{fresh(0, 1, 3), fresh(1, 1, 0)}, 0, 1, 0},
		{"tie drawn at random", []Candidate{fresh(1, 0, 0), fresh(5, 0, 0), fresh(0, 1, 0)}, 1, 2, 2},
		{"saturated loses to a busy fresh one", []Candidate{sat(0), fresh(50, 50, 10)}, 0, 1, 0},
		{"all saturated: fewest in flight", []Candidate{sat(4), sat(1), sat(2)}, 0, 1, 0},
		{"all saturated tie", []Candidate{sat(1), sat(1)}, 0, 0, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gotN := 0
			p := LeastLoaded{IntN: func(n int) int { gotN = n; return tt.draw }}
			if got := p.Pick(tt.cands); got != tt.want {
				t.Fatalf("Pick = %d, want %d", got, tt.want)
			}
			if gotN != tt.ties {
				t.Fatalf("drew among %d, want %d", gotN, tt.ties)
			}
		})
	}
}

func TestLeastLoadedSpreadsTies(t *testing.T) {
	seen := map[int]bool{}
	i := 0
	p := LeastLoaded{IntN: func(n int) int { i++; return i % n }}
	cands := []Candidate{{}, {}, {}}
	for range 3 {
		seen[p.Pick(cands)] = true
	}
	if len(seen) != 3 {
		t.Fatalf("ties went to %v, want all three", seen)
	}
}
