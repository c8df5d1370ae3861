package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/llmgw/llmgw/vllm"
)

// Decisions are a router's own account of how it placed a run's requests:
// per kind ("session" for tier 0, "prefix" for tier 1, "kv" for tier 2,
// "kv_pressure" for tier 2's cache-pressure rule), how many decisions
// of each outcome (hit, new, load_override, ...). The bench reads them from
// each target's /metrics (on its operations port) before and after a run
// and reports the difference,
// so a poor hit share comes with its reason — sessions moved by the load
// bound, prefixes silenced by the imbalance guard — without a second tool.
type Decisions map[string]map[string]float64

// decisionMetrics maps the routers' decision counters (docs/scheduler.md,
// "Metrics") to their kind in Decisions.
var decisionMetrics = map[string]string{
	"llmgw_router_session_decisions_total": "session",
	"llmgw_prefix_decisions_total":         "prefix",
	"llmgw_kv_decisions_total":             "kv",
	// tier 2's cache-pressure rule (kept, evictions, session_placed,
	// session_overfull)
	"llmgw_router_kv_pressure_decisions_total": "kv_pressure",
}

// maxMetricsBytes bounds how much of a /metrics page is read: a router's is
// a few tens of KiB; anything past this is not a router's.
const maxMetricsBytes = 4 << 20

// parseDecisions reads the decision counters from Prometheus text
// exposition. Lines of other metrics, comments and samples without a
// decision label are skipped; a decision counter whose value does not
// parse, or is negative or not finite, is an error naming the line, since a
// wrong count would mislead more than a missing one.
func parseDecisions(r io.Reader) (Decisions, error) {
	d := Decisions{}
	sc := bufio.NewScanner(io.LimitReader(r, maxMetricsBytes))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		brace := strings.IndexByte(line, '{')
		if brace < 0 {
			continue
		}
		kind, ok := decisionMetrics[line[:brace]]
		if !ok {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < brace {
			return nil, fmt.Errorf("metrics line %d: unterminated labels", n)
		}
		decision, ok := vllm.LabelValue(line[brace+1:end], "decision")
		if !ok {
			continue
		}
		fields := strings.Fields(line[end+1:]) // value [timestamp]
		if len(fields) == 0 {
			return nil, fmt.Errorf("metrics line %d: %s has no value", n, line[:brace])
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return nil, fmt.Errorf("metrics line %d: %s{decision=%q}: bad count %q", n, line[:brace], decision, fields[0])
		}
		if d[kind] == nil {
			d[kind] = map[string]float64{}
		}
		d[kind][decision] += v
		if math.IsInf(d[kind][decision], 0) {
			return nil, fmt.Errorf("metrics line %d: %s{decision=%q}: count overflows", n, line[:brace], decision)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return d, nil
}

// scrapeDecisions reads one router's decision counters from base/metrics.
func scrapeDecisions(ctx context.Context, client *http.Client, base string) (Decisions, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("scrape %s/metrics: %w", base, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s/metrics: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, fmt.Errorf("scrape %s/metrics: HTTP %d", base, resp.StatusCode)
	}
	d, err := parseDecisions(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s/metrics: %w", base, err)
	}
	return d, nil
}

// scrapeAll reads and sums the decision counters of every target, on its
// operations port (Target.Metrics); nil when any target's cannot be read
// (no operations port given, not a router), since a sum missing a router
// would be wrong rather than partial.
func scrapeAll(ctx context.Context, client *http.Client, targets []Target) (Decisions, error) {
	sum := Decisions{}
	for _, t := range targets {
		if t.Metrics == "" {
			return nil, fmt.Errorf("%s: no operations port to read the decision counters at (--target-metrics)", t.Label)
		}
		d, err := scrapeDecisions(ctx, client, t.Metrics)
		if err != nil {
			return nil, err
		}
		sum.add(d, 1)
	}
	return sum, nil
}

// add adds sign × o to d.
func (d Decisions) add(o Decisions, sign float64) {
	for kind, m := range o {
		if d[kind] == nil {
			d[kind] = map[string]float64{}
		}
		for k, v := range m {
			d[kind][k] += sign * v
		}
	}
}

// since is d − before with zero entries dropped: the decisions taken
// between the two readings. A counter that went down means the router
// restarted in between, and the difference would be meaningless: nil.
func (d Decisions) since(before Decisions) Decisions {
	out := Decisions{}
	out.add(d, 1)
	out.add(before, -1)
	for kind, m := range out {
		for k, v := range m {
			if v < 0 {
				return nil
			}
			if v == 0 {
				delete(m, k)
			}
		}
		if len(m) == 0 {
			delete(out, kind)
		}
	}
	return out
}

// cell renders one kind as "hit=230 load_override=12 new=60", or "-".
func (d Decisions) cell(kind string) string {
	m := d[kind]
	if len(m) == 0 {
		return "-"
	}
	keys := slices.Sorted(maps.Keys(m))
	for i, k := range keys {
		keys[i] = k + "=" + strconv.FormatFloat(m[k], 'f', -1, 64)
	}
	return strings.Join(keys, " ")
}
