package main

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/scripts/internal/benchchat"
)

// Headers the flow-control contract puts on responses.
const (
	hdrPriority = "X-Llmgw-Priority"
	hdrQueueMS  = "X-Llmgw-Queue-Ms"
	hdrReason   = "X-Llmgw-Flow-Reason"
	hdrRetry    = "Retry-After"
)

// outcome is how a request ended, as the benchmark accounts for it.
type outcome int

const (
	served  outcome = iota // 200 and a whole stream
	refused                // 429 with a flow reason and Retry-After
	lost                   // anything else: must not happen
)

// record is one request of a tenant.
type record struct {
	tenant  string
	router  int
	sent    time.Time
	done    time.Time
	ttft    time.Duration
	in, out int
	code    int
	outcome outcome
	// reason is a refusal's x-llmgw-flow-reason; why says why a request
	// counts as lost.
	reason, why string
	class       string // the class the router says it served
	queued      bool
	queueMS     float64
}

// classify judges one result: served when a 200's stream ended with
// [DONE]; refused when a 429 names a flow reason and has Retry-After, a
// queue_timeout only once the class's TTL has passed; lost otherwise.
func classify(res benchchat.Result, ttl time.Duration) (outcome, string, string) {
	switch {
	case res.ConnectError || res.Err != nil:
		return lost, "", "error: " + errString(res.Err)
	case res.Code == http.StatusOK && res.Complete:
		return served, "", ""
	case res.Code == http.StatusOK:
		return lost, "", "200 with an unfinished stream"
	case res.Code == http.StatusTooManyRequests:
		reason := res.Header.Get(hdrReason)
		switch {
		case reason == "":
			return lost, "", "429 without " + hdrReason
		case res.Header.Get(hdrRetry) == "":
			return lost, reason, "429 without " + hdrRetry
		case reason == "queue_timeout" && res.Elapsed < ttl:
			return lost, reason, "queue_timeout before the class's TTL"
		case reason == "queue_full" || reason == "queue_bytes" || reason == "queue_timeout":
			return refused, reason, ""
		default:
			return lost, reason, "429 with an unknown reason"
		}
	default:
		return lost, "", "status " + strconv.Itoa(res.Code)
	}
}

func errString(err error) string {
	if err == nil {
		return "none"
	}
	return err.Error()
}

// tenant is one tenant's load: its key, the routers it sends through
// (drawn at random per request), the header it adds, and its class's
// TTL (to judge a queue_timeout).
type tenant struct {
	name    string
	class   string
	key     string
	routers []int
	header  http.Header
	ttl     time.Duration
}

// loader sends the requests: one prompt of promptWords words per
// request, numbered first so that no two share a cached prefix.
type loader struct {
	client    *http.Client
	model     string
	addrs     []string // routers' API addresses
	prompt    string
	maxTokens int
	seq       atomic.Int64

	mu      sync.Mutex
	records []record
}

func newLoader(client *http.Client, model string, addrs []string, promptWords, maxTokens int) *loader {
	return &loader{client: client, model: model, addrs: addrs, maxTokens: maxTokens,
		prompt: strings.TrimSpace(strings.Repeat("lorem ipsum ", promptWords/2))}
}

// send makes one request of t through router i and records it. ctx is
// the benchmark's, not a phase's: a phase that ends stops sending, never
// a request it sent.
func (l *loader) send(ctx context.Context, t *tenant, i int) record {
	res := benchchat.Do(ctx, l.client, benchchat.Request{Addr: l.addrs[i], Key: t.key, Model: l.model,
		Prompt: strconv.FormatInt(l.seq.Add(1), 10) + " " + l.prompt, MaxTokens: l.maxTokens, Stream: true, Header: t.header})
	rec := record{tenant: t.name, router: i, sent: res.Sent, done: res.Sent.Add(res.Elapsed), ttft: res.TTFT, in: res.Input, out: res.Out, code: res.Code}
	rec.outcome, rec.reason, rec.why = classify(res, t.ttl)
	if res.Header != nil {
		rec.class = res.Header.Get(hdrPriority)
		if v := res.Header.Get(hdrQueueMS); v != "" {
			rec.queued = true
			rec.queueMS, _ = strconv.ParseFloat(v, 64)
		}
	}
	l.mu.Lock()
	l.records = append(l.records, rec)
	l.mu.Unlock()
	return rec
}

// take returns the records since the last take.
func (l *loader) take() []record {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.records
	l.records = nil
	return r
}

// openLoop sends each tenant's Poisson arrivals at its rate for d, and
// returns when every request sent has ended.
func (l *loader) openLoop(ctx context.Context, seed uint64, d time.Duration, ts []*tenant, rates []float64) {
	var wg sync.WaitGroup
	start := time.Now()
	for k, t := range ts {
		rng := rand.New(rand.NewPCG(seed, uint64(k)))
		sched := benchchat.Arrivals(rng, rates[k], d)
		wg.Go(func() {
			for _, at := range sched {
				if !benchchat.SleepUntil(ctx, start.Add(at)) {
					return
				}
				i := t.routers[rng.IntN(len(t.routers))]
				wg.Go(func() { l.send(ctx, t, i) })
			}
		})
	}
	wg.Wait()
}

// closedLoop keeps n requests of t in flight, spread over t's routers in
// turn, for d; it returns when the last has ended.
func (l *loader) closedLoop(ctx context.Context, d time.Duration, t *tenant, n int) {
	ctx2, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			i := t.routers[w%len(t.routers)]
			for ctx2.Err() == nil {
				l.send(ctx, t, i)
			}
		})
	}
	wg.Wait()
}
