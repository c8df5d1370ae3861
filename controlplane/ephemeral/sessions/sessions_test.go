package sessions

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/testkit"
)

// remote is what the other servers announce, set by the test.
type remote struct {
	live  map[string]bool
	ended map[string]time.Time
}

func (r remote) Live(node string) (bool, time.Time) { return r.live[node], r.ended[node] }
func (r remote) LiveNodes() []string {
	var out []string
	for n, ok := range r.live {
		if ok {
			out = append(out, n)
		}
	}
	return out
}

// TestRegistry: a node is detached only while no server holds a session
// for it, and since the later of its sessions' ends here and elsewhere.
func TestRegistry(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name     string
		here     []string // "+n" a session of n starts here, "-n" one ends (each at t0+1s steps)
		remote   remote
		node     string
		detached bool
		since    time.Time
	}{
		{"never seen", nil, remote{}, "n1", true, time.Time{}},
		{"attached here", []string{"+n1"}, remote{}, "n1", false, time.Time{}},
		{"attached twice, one ended", []string{"+n1", "+n1", "-n1"}, remote{}, "n1", false, time.Time{}},
		{"ended here", []string{"+n1", "-n1"}, remote{}, "n1", true, t0.Add(2 * time.Second)},
		{"ended here, live elsewhere", []string{"+n1", "-n1"}, remote{live: map[string]bool{"n1": true}}, "n1", false, time.Time{}},
		{"ended here, later elsewhere", []string{"+n1", "-n1"}, remote{ended: map[string]time.Time{"n1": t0.Add(time.Minute)}}, "n1", true, t0.Add(time.Minute)},
		{"ended elsewhere only", nil, remote{ended: map[string]time.Time{"n1": t0}}, "n1", true, t0},
		{"a new session clears the end", []string{"+n1", "-n1", "+n1"}, remote{}, "n1", false, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := t0
			reg := prometheus.NewRegistry()
			r := New(tt.remote, func() time.Time { return now }, reg)
			open := 0
			for _, op := range tt.here {
				now = now.Add(time.Second)
				if op[0] == '+' {
					r.Started(op[1:])
					open++
				} else {
					r.Ended(op[1:])
					open--
				}
			}
			at, detached := r.DetachedSince(tt.node)
			if detached != tt.detached || !at.Equal(tt.since) {
				t.Fatalf("DetachedSince = %v, %v; want %v, %v", at, detached, tt.since, tt.detached)
			}
			if got := r.Connected()[tt.node]; got == tt.detached {
				t.Fatalf("Connected()[%s] = %v while detached is %v", tt.node, got, tt.detached)
			}
			if g := testkit.Metric(t, reg, "llmgw_control_agent_sessions", nil); g != float64(open) {
				t.Fatalf("llmgw_control_agent_sessions = %v, want %d", g, open)
			}
		})
	}
}
