package console

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// chromiumPath is Debian's chromium, or the test is skipped (failed when
// CI is set: CI installs it, .ci/run), as integration's browser test.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if ci := os.Getenv("CI"); ci != "" && ci != "0" && !strings.EqualFold(ci, "false") {
		t.Fatal("chromium is not installed, and CI is set: .ci/run installs it (apt-get install chromium)")
	}
	t.Skip("chromium is not installed: apt-get install chromium to run the console's page test (under CI=true its absence fails)")
	return ""
}

// renderedDOM opens url in headless Chromium and returns the DOM once the
// page's script has run: --virtual-time-budget lets the page's timers and
// fetches run (virtual time waits for fetches in flight) before
// --dump-dom prints it. Chromium talks to nothing but loopback: every other
// host name resolves to nothing and any other address would go to a proxy
// on a closed loopback port; its background services are off.
func renderedDOM(t *testing.T, url string) string {
	t.Helper()
	return chromium(t, url, "--window-size=1366,768", "--dump-dom")
}

// screenshot saves what url draws at 1366×1200 as path (PNG).
func screenshot(t *testing.T, url, path string) {
	t.Helper()
	chromium(t, url, "--window-size=1366,1200", "--hide-scrollbars", "--screenshot="+path)
}

// chromium runs headless Chromium on url with the page's script given 3 s
// of virtual time, and returns what it prints.
func chromium(t *testing.T, url string, args ...string) string {
	t.Helper()
	bin := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--user-data-dir="+t.TempDir(), "--no-first-run", "--no-default-browser-check",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
		"--disable-default-apps", "--disable-domain-reliability", "--no-pings", "--metrics-recording-only",
		"--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
		"--virtual-time-budget=3000")
	cmd.Args = append(append(cmd.Args, args...), url)
	// Its own process group, killed whole on the deadline: the renderers
	// and helpers it forks go with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %s %s: %v\n%s", strings.Join(args, " "), url, err, tail(stderr.String(), 20))
	}
	return string(out)
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-lines):], "\n")
}

// TestModelsPageInBrowser draws the models page in Chromium from a fake
// AdminService: a model short of GPUs shows the leader's reason
// prominently, its range, demand and decisions (HELD and STEP, newest
// first); a model with a replica still loading says "starting" and names
// it; a model whose status failed says so; a ready model says nothing.
func TestModelsPageInBrowser(t *testing.T) {
	at := time.Now().Add(-time.Minute).UnixMilli()
	// The embedding model's engine: its KV cache 0.2 % used, which the
	// page must not round to 0 % (issue 34).
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.002\n"))
	}))
	defer engine.Close()
	engineAddr := strings.TrimPrefix(engine.URL, "http://")
	admin := &fakeAdmin{
		models: []*llmgwv1.Model{
			{Name: "chat", Engine: "vllm", Model: "org/chat-8b", Replicas: 1, GpusPerReplica: 1, Profile: "chat", Priority: 5,
				Autoscale: &llmgwv1.Autoscale{Min: 0, Max: 10, TargetWaiting: 2, TtftP90SloMs: 800}},
			{Name: "code", Engine: "vllm", Model: "org/code-7b", Replicas: 2, GpusPerReplica: 1, Profile: "chat"},
			{Name: "embed", Engine: "vllm", Model: "org/embed", Replicas: 1, GpusPerReplica: 1, Profile: "chat", Task: "embed"},
			{Name: "gone", Engine: "vllm", Model: "org/gone", Replicas: 1, GpusPerReplica: 1, Profile: "chat"},
		},
		replicas: []*llmgwv1.ReplicaView{
			{Replica: &llmgwv1.Replica{Id: "chat-0", Uid: 1, Model: "chat", Node: "n1"}, Status: &llmgwv1.ReplicaStatus{Uid: 1, Phase: ready}},
			{Replica: &llmgwv1.Replica{Id: "chat-1", Uid: 2, Model: "chat", Node: "n1", Sleeping: true}, Status: &llmgwv1.ReplicaStatus{Uid: 2, Phase: sleeping}},
			{Replica: &llmgwv1.Replica{Id: "code-0", Uid: 3, Model: "code", Node: "n1"}, Status: &llmgwv1.ReplicaStatus{Uid: 3, Phase: ready}},
			{Replica: &llmgwv1.Replica{Id: "code-1", Uid: 4, Model: "code", Node: "n1"}, Status: &llmgwv1.ReplicaStatus{Uid: 4, Phase: starting, Message: "loading weights"}},
			{Replica: &llmgwv1.Replica{Id: "embed-0", Uid: 5, Model: "embed", Node: "n1"}, Status: &llmgwv1.ReplicaStatus{Uid: 5, Phase: ready, Address: engineAddr}},
		},
		statuses: map[string]*llmgwv1.ModelStatusResponse{
			"chat": {Desired: 10, Placed: 2, Ready: 1, Sleeping: 1,
				UnplacedReason: "8 of 10 replicas cannot be placed: each needs 1 GPU; n1 has 8, 0 free (code 2, embed 1, chat 5)",
				Scale:          &llmgwv1.ModelScale{Model: "chat", Replicas: 10, Reason: "up: waiting 20.0", DecidedUnixMs: at},
				Demand:         &llmgwv1.ModelDemand{Model: "chat", Held: 7, Waiting: 40, Running: 64, Replicas: 1, Requests: 900},
				Events: []*llmgwv1.ScaleEvent{
					{UnixMs: at + 30_000, From: 10, To: 6, Reason: "waiting 11.0 per ready replica → 6: recommend 6; 10 was recommended within the last 5m0s", Blocked: true},
					{UnixMs: at, From: 5, To: 10, Reason: "up: waiting 20.0 per ready replica → 10: recommend 10"},
				}},
			"code":  {Desired: 2, Placed: 2, Ready: 1},
			"embed": {Desired: 1, Placed: 1, Ready: 1},
		},
	}
	c := New(admin, Access{}, NewLoad(), nil, slog.New(slog.DiscardHandler))
	mux := http.NewServeMux()
	c.Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	dom := renderedDOM(t, srv.URL+"/ui/#models")
	if !strings.Contains(dom, `data-rendered="models"`) {
		t.Fatalf("the models page was not drawn:\n%s", tail(dom, 40))
	}
	// Each model's panel, in the page's order; the checks look inside it.
	panelOf := func(name string) string {
		i := strings.Index(dom, `data-model="`+name+`"`)
		if i < 0 {
			t.Fatalf("no panel for %s:\n%s", name, tail(dom, 40))
		}
		rest := dom[i:]
		if j := strings.Index(rest[1:], `<section class="panel"`); j >= 0 {
			rest = rest[:j+1]
		}
		return rest
	}
	for name, wants := range map[string][]string{
		"chat": {`data-state="unplaced" data-desired="10" data-placed="2" data-ready="1" data-asleep="1"`, ">1 / 10 ready<", ">not placed<",
			`data-why="unplaced"`, "8 of 10 replicas cannot be placed: each needs 1 GPU; n1 has 8, 0 free (code 2, embed 1, chat 5)",
			"0..10", "waiting 2/replica", "TTFT p90 800 ms", "held 7", "waiting 40.0", "running 64.0 on 1 replicas", "900 requests in the last minute",
			"priority</b> 5", ">asleep<", `data-decisions="chat"`, "set to <b>10</b>", ">HELD<", ">STEP<", "10 was recommended within the last 5m0s", "10 → 6", "5 → 10"},
		"code": {`data-state="starting"`, ">1 / 2 ready<", ">starting<", `data-why="starting"`, "code-1 starting (loading weights)", "(no autoscale)",
			`data-task="generate"`},
		// Its task, and its KV cache's 0.2 % as such.
		"embed": {`data-state="ready"`, ">1 / 1 ready<", `data-task="embed"`, ">embedding<", `data-kv-usage="0.002"`, "</i></span>0.2%</td>"},
		"gone":  {`data-status-error`, "not found", ">0 / 1 ready<", `data-why="unplaced"`},
	} {
		p := panelOf(name)
		for _, w := range wants {
			if !strings.Contains(p, w) {
				t.Errorf("%s's panel lacks %q:\n%s", name, w, p)
			}
		}
	}
	if p := panelOf("embed"); strings.Contains(p, "data-why") {
		t.Errorf("a ready model shows a reason:\n%s", p)
	}
	if p := panelOf("chat"); strings.Index(p, ">HELD<") > strings.Index(p, ">STEP<") {
		t.Errorf("decisions not newest first:\n%s", p)
	}
	if p := panelOf("code"); strings.Contains(p, "data-decisions") {
		t.Errorf("a fixed model shows autoscaler decisions:\n%s", p)
	}
	if dir := os.Getenv("LLMGW_CONSOLE_SHOTS"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "models-autoscale-1366x1200.png")
		screenshot(t, srv.URL+"/ui/#models", path)
		t.Logf("screenshot in %s", path)
	}
}
