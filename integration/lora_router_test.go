package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLoRARouterOnDemand (issue "LoRA adapters", design §7.6): 2 sim
// replicas holding at most 2 adapters each, 6 adapters, two routers (the
// dev's and a second `llmgw router`). A burst for one cold adapter through
// both routers loads it once; skewed traffic over all six never has more
// than 2 held on an engine (the simulators' own high-water mark), and
// every request is answered 200 or 503 with Retry-After (all slots busy).
func TestLoRARouterOnDemand(t *testing.T) {
	d := startDev(t)
	r2 := startRouterProc(t, "r2", d.grpc)
	root := t.TempDir()
	names := []string{"a", "b", "c", "d", "e", "f"}
	yaml := "name: lora\nengine: sim\nmodel: org/base\nreplicas: 2\ngpus_per_replica: 1\nmax_loaded_adapters: 2\nmax_lora_rank: 16\nadapters:\n"
	for _, n := range names {
		if err := os.Mkdir(filepath.Join(root, n), 0o755); err != nil {
			t.Fatal(err)
		}
		yaml += fmt.Sprintf("  - {name: %s, path: %s}\n", n, filepath.Join(root, n))
	}
	yaml += "extra_args: [\"--sim-decode-ms-per-token\", \"1\"]\n"
	file := filepath.Join(t.TempDir(), "lora.yaml")
	writeFile(t, file, yaml)
	if out, err := d.ctl("model", "apply", "-f", file); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	ready := d.waitReady("lora", 2, 60*time.Second)
	routers := []string{"http://" + d.http, "http://" + r2.http}
	if !eventually(30*time.Second, func() bool {
		code, _ := postTo(t, routers[1]+"/v1/chat/completions", `{"model":"lora","messages":[{"role":"user","content":"x"}],"max_tokens":1}`)
		return code == 200
	}) {
		t.Fatalf("the second router did not serve the base model within %v", within(30*time.Second))
	}
	watch := startAdapterWatch(ready)
	chat := func(model string, maxTokens int) string {
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"select 1"}],"max_tokens":%d}`, model, maxTokens)
	}
	sendN := func(url, model string, maxTokens int) int {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chat(model, maxTokens)))
		if err != nil {
			t.Errorf("%s: %v", model, err)
			return 0
		}
		defer resp.Body.Close()
		if resp.StatusCode == 503 && resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s: 503 without Retry-After", model)
		}
		return resp.StatusCode
	}
	send := func(url, model string) int { return sendN(url, model, 2) }

	// A burst for cold adapter a through both routers: one load.
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for i := range 8 {
		wg.Go(func() {
			c := send(routers[i%2], "a")
			mu.Lock()
			codes[c]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[200] != 8 {
		t.Errorf("burst for a cold adapter: %v, want 8 × 200", codes)
	}
	if loads := adapterLoads(t, ready, "a"); loads != 1 {
		t.Errorf("adapter a loaded %d times under a concurrent burst, want 1", loads)
	}

	// Skewed traffic over all six adapters, most weight on the first.
	weights := []int{12, 6, 4, 3, 2, 2}
	var seq []string
	for i, w := range weights {
		for range w {
			seq = append(seq, names[i])
		}
	}
	codes = map[int]int{}
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < len(seq); i += 4 {
				c := send(routers[i%2], seq[(i*7)%len(seq)])
				mu.Lock()
				codes[c]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("skewed traffic: %v", codes)
	for c := range codes {
		if c != 200 && c != 503 {
			t.Errorf("status %d in skewed traffic: %v", c, codes)
		}
	}
	for _, r := range ready {
		rep := simAdapters(t, r.Status.Address)
		if rep.MaxHeld > 2 {
			t.Errorf("%s held %d adapters at once, want at most 2", r.Replica.ID, rep.MaxHeld)
		}
		t.Logf("%s: max_held %d, adapters %+v", r.Replica.ID, rep.MaxHeld, rep.Adapters)
	}
	// Unknown adapter: 404 through either router.
	for _, u := range routers {
		if c := send(u, "zzz"); c != 404 {
			t.Errorf("%s: unknown adapter answered %d, want 404", u, c)
		}
	}

	// Evictions under load (design §7.6 "else evicts the least recently used
	// idle adapter"). a and b stay busy — a worker each, back to back, with
	// requests long enough for the agent's scrape to see them running —
	// while every other held adapter has been idle for longer than the
	// plane's adapter_min_idle (2 s). Then two adapters no engine holds
	// are asked for until served: each needs a slot, so the plane must
	// evict, and what it evicts must be idle.
	stopHot := make(chan struct{})
	var hot sync.WaitGroup
	hotCodes := map[int]int{}
	hotServed := map[string]int{}
	for i, name := range []string{"a", "b"} {
		hot.Go(func() {
			for {
				select {
				case <-stopHot:
					return
				default:
				}
				c := sendN(routers[i%2], name, 40)
				mu.Lock()
				hotCodes[c]++
				if c == 200 {
					hotServed[name]++
				}
				mu.Unlock()
				if c != 200 {
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
	// The others' idle time is the plane's timer, so it takes its time: 2.5
	// s from now, after the skewed traffic ended. By then a and b must have
	// been served, so they are held and busy.
	idleFrom := time.Now()
	if !eventually(2500*time.Millisecond+30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return time.Since(idleFrom) >= 2500*time.Millisecond && hotServed["a"] > 0 && hotServed["b"] > 0
	}) {
		mu.Lock()
		t.Errorf("busy adapters served %v within %v, want a and b", hotServed, within(2500*time.Millisecond+30*time.Second))
		mu.Unlock()
	}
	held := watch.held()
	var cold []string
	for _, n := range names[2:] {
		if !held[n] && len(cold) < 2 {
			cold = append(cold, n)
		}
	}
	coldTries := map[string]int{}
	for i, name := range cold {
		wg.Go(func() {
			limit := within(40 * time.Second)
			deadline := time.Now().Add(limit)
			for tries := 1; time.Now().Before(deadline); tries++ {
				c := send(routers[i%2], name)
				mu.Lock()
				coldTries[name] = tries
				mu.Unlock()
				if c == 200 {
					return
				}
				if c != 503 {
					t.Errorf("cold adapter %s answered %d", name, c)
				}
				time.Sleep(200 * time.Millisecond)
			}
			t.Errorf("cold adapter %s not served within %v while a and b were busy", name, limit)
		})
	}
	wg.Wait()
	close(stopHot)
	hot.Wait()
	watch.stop()
	t.Logf("held before the cold requests %v; cold %v served after %v tries; a and b meanwhile: %v", held, cold, coldTries, hotCodes)
	for c, n := range hotCodes {
		if c != 200 {
			t.Errorf("busy adapters a and b answered %d × %d while others were evicted, want only 200", n, c)
		}
	}
	if err := d.stop(); err != nil {
		t.Errorf("stopping dev: %v", err)
	}
	checkEvictions(t, watch, evictionDecisions(t, d.log.String()), len(cold))
}

// checkEvictions fails the test for every problem evictionProblems finds
// and logs every eviction it judged.
func checkEvictions(t *testing.T, w *adapterWatch, decisions []evictionDecision, want int) {
	t.Helper()
	notes, problems := evictionProblems(w, decisions, want)
	for _, n := range notes {
		t.Log(n)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// evictionProblems judges every eviction twice: at the plane's decision
// (its "adapter evicted" log line, against the engine's samples up to that
// moment) and at the engine's unload (bracketed by two samples). Busy
// means a request for the adapter running or waiting in the engine; a busy
// eviction is a problem. Every unload must also follow a decision for that
// adapter and replica, and at least want evictions must have happened, so
// the check cannot pass vacuously.
func evictionProblems(w *adapterWatch, decisions []evictionDecision, want int) (notes, problems []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	notes = append(notes, fmt.Sprintf("sampled the engines %d times (%d failed reads)", w.reads, w.errs))
	for _, dec := range decisions {
		busy, ok := w.busyAround(dec.replica, dec.adapter, dec.at)
		notes = append(notes, fmt.Sprintf("plane evicted %s from %s for %s at %s: busy %d (sampled %v)", dec.adapter,
			dec.replica, dec.forAdapter, dec.at.Format("15:04:05.000"), busy, ok))
		if !ok {
			problems = append(problems, fmt.Sprintf("eviction of %s from %s at %s: no engine sample before it",
				dec.adapter, dec.replica, dec.at.Format(time.RFC3339Nano)))
		}
		if busy > 0 {
			problems = append(problems, fmt.Sprintf("the plane evicted %s from %s while %d requests for it ran or waited",
				dec.adapter, dec.replica, busy))
		}
	}
	for _, u := range w.unloads {
		notes = append(notes, fmt.Sprintf("engine %s unloaded %s between %s and %s: busy %v (sampled %d)", u.replica, u.adapter,
			u.after.Format("15:04:05.000"), u.before.Format("15:04:05.000"), u.busy, u.sampled))
		if u.busy {
			problems = append(problems, fmt.Sprintf("engine %s unloaded %s with requests for it running or waiting (counted by the engine)",
				u.replica, u.adapter))
		}
		if !slices.ContainsFunc(decisions, func(d evictionDecision) bool {
			return d.replica == u.replica && d.adapter == u.adapter && d.at.Before(u.before)
		}) {
			problems = append(problems, fmt.Sprintf("engine %s unloaded %s with no eviction decided by the plane before it",
				u.replica, u.adapter))
		}
	}
	if len(decisions) < want || len(w.unloads) < want {
		problems = append(problems, fmt.Sprintf("%d eviction decisions and %d unloads, want at least %d of each",
			len(decisions), len(w.unloads), want))
	}
	return notes, problems
}

// evictionDecision is one "adapter evicted" line of the control plane.
type evictionDecision struct {
	at                           time.Time
	adapter, replica, forAdapter string
}

var evictedRE = regexp.MustCompile(`time=(\S+) level=\S+ msg="adapter evicted"[^\n]*? model=(\S+) replica=(\S+) for=(\S+)`)

// evictionDecisions reads the plane's eviction log lines from dev's
// output (text format, times to the millisecond).
func evictionDecisions(t *testing.T, log string) []evictionDecision {
	t.Helper()
	var out []evictionDecision
	for _, m := range evictedRE.FindAllStringSubmatch(log, -1) {
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			t.Errorf("eviction log line time %q: %v", m[1], err)
			continue
		}
		out = append(out, evictionDecision{at: at, adapter: m[2], replica: m[3], forAdapter: m[4]})
	}
	return out
}

// adapterWatch samples every engine's GET /sim/adapters back to back (a
// goroutine per engine, a few milliseconds apart) until stop, keeping
// each sample's busy adapters and every unload the engines count, each
// bracketed by the two samples around it. Requests of a few tens of
// milliseconds cannot run unseen between two samples.
type adapterWatch struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	client *http.Client

	mu      sync.Mutex
	samples map[string][]adapterSample // by replica id, in time order
	unloads []adapterUnload
	reads   int
	errs    int
}

// adapterSample is one read of an engine: when it was taken (after the
// answer arrived) and, per adapter, its state and requests.
type adapterSample struct {
	at       time.Time
	adapters map[string]simAdapterInfo
}

// adapterUnload is one unload an engine counted between two samples.
// busy says whether the engine itself counted it as made with requests
// for the adapter running or waiting (the simulator's busy_unloads);
// sampled is what the two samples suggest — the adapter's requests in
// the earlier one plus those still in the later — only a note, since a
// request may end between the earlier sample and the unload (and under
// load the samples are far apart).
type adapterUnload struct {
	replica, adapter string
	after, before    time.Time
	busy             bool
	sampled          int
}

func startAdapterWatch(ready []replicaView) *adapterWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &adapterWatch{cancel: cancel, samples: map[string][]adapterSample{},
		client: &http.Client{Timeout: within(5 * time.Second), Transport: &http.Transport{}}}
	for _, r := range ready {
		id, addr := r.Replica.ID, r.Status.Address
		w.wg.Go(func() {
			for ctx.Err() == nil {
				w.sample(ctx, id, addr)
				select {
				case <-ctx.Done():
				case <-time.After(2 * time.Millisecond):
				}
			}
		})
	}
	return w
}

// stop ends the sampling and waits for it.
func (w *adapterWatch) stop() {
	w.cancel()
	w.wg.Wait()
	w.client.CloseIdleConnections()
}

func (w *adapterWatch) sample(ctx context.Context, id, addr string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/sim/adapters", nil)
	resp, err := w.client.Do(req)
	var rep simAdaptersReport
	if err == nil {
		err = json.NewDecoder(resp.Body).Decode(&rep)
		resp.Body.Close()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reads++
	if err != nil {
		if ctx.Err() == nil {
			w.errs++
		}
		return
	}
	cur := adapterSample{at: time.Now(), adapters: map[string]simAdapterInfo{}}
	for _, a := range rep.Adapters {
		cur.adapters[a.Name] = a
	}
	if prev := w.samples[id]; len(prev) > 0 {
		p := prev[len(prev)-1]
		for name, a := range cur.adapters {
			was := p.adapters[name]
			busyUnloads := a.BusyUnloads - was.BusyUnloads
			for range a.Unloads - was.Unloads {
				sampled := was.Running + was.Waiting
				if a.State == "unloaded" {
					sampled += a.Running + a.Waiting
				}
				w.unloads = append(w.unloads, adapterUnload{replica: id, adapter: name, after: p.at, before: cur.at,
					busy: busyUnloads > 0, sampled: sampled})
				busyUnloads--
			}
		}
	}
	w.samples[id] = append(w.samples[id], cur)
}

// held is every adapter some engine holds (loaded or loading) in its
// latest sample.
func (w *adapterWatch) held() map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]bool{}
	for _, s := range w.samples {
		if len(s) == 0 {
			continue
		}
		for name, a := range s[len(s)-1].adapters {
			if a.State != "unloaded" {
				out[name] = true
			}
		}
	}
	return out
}

// busyAround is the adapter's requests on the replica at the decision:
// the most in the last two samples taken before at plus a millisecond
// (log times are truncated to it). ok is false with no such sample.
// The caller holds mu.
func (w *adapterWatch) busyAround(replica, adapter string, at time.Time) (busy int, ok bool) {
	s := w.samples[replica]
	i, _ := slices.BinarySearchFunc(s, at.Add(time.Millisecond), func(x adapterSample, t time.Time) int { return x.at.Compare(t) })
	for j := max(0, i-2); j < i; j++ {
		a := s[j].adapters[adapter]
		busy, ok = max(busy, a.Running+a.Waiting), true
	}
	return busy, ok
}

type simAdapterInfo struct {
	Name        string `json:"name"`
	State       string `json:"state"`
	Loads       int    `json:"loads"`
	Unloads     int    `json:"unloads"`
	BusyUnloads int    `json:"busy_unloads"`
	Running     int    `json:"running"`
	Waiting     int    `json:"waiting"`
}

type simAdaptersReport struct {
	MaxHeld  int              `json:"max_held"`
	Adapters []simAdapterInfo `json:"adapters"`
}

func simAdapters(t *testing.T, addr string) simAdaptersReport {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/sim/adapters")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep simAdaptersReport
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

func adapterLoads(t *testing.T, ready []replicaView, name string) int {
	n := 0
	for _, r := range ready {
		for _, a := range simAdapters(t, r.Status.Address).Adapters {
			if a.Name == name {
				n += a.Loads
			}
		}
	}
	return n
}

// TestEvictionCheck shows the eviction check catches what it is for: an
// engine that scripts its GET /sim/adapters answers (c idle then unloaded;
// a busy then unloaded with its request still running; e busy, then
// finished and unloaded between two samples) read by a real adapterWatch,
// and decisions from log lines in the plane's format.
func TestEvictionCheck(t *testing.T) {
	reports := []string{
		`{"adapters":[{"name":"a","state":"loaded","running":1},{"name":"c","state":"loaded"},{"name":"e","state":"loaded","waiting":1}]}`,
		`{"adapters":[{"name":"a","state":"unloaded","unloads":1,"busy_unloads":1,"running":1},{"name":"c","state":"unloaded","unloads":1},{"name":"e","state":"unloaded","unloads":1,"busy_unloads":1}]}`,
	}
	var mu sync.Mutex
	served := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprint(w, reports[min(served, len(reports)-1)])
		served++
	}))
	defer srv.Close()
	var r replicaView
	if err := json.Unmarshal([]byte(fmt.Sprintf(`{"id":"lora-0","uid":1,"state":"ready","address":%q}`,
		strings.TrimPrefix(srv.URL, "http://"))), &r); err != nil {
		t.Fatal(err)
	}
	w := startAdapterWatch([]replicaView{r})
	if !eventually(10*time.Second, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.unloads) == 3
	}) {
		t.Fatal("the watch never saw the three unloads")
	}
	w.stop()
	first := w.samples["lora-0"][0].at
	at := first.Add(-time.Millisecond).UTC().Format("2006-01-02T15:04:05.000Z07:00")
	decisions := evictionDecisions(t, fmt.Sprintf(
		"time=%s level=INFO msg=\"adapter evicted\" node=x model=a replica=lora-0 for=d\n"+
			"time=%s level=INFO msg=\"adapter evicted\" model=c replica=lora-0 for=f\n", at, at))
	if len(decisions) != 2 {
		t.Fatalf("decisions %+v, want 2 from the log lines", decisions)
	}
	for _, tc := range []struct {
		name      string
		decisions []evictionDecision
		want      int
		problems  []string
	}{
		{name: "busy unloads, decisions before any sample", decisions: decisions, want: 1, problems: []string{
			"eviction of a from lora-0", "eviction of c from lora-0",
			"engine lora-0 unloaded a with requests", "engine lora-0 unloaded e with requests",
			"engine lora-0 unloaded e with no eviction"}},
		{name: "busy at the decision", want: 1, decisions: []evictionDecision{
			{at: first.Add(time.Millisecond), adapter: "a", replica: "lora-0"},
			{at: first.Add(time.Millisecond), adapter: "c", replica: "lora-0"},
			{at: first.Add(time.Millisecond), adapter: "e", replica: "lora-0"}},
			problems: []string{"the plane evicted a from lora-0 while 1", "engine lora-0 unloaded a with requests",
				"the plane evicted e from lora-0 while 1", "engine lora-0 unloaded e with requests"}},
		{name: "too few", want: 4, decisions: nil, problems: []string{
			"engine lora-0 unloaded a with requests", "engine lora-0 unloaded a with no eviction",
			"engine lora-0 unloaded c with no eviction", "engine lora-0 unloaded e with requests",
			"engine lora-0 unloaded e with no eviction", "0 eviction decisions and 3 unloads, want at least 4"}},
	} {
		_, problems := evictionProblems(w, tc.decisions, tc.want)
		slices.Sort(problems)
		slices.Sort(tc.problems)
		ok := len(problems) == len(tc.problems)
		for i := range problems {
			ok = ok && strings.HasPrefix(problems[i], tc.problems[i])
		}
		if !ok {
			t.Errorf("%s: problems\n%s\nwant prefixes\n%s", tc.name, strings.Join(problems, "\n"), strings.Join(tc.problems, "\n"))
		}
	}
}
