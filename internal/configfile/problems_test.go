package configfile

import (
	"errors"
	"io/fs"
	"strings"
	"testing"
)

func TestFlag(t *testing.T) {
	tests := []struct {
		got, want string
	}{
		{Flag("gpus"), "--gpus (gpus)"},
		{Flag("heartbeat-timeout"), "--heartbeat-timeout (heartbeat_timeout)"},
		{Flag("server-stabilization-time"), "--server-stabilization-time (server_stabilization_time)"},
		{FlagKey("label", "labels"), "--label (labels)"},
		{FlagKey("vllm-command", "engines.vllm.command"), "--vllm-command (engines.vllm.command)"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func TestProblems(t *testing.T) {
	nested := errors.Join(errors.New("breaker_failures: must be at least 1, got 0"), errors.New("breaker_cooldown: must be positive, got 0s"))
	tests := []struct {
		name   string
		record func(*Problems)
		want   []string // Err's lines; none = nil
	}{
		{"none", func(*Problems) {}, nil},
		{"only valid nested configs", func(p *Problems) { p.Join(nil, nil) }, nil},
		{"one", func(p *Problems) { p.Add(Flag("node-id"), "required") }, []string{"--node-id (node_id): required"}},
		{"formatted, in order", func(p *Problems) {
			p.Add("watch_queue", "must be at least 1, got %d", 0)
			p.Add(Flag("http-addr"), "%q: %w", "8080", errors.New("missing port in address"))
		}, []string{"watch_queue: must be at least 1, got 0", `--http-addr (http_addr): "8080": missing port in address`}},
		{"a setting is not a format", func(p *Problems) { p.Add("engines.a%db", "unknown engine") },
			[]string{"engines.a%db: unknown engine"}},
		{"nested problems keep their lines and place", func(p *Problems) {
			p.Add(Flag("adapter-wait"), "must be positive, got %s", "0s")
			p.Join(nil, nested)
			p.Add("kv_index_max_entries", "must be at least 1, got %d", 0)
		}, []string{"--adapter-wait (adapter_wait): must be positive, got 0s",
			"breaker_failures: must be at least 1, got 0", "breaker_cooldown: must be positive, got 0s",
			"kv_index_max_entries: must be at least 1, got 0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p Problems
			tt.record(&p)
			err := p.Err()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Err = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Err = nil, want %q", tt.want)
			}
			if got := strings.Split(err.Error(), "\n"); strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Fatalf("Err lines = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestProblemsWrapCauses: a problem whose format wraps a cause with %w, and
// a nested Validate's error, stay testable with errors.Is through Err.
func TestProblemsWrapCauses(t *testing.T) {
	sentinel := errors.New("nested")
	var p Problems
	p.Add(Flag("data-dir"), "%w", fs.ErrPermission)
	p.Join(sentinel)
	err := p.Err()
	if !errors.Is(err, fs.ErrPermission) {
		t.Errorf("Err = %v does not wrap the cause given with %%w", err)
	}
	if !errors.Is(err, sentinel) {
		t.Errorf("Err = %v does not wrap the nested error", err)
	}
}
