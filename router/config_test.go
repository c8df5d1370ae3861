package router

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/configfile"
	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/tracing"
	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/capture"
	"github.com/llmgw/llmgw/router/flow"
	"github.com/llmgw/llmgw/router/kvindex"
	"github.com/llmgw/llmgw/router/scheduler"
	"github.com/llmgw/llmgw/router/tokenize"
)

// TestConfigValidateEveryProblem breaks several settings at once: each is
// reported, on its own line, by the flag and key the user wrote (or the key
// alone where there is no flag).
func TestConfigValidateEveryProblem(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []string // each line's start, in order
	}{
		{"flags", func(c *Config) {
			c.Control = []string{"host"}
			c.HTTPAddr = "8080"
			c.MaxBodyBytes = 0
			c.KVMinBlocks = 0
		}, []string{"--control (control): ", "--http-addr (http_addr): ", "--max-body-bytes (max_body_bytes): ", "--kv-min-blocks (kv_min_blocks): "}},
		{"limits", func(c *Config) {
			c.ReadHeaderTimeout = 0
			c.BodyTimeout = -time.Second
			c.IdleTimeout = 0
			c.MaxHeaderBytes = 0
			c.MaxHeaderCount = -1
			c.MaxConnections = -1
			c.MaxInflight = 0
			c.ClientWriteTimeout = 0
			c.SessionHeaders = []string{"X-Session-Id", "x session", ""}
		}, []string{"--read-header-timeout (read_header_timeout): ", "--body-timeout (body_timeout): ", "--idle-timeout (idle_timeout): ",
			"--client-write-timeout (client_write_timeout): ", `--session-headers (session_headers): "x session" is not a header name`,
			`--session-headers (session_headers): "" is not`, "--max-header-bytes (max_header_bytes): ", "--max-header-count (max_header_count): ",
			"--max-connections (max_connections): ", "--max-inflight (max_inflight): "}},
		{"offload credit", func(c *Config) { c.KVIndex.Credit.CPU = 1.5 }, []string{"kv_credit_cpu: must be between 0 and 1"}},
		{"half an HTTPS setup", func(c *Config) { c.HTTPSCert = "api.pem" }, []string{"--https-key (https_key): required with --https-cert"}},
		{"the other half", func(c *Config) { c.HTTPSKey = "api-key.pem" }, []string{"--https-cert (https_cert): required with --https-key"}},
		{"every address", func(c *Config) { c.Control = []string{"a", "b:1", "c"} },
			[]string{`--control (control): "a": `, `--control (control): "c": `}},
		{"flags and keys without flags", func(c *Config) {
			c.ScrapeInterval = 0
			c.AdapterWait = -time.Second
			c.AdapterQueue = 0
			c.HoldMaxBytes = 0
			c.Breaker.Failures = 0
			c.Scheduler.Imbalance.Ratio = 0
			c.KVIndex.MaxEntries = 0
			c.Tokenize.Budget = 0
			c.Tokenize.CacheTokens = -1
		}, []string{"--scrape-interval (scrape_interval): ", "--adapter-wait (adapter_wait): ", "--adapter-queue (adapter_queue): ", "hold_max_bytes: ", "breaker_failures: ",
			"scheduler_imbalance_ratio: ", "kv_index_max_entries: ", "--tokenize-budget (tokenize_budget): ", "tokenize_cache_tokens: "}},
		{"flow", func(c *Config) {
			c.Flow.ReplicaConcurrency = -1
			c.Flow.Classes[1].Name = "Std"
		}, []string{"flow.replica_concurrency: ", "flow.classes[1]: name ", "flow.default_class: "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mutate(&c)
			err := c.Validate()
			if err == nil {
				t.Fatalf("Validate = nil, want %d problems", len(tt.want))
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Fatalf("Validate reported %d problems, want %d:\n%s", len(lines), len(tt.want), err)
			}
			for i, w := range tt.want {
				if !strings.HasPrefix(lines[i], w) {
					t.Errorf("problem %d = %q, want it to start %q", i, lines[i], w)
				}
			}
		})
	}
}

// TestConfigListenBeyondLoopback: the API may bind beyond loopback only
// with TLS for the router's cluster connections, or with --insecure; the
// refusal names the flag and says why and what to do (design §11).
func TestConfigListenBeyondLoopback(t *testing.T) {
	tlsFiles := mtls.Files{CA: "ca.pem", Cert: "r.pem", Key: "r-key.pem"}
	tests := []struct {
		name     string
		addr     string
		tls      mtls.Files
		insecure bool
		want     []string // each line's start; nil: valid
	}{
		{"default is loopback", DefaultConfig().HTTPAddr, mtls.Files{}, false, nil},
		{"localhost", "localhost:8080", mtls.Files{}, false, nil},
		{"every interface", ":8080", mtls.Files{}, false, []string{"--http-addr (http_addr): :8080: refusing to serve beyond loopback without TLS"}},
		{"one interface", "10.0.0.7:8080", mtls.Files{}, false, []string{"--http-addr (http_addr): 10.0.0.7:8080: refusing"}},
		{"--insecure", ":8080", mtls.Files{}, true, nil},
		{"TLS", "0.0.0.0:8080", tlsFiles, false, nil},
		{"half a TLS setup", "127.0.0.1:8080", mtls.Files{Cert: "r.pem"}, false, []string{"--tls-ca (tls_ca): ", "--tls-key (tls_key): "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.HTTPAddr, c.TLS, c.Insecure = tt.addr, tt.tls, tt.insecure
			err := c.Validate()
			var lines []string
			if err != nil {
				lines = strings.Split(err.Error(), "\n")
			}
			if len(lines) != len(tt.want) {
				t.Fatalf("Validate = %v, want %d problems %q", err, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.HasPrefix(lines[i], w) {
					t.Errorf("problem %d = %q, want it to start %q", i, lines[i], w)
				}
			}
			if len(tt.want) > 0 && strings.Contains(tt.want[0], "refusing") && !strings.Contains(err.Error(), "--insecure") {
				t.Errorf("the refusal does not say how to proceed: %v", err)
			}
		})
	}
}

// everyKey sets every key of the router's configuration file, each to a
// value its default is not.
const everyKey = `
id: r-7
control: [10.0.0.1:7400, 10.0.0.2:7400]
http_addr: 127.0.0.1:9090
data_dir: /var/lib/llmgw/router
ops_addr: 127.0.0.1:9091
pprof: true
gc_min_heap: 33554432
max_body_bytes: 1048576
scrape_interval: 250ms
connect_timeout: 3s
first_byte_timeout: 2m
shutdown_grace: 45s
read_header_timeout: 5s
body_timeout: 30s
idle_timeout: 90s
max_header_bytes: 32768
max_header_count: 50
max_connections: 2000
max_conns_per_addr: 100
max_inflight: 500
max_key_inflight: 64
client_write_timeout: 45s
session_headers: [X-Session-Id, X-Conversation]
breaker_failures: 5
breaker_cooldown: 7s
scheduler_sessions: 1024
scheduler_tree_entries: 2048
scheduler_imbalance_ratio: 2.5
scheduler_imbalance_min_gap: 8
scheduler_kv_imbalance_ratio: 3
scheduler_kv_imbalance_min_gap: 12
scheduler_kv_eviction_weight: 2
scheduler_kv_session_reserve_tokens: 8192
scheduler_kv_session_fill: 0.8
kv_index_max_entries: 4096
kv_speculation_ttl_min: 300ms
kv_speculation_ttl_max: 4s
kv_speculation_max_pending: 50000
kv_speculation_max_pending_per_replica: 5000
kv_credit_cpu: 0.7
kv_credit_storage: 0.2
tokenize_budget: 35ms
tokenize_cache_tokens: 9999
tokenize_max_response_bytes: 65536
kv_min_blocks: 2
adapter_wait: 10s
adapter_queue: 64
hold_max_bytes: 1048576
capture_path: CAPTURE_DIR/cap.jsonl
capture_max_bytes: 2097152
capture_max_files: 2
capture_queue: 64
require_api_key: true
flow:
  enabled: false
  replica_concurrency: 12
  max_waiting: 3
  kv_ceiling: 0.9
  default_class: normal
  classes:
    - {name: urgent, ttl: 10s, max_queued: 50, max_queued_bytes: 1048576, headroom: 0.01}
    - {name: normal, ttl: 20s, max_queued: 60, max_queued_bytes: 2097152, headroom: 0.2}
  fairness_half_life: 30s
  output_weight: 3
  inversion_wait: 200ms
  unseen_window: 400ms
  tick: 5ms
  report_interval: 500ms
tls_ca: /etc/llmgw/ca.pem
tls_cert: /etc/llmgw/r-7.pem
tls_key: /etc/llmgw/r-7-key.pem
insecure: true
https_cert: /etc/llmgw/api.pem
https_key: /etc/llmgw/api-key.pem
otlp_traces_endpoint: 127.0.0.1:4317
trace_sampling_ratio: 0.5
trace_insecure: true
trace_ca: /etc/llmgw/otlp-ca.pem
`

// TestConfigFileEveryKey decodes a file with every key strictly: a key the
// struct does not have (a typo, a flag whose field lost its tag) fails the
// decode, and a field no key reached fails the comparison.
func TestConfigFileEveryKey(t *testing.T) {
	got := DefaultConfig()
	capDir := t.TempDir() // the capture's directory must exist to validate
	if err := configfile.Decode(strings.NewReader(strings.ReplaceAll(everyKey, "CAPTURE_DIR", capDir)), &got); err != nil {
		t.Fatal(err)
	}
	want := Config{
		ID: "r-7", Control: []string{"10.0.0.1:7400", "10.0.0.2:7400"}, HTTPAddr: "127.0.0.1:9090",
		DataDir: "/var/lib/llmgw/router", OpsAddr: "127.0.0.1:9091", Pprof: true, GCMinHeap: 32 << 20, MaxBodyBytes: 1 << 20, ScrapeInterval: 250 * time.Millisecond,
		ConnectTimeout: 3 * time.Second, FirstByteTimeout: 2 * time.Minute, ShutdownGrace: 45 * time.Second,
		ReadHeaderTimeout: 5 * time.Second, BodyTimeout: 30 * time.Second, IdleTimeout: 90 * time.Second,
		MaxHeaderBytes: 32 << 10, MaxHeaderCount: 50, MaxConnections: 2000, MaxConnsPerAddr: 100, MaxInflight: 500, MaxKeyInflight: 64,
		ClientWriteTimeout: 45 * time.Second, SessionHeaders: []string{"X-Session-Id", "X-Conversation"},
		Breaker: breaker.Config{Failures: 5, Cooldown: 7 * time.Second},
		Scheduler: scheduler.Config{Sessions: 1024, TreeEntries: 2048,
			Imbalance: scheduler.Imbalance{Ratio: 2.5, MinGap: 8}, KVImbalance: scheduler.KVImbalance{Ratio: 3, MinGap: 12},
			KVPressure: scheduler.KVPressure{EvictionWeight: 2, SessionReserveTokens: 8192, SessionFill: 0.8}},
		KVIndex: kvindex.Config{MaxEntries: 4096, SpecTTLMin: 300 * time.Millisecond, SpecTTLMax: 4 * time.Second,
			SpecPending: 50000, SpecPendingPerReplica: 5000, Credit: kvindex.Weights{CPU: 0.7, Storage: 0.2}},
		Tokenize:      tokenize.Config{Budget: 35 * time.Millisecond, CacheTokens: 9999, MaxResponseBytes: 64 << 10},
		KVMinBlocks:   2,
		AdapterWait:   10 * time.Second,
		AdapterQueue:  64,
		HoldMaxBytes:  1 << 20,
		Capture:       capture.Config{Path: filepath.Join(capDir, "cap.jsonl"), MaxBytes: 2 << 20, MaxFiles: 2, Queue: 64},
		TLS:           mtls.Files{CA: "/etc/llmgw/ca.pem", Cert: "/etc/llmgw/r-7.pem", Key: "/etc/llmgw/r-7-key.pem"},
		Insecure:      true,
		HTTPSCert:     "/etc/llmgw/api.pem",
		HTTPSKey:      "/etc/llmgw/api-key.pem",
		RequireAPIKey: true,
		Tracing:       tracing.Config{OTLPEndpoint: "127.0.0.1:4317", SamplingRatio: 0.5, Insecure: true, CA: "/etc/llmgw/otlp-ca.pem"},
		Flow: flow.Config{ReplicaConcurrency: 12, MaxWaiting: 3, KVCeiling: 0.9, DefaultClass: "normal",
			Classes: []flow.Class{{Name: "urgent", TTL: 10 * time.Second, MaxQueued: 50, MaxQueuedBytes: 1 << 20, Headroom: 0.01},
				{Name: "normal", TTL: 20 * time.Second, MaxQueued: 60, MaxQueuedBytes: 2 << 20, Headroom: 0.2}},
			HalfLife: 30 * time.Second, OutputWeight: 3, InversionWait: 200 * time.Millisecond, UnseenWindow: 400 * time.Millisecond, Tick: 5 * time.Millisecond,
			ReportInterval: 500 * time.Millisecond},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("the example file does not validate: %v", err)
	}
	// Every decodable field differs from its default, so a field added
	// without a key here is caught.
	for _, path := range unchanged(reflect.ValueOf(DefaultConfig()), reflect.ValueOf(got), "") {
		t.Errorf("field %s has no key in the example file", path)
	}

	t.Run("unknown key", func(t *testing.T) {
		c := DefaultConfig()
		err := configfile.Decode(strings.NewReader("http_adr: :9090\n"), &c)
		if err == nil || !strings.Contains(err.Error(), "http_adr") {
			t.Fatalf("Decode = %v, want an error naming http_adr", err)
		}
	})
}

// unchanged lists the YAML-decodable leaf fields that are equal in a and b.
func unchanged(a, b reflect.Value, prefix string) []string {
	var out []string
	for i := range a.NumField() {
		f := a.Type().Field(i)
		if f.Tag.Get("yaml") == "-" {
			continue
		}
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Duration]() {
			out = append(out, unchanged(a.Field(i), b.Field(i), prefix+f.Name+".")...)
			continue
		}
		if reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			out = append(out, prefix+f.Name)
		}
	}
	return out
}
