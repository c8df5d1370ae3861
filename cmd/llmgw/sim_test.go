package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/agent/engine"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// simRoot is llmgw with only its sim command, as main builds it.
func simRoot() *cobra.Command {
	root := &cobra.Command{Use: "llmgw", SilenceUsage: true, SilenceErrors: true}
	root.PersistentFlags().String("log-level", "warn", "")
	root.PersistentFlags().String("log-format", "text", "")
	root.AddCommand(newSimCmd())
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	return root
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestSimServeRefusesUnknownFlags: as vLLM's argparse, the simulator exits
// with an error naming a flag neither it nor vLLM knows, before serving.
func TestSimServeRefusesUnknownFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus-flag", "3"}, "unrecognized arguments: --bogus-flag"},
		{[]string{"--max-num-seq", "8"}, "unrecognized arguments: --max-num-seq"},    // a typo of --max-num-seqs
		{[]string{"--no-max-num-seqs"}, "unrecognized arguments: --no-max-num-seqs"}, // --no- is for booleans only
		{[]string{"-x"}, "unrecognized arguments: -x"},
		{[]string{"--enable-lora", "--bogus_flag=1"}, "unrecognized arguments: --bogus-flag"},
		{[]string{"extra-positional"}, "unrecognized arguments: extra-positional"},
	} {
		root := simRoot()
		root.SetArgs(append([]string{"sim", "serve", "m", "--port", "1"}, tc.args...))
		if err := root.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestSimServeTakesVLLMDriverArgv runs the vllm driver's real argv, for
// every model feature, against the strict simulator: each must start and
// serve, so a typo in the driver fails here and not on a GPU node.
func TestSimServeTakesVLLMDriverArgv(t *testing.T) {
	dir := t.TempDir()
	for _, a := range []string{"sql", "legal"} {
		if err := os.MkdirAll(filepath.Join(dir, a), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	adapters := []*llmgwv1.Adapter{{Name: "sql", Path: filepath.Join(dir, "sql")}, {Name: "legal", Path: filepath.Join(dir, "legal")}}
	tests := []struct {
		name  string
		model *llmgwv1.Model
		want  []string // model ids /v1/models must list
	}{
		{"plain", &llmgwv1.Model{}, []string{"demo"}},
		{"kv events", &llmgwv1.Model{KvEvents: true, BlockSize: 32, HashSeed: "7"}, []string{"demo"}},
		{"embedding model", &llmgwv1.Model{Task: "embed"}, []string{"demo"}},
		{"adapters at start", &llmgwv1.Model{Adapters: adapters, MaxLoraRank: 32}, []string{"demo", "sql", "legal"}},
		{"runtime adapters", &llmgwv1.Model{Adapters: adapters, MaxLoadedAdapters: 1}, []string{"demo"}},
		{"extra args in vLLM's forms", &llmgwv1.Model{ExtraArgs: []string{
			"--max-num-seqs", "8", "--max_num_batched_tokens=4096", "--no-enable-prefix-caching", "-tp", "1",
			"--trust-remote-code", "--dtype", "bfloat16", "--gpu-memory-utilization=0.6", "--disable-log-requests",
			"--sim-gpu", "l4", "--sim-load-scale", "0"}}, []string{"demo"}},
		{"sleep mode", &llmgwv1.Model{Autoscale: &llmgwv1.Autoscale{Max: 2, TargetWaiting: 1, Sleep: true},
			ExtraArgs: []string{"--sim-gpu", "l4", "--sim-load-scale", "0"}}, []string{"demo"}},
		{"every feature", &llmgwv1.Model{KvEvents: true, Adapters: adapters,
			ExtraArgs: []string{"--enable-chunked-prefill", "--long-prefill-token-threshold", "512", "--sim-timing", "simple"}},
			[]string{"demo", "sql", "legal"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.model
			m.Name, m.Engine, m.Model = "demo", engine.Sim, "Qwen/Qwen2.5-0.5B-Instruct"
			port := freeTCPPort(t)
			l, err := engine.Plan(engine.Spec{Replica: &llmgwv1.Replica{Id: "demo-0"}, Model: m, Host: "127.0.0.1",
				Port: port, KVEventsPort: freeTCPPort(t), KVReplayPort: freeTCPPort(t), Command: []string{"llmgw", "sim"}})
			if err != nil {
				t.Fatal(err)
			}
			for _, kv := range l.Env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			root := simRoot()
			root.SetArgs(l.Argv[1:]) // sim serve MODEL ...
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- root.ExecuteContext(ctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("sim serve %q: %v", l.Argv[1:], err)
				}
			}()
			base := "http://127.0.0.1:" + strconv.Itoa(port)
			var body string
			testkit.WaitErr(t, 20*time.Second, fmt.Sprintf("sim serve %q to serve", l.Argv[1:]), func() error {
				select {
				case err := <-done:
					done <- err
					t.Fatalf("sim serve %q exited: %v", l.Argv[1:], err)
				default:
				}
				resp, err := http.Get(base + "/v1/models")
				if err != nil {
					return err
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				body = string(b)
				return nil
			})
			for _, id := range tc.want {
				if !strings.Contains(body, `"id":"`+id+`"`) {
					t.Errorf("/v1/models lacks %s: %s", id, body)
				}
			}
			// Sleep mode's endpoints are served exactly when the driver
			// asks for them (VLLM_SERVER_DEV_MODE).
			resp, err := http.Get(base + "/is_sleeping")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if sleep := m.GetAutoscale().GetSleep(); sleep != (resp.StatusCode == http.StatusOK) ||
				(sleep && strings.TrimSpace(string(b)) != `{"is_sleeping":false}`) {
				t.Errorf("sleep mode %v: /is_sleeping = %s %s", sleep, resp.Status, b)
			}
		})
	}
}
