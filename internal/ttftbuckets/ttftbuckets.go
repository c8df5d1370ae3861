// Package ttftbuckets is the fixed histogram of time to first token that
// routers fill and the leader reads (design §5.7 "The inputs"): each
// router counts its answers' time to first token over its last minute in
// these buckets (ModelDemand.ttft_buckets) and the leader sums every
// router's counts bucket by bucket and reads the fleet's p90 off the sum.
// Counts add up only if every router and the leader share one set of
// bounds, so the bounds live here, once, and are part of the wire
// contract: a change must append buckets, never move one (an older peer
// reads an extra bucket as past its last bound, which is where a count
// past every bound goes anyway).
//
// The package imports only the standard library (design §3): a leaf the
// router and the control plane both import.
package ttftbuckets

import "time"

// bounds are the buckets' upper bounds, inclusive: bucket i counts times
// in (bounds[i-1], bounds[i]], bucket 0 those up to bounds[0], and one
// more bucket, the last, those past every bound. Finer where SLOs are
// usually set (a few hundred ms to a few s), up to a minute.
var bounds = [...]time.Duration{
	25 * time.Millisecond, 50 * time.Millisecond, 75 * time.Millisecond, 100 * time.Millisecond,
	150 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 400 * time.Millisecond,
	500 * time.Millisecond, 750 * time.Millisecond, time.Second, 1500 * time.Millisecond,
	2 * time.Second, 3 * time.Second, 4 * time.Second, 5 * time.Second,
	7500 * time.Millisecond, 10 * time.Second, 15 * time.Second, 20 * time.Second,
	30 * time.Second, 60 * time.Second,
}

// N is the number of buckets: one per bound, and the last past every
// bound.
const N = len(bounds) + 1

// Bounds returns the buckets' upper bounds (inclusive), in order; a copy
// the caller may keep. Bucket len(Bounds()) counts what is past them all.
func Bounds() []time.Duration { return append([]time.Duration(nil), bounds[:]...) }

// Index is the bucket that counts d: the first whose bound is at least d,
// or N-1 past every bound. A negative d counts in bucket 0.
func Index(d time.Duration) int {
	lo, hi := 0, len(bounds)
	for lo < hi { // the first bound >= d
		mid := (lo + hi) / 2
		if bounds[mid] < d {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// Add adds src's counts to dst bucket by bucket, growing dst to src's
// length, and returns it: how the leader sums the routers' counts. A
// count beyond N (a peer with more buckets) is kept in its place;
// Quantile reads it as past every bound.
func Add(dst, src []uint64) []uint64 {
	for len(dst) < len(src) {
		dst = append(dst, 0)
	}
	for i, c := range src {
		dst[i] += c
	}
	return dst
}

// P90 is the 90th percentile of the counts: Quantile(buckets, 0.9).
func P90(buckets []uint64) time.Duration { return Quantile(buckets, 0.9) }

// Quantile is the q-quantile (0 < q <= 1) of the times counted in
// buckets, interpolated linearly within the bucket it falls in, as
// Prometheus' histogram_quantile does: bucket 0 from 0 to its bound.
// When it falls past the last bound the answer is the last bound, the
// most the counts can tell. 0 when nothing is counted.
func Quantile(buckets []uint64, q float64) time.Duration {
	var total uint64
	for _, c := range buckets {
		total += c
	}
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var cum uint64
	for i, c := range buckets {
		if c == 0 || float64(cum+c) < rank {
			cum += c
			continue
		}
		if i >= len(bounds) {
			break
		}
		lo := time.Duration(0)
		if i > 0 {
			lo = bounds[i-1]
		}
		frac := (rank - float64(cum)) / float64(c)
		return lo + time.Duration(frac*float64(bounds[i]-lo))
	}
	return bounds[len(bounds)-1]
}
