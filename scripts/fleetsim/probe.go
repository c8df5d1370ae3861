package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Probes measure the KV lag end to end without touching the routers' code:
// each fake agent's probe carrier replica holds a single block, the latest
// probe's hash. A probe is an event on it — store the new probe block,
// remove the last — that rides in the agent's next update with the churn,
// so it takes the path every event takes (agent → its server → the other
// servers → every watch → every router's index). The harness polls each
// router's read-only GET /debug/kvindex?replica=ID (router/debug.go, on its operations port)
// until the probe's block, or a later probe's, is there: updates of one
// agent apply in order, so a later probe there means this one was applied.
//
// Two lags per probe and router: from the event (the moment the probe was
// made, which waits up to one flush interval in the agent, as a real
// agent's mirror batches for 250 ms) and from the send (the update leaving
// the agent). "All routers" is the latest router's arrival.

// maxInflightProbes bounds the probes travelling at once.
const maxInflightProbes = 32

// probeTag marks probe blocks in their top 16 bits; churn hashes never
// carry it.
const probeTag = 0xF1EE

func probeHash(seq uint64) uint64 { return probeTag<<48 | seq&(1<<48-1) }

// probe is one probe event.
type probe struct {
	seq     uint64
	replica string // set by addProbe
	event   time.Time
	sentCh  chan time.Time
}

// sent records when the update carrying p left the agent.
func (p *probe) sent(t time.Time) {
	select {
	case p.sentCh <- t:
	default:
	}
}

// lagSample is one probe's outcome.
type lagSample struct {
	fromEvent, fromSend time.Duration // to the last router
	perRouter           []time.Duration
	lost                bool // not on every router within the timeout
}

// prober makes probes at an interval, round robin over the agents, and
// polls the routers for them.
type prober struct {
	hc       *http.Client
	routers  []string // HTTP addresses
	poll     time.Duration
	timeout  time.Duration
	interval time.Duration
	seq      uint64
}

// window probes for d and returns every probe's outcome, waiting for the
// last (at most the timeout), and how many probes were skipped because
// maxInflightProbes were still travelling: a plane that lags seconds gets
// fewer samples rather than a polling storm from the harness.
func (pr *prober) window(ctx context.Context, agents []*fakeAgent, d time.Duration) ([]lagSample, int) {
	var (
		mu       sync.Mutex
		out      []lagSample
		wg       sync.WaitGroup
		inflight atomic.Int32
		skipped  int
	)
	tick := time.NewTicker(pr.interval)
	defer tick.Stop()
	end := time.After(d)
	next := 0
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-end:
			break loop
		case <-tick.C:
			if inflight.Load() >= maxInflightProbes {
				skipped++
				continue
			}
			a := agents[next%len(agents)]
			next++
			pr.seq++
			p := &probe{seq: pr.seq, event: time.Now(), sentCh: make(chan time.Time, 1)}
			if err := a.addProbe(p); err != nil {
				continue
			}
			inflight.Add(1)
			wg.Go(func() {
				defer inflight.Add(-1)
				s := pr.follow(ctx, p)
				mu.Lock()
				out = append(out, s)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	return out, skipped
}

// follow waits for p's send and its arrival at every router.
func (pr *prober) follow(ctx context.Context, p *probe) lagSample {
	ctx, cancel := context.WithTimeout(ctx, pr.timeout)
	defer cancel()
	s := lagSample{perRouter: make([]time.Duration, len(pr.routers))}
	var sent time.Time
	select {
	case sent = <-p.sentCh:
	case <-ctx.Done():
		s.lost = true
		return s
	}
	var wg sync.WaitGroup
	arrived := make([]time.Time, len(pr.routers))
	for i, r := range pr.routers {
		wg.Go(func() {
			for ctx.Err() == nil {
				ok, err := pr.holds(ctx, r, p)
				if ok && err == nil {
					arrived[i] = time.Now()
					return
				}
				// 5 % of the lag so far, at least the poll interval: the
				// resolution stays relative and a slow plane is not
				// polled harder.
				t := time.NewTimer(max(pr.poll, time.Since(sent)/20))
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				t.Stop()
			}
		})
	}
	wg.Wait()
	var last time.Time
	for i, at := range arrived {
		if at.IsZero() {
			s.lost = true
			continue
		}
		s.perRouter[i] = at.Sub(p.event)
		if at.After(last) {
			last = at
		}
	}
	if !s.lost {
		s.fromEvent, s.fromSend = last.Sub(p.event), last.Sub(sent)
	}
	return s
}

// holds reports whether router r's index holds p's block or a later
// probe's on p's replica.
func (pr *prober) holds(ctx context.Context, r string, p *probe) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r+"/debug/kvindex?replica="+p.replica, nil)
	if err != nil {
		return false, err
	}
	resp, err := pr.hc.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return false, nil
	}
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("GET /debug/kvindex: status %d", resp.StatusCode)
	}
	var body struct {
		Hashes []uint64 `json:"hashes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return false, err
	}
	return holdsProbe(body.Hashes, p.seq), nil
}

// holdsProbe reports whether hashes hold probe seq's block or a later one.
func holdsProbe(hashes []uint64, seq uint64) bool {
	for _, h := range hashes {
		if h>>48 == probeTag && h&(1<<48-1) >= seq {
			return true
		}
	}
	return false
}

// summary is nearest-rank percentiles of one figure, in milliseconds.
type summary struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

func summarize(ds []time.Duration) summary {
	if len(ds) == 0 {
		return summary{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	ms := func(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Microsecond)) / 1000 }
	return summary{N: len(s), P50: ms(rank(0.50)), P99: ms(rank(0.99)), Max: ms(s[len(s)-1])}
}

func uint64FromFloat(f float64) uint64 { return math.Float64bits(f) }
func floatFromUint64(u uint64) float64 { return math.Float64frombits(u) }
