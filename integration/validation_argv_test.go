package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestApplyRefusesInjection holds issue 26's "model: "--trust-remote-code",
// replicas: 1e9, replicas: 1.5, an adapter named -x: refused with an error
// naming the key; nothing applied", against a real control server: through
// `llmgwctl model apply -f`, and through the AdminService directly, which
// must refuse what a client without llmgwctl's own checks sends. Afterwards
// the server lists the one good model and nothing else.
func TestApplyRefusesInjection(t *testing.T) {
	s := newServer(t, "c1", serverOpts{extra: []string{"--bootstrap"}})
	s.start()
	c := &cluster{t: t, servers: []*controlServer{s}}
	c.waitLeader(c.servers, formTimeout)

	dir := t.TempDir()
	apply := func(name, body string) (string, error) {
		p := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return s.ctl("model", "apply", "-f", p)
	}
	const head = "name: bad\nengine: vllm\n"
	if out, err := apply("good", "name: good\nengine: vllm\nmodel: org/good\nreplicas: 2\n"); err != nil {
		t.Fatalf("a valid model refused: %v (%s)", err, out)
	}
	for _, tc := range []struct{ name, body, want string }{
		{"model-as-flag", head + "model: \"--trust-remote-code\"\n", `model: line 3: must not start with "-"`},
		{"replicas-exponent", head + "model: org/m\nreplicas: 1e9\n", "replicas: line 4: must be a whole number, got 1e9"},
		{"replicas-fraction", head + "model: org/m\nreplicas: 1.5\n", "replicas: line 4: must be a whole number, got 1.5"},
		{"replicas-billion", head + "model: org/m\nreplicas: 1000000000\n", "replicas: line 4: must be at most 4096"},
		{"adapter-as-flag", head + "model: org/m\nadapters:\n  - name: \"-x\"\n    path: /adapters/x\n", "adapters[0].name: line 5: must match"},
		{"adapter-path-as-flag", head + "model: org/m\nadapters:\n  - name: x\n    path: \"--trust-remote-code\"\n", `adapters[0].path: line 6: must not start with "-"`},
		{"remote-code-spelt-otherwise", head + "model: org/m\nextra_args: [\"--trust_remote_code=true\"]\n", "extra_args[0]: line 4: --trust-remote-code runs code"},
	} {
		out, err := apply(tc.name, tc.body)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: apply = %v (%s), want an error naming the key: %q", tc.name, err, out, tc.want)
		}
	}

	// The server's own check, for clients that skip llmgwctl's.
	a, closeAdmin := admin(t, s.grpc)
	defer closeAdmin()
	ctx, cancel := context.WithTimeout(context.Background(), within(15*time.Second))
	defer cancel()
	for _, tc := range []struct {
		name  string
		model *llmgwv1.Model
		want  string
	}{
		{"model as a flag", &llmgwv1.Model{Name: "bad", Engine: "vllm", Model: "--trust-remote-code", Replicas: 1}, `model: must not start with "-"`},
		{"replicas 1e9", &llmgwv1.Model{Name: "bad", Engine: "vllm", Model: "org/m", Replicas: 1e9}, "replicas: must be at most 4096"},
		{"adapter -x", &llmgwv1.Model{Name: "bad", Engine: "vllm", Model: "org/m", Replicas: 1,
			Adapters: []*llmgwv1.Adapter{{Name: "-x", Path: "/adapters/x"}}}, "adapters[0].name: must match"},
		{"a LoRA module in extra_args", &llmgwv1.Model{Name: "bad", Engine: "vllm", Model: "org/m", Replicas: 1,
			Adapters: []*llmgwv1.Adapter{{Name: "x", Path: "/adapters/x"}}, ExtraArgs: []string{"evil=/tmp/evil"}}, "extra_args[0]"},
	} {
		_, err := a.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: tc.model})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("AdminService.ApplyModel, %s: %v, want InvalidArgument naming %q", tc.name, err, tc.want)
		}
	}

	out, err := s.ctl("model", "list", "--consistent", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var models []struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(out), &models); err != nil {
		t.Fatalf("model list: %v: %s", err, out)
	}
	var names []string
	for _, m := range models {
		names = append(names, m.Name)
	}
	if !slices.Equal(names, []string{"good"}) {
		t.Errorf("models after the refusals: %q, want only the valid one", names)
	}
}

// TestConfigTypeErrorsNameTheKey holds issue 26's "control-config type
// errors do not name the key": each server role refuses to start on a
// value of the wrong type, or a fraction where a count belongs, and says
// which key — nested ones by their path — rather than a line alone.
func TestConfigTypeErrorsNameTheKey(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		role, body string
		want       []string
	}{
		{"control", "node_id: c1\nheartbeat_timeout: [1]\nbootstrap_expect: \"x\"\n", []string{
			"heartbeat_timeout: line 2: cannot unmarshal !!seq into time.Duration",
			"bootstrap_expect: line 3: cannot unmarshal !!str `x` into int"}},
		{"control", "bootstrap_expect: 1.5\ngossip:\n  reconnect_interval: soon\n", []string{
			"bootstrap_expect: line 1: must be a whole number, got 1.5", "gossip.reconnect_interval: line 3"}},
		{"agent", "node_id: n1\ngpus: 1.5\n", []string{"gpus: line 2: must be a whole number, got 1.5"}},
		{"router", "max_body_bytes: [1]\n", []string{"max_body_bytes: line 1: cannot unmarshal !!seq"}},
	} {
		p := filepath.Join(dir, tc.role+".yaml")
		if err := os.WriteFile(p, []byte(tc.body), 0o644); err != nil {
			t.Fatal(err)
		}
		// Should the file be taken, the process keeps its files in the
		// test's directory and stops at the deadline.
		ctx, cancel := context.WithTimeout(context.Background(), within(10*time.Second))
		cmd := exec.CommandContext(ctx, bins.llmgw, tc.role, "--config", p)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil {
			t.Errorf("llmgw %s started with %q", tc.role, tc.body)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("llmgw %s --config with %q: output lacks %q:\n%s", tc.role, tc.body, w, out)
			}
		}
	}
}
