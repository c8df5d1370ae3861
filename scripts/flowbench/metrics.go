package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sample is one line of Prometheus's text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseMetrics reads the samples whose names start with prefix from a
// /metrics page in Prometheus's text format (comments skipped; a line it
// cannot read is an error, so a format change is not read as zeros).
func parseMetrics(r io.Reader, prefix string) ([]sample, error) {
	var out []sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		s, err := parseLine(line)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return out, nil
}

// parseLine reads `name{a="x",b="y"} value [timestamp]`.
func parseLine(line string) (sample, error) {
	s := sample{labels: map[string]string{}}
	rest := line
	if i := strings.IndexAny(line, "{ "); i >= 0 && line[i] == '{' {
		s.name = line[:i]
		rest = line[i+1:]
		for {
			rest = strings.TrimLeft(rest, ", ")
			if strings.HasPrefix(rest, "}") {
				rest = rest[1:]
				break
			}
			eq := strings.Index(rest, `="`)
			if eq <= 0 {
				return sample{}, fmt.Errorf("metrics line %q: a label without a value", line)
			}
			key := rest[:eq]
			rest = rest[eq+2:]
			var val strings.Builder
			closed := false
			for i := 0; i < len(rest); i++ {
				c := rest[i]
				if c == '\\' && i+1 < len(rest) {
					i++
					switch rest[i] {
					case 'n':
						val.WriteByte('\n')
					default:
						val.WriteByte(rest[i])
					}
					continue
				}
				if c == '"' {
					rest = rest[i+1:]
					closed = true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				return sample{}, fmt.Errorf("metrics line %q: an unclosed label value", line)
			}
			s.labels[key] = val.String()
		}
	} else {
		sp := strings.IndexByte(line, ' ')
		if sp < 0 {
			return sample{}, fmt.Errorf("metrics line %q: no value", line)
		}
		s.name, rest = line[:sp], line[sp:]
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return sample{}, fmt.Errorf("metrics line %q: no value", line)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return sample{}, fmt.Errorf("metrics line %q: %w", line, err)
	}
	s.value = v
	return s, nil
}

// sum adds the values of the samples named name whose labels include
// every pair of match.
func sum(samples []sample, name string, match map[string]string) float64 {
	total := 0.0
	for _, s := range samples {
		if s.name == name && matches(s, match) {
			total += s.value
		}
	}
	return total
}

// most is the largest value among the samples sum would add (0 for none).
func most(samples []sample, name string, match map[string]string) float64 {
	m := 0.0
	for _, s := range samples {
		if s.name == name && matches(s, match) {
			m = max(m, s.value)
		}
	}
	return m
}

func matches(s sample, match map[string]string) bool {
	for k, v := range match {
		if s.labels[k] != v {
			return false
		}
	}
	return true
}

// scrape reads addr's /metrics, the samples named with prefix.
func scrape(ctx context.Context, hc *http.Client, addr, prefix string) ([]sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", addr, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", addr, resp.Status)
	}
	return parseMetrics(resp.Body, prefix)
}

// scraper reads every router's flow metrics every interval while Run
// runs, keeping for each round the figures inversions are counted from.
type scraper struct {
	hc       *http.Client
	addrs    []string
	model    string
	interval time.Duration

	mu     sync.Mutex
	rounds []round
	failed int
}

// Run scrapes until ctx ends. A round in which a router did not answer
// is dropped (and counted), so no interval is judged on half the fleet.
func (s *scraper) Run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		rd, ok := s.round(ctx)
		s.mu.Lock()
		if ok {
			s.rounds = append(s.rounds, rd)
		} else if ctx.Err() == nil {
			s.failed++
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *scraper) round(ctx context.Context) (round, bool) {
	rd := round{at: time.Now()}
	pages := make([][]sample, len(s.addrs))
	errs := make([]error, len(s.addrs))
	var wg sync.WaitGroup
	for i, a := range s.addrs {
		wg.Go(func() { pages[i], errs[i] = scrape(ctx, s.hc, a, "llmgw_router_flow_") })
	}
	wg.Wait()
	for i, p := range pages {
		if errs[i] != nil {
			return rd, false
		}
		rd.batchDispatched += sum(p, "llmgw_router_flow_dispatched_total", map[string]string{"model": s.model, "class": "batch"})
		rd.interactiveOldest = max(rd.interactiveOldest,
			most(p, "llmgw_router_flow_oldest_wait_seconds", map[string]string{"model": s.model, "class": "interactive"}))
	}
	return rd, true
}

// take returns the rounds since the last take and how many failed.
func (s *scraper) take() ([]round, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, f := s.rounds, s.failed
	s.rounds, s.failed = nil, 0
	return r, f
}

// engineLoad samples the engines' own running and waiting requests while
// Run runs: where a request that flow control let on waits, if anywhere.
type engineLoad struct {
	hc       *http.Client
	addrs    []string
	interval time.Duration

	mu sync.Mutex
	engineFigures
}

// engineFigures sums the rounds in which every engine answered.
type engineFigures struct {
	Rounds int `json:"rounds"`
	// QueuedRounds is the rounds in which some engine had a request
	// waiting; MaxWaiting the most one engine had.
	QueuedRounds int     `json:"queued_rounds"`
	MaxWaiting   float64 `json:"max_waiting"`
	// RunningSum and WaitingSum add each round's fleet totals.
	RunningSum float64 `json:"running_sum"`
	WaitingSum float64 `json:"waiting_sum"`
}

// Run samples until ctx ends.
func (e *engineLoad) Run(ctx context.Context) {
	t := time.NewTicker(e.interval)
	defer t.Stop()
	for {
		pages := make([][]sample, len(e.addrs))
		errs := make([]error, len(e.addrs))
		var wg sync.WaitGroup
		for i, a := range e.addrs {
			wg.Go(func() { pages[i], errs[i] = scrape(ctx, e.hc, a, "vllm:num_requests_") })
		}
		wg.Wait()
		if !slices.ContainsFunc(errs, func(err error) bool { return err != nil }) {
			var running, waiting, most float64
			for _, p := range pages {
				running += sum(p, "vllm:num_requests_running", nil)
				w := sum(p, "vllm:num_requests_waiting", nil)
				waiting += w
				most = max(most, w)
			}
			e.mu.Lock()
			e.Rounds++
			e.RunningSum += running
			e.WaitingSum += waiting
			e.MaxWaiting = max(e.MaxWaiting, most)
			if most > 0 {
				e.QueuedRounds++
			}
			e.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (e *engineLoad) figures() engineFigures {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.engineFigures
}
