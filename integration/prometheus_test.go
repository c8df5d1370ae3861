package integration

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// promFor shortens every `for:` of the production rules for the test; the
// rules themselves (expressions, labels) are the shipped ones.
var promFor = regexp.MustCompile(`(?m)^(\s+for:\s*)\S+$`)

// scrapeJob is one scrape job of the test's Prometheus, named as the rules
// expect (llmgw-control, llmgw-agent, llmgw-router).
type scrapeJob struct {
	name    string
	targets []string
}

// prometheusServer is a real Prometheus (Debian's package) scraping the
// test's processes every within(500 ms) and evaluating the alert rules as
// often; a scrape may take 80 % of that (on a loaded machine a fixed 400 ms
// timeout marks a slow target down and fires its alert).
type prometheusServer struct {
	t    *testing.T
	addr string
	cmd  *exec.Cmd
}

func startPrometheus(t *testing.T, jobs []scrapeJob) *prometheusServer {
	t.Helper()
	var cfg strings.Builder
	for _, j := range jobs {
		quoted := make([]string, len(j.targets))
		for i, a := range j.targets {
			quoted[i] = strconv.Quote(a)
		}
		fmt.Fprintf(&cfg, "  - job_name: %s\n    static_configs:\n      - targets: [%s]\n", j.name, strings.Join(quoted, ", "))
	}
	return startPrometheusWith(t, cfg.String())
}

// startPrometheusWith is startPrometheus with scrapeConfigs, the YAML of
// its scrape_configs list (each item indented two spaces).
func startPrometheusWith(t *testing.T, scrapeConfigs string) *prometheusServer {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not installed (Debian package prometheus; .ci/run installs it)")
	}
	dir := t.TempDir()
	rules, err := os.ReadFile("../deploy/prometheus/llmgw-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yml"), promFor.ReplaceAll(rules, []byte("${1}1s")), 0o644); err != nil {
		t.Fatal(err)
	}
	var cfg strings.Builder
	every := within(500 * time.Millisecond).Milliseconds()
	fmt.Fprintf(&cfg, `global:
  scrape_interval: %[1]dms
  scrape_timeout: %[2]dms
  evaluation_interval: %[1]dms
rule_files: [rules.yml]
scrape_configs:
`, every, every*4/5)
	cfg.WriteString(scrapeConfigs)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &prometheusServer{t: t, addr: freeAddr(t)}
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	p.cmd = exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+p.addr)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Logf("prometheus output:\n%s", tail(string(b), 30))
		}
	})
	if !eventually(30*time.Second, func() bool {
		resp, err := http.Get("http://" + p.addr + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}) {
		t.Fatalf("prometheus did not become ready within %v", within(30*time.Second))
	}
	return p
}

// get decodes the data field of a Prometheus API answer into data.
func (p *prometheusServer) get(path string, data any) error {
	resp, err := http.Get("http://" + p.addr + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("GET %s: %s: %s", path, body.Status, body.Error)
	}
	return json.Unmarshal(body.Data, data)
}

type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

func (p *prometheusServer) alerts() ([]promAlert, error) {
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	if err := p.get("/api/v1/alerts", &data); err != nil {
		return nil, err
	}
	return data.Alerts, nil
}

// firing reports whether alert fires with every label in match.
func (p *prometheusServer) firing(alert string, match map[string]string) bool {
	list, err := p.alerts()
	if err != nil {
		return false
	}
	for _, a := range list {
		if a.Labels["alertname"] != alert || a.State != "firing" {
			continue
		}
		ok := true
		for k, v := range match {
			ok = ok && a.Labels[k] == v
		}
		if ok {
			return true
		}
	}
	return false
}

// gone reports whether alert is neither pending nor firing.
func (p *prometheusServer) gone(alert string) bool {
	list, err := p.alerts()
	if err != nil {
		return false
	}
	return !slices.ContainsFunc(list, func(a promAlert) bool { return a.Labels["alertname"] == alert })
}

// targetHealth is every active target's health ("up", "down", "unknown")
// by "job instance".
func (p *prometheusServer) targetHealth() (map[string]string, error) {
	var data struct {
		ActiveTargets []struct {
			Labels map[string]string `json:"labels"`
			Health string            `json:"health"`
		} `json:"activeTargets"`
	}
	if err := p.get("/api/v1/targets?state=active", &data); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, tg := range data.ActiveTargets {
		out[tg.Labels["job"]+" "+tg.Labels["instance"]] = tg.Health
	}
	return out, nil
}

// unhealthy lists the targets of jobs whose health is not want ("" when
// every one is).
func (p *prometheusServer) unhealthy(jobs []scrapeJob, want string) string {
	health, err := p.targetHealth()
	if err != nil {
		return err.Error()
	}
	var bad []string
	for _, j := range jobs {
		for _, a := range j.targets {
			if h := health[j.name+" "+a]; h != want {
				bad = append(bad, fmt.Sprintf("%s %s is %q", j.name, a, h))
			}
		}
	}
	return strings.Join(bad, "; ")
}

// query is the value of the first sample of an instant query; ok is false
// when the answer is empty or could not be read.
func (p *prometheusServer) query(expr string) (float64, bool) {
	var data struct {
		Result []struct {
			Value [2]any `json:"value"`
		} `json:"result"`
	}
	if err := p.get("/api/v1/query?query="+url.QueryEscape(expr), &data); err != nil || len(data.Result) == 0 {
		return 0, false
	}
	s, _ := data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil
}

// TestPrometheusAlerts (design §9): a real Prometheus with the shipped rules
// (their `for:` shortened) scrapes a 3-node control plane, an agent running
// a sim model and a router serving it, every target up. The plane's lag
// histogram fills between the three nodes. Killing the agent fires
// LlmgwAgentDisconnected; with its engines killed too the router answers
// 5xx and LlmgwRouterErrorRate fires; restarting the agent resolves the
// first. Killing a control node fires LlmgwControlNodeDown for it,
// restarting it resolves it; killing two of three fires LlmgwNoLeader;
// killing the third leaves the agent running and detached, which fires
// LlmgwAgentDisconnected again, this time from its own gauge.
func TestPrometheusAlerts(t *testing.T) {
	if _, err := exec.LookPath("prometheus"); err != nil {
		t.Skip("prometheus is not installed (Debian package prometheus; .ci/run installs it)")
	}
	c := startCluster(t, 3)
	c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	var controlGRPC, controlHTTP []string
	for _, s := range c.servers {
		controlGRPC, controlHTTP = append(controlGRPC, s.grpc), append(controlHTTP, s.http)
	}
	agent := startAgentProc(t, "n1", controlGRPC)
	router := startRouterProc(t, "r1", controlGRPC...)
	jobs := []scrapeJob{
		{"llmgw-control", controlHTTP},
		{"llmgw-agent", []string{agent.http}},
		{"llmgw-router", []string{router.ops}}, // the operations port
	}
	p := startPrometheus(t, jobs)
	var bad string
	if !eventually(20*time.Second, func() bool { bad = p.unhealthy(jobs, "up"); return bad == "" }) {
		t.Fatalf("scrape targets not up within %v: %s", within(20*time.Second), bad)
	}
	// The model is applied under Prometheus's eyes, so the replicas'
	// status updates cross the plane between scrapes.
	applyModel(t, c.servers[0].grpc, "demo", 2)
	waitServing(t, c.servers[0].grpc, "demo", 2, router)
	healthy := []string{"LlmgwNoLeader", "LlmgwControlNodeDown", "LlmgwAgentDisconnected", "LlmgwRouterErrorRate"}
	if !eventually(20*time.Second, func() bool {
		for _, a := range healthy {
			if !p.gone(a) {
				return false
			}
		}
		return true
	}) {
		list, _ := p.alerts()
		t.Fatalf("a healthy cluster has alerts: %v", list)
	}

	// The agent's updates (its replicas starting, then ready) reach the two
	// control nodes it is not attached to through the plane, which
	// observes their lag: the metric LlmgwEphemeralPlaneLag is built on
	// (one control node alone has no samples). The alert's quantile,
	// without its threshold, is a number once scrapes saw it grow.
	var lag float64
	if !eventually(20*time.Second, func() bool {
		v, ok := p.query(`max(histogram_quantile(0.99, sum by (job, instance, le) (rate(llmgw_control_ephemeral_lag_seconds_bucket{job="llmgw-control"}[5m]))))`)
		lag = v
		return ok && !math.IsNaN(v)
	}) {
		n, _ := p.query(`sum(llmgw_control_ephemeral_lag_seconds_count{job="llmgw-control"})`)
		t.Fatalf("no p99 of llmgw_control_ephemeral_lag_seconds in a 3-node cluster with an agent (%v samples)", n)
	}
	t.Logf("ephemeral plane lag, p99 of the busiest receiver: %.3fs", lag)

	// Agent down: its scrape fails, LlmgwAgentDisconnected fires for it.
	agent.kill()
	agentAlert := map[string]string{"job": "llmgw-agent", "instance": agent.http, "severity": "warning"}
	if !eventually(20*time.Second, func() bool { return p.firing("LlmgwAgentDisconnected", agentAlert) }) {
		t.Fatalf("LlmgwAgentDisconnected did not fire within %v of the agent's kill", within(20*time.Second))
	}
	// Its engines outlive it (design §6); kill them too and every request
	// through the router fails with a 5xx.
	killEngines(t, agent)
	if !eventually(30*time.Second, func() bool {
		code, _ := chat(router.http, "demo")
		if code != 0 && code < 500 {
			t.Logf("chat with no engine left answered %d", code)
		}
		return p.firing("LlmgwRouterErrorRate", map[string]string{"job": "llmgw-router", "severity": "critical"})
	}) {
		t.Fatalf("LlmgwRouterErrorRate did not fire within %v with every engine dead", within(30*time.Second))
	}
	// The agent comes back, starts the engines again and attaches.
	agent.start()
	if !eventually(45*time.Second, func() bool {
		attached, _ := testkit.Scrape(agent.http, "llmgw_agent_session_attached", nil)
		return attached == 1 && p.gone("LlmgwAgentDisconnected")
	}) {
		t.Fatalf("LlmgwAgentDisconnected did not resolve within %v of the agent's restart", within(45*time.Second))
	}
	waitServing(t, c.servers[0].grpc, "demo", 2, router)

	leader := c.waitLeader(c.servers, formTimeout)
	victim := without(c.servers, leader)[0]
	victim.kill()
	if !eventually(30*time.Second, func() bool {
		return p.firing("LlmgwControlNodeDown", map[string]string{"instance": victim.http, "job": "llmgw-control"})
	}) {
		t.Fatalf("LlmgwControlNodeDown did not fire for %s within %v", victim.id, within(30*time.Second))
	}
	if p.firing("LlmgwNoLeader", nil) {
		t.Fatal("LlmgwNoLeader fired with two of three nodes up")
	}
	victim.start()
	if !eventually(30*time.Second, func() bool { return p.gone("LlmgwControlNodeDown") }) {
		t.Fatalf("LlmgwControlNodeDown did not resolve within %v of %s's restart", within(30*time.Second), victim.id)
	}

	c.waitLeader(c.servers, formTimeout)
	survivor := c.servers[0]
	for _, s := range c.servers[1:] {
		s.kill()
	}
	if !eventually(30*time.Second, func() bool {
		return p.firing("LlmgwNoLeader", map[string]string{"job": "llmgw-control", "severity": "critical"})
	}) {
		t.Fatalf("LlmgwNoLeader did not fire within %v with only %s up", within(30*time.Second), survivor.id)
	}

	// No control node at all: the agent still answers its scrape but has
	// no session, the alert's other half.
	survivor.kill()
	if !eventually(30*time.Second, func() bool {
		return p.unhealthy(jobs[1:2], "up") == "" && p.firing("LlmgwAgentDisconnected", agentAlert)
	}) {
		attached, _ := testkit.Scrape(agent.http, "llmgw_agent_session_attached", nil)
		t.Fatalf("LlmgwAgentDisconnected did not fire for a running agent with no control node (attached=%v)", attached)
	}
}
