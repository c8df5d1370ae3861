package integration

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/agent/kv"
	"github.com/llmgw/llmgw/internal/testkit"
)

// The agent's KV listener against the real simulator process (design §7.5
// step 2): after a burst of requests that stores and evicts blocks, with
// batches dropped on the way, the mirror equals the engine's own block set
// once both are quiet — in both encodings and both hash forms.
func TestKVAgentMirrorsSimulator(t *testing.T) {
	tests := []struct {
		name     string
		encoding string
		intHash  string
	}{
		{"map-ints", "map", "1"},
		{"array-bytes", "array", "0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			hub, err := kv.NewHub(slog.New(slog.DiscardHandler), reg)
			if err != nil {
				t.Fatal(err)
			}
			cfg := kv.DefaultListenerConfig()
			cfg.ReplicaID, cfg.UID, cfg.Topic, cfg.BlockSize, cfg.HashSeed = "demo-0", 1, "kv", 4, "11"
			cfg.Endpoint = "tcp://127.0.0.1:0"
			cfg.ReplayEndpoint = "tcp://" + freeAddr(t)
			l, err := hub.Listen(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			l.Engine(1)

			kvcfg, _ := json.Marshal(map[string]any{"enable_kv_cache_events": true, "publisher": "zmq",
				"endpoint": l.Endpoint(), "replay_endpoint": cfg.ReplayEndpoint, "topic": "kv"})
			addr := freeAddr(t)
			host, port, _ := strings.Cut(addr, ":")
			var out bytes.Buffer
			cmd := exec.Command(bins.llmgw, "sim", "serve", "org/demo", "--host", host, "--port", port,
				"--block-size", "4", "--num-gpu-blocks-override", "48", "--max-model-len", "128",
				"--kv-events-config", string(kvcfg), "--sim-kv-events-encoding", tc.encoding,
				"--sim-kv-drop-rate", "0.3", "--sim-decode-ms-per-token", "0", "--sim-prefill-us-per-token", "0")
			cmd.Env = append(os.Environ(), "PYTHONHASHSEED=11", "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES="+tc.intHash)
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				if t.Failed() {
					t.Logf("simulator output:\n%s", out.String())
				}
			}()
			base := "http://" + addr
			if !eventually(20*time.Second, func() bool {
				resp, err := http.Get(base + "/health")
				if err == nil {
					resp.Body.Close()
				}
				return err == nil && resp.StatusCode == http.StatusOK
			}) {
				t.Fatal("simulator not healthy")
			}
			complete := func(prompt []int) {
				t.Helper()
				b, _ := json.Marshal(map[string]any{"model": "org/demo", "prompt": prompt, "max_tokens": 2})
				resp, err := http.Post(base+"/v1/completions", "application/json", bytes.NewReader(b))
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("completion: %d %s", resp.StatusCode, body)
				}
			}
			// Shared prefixes, and more distinct blocks than the cache
			// holds, so blocks are stored, shared and evicted.
			for i := range 60 {
				prompt := []int{1, 2, 3, 4, 5, 6, 7, 8}
				for j := range 8 + i%5*4 {
					prompt = append(prompt, 100+(i%9)*50+j)
				}
				complete(prompt)
			}
			// A last batch that is not dropped shows any gap at the end.
			resp, err := http.Post(base+"/sim/faults", "application/json", strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			complete([]int{9, 9, 9, 9, 8, 8, 8, 8})

			var want []uint64
			if !eventually(10*time.Second, func() bool {
				var blocks struct {
					BlockHashes []uint64 `json:"block_hashes"`
				}
				resp, err := http.Get(base + "/sim/blocks")
				if err != nil {
					return false
				}
				defer resp.Body.Close()
				if err := json.NewDecoder(resp.Body).Decode(&blocks); err != nil {
					return false
				}
				want = blocks.BlockHashes
				got, untrusted, _ := hub.Blocks("demo-0")
				return !untrusted && slices.Equal(got, want)
			}) {
				got, untrusted, _ := hub.Blocks("demo-0")
				t.Fatalf("mirror %v (untrusted %v), simulator %v", got, untrusted, want)
			}
			if len(want) == 0 {
				t.Fatal("the simulator holds no blocks: the test exercised nothing")
			}
			full := hub.Full()
			if len(full) != 1 || !full[0].GetReset_() || full[0].GetBlockSize() != 4 || len(full[0].GetStored()) != len(want) {
				t.Errorf("full copy %v", full)
			}
			// The drops were there, and replay repaired them; the simulator
			// hashes as the router does, so nothing needed mapping.
			if n := testkit.Metric(t, reg, "llmgw_agent_kv_replays_total", testkit.Labels{"result": "repaired"}); n == 0 {
				t.Error("no replay repaired a gap: the test exercised no drop")
			}
			if n := testkit.Metric(t, reg, "llmgw_agent_kv_hash_mismatches_total", nil); n != 0 {
				t.Errorf("%v hash mismatches against the simulator", n)
			}
			t.Logf("%d blocks mirrored; batches %v gaps %v", len(want), testkit.Metric(t, reg, "llmgw_agent_kv_batches_total", nil), testkit.Metric(t, reg, "llmgw_agent_kv_gaps_total", nil))
		})
	}
}
