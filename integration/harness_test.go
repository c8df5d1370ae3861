// Package integration runs llmgw's real binaries on loopback and drives them
// as an operator and a client would (design §12). Nothing here reaches into a
// component's internals: processes, HTTP, gRPC and llmgwctl only.
//
// # Waits and deadlines on a loaded machine
//
// The suite must hold on a shared CI machine at a load many times its CPUs,
// where a process may go unscheduled for a second and Raft holds spurious
// elections. So:
//
//   - Every wait is for a condition (eventually, eventuallyErr, waitLeader,
//     waitServing, ...), with a deadline and a failure message naming what
//     did not happen. A time.Sleep is only ever pacing (between retries or
//     samples); "give it a moment" is a wait for the condition that moment
//     was for (load.carry: a phase held at least so long and until n more
//     requests were answered; commitWriter.waitCommits: writes committed
//     since). A check that a thing does not happen (cluster.neverPeer)
//     watches for a stated length, which is not scaled.
//   - A deadline is written as the time an idle developer machine needs,
//     with room, and scaled by within(d): d times the timeout scale, the
//     suite's one knob for load. The scale is LLMGW_TEST_TIMEOUT_SCALE when
//     set (a number >= 1); else 3 when CI is set (not "" / "0" / "false");
//     else 1 + the 1-minute load average per CPU when the run starts,
//     capped at 4. eventually and eventuallyErr scale the timeout they are
//     given, so a caller passes the idle-machine figure; every other
//     deadline (contexts, HTTP clients, llmgwctl --timeout, stop graces,
//     hand-written polls) calls within itself. A generous deadline costs a
//     passing run nothing: the poll returns as soon as the condition holds.
//   - A figure a test measures (failover time, write gap, time to equal KV
//     indexes) is logged, not asserted. The exception is a bound an issue
//     sets (kvQuiesceBound); it is scaled the same way and the figure is
//     logged either way.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/testkit"
)

// bins holds the paths of the binaries TestMain builds once for every test.
var bins struct{ llmgw, llmgwctl string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "llmgw-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins.llmgw = filepath.Join(dir, "llmgw")
	bins.llmgwctl = filepath.Join(dir, "llmgwctl")
	for out, pkg := range map[string]string{bins.llmgw: "../cmd/llmgw", bins.llmgwctl: "../cmd/llmgwctl"} {
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build", pkg, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	fmt.Fprintf(os.Stderr, "integration: deadlines scaled ×%.1f (%s)\n", timeoutScale, timeoutScaleWhy)
	chatClient.Timeout = within(30 * time.Second)
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// freeAddr returns a loopback address nothing listens on right now, with
// a port below the kernel's ephemeral range: a port from that range (what
// listening on :0 hands out) can be taken by any outgoing connection of
// the busy machine while a killed server is down, and its restart then
// fails with "address already in use". Ports are drawn from a random start
// so that concurrent test binaries rarely probe the same ones.
func freeAddr(t *testing.T) string {
	t.Helper()
	return freeAddrOn(t, "127.0.0.1")
}

// freeAddrOn is freeAddr on another loopback address.
func freeAddrOn(t *testing.T, host string) string {
	t.Helper()
	lo, hi := portPool()
	hi = rangesFrom(lo, hi) // the rest is freePortRange's
	n := hi - lo
	start := rand.IntN(n)
	for i := range n {
		addr := net.JoinHostPort(host, strconv.Itoa(lo+(start+i)%n))
		if _, taken := handedOut.Load(addr); taken {
			continue
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		// Gossip binds UDP on the same port.
		u, err := net.ListenPacket("udp", addr)
		l.Close()
		if err != nil {
			continue
		}
		u.Close()
		if _, taken := handedOut.LoadOrStore(addr, true); taken {
			continue
		}
		return addr
	}
	t.Fatalf("no free port on %s in %d-%d", host, lo, hi)
	return ""
}

// freePortRange returns "lo-hi", n consecutive loopback ports from
// freeAddr's pool that nothing listens on right now and freeAddr has not
// handed out, and marks them handed out: an agent's or dev's --port-range
// for its engines, kept out of the kernel's ephemeral range and off the
// ports of other processes on the machine as freeAddr's are. Ranges come
// from the pool's top third (rangesFrom).
func freePortRange(t *testing.T, n int) string {
	t.Helper()
	lo, hi := portPool()
	// First fit, so that the ranges of one test binary do not leave gaps
	// too short for the next.
	for first := rangesFrom(lo, hi); first+n <= hi; first++ {
		if !portsFree(first, n) {
			continue
		}
		for p := first; p < first+n; p++ {
			handedOut.Store(net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), true)
		}
		return fmt.Sprintf("%d-%d", first, first+n-1)
	}
	t.Fatalf("no %d free consecutive ports in %d-%d", n, rangesFrom(lo, hi), hi-1)
	return ""
}

// rangesFrom is where freePortRange's share of the pool lo..hi starts: its
// top third, which freeAddr leaves alone, so that the single ports it
// scatters do not break up the runs of consecutive ones.
func rangesFrom(lo, hi int) int { return hi - (hi-lo)/3 }

// portsFree reports whether ports first..first+n-1 are neither handed out
// nor listened on.
func portsFree(first, n int) bool {
	for p := first; p < first+n; p++ {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		if _, taken := handedOut.Load(addr); taken {
			return false
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

// handedOut holds every address freeAddr has returned in this test binary.
// A port is free again the moment freeAddr closes its probe, so without it
// two calls for one `llmgw dev` drew the same port about once a suite (the
// router and the control plane both on it: "address already in use").
var handedOut sync.Map

// portPool is the range freeAddr draws from: LLMGW_TEST_PORTS (lo-hi,
// inclusive) when set, for a machine shared with other processes that
// bind fixed ports (the whole suite needs some 4,000: freePortRange's
// runs for every agent and dev come from its top third, never reused);
// else the 8,000 ports below the kernel's ephemeral
// range (/proc/sys/net/ipv4/ip_local_port_range, 32768 on Linux by
// default), never below 10000.
func portPool() (lo, hi int) {
	if v := os.Getenv("LLMGW_TEST_PORTS"); v != "" {
		a, b, _ := strings.Cut(v, "-")
		l, err1 := strconv.Atoi(a)
		h, err2 := strconv.Atoi(b)
		if err1 != nil || err2 != nil || l <= 0 || l >= h || h >= 65536 {
			// A typo must not quietly fall back to the default pool, the
			// very ports the variable was set to keep away from.
			panic(fmt.Sprintf("LLMGW_TEST_PORTS=%q: want lo-hi, 0 < lo < hi < 65536", v))
		}
		return l, h + 1
	}
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 12000 {
				hi = v
			}
		}
	}
	return max(10000, hi-8000), hi
}

// devProcess is one `llmgw dev` started by a test.
type devProcess struct {
	t       *testing.T
	cmd     *exec.Cmd
	http    string // router address
	ops     string // the router's operations port: /metrics, /sd/replicas, /debug/kvindex
	grpc    string // control plane address
	dataDir string
	log     *testkit.SyncBuffer // dev's output, read while it runs
	exited  chan struct{}       // closed once the process has exited; then err is set
	err     error
}

// startDev starts `llmgw dev` on free loopback ports and waits until the
// router answers for the demo model through a ready replica.
func startDev(t *testing.T, extra ...string) *devProcess {
	t.Helper()
	d := &devProcess{t: t, http: freeAddr(t), ops: freeAddr(t), grpc: freeAddr(t), dataDir: t.TempDir(), log: &testkit.SyncBuffer{}, exited: make(chan struct{})}
	// Every listening address is a free one, so a dev started here never
	// collides with another package's tests or a dev the developer runs.
	args := append([]string{"dev", "--http-addr", d.http, "--ops-addr", d.ops, "--grpc-addr", d.grpc, "--data-dir", d.dataDir,
		"--raft-addr", freeAddr(t), "--control-http-addr", freeAddr(t),
		"--agent-http-addr", freeAddr(t), "--agent-grpc-addr", freeAddr(t)}, extra...)
	d.cmd = exec.Command(bins.llmgw, args...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			t.Logf("llmgw dev output:\n%s", tail(d.log.String(), 80))
		}
	})
	d.waitReady("demo", 2, 60*time.Second)
	return d
}

// timeoutScale multiplies every deadline of the suite; timeoutScaleWhy says
// where it came from (see the package comment).
var timeoutScale, timeoutScaleWhy = scaleFromEnv(os.Getenv("LLMGW_TEST_TIMEOUT_SCALE"), os.Getenv("CI"), loadPerCPU())

// scaleFromEnv is the timeout scale: the knob when set, else 3 in CI, else
// 1 + the load per CPU (negative when unknown), capped at 4.
func scaleFromEnv(knob, ci string, load float64) (float64, string) {
	ignored := ""
	if knob != "" {
		if v, err := strconv.ParseFloat(knob, 64); err == nil && v >= 1 {
			return v, "LLMGW_TEST_TIMEOUT_SCALE=" + knob
		}
		ignored = fmt.Sprintf("; LLMGW_TEST_TIMEOUT_SCALE=%q ignored: not a number >= 1", knob)
	}
	if ci != "" && ci != "0" && !strings.EqualFold(ci, "false") {
		return 3, "CI=" + ci + ignored
	}
	if load < 0 {
		return 1, "load unknown" + ignored
	}
	return min(4, 1+load), fmt.Sprintf("load %.2f per CPU%s", load, ignored)
}

// loadPerCPU is the 1-minute load average over the CPUs Go may use; -1 if
// /proc/loadavg cannot be read.
func loadPerCPU() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v / float64(runtime.NumCPU())
}

// within is deadline d, meant for an idle machine, scaled for this one.
func within(d time.Duration) time.Duration {
	return time.Duration(float64(d) * timeoutScale)
}

// stop asks dev to stop (as Ctrl-C does) and waits; it kills after a grace.
func (d *devProcess) stop() error {
	if d.cmd.ProcessState != nil {
		return nil
	}
	_ = d.cmd.Process.Signal(os.Interrupt)
	grace := within(30 * time.Second)
	select {
	case <-d.exited:
		return d.err
	case <-time.After(grace):
		_ = d.cmd.Process.Kill()
		<-d.exited
		return fmt.Errorf("llmgw dev did not stop within %v of SIGINT", grace)
	}
}

// ctl runs llmgwctl against this dev's control plane.
func (d *devProcess) ctl(args ...string) (string, error) {
	cmd := exec.Command(bins.llmgwctl, append([]string{"--addr", d.grpc, "--timeout", within(10 * time.Second).String()}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if err != nil {
		return out.String() + errOut.String(), fmt.Errorf("llmgwctl %s: %w: %s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), nil
}

// replicaView is the part of `llmgwctl replica list -o json` tests read.
type replicaView struct {
	Replica struct {
		ID    string      `json:"id"`
		UID   json.Number `json:"uid"`
		Model string      `json:"model"`
		Node  string      `json:"node"`
	} `json:"replica"`
	Status *replicaStatusView `json:"status"`
}

// replicaStatusView is a replica's engine as replicaView reads it; Phase
// is the table's word (ready, unhealthy, ...).
type replicaStatusView struct {
	UID         json.Number
	Incarnation json.Number
	Phase       string
	Address     string
	PID         int
	Restarts    int
}

// UnmarshalJSON reads one item of `replica list -o json` (flat: the
// placement's fields, state, then the engine's; docs/operations.md) into
// the placement and the status of this replica's uid (nil when state is
// unknown: no status of this uid yet).
func (r *replicaView) UnmarshalJSON(b []byte) error {
	var flat struct {
		ID          string      `json:"id"`
		UID         json.Number `json:"uid"`
		Model       string      `json:"model"`
		Node        string      `json:"node"`
		State       string      `json:"state"`
		Incarnation json.Number `json:"incarnation"`
		Address     string      `json:"address"`
		PID         int         `json:"pid"`
		Restarts    int         `json:"restarts"`
	}
	if err := json.Unmarshal(b, &flat); err != nil {
		return err
	}
	*r = replicaView{}
	r.Replica.ID, r.Replica.UID, r.Replica.Model, r.Replica.Node = flat.ID, flat.UID, flat.Model, flat.Node
	if flat.State != "" && flat.State != "unknown" {
		r.Status = &replicaStatusView{UID: flat.UID, Incarnation: flat.Incarnation, Phase: flat.State,
			Address: flat.Address, PID: flat.PID, Restarts: flat.Restarts}
	}
	return nil
}

func (r replicaView) ready() bool {
	return r.Status != nil && r.Status.UID == r.Replica.UID && r.Status.Phase == "ready" && r.Status.Address != ""
}

func (d *devProcess) replicas() ([]replicaView, error) {
	out, err := d.ctl("replica", "list", "-o", "json")
	if err != nil {
		return nil, err
	}
	var list []replicaView
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("decode replica list: %w: %s", err, out)
	}
	return list, nil
}

func (d *devProcess) modelReplicas(model string) []replicaView {
	d.t.Helper()
	list, err := d.replicas()
	if err != nil {
		d.t.Fatal(err)
	}
	var out []replicaView
	for _, r := range list {
		if r.Replica.Model == model {
			out = append(out, r)
		}
	}
	return out
}

// waitReady waits until model has n ready replicas and the router serves it.
func (d *devProcess) waitReady(model string, n int, timeout time.Duration) []replicaView {
	d.t.Helper()
	var last []replicaView
	dead := false
	ok := eventually(timeout, func() bool {
		select {
		case <-d.exited:
			dead = true
			return true // nothing more to wait for
		default:
		}
		list, err := d.replicas()
		if err != nil {
			return false
		}
		last = last[:0]
		for _, r := range list {
			if r.Replica.Model == model && r.ready() {
				last = append(last, r)
			}
		}
		if len(last) != n {
			return false
		}
		resp, err := http.Get("http://" + d.http + "/v1/models")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var body struct {
			Data []struct{ ID string } `json:"data"`
		}
		if json.NewDecoder(resp.Body).Decode(&body) != nil {
			return false
		}
		for _, m := range body.Data {
			if m.ID == model {
				return d.chatOK(model)
			}
		}
		return false
	})
	if dead {
		d.t.Fatalf("model %s: llmgw dev exited (%v) before %d replicas were ready", model, d.err, n)
	}
	if !ok {
		d.t.Fatalf("model %s: %d ready replicas (or the router does not serve it), want %d, within %v", model, len(last), n, within(timeout))
	}
	return last
}

// chatOK reports whether one small chat completion for model succeeds.
func (d *devProcess) chatOK(model string) bool {
	code, _ := d.post("/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"ping"}],"max_tokens":2}`, model))
	return code == http.StatusOK
}

func (d *devProcess) post(path, body string) (int, []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), within(30*time.Second))
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+d.http+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	return do(req)
}

// do sends req and returns its status and body, or 0 and the error's text.
func do(req *http.Request) (int, []byte) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes()
}

func (d *devProcess) get(path string) (int, []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), within(30*time.Second))
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.http+path, nil)
	return do(req)
}

// eventually polls cond until it holds or within(timeout) passes: timeout
// is what an idle machine needs, scaled here so no caller forgets to.
func eventually(timeout time.Duration, cond func() bool) bool {
	return testkit.Eventually(within(timeout), cond)
}

// alive reports whether a process with this pid exists (and is not a zombie
// we could still reap: engines are the agent's children, not ours).
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state is the field after the parenthesised command name.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

func tail(s string, lines int) string {
	parts := strings.Split(s, "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}

// TestTimeoutScale: the knob wins when it is a number >= 1; CI means 3;
// otherwise 1 + the load per CPU, capped at 4, and 1 when the load is
// unknown.
func TestTimeoutScale(t *testing.T) {
	for _, tc := range []struct {
		knob, ci string
		load     float64
		want     float64
	}{
		{"2.5", "true", 7, 2.5},
		{"0.5", "", 0, 1},      // below 1: ignored, the load decides
		{"fast", "", 0.5, 1.5}, // not a number: ignored
		{"", "true", 0, 3},
		{"", "false", 0.25, 1.25},
		{"", "0", 0, 1},
		{"", "", 7.5, 4},
		{"", "", -1, 1},
	} {
		if got, why := scaleFromEnv(tc.knob, tc.ci, tc.load); got != tc.want {
			t.Errorf("scaleFromEnv(%q, %q, %v) = %v (%s), want %v", tc.knob, tc.ci, tc.load, got, why, tc.want)
		}
	}
}
