package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestConsoleInBrowser (issue 17, design §9) opens the web console of
// `llmgw dev` running two models in headless Chromium and checks what each
// page shows once its JavaScript has drawn it from the console's JSON: the
// leader and its health, the node, both models with every replica ready
// and its load read, an adapter loaded by a request for it, the router's
// decisions by tier, a tenant's limits and budget left, and the flow
// page's tables. Each page is
// saved as a screenshot at 1366×768 (and the models page at 1920×1080) to
// $LLMGW_CONSOLE_SHOTS, or the test's temporary directory. Then the models page, refreshing itself,
// must show one replica's killed engine restarted and another's frozen
// engine as not ready, then ready again.
func TestConsoleInBrowser(t *testing.T) {
	chromiumPath(t) // skip (or fail under CI) before starting anything
	console := freeAddr(t)
	d := startDev(t, "--control-http-addr", console)
	base := "http://" + console + "/ui/"

	root := t.TempDir()
	yaml := "name: coder\nengine: sim\nmodel: org/coder-7b\nreplicas: 2\ngpus_per_replica: 1\nmax_loaded_adapters: 2\nmax_lora_rank: 16\n" +
		"extra_args: [\"--sim-decode-ms-per-token\", \"1\"]\nadapters:\n"
	for _, a := range []string{"sql", "rust"} {
		if err := os.Mkdir(filepath.Join(root, a), 0o755); err != nil {
			t.Fatal(err)
		}
		yaml += fmt.Sprintf("  - {name: %s, path: %s}\n", a, filepath.Join(root, a))
	}
	file := filepath.Join(root, "coder.yaml")
	writeFile(t, file, yaml)
	if out, err := d.ctl("model", "apply", "-f", file); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	d.waitReady("coder", 2, 60*time.Second)

	// Traffic the routers page can show: prompts long enough for tier 1 to
	// decide (hits and misses), and a request for an adapter, which loads it.
	prompt := strings.Repeat("You are a helpful assistant that answers questions about the gateway in detail. ", 6)
	for i := range 8 {
		if code, body := d.post("/v1/chat/completions", fmt.Sprintf(`{"model":"demo","messages":[{"role":"user","content":%q}],"max_tokens":2}`, prompt+fmt.Sprint(i%2))); code != http.StatusOK {
			t.Fatalf("chat: %d %s", code, body)
		}
	}
	if code, body := d.post("/v1/chat/completions", `{"model":"sql","messages":[{"role":"user","content":"select 1"}],"max_tokens":2}`); code != http.StatusOK {
		t.Fatalf("chat with adapter sql: %d %s", code, body)
	}
	// The console reads the router every 5 s: wait for those decisions in
	// its JSON before asking the browser.
	if !eventually(20*time.Second, func() bool {
		return strings.Contains(getBody(base+"api/routers"), `"decision":"miss"`)
	}) {
		t.Fatalf("the console's routers JSON shows no tier-1 decision within %v: %s", within(20*time.Second), getBody(base+"api/routers"))
	}

	// A tenant for the tenants page (issue 28): its limits and mode.
	if out, err := d.ctl("tenant", "create", "team-a", "--rpm", "60", "--daily-tokens", "100000", "--model-limit", "demo:input-tpm=5000"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}

	shots := os.Getenv("LLMGW_CONSOLE_SHOTS")
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	b := startBrowser(t, 1366, 768)
	router := "http://" + d.ops // the console reads the router's operations port
	pages := []struct {
		page string
		want []string
	}{
		{"cluster", []string{`data-server="dev-control"`, ">leader<", ">healthy<", "Failure tolerance", "of 1 voters"}},
		{"nodes", []string{`data-node="dev" data-state="active"`, ">attached<", "4 / 8"}},
		{"models", []string{`data-model="demo"`, `data-model="coder"`, `data-replica="demo-0" data-phase="ready"`,
			`data-replica="demo-1" data-phase="ready"`, ">2 / 2 ready<", "%</td>"}},
		{"adapters", []string{`data-adapter="sql"`, `data-adapter="rust"`, ">loaded<", ">cold<"}},
		{"routers", []string{`data-router="` + router + `"`, ">up<", "tier 1: prefix (rendezvous)", `data-decision="miss"`}},
		{"tenants", []string{`data-tenant="team-a" data-shadow="false"`, ">enforcing<", "rpm <b>60</b>", `data-scope="demo"`, "input-tpm <b>5000</b>",
			`data-left="100000"`}},
		// The routers' flow-control queues (issue 29): idle here, so the
		// tables alone.
		{"flow", []string{`id="flow-total"`, `id="flow-routers"`, "Oldest wait"}},
	}
	for _, p := range pages {
		b.navigate(base + "#" + p.page)
		var dom string
		ok := eventually(15*time.Second, func() bool {
			var drawn bool
			if dom, drawn = b.dom(p.page); !drawn {
				return false
			}
			for _, w := range p.want {
				if !strings.Contains(dom, w) {
					return false
				}
			}
			return true
		})
		if !ok {
			var missing []string
			for _, w := range p.want {
				if !strings.Contains(dom, w) {
					missing = append(missing, w)
				}
			}
			t.Fatalf("page %s lacks %q within %v; its DOM:\n%s", p.page, missing, within(15*time.Second), tail(dom, 60))
		}
		b.screenshot(filepath.Join(shots, p.page+"-1366x768.png"))
	}
	t.Logf("%d pages drawn, checked and captured in %v; screenshots in %s", len(pages), time.Since(started).Round(time.Millisecond), shots)

	wide := startBrowser(t, 1920, 1080)
	wide.navigate(base + "#models")
	if !eventually(15*time.Second, func() bool { _, ok := wide.dom("models"); return ok }) {
		t.Fatalf("the models page was not drawn at 1920×1080 within %v", within(15*time.Second))
	}
	wide.screenshot(filepath.Join(shots, "models-1920x1080.png"))

	// A failed engine, as the page shows it by refreshing itself. A killed
	// engine is started again by its agent within about a second — less than
	// the page's 2 s refresh — so the kill shows as a restart; an engine
	// that stops answering (frozen with SIGSTOP) shows as not ready until it
	// answers again.
	b.navigate(base + "#models")
	pids := map[string]int{}
	for _, r := range d.modelReplicas("demo") {
		if !r.ready() {
			t.Fatalf("%s is not ready before the failures: %+v", r.Replica.ID, r)
		}
		pids[r.Replica.ID] = r.Status.PID
	}
	rowRE := regexp.MustCompile(`data-replica="(demo-\d+)" data-phase="([^"]*)" data-restarts="(\d+)"`)
	rows := func() map[string][2]string {
		out := map[string][2]string{}
		if dom, ok := b.dom("models"); ok {
			for _, m := range rowRE.FindAllStringSubmatch(dom, -1) {
				out[m[1]] = [2]string{m[2], m[3]}
			}
		}
		return out
	}
	if err := syscall.Kill(pids["demo-1"], syscall.SIGKILL); err != nil {
		t.Fatalf("kill demo-1's engine (pid %d): %v", pids["demo-1"], err)
	}
	killed := time.Now()
	if !eventually(15*time.Second, func() bool { return rows()["demo-1"] == [2]string{"ready", "1"} }) {
		t.Fatalf("demo-1 shows %v in the browser %v after its engine was killed, want ready again with 1 restart", rows()["demo-1"], within(15*time.Second))
	}
	t.Logf("the browser showed demo-1 restarted and ready %v after its engine was killed", time.Since(killed).Round(time.Millisecond))

	if err := syscall.Kill(pids["demo-0"], syscall.SIGSTOP); err != nil {
		t.Fatalf("freeze demo-0's engine (pid %d): %v", pids["demo-0"], err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pids["demo-0"], syscall.SIGCONT) })
	frozen := time.Now()
	if !eventually(15*time.Second, func() bool { p := rows()["demo-0"][0]; return p != "" && p != "ready" }) {
		t.Fatalf("demo-0 still shows %v in the browser %v after its engine stopped answering", rows()["demo-0"], within(15*time.Second))
	}
	t.Logf("the browser showed demo-0 %q %v after its engine stopped answering", rows()["demo-0"][0], time.Since(frozen).Round(time.Millisecond))
	b.screenshot(filepath.Join(shots, "models-failed-1366x768.png"))
	if err := syscall.Kill(pids["demo-0"], syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if !eventually(15*time.Second, func() bool { return rows()["demo-0"][0] == "ready" }) {
		t.Fatalf("demo-0 shows %v in the browser %v after its engine answers again", rows()["demo-0"], within(15*time.Second))
	}
}

// getBody is the body of a GET, or the error's text.
func getBody(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var v json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return resp.Status + ": " + err.Error()
	}
	return string(v)
}
