package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// promFor shortens every `for:` of the production rules for the test; the
// rules themselves (expressions, labels) are the shipped ones.
var promFor = regexp.MustCompile(`(?m)^(\s+for:\s*)\S+$`)

// prometheusServer is a real Prometheus (Debian's package) scraping the
// test's processes every 500 ms and evaluating the alert rules as often.
type prometheusServer struct {
	t    *testing.T
	addr string
	cmd  *exec.Cmd
}

func startPrometheus(t *testing.T, controlTargets []string) *prometheusServer {
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
	quoted := make([]string, len(controlTargets))
	for i, a := range controlTargets {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 500ms
  scrape_timeout: 400ms
  evaluation_interval: 500ms
rule_files: [rules.yml]
scrape_configs:
  - job_name: llmgw-control
    static_configs:
      - targets: [%s]
`, strings.Join(quoted, ", "))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
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
		t.Fatal("prometheus did not become ready")
	}
	return p
}

type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

func (p *prometheusServer) alerts() ([]promAlert, error) {
	resp, err := http.Get("http://" + p.addr + "/api/v1/alerts")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	return body.Data.Alerts, nil
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

// TestPrometheusAlerts (plan §9): a real Prometheus with the shipped rules
// (their `for:` shortened) scrapes a 3-node control plane. Killing a node
// fires LlmgwControlNodeDown for it, restarting it resolves it; killing two
// of three fires LlmgwNoLeader.
func TestPrometheusAlerts(t *testing.T) {
	if _, err := exec.LookPath("prometheus"); err != nil {
		t.Skip("prometheus is not installed (Debian package prometheus; .ci/run installs it)")
	}
	c := startCluster(t, 3)
	leader := c.waitLeader(c.servers, 30*time.Second)
	var targets []string
	for _, s := range c.servers {
		targets = append(targets, s.http)
	}
	p := startPrometheus(t, targets)
	if !eventually(20*time.Second, func() bool {
		list, err := p.alerts()
		return err == nil && !p.firing("LlmgwNoLeader", nil) && !p.firing("LlmgwControlNodeDown", nil) && list != nil
	}) {
		t.Fatal("the alerts API did not answer, or a healthy cluster has firing alerts")
	}

	victim := without(c.servers, leader)[0]
	victim.kill()
	if !eventually(30*time.Second, func() bool {
		return p.firing("LlmgwControlNodeDown", map[string]string{"instance": victim.http, "job": "llmgw-control"})
	}) {
		t.Fatalf("LlmgwControlNodeDown did not fire for %s", victim.id)
	}
	if p.firing("LlmgwNoLeader", nil) {
		t.Fatal("LlmgwNoLeader fired with two of three nodes up")
	}
	victim.start()
	if !eventually(30*time.Second, func() bool {
		list, err := p.alerts()
		if err != nil {
			return false
		}
		for _, a := range list {
			if a.Labels["alertname"] == "LlmgwControlNodeDown" {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("LlmgwControlNodeDown did not resolve after %s restarted", victim.id)
	}

	c.waitLeader(c.servers, 30*time.Second)
	survivor := c.servers[0]
	for _, s := range c.servers[1:] {
		s.kill()
	}
	if !eventually(30*time.Second, func() bool {
		return p.firing("LlmgwNoLeader", map[string]string{"job": "llmgw-control", "severity": "critical"})
	}) {
		t.Fatalf("LlmgwNoLeader did not fire with only %s up", survivor.id)
	}
}
