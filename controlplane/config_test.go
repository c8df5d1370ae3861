package controlplane

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/configfile"
	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
)

// problems splits Validate's joined error into one line per problem.
func problems(err error) []string {
	if err == nil {
		return nil
	}
	var out []string
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			out = append(out, e.Error())
		}
		return out
	}
	return []string{err.Error()}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *Config)
		// want are the prefixes of the problems, in order; none = valid.
		want []string
	}{
		{"valid", func(*Config) {}, nil},
		{"no node id", func(c *Config) { c.NodeID = "" }, []string{"--node-id (node_id): required"}},
		{"no data dir", func(c *Config) { c.DataDir = "" }, []string{"--data-dir (data_dir): required"}},
		{"bad grpc addr", func(c *Config) { c.GRPCAddr = "nope" }, []string{`--grpc-addr (grpc_addr): "nope" is not host:port`}},
		{"wildcard raft addr", func(c *Config) { c.RaftAddr, c.Insecure = "0.0.0.0:7401", true }, []string{"--raft-addr (raft_addr): \"0.0.0.0:7401\" must name an address"}},
		{"bootstrap expect", func(c *Config) { c.BootstrapExpect = 3 }, nil},
		{"bootstrap and bootstrap expect", func(c *Config) { c.Bootstrap, c.BootstrapExpect = true, 3 },
			[]string{"--bootstrap (bootstrap) and --bootstrap-expect (bootstrap_expect): give one"}},
		{"bootstrap and join", func(c *Config) { c.Bootstrap, c.Join = true, []string{"a:1"} },
			[]string{"--bootstrap (bootstrap) and --join (join): give one"}},
		{"negative bootstrap expect", func(c *Config) { c.BootstrapExpect = -1 }, []string{"--bootstrap-expect (bootstrap_expect): must be at least 1"}},
		{"bootstrap expect without gossip", func(c *Config) { c.BootstrapExpect, c.GossipAddr = 3, "" },
			[]string{"--gossip-addr (gossip_addr): required with --bootstrap-expect"}},
		{"join", func(c *Config) { c.Join = []string{"a:1"} }, nil},
		{"bad join addr", func(c *Config) { c.Join = []string{"nope"} }, []string{"--join (join):"}},
		{"join without gossip", func(c *Config) { c.Join, c.GossipAddr = []string{"a:1"}, "" }, []string{"--gossip-addr (gossip_addr): required with --join"}},
		{"zero stabilization", func(c *Config) { c.ServerStabilizationTime = 0 }, []string{"--server-stabilization-time (server_stabilization_time): must be positive"}},
		{"zero heartbeat", func(c *Config) { c.HeartbeatTimeout = 0 }, []string{"--heartbeat-timeout (heartbeat_timeout): must be positive, got 0s"}},
		{"election below heartbeat", func(c *Config) { c.ElectionTimeout = 100 * time.Millisecond },
			[]string{"--election-timeout (election_timeout): 100ms must be at least --heartbeat-timeout (heartbeat_timeout) 500ms"}},
		{"lease above heartbeat", func(c *Config) { c.LeaderLeaseTimeout = time.Second }, []string{"leader_lease_timeout: 1s must not exceed --heartbeat-timeout"}},
		{"file-only setting", func(c *Config) { c.DrainTimeout = -time.Second }, []string{"drain_timeout: must be positive, got -1s"}},
		{"negative gossip timing", func(c *Config) { c.Gossip.ProbeTimeout = -time.Second }, []string{"gossip.probe_timeout: must not be negative"}},
		{"negative reconnect window", func(c *Config) { c.Gossip.ReconnectTimeout = -time.Hour }, []string{"gossip.reconnect_timeout: must not be negative"}},
		{"watch queue", func(c *Config) { c.WatchQueue = 0 }, []string{"watch_queue: must be at least 1, got 0"}},
		{"console routers", func(c *Config) { c.ConsoleRouters = []string{"http://127.0.0.1:8080", "https://r2:8443"} }, nil},
		{"console router not a URL", func(c *Config) { c.ConsoleRouters = []string{"127.0.0.1:8080"} },
			[]string{`--console-router (console_router): "127.0.0.1:8080" must be a router's base URL`}},
		{"half a TLS setup", func(c *Config) { c.TLS.Cert = "c.pem" }, []string{
			"--tls-ca (tls_ca): required when any of", "--tls-key (tls_key): required when any of"}},
		{"plain text beyond loopback", func(c *Config) { c.GRPCAddr, c.GossipAddr = "10.0.0.1:7400", "0.0.0.0:7402" }, []string{
			`--grpc-addr (grpc_addr): "10.0.0.1:7400" is beyond loopback and there is no TLS`,
			`--gossip-addr (gossip_addr): "0.0.0.0:7402" is beyond loopback and there is no TLS`}},
		{"plain text beyond loopback, --insecure", func(c *Config) { c.GRPCAddr, c.RaftAddr, c.Insecure = "10.0.0.1:7400", "10.0.0.1:7401", true }, nil},
		{"TLS beyond loopback", func(c *Config) {
			c.GRPCAddr, c.RaftAddr, c.TLS = "10.0.0.1:7400", "10.0.0.1:7401", mtls.Files{CA: "ca.pem", Cert: "c.pem", Key: "k.pem"}
		}, nil},
		{"limits", func(c *Config) {
			c.Limits.GRPCMaxRecvBytes, c.Limits.MaxWatchStreamsPerAddress, c.Limits.AgentMaxStatusBytes = 10, 0, 0
		}, []string{
			"--grpc-max-recv-bytes (grpc_max_recv_bytes): must be at least 65536, got 10",
			"max_watch_streams_per_address: must be at least 1, got 0",
			"agent_max_status_bytes: must be at least 256",
		}},
		{"listener limits", func(c *Config) {
			c.Limits.Listeners.GRPCMaxConns, c.Limits.Listeners.GRPCMaxConnsPerAddress, c.Limits.Listeners.HandshakeTimeout = 0, 0, 0
		}, []string{
			"grpc_max_conns: must be at least 1, got 0",
			"grpc_max_conns_per_address: must be at least 1, got 0",
			"handshake_timeout: must be at least 100ms, got 0s",
		}},
		{"grpc connections lowered alone", func(c *Config) { c.Limits.Listeners.GRPCMaxConns = 100 }, nil},
		{"send above what clients accept", func(c *Config) { c.Limits.GRPCMaxSendBytes = 128 << 20 },
			[]string{"--grpc-max-send-bytes (grpc_max_send_bytes): must not exceed"}},
		{"chunks too large for the receive limit", func(c *Config) { c.Limits.EphemeralChunkBytes = 3 << 20 },
			[]string{"ephemeral_chunk_bytes: must be at most half of grpc_max_recv_bytes (2097152)"}},
		{"chunks too small", func(c *Config) { c.Limits.EphemeralChunkBytes = 1 << 10 },
			[]string{"ephemeral_chunk_bytes: must be at least 16384"}},
		{"restore above the format", func(c *Config) { c.Limits.SnapshotRestoreMaxBytes = 1 << 30 },
			[]string{"snapshot_restore_max_bytes: must not exceed"}},
		{"several problems at once, each reported", func(c *Config) {
			c.NodeID, c.GRPCAddr, c.HeartbeatTimeout, c.AdapterMinIdle = "", "nope", 0, -time.Second
			c.Join, c.GossipAddr = []string{"a:1"}, ""
		}, []string{
			"--node-id (node_id): required",
			"--grpc-addr (grpc_addr):",
			"--gossip-addr (gossip_addr): required with --join",
			"--heartbeat-timeout (heartbeat_timeout): must be positive",
			"adapter_min_idle: must not be negative",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.NodeID = "c1"
			tt.mutate(&c)
			got := problems(c.Validate())
			if len(got) != len(tt.want) {
				t.Fatalf("Validate reported %d problems, want %d:\n%s", len(got), len(tt.want), strings.Join(got, "\n"))
			}
			for i, want := range tt.want {
				if !strings.HasPrefix(got[i], want) {
					t.Errorf("problem %d is %q, want prefix %q", i, got[i], want)
				}
			}
		})
	}
}

// TestValidateErrorsAreErrors: a problem that wraps a cause keeps it, so a
// caller can still test it with errors.Is.
func TestValidateErrorsAreErrors(t *testing.T) {
	c := DefaultConfig()
	c.NodeID = "c1"
	c.GRPCAddr = "nope"
	err := c.Validate()
	var one interface{ Unwrap() error }
	if err == nil || !errors.As(err, &one) || one.Unwrap() == nil {
		t.Fatalf("Validate = %v: the address problem does not wrap its cause", err)
	}
}

// TestDecodeConfig: a control node's YAML file (design §2) decodes into
// Config through configfile.Decode: keys are the flags' names with
// underscores, absent keys keep their values, unknown keys and the
// build-only version are refused, and a refused file changes nothing.
func TestDecodeConfig(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr string
		check   func(t *testing.T, c Config)
	}{
		{"empty keeps defaults", "", "", func(t *testing.T, c Config) {
			d := DefaultConfig()
			if c.GRPCAddr != d.GRPCAddr || c.HeartbeatTimeout != d.HeartbeatTimeout || c.NodeID != "" {
				t.Fatalf("changed: %+v", c)
			}
		}},
		{"fields and durations", "node_id: c1\ngrpc_addr: 10.0.0.1:7400\nbootstrap: true\nheartbeat_timeout: 200ms\njoin: [a:1, b:2]\n", "", func(t *testing.T, c Config) {
			if c.NodeID != "c1" || c.GRPCAddr != "10.0.0.1:7400" || !c.Bootstrap || c.HeartbeatTimeout != 200*time.Millisecond || len(c.Join) != 2 {
				t.Fatalf("decoded %+v", c)
			}
			if c.ElectionTimeout != DefaultConfig().ElectionTimeout {
				t.Fatal("an absent key lost its default")
			}
		}},
		{"nested gossip tuning", "gossip:\n  probe_interval: 100ms\n  suspicion_mult: 2\n  reconnect_interval: 1s\n  reconnect_timeout: 24h\n", "", func(t *testing.T, c Config) {
			if c.Gossip.ProbeInterval != 100*time.Millisecond || c.Gossip.SuspicionMult != 2 ||
				c.Gossip.ReconnectInterval != time.Second || c.Gossip.ReconnectTimeout != 24*time.Hour {
				t.Fatalf("decoded %+v", c.Gossip)
			}
		}},
		{"limits at the top level", "max_watch_streams_per_address: 8\nagent_replica_slack: 0\n", "", func(t *testing.T, c Config) {
			if c.Limits.MaxWatchStreamsPerAddress != 8 || c.Limits.AgentReplicaSlack != 0 || c.Limits.GRPCMaxRecvBytes != DefaultLimits().GRPCMaxRecvBytes {
				t.Fatalf("decoded %+v", c.Limits)
			}
		}},
		{"listener limits at the top level", "grpc_max_conns: 10000\ngrpc_max_conns_per_address: 1000\nhandshake_timeout: 3s\n", "", func(t *testing.T, c Config) {
			if c.Limits.Listeners != (ListenerLimits{GRPCMaxConns: 10000, GRPCMaxConnsPerAddress: 1000, HandshakeTimeout: 3 * time.Second}) {
				t.Fatalf("decoded %+v", c.Limits.Listeners)
			}
		}},
		{"unknown key", "grpc_adr: x:1\n", "grpc_adr", nil},
		{"bad duration", "election_timeout: soon\n", "election_timeout: line 1", nil},
		// Issue 26: a value of the wrong type names its key, nested keys by
		// their path, and a fraction is no integer.
		{"a list for a duration", "node_id: c1\nheartbeat_timeout: [1]\n", "heartbeat_timeout: line 2: cannot unmarshal !!seq into time.Duration", nil},
		{"a string for a count", "bootstrap_expect: \"x\"\n", "bootstrap_expect: line 1: cannot unmarshal !!str `x` into int", nil},
		{"a fraction for a count", "bootstrap_expect: 1.5\n", "bootstrap_expect: line 1: must be a whole number, got 1.5", nil},
		{"a nested key", "gossip:\n  reconnect_interval: [1]\n", "gossip.reconnect_interval: line 2", nil},
		{"a limit at the top level", "max_watch_streams_per_address: 1e9\n", "max_watch_streams_per_address: line 1: must be a whole number", nil},
		{"version is not from the file", "version: 9\n", "version", nil},
		{"tls keys at the top level", "tls_ca: /p/ca.pem\ntls_cert: /p/c1.pem\ntls_key: /p/c1-key.pem\ninsecure: true\n", "", func(t *testing.T, c Config) {
			if c.TLS != (mtls.Files{CA: "/p/ca.pem", Cert: "/p/c1.pem", Key: "/p/c1-key.pem"}) || !c.Insecure {
				t.Fatalf("decoded %+v insecure %v", c.TLS, c.Insecure)
			}
		}},
		{"two documents", "node_id: a\n---\nnode_id: b\n", "more than one", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			err := configfile.Decode(strings.NewReader(tt.yaml), &c)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Decode: %v, want an error mentioning %q", err, tt.wantErr)
				}
				if c.GRPCAddr != DefaultConfig().GRPCAddr || c.NodeID != "" {
					t.Fatal("a refused file changed the config")
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			tt.check(t, c)
		})
	}
}

// FuzzDecodeConfig: the file is outside input; no panic, and a refusal
// leaves the config as it was.
func FuzzDecodeConfig(f *testing.F) {
	f.Add("node_id: c1\nheartbeat_timeout: 200ms\njoin: [a:1]\n")
	f.Add("{")
	f.Add("watch_queue: -1\n")
	f.Fuzz(func(t *testing.T, doc string) {
		c := DefaultConfig()
		if err := configfile.Decode(strings.NewReader(doc), &c); err != nil {
			if c.GRPCAddr != DefaultConfig().GRPCAddr || c.NodeID != "" {
				t.Fatal("a refused file changed the config")
			}
			return
		}
		_ = c.Validate()
	})
}

// TestLoadTLS: a server's certificate must be a server's, named as its
// --node-id (the others verify exactly that before letting it into Raft);
// anything else refuses to start, naming what it found and what it needs.
func TestLoadTLS(t *testing.T) {
	ca := mtlstest.New(t)
	own, dir := ca.Files(mtls.RoleServer, "c1"), t.TempDir()
	tests := []struct {
		name  string
		files mtls.Files
		err   string // "" loads
	}{
		{"none", mtls.Files{}, ""},
		{"its own", own, ""},
		{"another server's", ca.Files(mtls.RoleServer, "c2"), "is the certificate of server/c2; this server needs one for server/c1 (--node-id c1)"},
		{"an agent's", ca.Files(mtls.RoleAgent, "c1"), "is the certificate of agent/c1"},
		{"a missing file", mtls.Files{CA: own.CA, Cert: filepath.Join(dir, "nope.pem"), Key: filepath.Join(dir, "nope-key.pem")}, "nope.pem"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.NodeID, c.TLS = "c1", tt.files
			src, err := loadTLS(c)
			if tt.err == "" {
				if err != nil || (src == nil) != !tt.files.Enabled() {
					t.Fatalf("loadTLS = %v, %v", src, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("loadTLS: %v, want an error containing %q", err, tt.err)
			}
		})
	}
}
