package main

import (
	"sort"
	"time"
)

// jain is Jain's fairness index of xs: (Σx)² / (n·Σx²), 1 when every x
// is equal, 1/n when one takes everything. No service at all counts as
// fair (1).
func jain(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return 1
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// event is a tenant's served value (tokens) at a time.
type event struct {
	tenant string
	at     time.Time
	value  float64
}

// perBucket sums, per tenant, the value of each event whose time falls
// in each of n buckets of width w after start (bucket m is
// [start+m·w, start+(m+1)·w)); a tenant a bucket lacks still has its
// zero, so Jain's index counts the tenants that got nothing.
func perBucket(events []event, tenants []string, start time.Time, w time.Duration, n int) []map[string]float64 {
	out := make([]map[string]float64, n)
	for m := range out {
		out[m] = map[string]float64{}
		for _, t := range tenants {
			out[m][t] = 0
		}
	}
	for _, e := range events {
		if e.at.Before(start) {
			continue
		}
		m := int(e.at.Sub(start) / w)
		if m >= n {
			continue
		}
		if _, ok := out[m][e.tenant]; ok {
			out[m][e.tenant] += e.value
		}
	}
	return out
}

// values is m's values in the order of keys.
func values(m map[string]float64, keys []string) []float64 {
	out := make([]float64, len(keys))
	for i, k := range keys {
		out[i] = m[k]
	}
	return out
}

// share is part / total (0 when total is).
func share(part, total float64) float64 {
	if total == 0 {
		return 0
	}
	return part / total
}

// fairShares is the max-min fair division of capacity between demands
// (water-filling): a demand below an equal split gets all it asks, and
// what it leaves is split among the rest the same way.
func fairShares(demand map[string]float64, capacity float64) map[string]float64 {
	keys := make([]string, 0, len(demand))
	for k := range demand {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return demand[keys[i]] < demand[keys[j]] })
	out := make(map[string]float64, len(demand))
	left := capacity
	for i, k := range keys {
		equal := left / float64(len(keys)-i)
		got := min(demand[k], equal)
		out[k] = got
		left -= got
	}
	return out
}

// round is one scrape of every router at about the same time: the
// batch dispatches counted so far, summed over the routers, and the
// longest any interactive request had waited, the most over the routers.
type round struct {
	at                time.Time
	batchDispatched   float64
	interactiveOldest float64 // seconds
}

// inversionCount is the batch dispatches counted in intervals between
// consecutive rounds while interactive work had waited more than
// threshold anywhere. strict flags an interval by its end only (an
// interactive request waiting then had waited all through it);
// conservative also by its start (one waiting then may have left early in
// the interval), an upper bound. total is every batch dispatch counted;
// maxGap the longest interval, which bounds how late a wait is seen. A
// counter that fell (a router restarted) counts from zero.
type inversionCount struct {
	strict, conservative, total float64
	maxGap                      time.Duration
}

func countInversions(rounds []round, threshold float64) inversionCount {
	var c inversionCount
	for i := 1; i < len(rounds); i++ {
		prev, cur := rounds[i-1], rounds[i]
		d := cur.batchDispatched - prev.batchDispatched
		if d < 0 {
			d = cur.batchDispatched
		}
		c.total += d
		c.maxGap = max(c.maxGap, cur.at.Sub(prev.at))
		if cur.interactiveOldest > threshold {
			c.strict += d
		}
		if cur.interactiveOldest > threshold || prev.interactiveOldest > threshold {
			c.conservative += d
		}
	}
	return c
}
