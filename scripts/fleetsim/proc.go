package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is one `llmgw` process the harness started (a control server or a
// router), with the figures read from /proc and its /metrics, which is on
// opsAddr (a router's operations port; a control server's HTTP port).
type proc struct {
	name, httpAddr, pprofAddr, logPath string
	opsAddr                            string
	args                               []string
	cmd                                *exec.Cmd
	done                               chan error
}

// start runs bin with p.args; its output goes to p.logPath. The pprof
// listener of the harness's build (pprofOverlay) is given by environment.
func (p *proc) start(bin string) error {
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	p.cmd = exec.Command(bin, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.Env = append(os.Environ(), pprofEnv+"="+p.pprofAddr)
	// The process dies with the harness, even when the harness cannot
	// stop it (a panic, a kill -9): left over, it would load the next
	// run's machine.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.done = make(chan error, 1)
	go func(cmd *exec.Cmd, done chan<- error) { done <- cmd.Wait() }(p.cmd, p.done)
	return nil
}

// stop is SIGINT, then SIGKILL after a grace; it waits for the process.
func (p *proc) stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
	p.cmd = nil
}

// exited reports whether the process has ended (and why).
func (p *proc) exited() (bool, error) {
	if p.cmd == nil {
		return true, nil
	}
	select {
	case err := <-p.done:
		p.done <- err // keep it for stop
		return true, err
	default:
		return false, nil
	}
}

func (p *proc) pid() int {
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// usage is a process's CPU time and memory at one moment.
type usage struct {
	at      time.Time
	cpu     time.Duration // user + system
	rss     int64         // bytes
	heap    float64       // go_memstats_heap_inuse_bytes, bytes (0 if unread)
	metrics map[string]float64
}

// clockTick is the unit of /proc/PID/stat's CPU times: USER_HZ, 100 on
// every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// readStat reads the CPU time (utime + stime) of pid, "self" allowed.
func readStat(pid string) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	return parseStat(string(b))
}

// parseStat takes utime and stime (fields 14 and 15) from a /proc/PID/stat
// line. The command name (field 2) is in parentheses and may hold spaces,
// so fields are counted from the last ')'.
func parseStat(s string) (time.Duration, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat: no command name in %.40q", s)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): utime is f[11], stime f[12].
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %d fields after the command name, want at least 13", len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("stat: utime %q stime %q", f[11], f[12])
	}
	return time.Duration(u+st) * clockTick, nil
}

// readRSS reads VmRSS of pid from /proc/PID/status, in bytes.
func readRSS(pid string) (int64, error) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	return parseRSS(string(b))
}

func parseRSS(s string) (int64, error) {
	for line := range strings.SplitSeq(s, "\n") {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("status: VmRSS line %q", line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("status: VmRSS line %q: %w", line, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("status: no VmRSS line")
}

// metricNames are the figures read from every process's /metrics at each
// snapshot (summed over labels): memory, and the signals of a plane that
// does not keep up.
var metricNames = []string{
	"go_memstats_heap_inuse_bytes",
	"llmgw_control_watch_overflows_total",
	"llmgw_control_ephemeral_gaps_total",
	"llmgw_control_ephemeral_full_copy_requests_total",
	"llmgw_control_ephemeral_drops_total",
	"llmgw_control_agent_sessions_cut_total",
	"llmgw_router_watch_reconnects_total",
	routerEphemeral,
	"llmgw_router_watch_ephemeral_dropped_total",
	"llmgw_router_kvindex_entries",
	"llmgw_router_kvindex_replicas",
	"llmgw_router_kvindex_dropped_blocks_total",
}

// routerEphemeral counts the ephemeral updates a router's watch received.
const routerEphemeral = `llmgw_router_watch_events_total{type="ephemeral"}`

// snapshot reads p's usage now.
func (p *proc) snapshot(ctx context.Context, hc *http.Client) (usage, error) {
	u := usage{at: time.Now()}
	pid := strconv.Itoa(p.pid())
	var err error
	if u.cpu, err = readStat(pid); err != nil {
		return u, fmt.Errorf("%s: %w", p.name, err)
	}
	if u.rss, err = readRSS(pid); err != nil {
		return u, fmt.Errorf("%s: %w", p.name, err)
	}
	if u.metrics, err = scrape(ctx, hc, p.opsAddr, metricNames); err != nil {
		return u, fmt.Errorf("%s: %w", p.name, err)
	}
	u.heap = u.metrics["go_memstats_heap_inuse_bytes"]
	return u, nil
}

// scrape sums the samples (any labels) of each named metric family on a
// process's /metrics; a family not exposed is 0.
func scrape(ctx context.Context, hc *http.Client, addr string, names []string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: status %d", resp.StatusCode)
	}
	return parseMetrics(resp.Body, names)
}

// parseMetrics sums the samples of each named family in Prometheus text;
// a name given with its labels (`name{type="x"}`, as the exposition writes
// them) takes that series alone.
func parseMetrics(r io.Reader, names []string) (map[string]float64, error) {
	want := make(map[string]bool, len(names))
	out := make(map[string]float64, len(names))
	for _, n := range names {
		want[n] = true
		out[n] = 0
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		// A name with labels matches the series with exactly those.
		if i := strings.IndexByte(line, '}'); i >= 0 && want[line[:i+1]] {
			name = line[:i+1]
		}
		if !want[name] {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		out[name] += v
	}
	return out, sc.Err()
}

// portRange is where the harness's listeners go: the loopback ports lo
// to hi, or any free ephemeral port when lo is 0 (--ports).
type portRange struct{ lo, hi int }

// parsePorts reads "LO-HI"; "" is any free port.
func parsePorts(s string) (portRange, error) {
	if s == "" {
		return portRange{}, nil
	}
	a, b, ok := strings.Cut(s, "-")
	lo, err1 := strconv.Atoi(strings.TrimSpace(a))
	hi, err2 := strconv.Atoi(strings.TrimSpace(b))
	if !ok || err1 != nil || err2 != nil || lo < 1 || hi > 65535 || lo > hi {
		return portRange{}, fmt.Errorf("want LO-HI with 1 <= LO <= HI <= 65535, got %q", s)
	}
	return portRange{lo, hi}, nil
}

// free returns n distinct loopback addresses nothing listens on now, from
// the range (the lowest free first) or, without one, from the kernel's
// ephemeral ports.
func (pr portRange) free(n int, seen map[string]bool) ([]string, error) {
	out := make([]string, 0, n)
	if pr.lo == 0 {
		for len(out) < n {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, err
			}
			a := l.Addr().String()
			l.Close()
			if !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
		return out, nil
	}
	for p := pr.lo; p <= pr.hi && len(out) < n; p++ {
		a := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		if seen[a] {
			continue
		}
		l, err := net.Listen("tcp", a)
		if err != nil {
			continue // taken
		}
		l.Close()
		seen[a] = true
		out = append(out, a)
	}
	if len(out) < n {
		return nil, fmt.Errorf("--ports %d-%d: fewer than %d free ports left", pr.lo, pr.hi, n)
	}
	return out, nil
}

// pprofEnv names the address the harness's build serves net/http/pprof on.
const pprofEnv = "LLMGW_FLEETSIM_PPROF"

// pprofOverlay is a file the harness adds to cmd/llmgw with `go build
// -overlay`, so its build of llmgw serves /debug/pprof on the loopback
// address in $LLMGW_FLEETSIM_PPROF. The tree is not changed and the
// released binary has no such listener.
const pprofOverlay = `package main

import (
	"net/http"
	_ "net/http/pprof"
	"os"
)

func init() {
	if addr := os.Getenv("` + pprofEnv + `"); addr != "" {
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
}
`
