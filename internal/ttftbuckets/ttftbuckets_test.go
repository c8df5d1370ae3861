package ttftbuckets

import (
	"slices"
	"testing"
	"time"
)

const ms = time.Millisecond

func TestIndex(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want int
	}{
		{-time.Second, 0},
		{0, 0},
		{25 * ms, 0}, // bounds are inclusive
		{25*ms + 1, 1},
		{100 * ms, 3},
		{time.Second, 10},
		{60 * time.Second, N - 2},
		{60*time.Second + 1, N - 1}, // past every bound
		{time.Hour, N - 1},
	}
	for _, tt := range tests {
		if got := Index(tt.d); got != tt.want {
			t.Errorf("Index(%s) = %d, want %d", tt.d, got, tt.want)
		}
	}
}

func TestBoundsAreACopyInOrder(t *testing.T) {
	b := Bounds()
	if len(b) != N-1 || !slices.IsSorted(b) {
		t.Fatalf("Bounds() = %v: want %d increasing bounds", b, N-1)
	}
	b[0] = time.Hour
	if Bounds()[0] != 25*ms {
		t.Fatal("changing the slice Bounds returned changed the bounds")
	}
}

// counts is a histogram with n times counted at each duration.
func counts(n uint64, ds ...time.Duration) []uint64 {
	b := make([]uint64, N)
	for _, d := range ds {
		b[Index(d)] += n
	}
	return b
}

func TestQuantile(t *testing.T) {
	tests := []struct {
		name    string
		buckets []uint64
		q       float64
		want    time.Duration
	}{
		{"nothing counted", make([]uint64, N), 0.9, 0},
		{"nil", nil, 0.9, 0},
		// One count in (200, 300]: 90 % of the way through it.
		{"one count", counts(1, 250*ms), 0.9, 290 * ms},
		// 90 in bucket 0 and 10 in (75, 100]: rank 90 ends bucket 0.
		{"at a bucket's end", Add(counts(90, 10*ms), counts(10, 80*ms)), 0.9, 25 * ms},
		// 80 fast, 20 in (1, 1.5] s: rank 90 is halfway through the slow bucket.
		{"interpolated", Add(counts(80, 10*ms), counts(20, 1200*ms)), 0.9, 1250 * ms},
		{"past every bound", Add(counts(1, 10*ms), counts(9, 2*time.Minute)), 0.9, 60 * time.Second},
		// A peer with more buckets: what is beyond ours is past every bound.
		{"longer than ours", append(make([]uint64, N), 5), 0.9, 60 * time.Second},
		{"median", Add(counts(50, 10*ms), counts(50, 450*ms)), 0.5, 25 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Quantile(tt.buckets, tt.q); got != tt.want {
				t.Fatalf("Quantile(%v, %g) = %s, want %s", tt.buckets, tt.q, got, tt.want)
			}
		})
	}
	if got, want := P90(counts(1, 250*ms)), 290*ms; got != want {
		t.Fatalf("P90 = %s, want %s", got, want)
	}
}

func TestAdd(t *testing.T) {
	got := Add([]uint64{1, 2}, []uint64{10, 20, 30})
	if !slices.Equal(got, []uint64{11, 22, 30}) {
		t.Fatalf("Add = %v", got)
	}
	if got := Add(nil, counts(2, time.Second)); got[10] != 2 || len(got) != N {
		t.Fatalf("Add(nil, …) = %v", got)
	}
}
