package service

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// raftConfig is a Raft configuration that counts its reads.
type raftConfig struct {
	mu      sync.Mutex
	servers []raft.Server
	last    uint64
	reads   int
}

func (f *raftConfig) Servers() []raft.Server {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	return f.servers
}

func (f *raftConfig) LastIndex() uint64 { return f.last }

func (f *raftConfig) set(last uint64, ids ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.last, f.servers = last, nil
	for _, id := range ids {
		f.servers = append(f.servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(id + ":7000")})
	}
}

// TestConfigMembers: the cached configuration answers members and
// strangers, a server just added is found at its first call, a stranger
// costs at most one read per refresh interval, the copy expires, and a
// configuration that cannot be read keeps the last one.
func TestConfigMembers(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	now := t0
	r := &raftConfig{}
	m := NewConfigMembers(r, func() time.Time { return now })
	type step struct {
		name          string
		at            time.Duration // since t0
		change        func()
		id            string
		member, state bool
		reads         int // total reads after the step
	}
	steps := []step{
		{"a fresh server has no state", 0, nil, "c9", false, false, 1},
		{"bootstrapped: the copy is fresh, but a miss re-reads", 300 * time.Millisecond, func() { r.set(1, "c1", "c2", "c3") }, "c2", true, true, 2},
		{"a member from the copy", 400 * time.Millisecond, nil, "c3", true, true, 2},
		{"a stranger re-reads once", 600 * time.Millisecond, nil, "c9", false, true, 3},
		{"a stranger again within the refresh interval: no read", 700 * time.Millisecond, nil, "c9", false, true, 3},
		{"a server just added is found at its first call", 900 * time.Millisecond, func() { r.set(5, "c1", "c2", "c3", "c4") }, "c4", true, true, 4},
		{"removed: the copy holds it until it expires", 1500 * time.Millisecond, func() { r.set(6, "c1", "c2", "c3") }, "c4", true, true, 4},
		{"the copy expired", 3 * time.Second, nil, "c4", false, true, 5},
		{"raft shut down: the last copy stays", 6 * time.Second, func() { r.set(6) }, "c2", true, true, 6},
	}
	for _, s := range steps {
		now = t0.Add(s.at)
		if s.change != nil {
			s.change()
		}
		member, state := m.Member(s.id)
		if member != s.member || state != s.state {
			t.Fatalf("%s: Member(%s) = %v, %v; want %v, %v", s.name, s.id, member, state, s.member, s.state)
		}
		if r.reads != s.reads {
			t.Fatalf("%s: %d reads, want %d", s.name, r.reads, s.reads)
		}
	}
}

// TestAuthorizerCountsAndLogsRefusals: every refusal of a stranger's
// server certificate is counted by method; the log says it once a minute
// per caller.
func TestAuthorizerCountsAndLogsRefusals(t *testing.T) {
	reg := prometheus.NewRegistry()
	var buf bytes.Buffer
	now := time.Unix(1_800_000_000, 0)
	a := NewAuthorizer(AuthzConfig{Enabled: true, Self: "c1", Members: members{ids: []string{"c1", "c2"}, hasState: true},
		Metrics: NewAuthzMetrics(reg), Now: func() time.Time { return now }}, slog.New(slog.NewTextHandler(&buf, nil)))
	stranger := ctxAs(mtls.Identity{Role: mtls.RoleServer, Name: "c9"})
	other := ctxAs(mtls.Identity{Role: mtls.RoleServer, Name: "c8"})
	call := func(ctx context.Context, method string) {
		if err := a.Check(ctx, method); err == nil {
			t.Fatalf("%s admitted", method)
		}
	}
	for range 50 {
		call(stranger, llmgwv1.AdminService_ListApiKeys_FullMethodName)
	}
	call(stranger, llmgwv1.ServerService_RegisterNode_FullMethodName)
	call(other, llmgwv1.ServerService_RegisterNode_FullMethodName)
	call(stranger, "/llmgw.v1.AdminService/Nope")
	if got := testkit.Metric(t, reg, "llmgw_control_server_calls_refused_total", testkit.Labels{"method": "AdminService/ListApiKeys"}); got != 50 {
		t.Fatalf("ListApiKeys refusals counted %v, want 50", got)
	}
	if got := testkit.Metric(t, reg, "llmgw_control_server_calls_refused_total", nil); got != 53 {
		t.Fatalf("refusals counted %v, want 53", got)
	}
	if got := testkit.Metric(t, reg, "llmgw_control_server_calls_refused_total", testkit.Labels{"method": "other"}); got != 1 {
		t.Fatalf("the junk method counted %v under other, want 1", got)
	}
	if n := strings.Count(buf.String(), "caller=server/c9"); n != 1 {
		t.Fatalf("c9's refusals logged %d times in a minute, want 1:\n%s", n, buf.String())
	}
	if n := strings.Count(buf.String(), "caller=server/c8"); n != 1 {
		t.Fatalf("c8's refusal logged %d times, want 1", n)
	}
	now = now.Add(time.Minute)
	call(stranger, llmgwv1.ServerService_RegisterNode_FullMethodName)
	if n := strings.Count(buf.String(), "caller=server/c9"); n != 2 {
		t.Fatalf("c9's refusal a minute later logged %d times in all, want 2", n)
	}
}
