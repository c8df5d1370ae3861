package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Helpers of the failover tests (issue "Failover", design §5.3-§5.6, §6): an
// agent and routers as real processes beside a real 3-server cluster, a
// steady chat load that counts every failed client request, and readers
// of the processes' /metrics and logs.

// llmgwProcess starts any llmgw subcommand with the restart, kill -9 and
// Ctrl-C of controlServer, whose fields it fills for that purpose.
func llmgwProcess(t *testing.T, id string, args ...string) *controlServer {
	t.Helper()
	dir := t.TempDir()
	p := &controlServer{t: t, id: id, dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, id+".log")}
	p.args = append(args, "--data-dir", p.dataDir)
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			b, _ := os.ReadFile(p.logPath)
			t.Logf("%s output:\n%s", p.id, tail(string(b), 40))
		}
	})
	return p
}

// startAgentProc runs `llmgw agent` with 2 GPUs, engines on a port range of
// its own, and engines left running when it exits (design §6); extra flags
// go last.
func startAgentProc(t *testing.T, node string, control []string, extra ...string) *controlServer {
	t.Helper()
	args := append([]string{"agent", "--node-id", node, "--control", strings.Join(control, ","),
		"--advertise-addr", "127.0.0.1", "--http-addr", freeAddr(t), "--grpc-addr", freeAddr(t),
		"--gpus", "2", "--port-range", freePortRange(t, 30), "--stop-grace", "2s"}, extra...)
	a := llmgwProcess(t, node, args...)
	a.http = a.args[slicesIndex(a.args, "--http-addr")+1]
	a.start()
	// Engines outlive the agent on purpose; the test does not.
	t.Cleanup(func() { killEngines(t, a) })
	return a
}

// startRouterProc runs `llmgw router` watching through control.
func startRouterProc(t *testing.T, id string, control ...string) *controlServer {
	t.Helper()
	return startRouterWith(t, id, control)
}

// startRouterWith is startRouterProc with extra flags (a later --ops-addr
// among them replaces the free one given first).
func startRouterWith(t *testing.T, id string, control []string, extra ...string) *controlServer {
	t.Helper()
	r := llmgwProcess(t, id, append([]string{"router", "--id", id, "--control", strings.Join(control, ","), "--http-addr", freeAddr(t),
		"--ops-addr", freeAddr(t)}, extra...)...)
	r.http = r.args[slicesIndex(r.args, "--http-addr")+1]
	r.ops = r.args[slicesLastIndex(r.args, "--ops-addr")+1]
	r.start()
	return r
}

func slicesLastIndex(s []string, v string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == v {
			return i
		}
	}
	return -1
}

func slicesIndex(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// killEngines kills every engine an agent's records name (they are not
// the test's children once the agent is gone).
func killEngines(t *testing.T, a *controlServer) {
	for _, pid := range recordedEngines(a) {
		killGroup(pid)
	}
}

func killGroup(pid int) {
	if pid > 1 {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}

var pidRE = regexp.MustCompile(`"pid":\s*(\d+)`)

// recordedEngines reads the engine records the agent keeps in its data dir.
func recordedEngines(a *controlServer) []int {
	files, _ := filepath.Glob(filepath.Join(a.dataDir, "engines", "*.json"))
	var out []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if m := pidRE.FindSubmatch(b); m != nil {
			p, _ := strconv.Atoi(string(m[1]))
			out = append(out, p)
		}
	}
	sort.Ints(out)
	return out
}

// applyModel applies a sim model with n replicas through any server.
func applyModel(t *testing.T, addr, name string, n int) {
	t.Helper()
	file := filepath.Join(t.TempDir(), name+".yaml")
	writeFile(t, file, fmt.Sprintf("name: %s\nengine: sim\nmodel: org/%s\nreplicas: %d\ngpus_per_replica: 1\n"+
		"extra_args: [\"--sim-decode-ms-per-token\", \"1\"]\n", name, name, n))
	if err := eventuallyErr(30*time.Second, func() error { _, err := ctlAt(addr, "model", "apply", "-f", file); return err }); err != nil {
		t.Fatalf("model apply %s: %v", name, err)
	}
}

// clusterReplicas is `llmgwctl replica list -o json` through addr.
func clusterReplicas(addr string) ([]replicaView, error) {
	out, err := ctlAt(addr, "replica", "list", "-o", "json")
	if err != nil {
		return nil, err
	}
	var list []replicaView
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("decode replica list: %w", err)
	}
	return list, nil
}

// waitServing waits until model has n READY replicas in the cluster's
// view and every router answers a chat for it.
func waitServing(t *testing.T, addr, model string, n int, routers ...*controlServer) []replicaView {
	t.Helper()
	var ready []replicaView
	ok := eventually(90*time.Second, func() bool {
		list, err := clusterReplicas(addr)
		if err != nil {
			return false
		}
		ready = ready[:0]
		for _, r := range list {
			if r.Replica.Model == model && r.ready() {
				ready = append(ready, r)
			}
		}
		if len(ready) != n {
			return false
		}
		for _, r := range routers {
			if code, _ := chat(r.http, model); code != http.StatusOK {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("model %s: %d of %d replicas ready (or a router does not serve it) within %v", model, len(ready), n, within(90*time.Second))
	}
	return ready
}

// chatClient's timeout is within(30s), set by TestMain.
var chatClient = &http.Client{}

func chat(addr, model string) (int, string) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"ping"}],"max_tokens":4}`, model)
	resp, err := chatClient.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return resp.StatusCode, string(b)
}

// load is a steady chat load on routers: workers per router, each sending
// one request after another. Every request that is not a 200 is a failed
// client request, kept with its answer.
type load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ok     atomic.Int64

	mu     sync.Mutex
	failed []string
}

func startLoad(model string, workers int, routers ...*controlServer) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{cancel: cancel}
	for _, r := range routers {
		for range workers {
			l.wg.Add(1)
			go func(addr, id string) {
				defer l.wg.Done()
				for ctx.Err() == nil {
					code, body := chat(addr, model)
					if code == http.StatusOK {
						l.ok.Add(1)
						continue
					}
					l.mu.Lock()
					l.failed = append(l.failed, fmt.Sprintf("%s %s: %d %s", time.Now().Format("15:04:05.000"), id, code, body))
					l.mu.Unlock()
				}
			}(r.http, r.id)
		}
	}
	return l
}

// answered is how many requests have been answered so far, 200 or not.
func (l *load) answered() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok.Load() + int64(len(l.failed))
}

// carry holds a phase of the scenario (a fault in force, the time after
// it) for at least hold and until the load has had n more requests
// answered, so the phase carried traffic however slow the machine is. It
// fails the test if those requests are not answered within(hold + 30s).
func (l *load) carry(t *testing.T, hold time.Duration, n int64, phase string) {
	t.Helper()
	start, base := time.Now(), l.answered()
	if !eventually(hold+30*time.Second, func() bool { return time.Since(start) >= hold && l.answered() >= base+n }) {
		t.Fatalf("%s: %d requests answered within %v, want %d", phase, l.answered()-base, within(hold+30*time.Second), n)
	}
}

// stop ends the load and returns the successes and failures.
func (l *load) stop() (int64, []string) {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok.Load(), l.failed
}

// checkNoFailures stops the load and fails the test on any failed request
// or on too little traffic to have exercised anything.
func (l *load) checkNoFailures(t *testing.T, minOK int64) {
	t.Helper()
	ok, failed := l.stop()
	if len(failed) > 0 {
		t.Errorf("%d failed client requests (of %d); first: %s", len(failed), ok+int64(len(failed)), strings.Join(failed[:min(5, len(failed))], " | "))
	}
	if ok < minOK {
		t.Errorf("only %d successful requests: the load did not run", ok)
	}
	t.Logf("load: %d requests, %d failed", ok+int64(len(failed)), len(failed))
}

var attachedRE = regexp.MustCompile(`msg="attached to control node" .*?\baddr=(\S+)`)

// attachedTo is the control address of the agent's latest session, from
// its log.
func attachedTo(a *controlServer) string {
	m := attachedRE.FindAllStringSubmatch(a.output(), -1)
	if len(m) == 0 {
		return ""
	}
	return m[len(m)-1][1]
}

func serverByGRPC(c *cluster, addr string) *controlServer {
	for _, s := range c.servers {
		if s.grpc == addr {
			return s
		}
	}
	return nil
}

// summary is "n=…, median …, max …" of durations.
func summary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "n=0"
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf("n=%d, median %v, max %v", len(s), med.Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

// errRetry makes eventuallyErr try again.
var errRetry = fmt.Errorf("not yet")
