package integration

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// metricRef finds metric names in PromQL and in Go sources.
var metricRef = regexp.MustCompile(`\bllmgw_[a-z0-9_]+`)

// referencedMetrics is every llmgw metric the alert rules and the dashboard
// query, with a histogram's _bucket/_sum/_count folded into its name.
func referencedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	refs := map[string][]string{}
	add := func(where, text string) {
		for _, m := range metricRef.FindAllString(text, -1) {
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				m = strings.TrimSuffix(m, suf)
			}
			if !slices.Contains(refs[m], where) {
				refs[m] = append(refs[m], where)
			}
		}
	}
	rules, err := os.ReadFile("../deploy/prometheus/llmgw-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(rules), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			add("deploy/prometheus/llmgw-alerts.yml", line)
		}
	}
	dashboards, _ := filepath.Glob("../deploy/grafana/*.json")
	if len(dashboards) == 0 {
		t.Fatal("no dashboard in deploy/grafana")
	}
	for _, path := range dashboards {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Panels []struct {
				Targets []struct{ Expr string } `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				add(strings.TrimPrefix(path, "../"), tg.Expr)
			}
		}
	}
	if len(refs) < 20 {
		t.Fatalf("only %d metrics referenced: the rules or the dashboard did not parse", len(refs))
	}
	return refs
}

// scrapeNames returns the metric families a /metrics endpoint exports (from
// its # TYPE lines, so a histogram counts once under its own name).
func scrapeNames(t *testing.T, addr string) map[string]bool {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 4 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = true
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	return names
}

// declaredMetrics is every llmgw metric name registered in the components'
// Go sources. A labelled vector with no series yet (no KV reset has
// happened, no watch update was dropped) is not in a scrape, so a name
// absent from the scrapes must at least be declared here.
func declaredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, dir := range []string{"../controlplane", "../agent", "../router"} {
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range regexp.MustCompile(`Name:\s*"(llmgw_[a-z0-9_]+)"`).FindAllStringSubmatch(string(b), -1) {
				out[m[1]] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestAlertedMetricsExported: every metric the alert rules and the dashboard
// name is exported by a running component, so a rename cannot silently
// break an alert (design §9). Control, agent and router of `llmgw dev` are
// scraped after some traffic; a labelled vector that has no series yet must
// be declared in a component's source under the same name. An unlabelled
// histogram is exported even empty: llmgw_control_ephemeral_lag_seconds has
// no samples on one control node (nothing is forwarded), and
// TestPrometheusAlerts checks that a 3-node cluster fills it.
func TestAlertedMetricsExported(t *testing.T) {
	controlHTTP, agentHTTP := freeAddr(t), freeAddr(t)
	d := startDev(t, "--raft-addr", freeAddr(t), "--control-http-addr", controlHTTP, "--agent-http-addr", agentHTTP,
		"--agent-grpc-addr", freeAddr(t), "--port-range", "21200-21299")
	for range 3 {
		if !d.chatOK("demo") {
			t.Fatal("chat through the router failed")
		}
	}
	// A streamed answer fills the TTFT histogram.
	if code, body := d.post("/v1/chat/completions", `{"model":"demo","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`); code != http.StatusOK {
		t.Fatalf("streamed chat: %d %s", code, body)
	}
	exported := map[string]string{}
	// The router's load-reading histogram fills once a load snapshot
	// arrived; give the agents' first interval a moment.
	if !eventually(10*time.Second, func() bool { return scrapeNames(t, d.ops)["llmgw_router_load_reading_age_seconds"] }) {
		t.Logf("the router has no llmgw_router_load_reading_age_seconds series within %v (no load snapshot yet)", within(10*time.Second))
	}
	for comp, addr := range map[string]string{"control": controlHTTP, "agent": agentHTTP, "router": d.ops} {
		for n := range scrapeNames(t, addr) {
			exported[n] = comp
		}
	}
	declared := declaredMetrics(t)
	var staticOnly []string
	for name, where := range referencedMetrics(t) {
		if _, ok := exported[name]; ok {
			continue
		}
		if declared[name] {
			staticOnly = append(staticOnly, name)
			continue
		}
		t.Errorf("%s (used in %s) is exported by no component", name, strings.Join(where, ", "))
	}
	slices.Sort(staticOnly)
	t.Logf("declared but without series in this run (labelled vectors): %s", strings.Join(staticOnly, ", "))
}
