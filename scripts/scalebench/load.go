package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/scripts/internal/benchchat"
	"github.com/llmgw/llmgw/scripts/internal/benchproc"
)

// record is one request as the client saw it.
type record struct {
	sent time.Time
	ttft time.Duration
	done time.Time
	code int
	ok   bool   // 200 and a whole stream
	why  string // what went wrong otherwise
	held time.Duration
}

// loader sends streamed chat requests for one model, each prompt numbered
// first so that none shares a cached prefix.
type loader struct {
	b      *bench
	model  string
	prompt string
	seq    atomic.Int64

	mu      sync.Mutex
	records []record
}

func (b *bench) loader(model string) *loader {
	return &loader{b: b, model: model, prompt: strings.TrimSpace(strings.Repeat("lorem ipsum ", b.cfg.promptWords/2))}
}

func (l *loader) send(ctx context.Context) record {
	res := benchchat.Do(ctx, l.b.client, benchchat.Request{Addr: l.b.router, Model: l.model, Stream: true,
		Prompt: strconv.FormatInt(l.seq.Add(1), 10) + " " + l.prompt, MaxTokens: l.b.cfg.maxTokens})
	r := record{sent: res.Sent, ttft: res.TTFT, done: res.Sent.Add(res.Elapsed), code: res.Code, ok: res.Code == http.StatusOK && res.Complete}
	switch {
	case res.Err != nil:
		r.why = res.Err.Error()
	case !r.ok:
		r.why = fmt.Sprintf("status %d (complete %v)", res.Code, res.Complete)
	}
	if v := res.Header.Get("X-Llmgw-Hold-Ms"); v != "" {
		ms, _ := strconv.ParseFloat(v, 64)
		r.held = time.Duration(ms * float64(time.Millisecond))
	}
	l.mu.Lock()
	l.records = append(l.records, r)
	l.mu.Unlock()
	return r
}

func (l *loader) take() []record {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.records
	l.records = nil
	return r
}

// segment is rate requests per second for d.
type segment struct {
	rate float64
	d    time.Duration
}

// openLoop sends Poisson arrivals through the segments in turn and
// returns when every request sent has ended.
func (l *loader) openLoop(ctx context.Context, seed uint64, segs []segment) {
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(seed, 7))
	start := time.Now()
	for _, s := range segs {
		for _, at := range benchchat.Arrivals(rng, s.rate, s.d) {
			if !benchchat.SleepUntil(ctx, start.Add(at)) {
				break
			}
			wg.Go(func() { l.send(ctx) })
		}
		start = start.Add(s.d)
	}
	wg.Wait()
}

// closedLoop keeps n requests in flight for d.
func (l *loader) closedLoop(ctx context.Context, n int, d time.Duration) {
	ctx2, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for ctx2.Err() == nil {
				l.send(ctx)
			}
		})
	}
	wg.Wait()
}

// status is `llmgwctl model status NAME`.
func (b *bench) status(model string) (*llmgwv1.ModelStatusResponse, error) {
	out, err := b.c.CtlOut("model", "status", model, "-o", "json")
	if err != nil {
		return nil, err
	}
	st := &llmgwv1.ModelStatusResponse{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(out), st); err != nil {
		return nil, fmt.Errorf("model status: %w", err)
	}
	return st, nil
}

// replicaItem is one entry of `llmgwctl replica list -o json`.
type replicaItem struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	State   string `json:"state"`
	Address string `json:"address"`
}

// replicas lists every replica placed, draining ones included.
func (b *bench) replicas() ([]replicaItem, error) {
	out, err := b.c.CtlOut("replica", "list", "-o", "json")
	if err != nil {
		return nil, err
	}
	var list []replicaItem
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("replica list: %w", err)
	}
	return list, nil
}

// replicaAddrs is the addresses of model's ready replicas, by id.
func (b *bench) replicaAddrs(model string) (map[string]string, error) {
	list, err := b.replicas()
	if err != nil {
		return nil, err
	}
	addrs := map[string]string{}
	for _, r := range list {
		if r.Model == model && r.State == "ready" && r.Address != "" {
			addrs[r.ID] = r.Address
		}
	}
	return addrs, nil
}

// replicaCount is how many replicas of model are placed, draining ones
// included (each holds its GPUs until it is gone).
func (b *bench) replicaCount(model string) (int, error) {
	list, err := b.replicas()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range list {
		if r.Model == model {
			n++
		}
	}
	return n, nil
}

// engineQueue is an engine's requests running plus waiting.
func engineQueue(addr string) (float64, bool) {
	run, ok1 := testkit.Scrape(addr, "vllm:num_requests_running", nil)
	wait, ok2 := testkit.Scrape(addr, "vllm:num_requests_waiting", nil)
	return run + wait, ok1 && ok2
}

// leaderMetric is a series of the control server's /metrics.
func (b *bench) leaderMetric(name string, labels testkit.Labels) float64 {
	s := b.c.Servers[0]
	for i, a := range s.Args {
		if a == "--http-addr" && i+1 < len(s.Args) {
			v, _ := testkit.Scrape(s.Args[i+1], name, labels)
			return v
		}
	}
	return 0
}

// waitFor polls cond every 200 ms until it holds or d passes.
func waitFor(ctx context.Context, d time.Duration, what string, cond func() bool) error {
	if err := benchproc.Until(d, what, func() bool { return ctx.Err() != nil || cond() }); err != nil {
		return err
	}
	return ctx.Err()
}
