package main

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// streamingRouter answers every chat request with two tokens, usage with
// cached_tokens, and a replica header, as a router does.
func streamingRouter(replica string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Llmgw-Replica", replica)
		for _, c := range []string{
			`{"choices":[{"delta":{"role":"assistant","content":""}}]}`,
			`{"choices":[{"delta":{"content":"a"}}]}`,
			`{"choices":[{"delta":{"content":"b"}}]}`,
			`{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}`,
			`[DONE]`,
		} {
			fmt.Fprintf(w, "data: %s\n\n", c)
		}
	})
}

func TestBenchCommand(t *testing.T) {
	a := httptest.NewServer(streamingRouter("demo-0"))
	defer a.Close()
	b := httptest.NewServer(streamingRouter("demo-1"))
	defer b.Close()
	chart := filepath.Join(t.TempDir(), "chart.svg")

	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, out string)
	}{
		{"one target as JSON", []string{"--addr", "127.0.0.1:1", "--target", a.URL, "--concurrency", "2", "-o", "json"}, func(t *testing.T, out string) {
			var r map[string]any
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, out)
			}
			if r["requests"] != 6.0 || r["errors"] != 0.0 || r["cache_hit_share"] != 0.4 {
				t.Fatalf("requests %v errors %v hit share %v", r["requests"], r["errors"], r["cache_hit_share"])
			}
			if _, ok := r["ttft_seconds"].(map[string]any)["p99"]; !ok {
				t.Fatalf("no ttft_seconds.p99 in %s", out)
			}
		}},
		{"two targets as JSON runs", []string{"--addr", "127.0.0.1:1", "--target", "a=" + a.URL, "--target", "b=" + b.URL, "--concurrency", "2", "-o", "json", "--reset-caches=false"}, func(t *testing.T, out string) {
			var r struct {
				Runs []struct {
					Label    string         `json:"label"`
					Replicas map[string]int `json:"replicas"`
				} `json:"runs"`
			}
			if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Runs) != 2 || r.Runs[1].Label != "b" || r.Runs[1].Replicas["demo-1"] != 6 {
				t.Fatalf("runs %+v (%v)\n%s", r.Runs, err, out)
			}
		}},
		{"round robin as a table, with a chart", []string{"--addr", "127.0.0.1:1", "--target", "a=" + a.URL, "--target", "b=" + b.URL, "--targets-round-robin", "--chart", chart, "--rate", "1000", "--reset-caches=false"}, func(t *testing.T, out string) {
			if !strings.HasPrefix(out, "METRIC") || !strings.Contains(out, "a+b") || !strings.Contains(out, "demo-0=3 demo-1=3") {
				t.Fatalf("table:\n%s", out)
			}
			raw, err := os.ReadFile(chart)
			if err != nil {
				t.Fatal(err)
			}
			d := xml.NewDecoder(bytes.NewReader(raw))
			for {
				if _, err := d.Token(); err != nil {
					if !errors.Is(err, io.EOF) {
						t.Fatalf("chart is not XML: %v", err)
					}
					break
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			root := newRootCmd(&out)
			root.SetErr(io.Discard)
			root.SetArgs(append([]string{"bench", "--model", "demo", "--requests", "6", "--quiet"}, tt.args...))
			if err := root.Execute(); err != nil {
				t.Fatalf("bench: %v", err)
			}
			tt.check(t, out.String())
		})
	}
}

func TestBenchCommandRejectsBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--model", "m"}, "--target"},
		{[]string{"--addr", "127.0.0.1:1", "--target", "nope", "--model", "m"}, "--target"},
		{[]string{"--addr", "127.0.0.1:1", "--target", "http://127.0.0.1:1"}, "--model"},
		{[]string{"--addr", "127.0.0.1:1", "--target", "http://127.0.0.1:1", "--model", "m", "--rate", "2", "--concurrency", "3"}, "choose one"},
		{[]string{"--addr", "127.0.0.1:1", "--target", "http://127.0.0.1:1", "--model", "m", "--workload", "nope"}, "--workload"},
		{[]string{"--addr", "127.0.0.1:1", "--target", "http://127.0.0.1:1", "--workload", "lora-mix"}, "--adapters"},
		{[]string{"--addr", "127.0.0.1:1", "--target", "http://127.0.0.1:1", "--model", "m", "--ca-cert", "/nonexistent/ca.pem"}, "--ca-cert"},
		{[]string{"--addr", "127.0.0.1:1", "--target", "http://127.0.0.1:1", "--target", "http://127.0.0.1:2", "--target-metrics", "http://127.0.0.1:3", "--model", "m"}, "--target-metrics: give one per --target"},
		{[]string{"--addr", "127.0.0.1:1", "--target", "http://127.0.0.1:1", "--target-metrics", "127.0.0.1:3", "--model", "m"}, "--target-metrics"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			root := newRootCmd(io.Discard)
			root.SetErr(io.Discard)
			root.SetArgs(append([]string{"bench", "--quiet"}, tt.args...))
			err := root.Execute()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one naming %s", err, tt.want)
			}
		})
	}
}

// TestBenchCommandTrustsCACert: an https router whose certificate the
// system does not trust fails every request, unless --ca-cert names its CA.
func TestBenchCommandTrustsCACert(t *testing.T) {
	s := httptest.NewTLSServer(streamingRouter("demo-0"))
	defer s.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		args       []string
		wantErrors float64
		wantErr    string
	}{
		{"system roots only", nil, 6, ""},
		{"--ca-cert", []string{"--ca-cert", ca}, 0, ""},
		{"--ca-cert not PEM", []string{"--ca-cert", notPEM}, 0, "no PEM certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			root := newRootCmd(&out)
			root.SetErr(io.Discard)
			root.SetArgs(append([]string{"bench", "--addr", "127.0.0.1:1", "--model", "demo", "--requests", "6", "--quiet", "-o", "json", "--target", s.URL}, tt.args...))
			err := root.Execute()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("bench: %v", err)
			}
			var r map[string]any
			if err := json.Unmarshal(out.Bytes(), &r); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, out.String())
			}
			if r["requests"] != 6.0 || r["errors"] != tt.wantErrors {
				t.Fatalf("requests %v errors %v, want 6 and %v", r["requests"], r["errors"], tt.wantErrors)
			}
		})
	}
}

// fakeEngine serves an engine's /tokenize (ten tokens no other request
// has), /reset_prefix_cache (counted) and nothing else.
type fakeEngine struct {
	mu      sync.Mutex
	noReset bool // answer /reset_prefix_cache 404, as vLLM outside its dev mode
	resets  int
	n       int
}

func (e *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch r.URL.Path {
	case "/reset_prefix_cache":
		if e.noReset {
			http.NotFound(w, r)
			return
		}
		e.resets++
	case "/tokenize":
		e.n++
		toks := make([]int, 10)
		for i := range toks {
			toks[i] = 100*e.n + i
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"count": 10, "tokens": toks})
	default:
		http.NotFound(w, r)
	}
}

// TestBenchCommandSeedsResetsAndWarmth: --engine resets before every run,
// --seeds prints the summary, and a router whose engines report hits no
// cold start allows (the fake's 4 of 10 from the first request) is
// refused in a comparison unless --allow-warm.
func TestBenchCommandSeedsResetsAndWarmth(t *testing.T) {
	a := httptest.NewServer(streamingRouter("demo-0"))
	defer a.Close()
	eng := &fakeEngine{}
	e := httptest.NewServer(eng)
	defer e.Close()
	base := []string{"bench", "--addr", "127.0.0.1:1", "--model", "demo", "--requests", "3", "--concurrency", "1", "--quiet",
		"--target", "x=" + a.URL, "--target", "y=" + a.URL, "--engine", e.URL, "--reset-settle", "0", "--block-size", "4", "--seeds", "2"}

	var out bytes.Buffer
	root := newRootCmd(&out)
	root.SetErr(io.Discard)
	root.SetArgs(base)
	err := root.Execute()
	if err == nil || !strings.Contains(err.Error(), "--allow-warm") {
		t.Fatalf("err = %v, want the warm-cache refusal", err)
	}
	if !strings.HasPrefix(out.String(), "SUMMARY") || !strings.Contains(out.String(), "x 0-0 y (2 ties)") {
		t.Fatalf("the summary is printed before the refusal:\n%s", out.String())
	}
	if eng.resets != 4 {
		t.Fatalf("%d resets, want one per run (4)", eng.resets)
	}

	out.Reset()
	root = newRootCmd(&out)
	root.SetErr(io.Discard)
	root.SetArgs(append(base, "--allow-warm", "-o", "json"))
	if err := root.Execute(); err != nil {
		t.Fatalf("--allow-warm: %v", err)
	}
	var res struct {
		Runs []struct {
			Seed      uint64   `json:"seed"`
			Ceiling   *float64 `json:"cache_hit_ceiling"`
			WarmStart bool     `json:"warm_start"`
			Reset     bool     `json:"caches_reset"`
		} `json:"runs"`
		Summary struct {
			Seeds []uint64 `json:"seeds"`
			Wins  []struct {
				A, B string
			} `json:"wins"`
		} `json:"summary"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out.String())
	}
	if len(res.Runs) != 4 || res.Runs[0].Ceiling == nil || *res.Runs[0].Ceiling != 0 || !res.Runs[0].WarmStart || !res.Runs[0].Reset ||
		fmt.Sprint(res.Summary.Seeds) != "[1 2]" || len(res.Summary.Wins) != 4 {
		t.Fatalf("result %+v", res)
	}

	// summarize: the same summary from the saved JSON.
	saved := filepath.Join(t.TempDir(), "runs.json")
	if err := os.WriteFile(saved, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"x": 1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		files   []string
		want    string
		wantErr string
	}{
		{files: []string{saved}, want: "hit/ceiling mean (range)"},
		{files: []string{saved, bad}, wantErr: "neither a bench report"},
		{files: []string{filepath.Join(t.TempDir(), "none.json")}, wantErr: "no such file"},
	} {
		out.Reset()
		root = newRootCmd(&out)
		root.SetErr(io.Discard)
		root.SetArgs(append([]string{"bench", "summarize"}, tt.files...))
		err := root.Execute()
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("summarize %v: err = %v, want %q", tt.files, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !strings.Contains(out.String(), tt.want) {
			t.Fatalf("summarize %v: %v\n%s", tt.files, err, out.String())
		}
	}
}

// TestBenchCommandWithoutAResetEndpoint is issue 27's case: by default
// `llmgwctl bench` against an engine without POST /reset_prefix_cache
// says so on stderr and runs, the table marking the run "cache not reset";
// --reset-caches given by name makes it an error.
func TestBenchCommandWithoutAResetEndpoint(t *testing.T) {
	a := httptest.NewServer(streamingRouter("demo-0"))
	defer a.Close()
	e := httptest.NewServer(&fakeEngine{noReset: true})
	defer e.Close()
	args := []string{"bench", "--addr", "127.0.0.1:1", "--model", "demo", "--requests", "2", "--concurrency", "1", "--quiet",
		"--target", a.URL, "--engine", e.URL, "--reset-settle", "0", "--block-size", "4"}
	tests := []struct {
		name    string
		extra   []string
		wantOut string // in the table
		wantLog string // on stderr
		wantErr string
	}{
		// The fake router reports cached tokens from the first request:
		// a warm start, which the cell shows beside the missing reset.
		{name: "by default", wantOut: "WARM (8 tokens), cache not reset", wantLog: "VLLM_SERVER_DEV_MODE=1"},
		{name: "reset asked by name", extra: []string{"--reset-caches"}, wantErr: "VLLM_SERVER_DEV_MODE=1"},
		{name: "reset turned off", extra: []string{"--reset-caches=false"}, wantOut: "WARM (8 tokens)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, stderr bytes.Buffer
			root := newRootCmd(&out)
			root.SetErr(&stderr)
			root.SetArgs(append(slices.Clone(args), tt.extra...))
			err := root.Execute()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("bench: %v\nstderr: %s", err, stderr.String())
			}
			var caches string
			for _, line := range strings.Split(out.String(), "\n") {
				if f := strings.Fields(line); len(f) > 1 && f[0] == "caches" {
					caches = strings.Join(f[1:], " ")
				}
			}
			if caches != tt.wantOut {
				t.Errorf("caches row %q, want %q\n%s", caches, tt.wantOut, out.String())
			}
			if !strings.Contains(stderr.String(), tt.wantLog) {
				t.Errorf("stderr lacks %q:\n%s", tt.wantLog, stderr.String())
			}
		})
	}
}

// TestBenchCommandComparisonNeedsAReset: two targets and no control plane
// to list the engines is an error saying what to do, not a silent
// warm-against-cold comparison.
func TestBenchCommandComparisonNeedsAReset(t *testing.T) {
	a := httptest.NewServer(streamingRouter("demo-0"))
	defer a.Close()
	root := newRootCmd(io.Discard)
	root.SetErr(io.Discard)
	root.SetArgs([]string{"bench", "--addr", "127.0.0.1:1", "--model", "demo", "--requests", "2", "--quiet", "--target", a.URL, "--target", a.URL})
	err := root.Execute()
	if err == nil || !strings.Contains(err.Error(), "--reset-caches") || !strings.Contains(err.Error(), "--engine") {
		t.Fatalf("err = %v, want one naming --reset-caches and --engine", err)
	}
}

func TestRateText(t *testing.T) {
	tests := []struct {
		n       int64
		elapsed time.Duration
		want    string
	}{
		{1, 10 * time.Microsecond, "(- req/s)"}, // the first tick: no 100000 req/s
		{5, 999 * time.Millisecond, "(- req/s)"},
		{30, 2 * time.Second, "(15.0 req/s)"},
		{7, 10 * time.Second, "(0.7 req/s)"},
	}
	for _, tt := range tests {
		if got := rateText(tt.n, tt.elapsed); got != tt.want {
			t.Errorf("rateText(%d, %s) = %q, want %q", tt.n, tt.elapsed, got, tt.want)
		}
	}
}
