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
	"strings"
	"testing"
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
			root.SetArgs(append([]string{"bench", "--model", "demo", "--requests", "6", "--quiet", "-o", "json", "--target", s.URL}, tt.args...))
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
