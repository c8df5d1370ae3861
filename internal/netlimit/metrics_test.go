package netlimit

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "llmgw_test")
	l := m.New("api", Config{MaxConnsPerAddr: 1})
	var closed []string
	a, _ := l.Admit(&fakeConn{name: "a", local: tcpAddr("10.9.9.9", 443), remote: tcpAddr("10.0.0.1", 1), closed: &closed})
	l.Idle(a)
	l.Admit(&fakeConn{name: "b", local: tcpAddr("10.9.9.9", 443), remote: tcpAddr("10.0.0.1", 2), closed: &closed})
	m.New("raft", Config{}) // a second listener beside it
	want := `
# HELP llmgw_test_connections_open Connections open on a listener, by listener and state: before the end of their handshake (handshake), serving (active), between requests (idle).
# TYPE llmgw_test_connections_open gauge
llmgw_test_connections_open{listener="api",state="active"} 0
llmgw_test_connections_open{listener="api",state="handshake"} 1
llmgw_test_connections_open{listener="api",state="idle"} 0
llmgw_test_connections_open{listener="raft",state="active"} 0
llmgw_test_connections_open{listener="raft",state="handshake"} 0
llmgw_test_connections_open{listener="raft",state="idle"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "llmgw_test_connections_open"); err != nil {
		t.Error(err)
	}
	if got := testutil.ToFloat64(m.dropped.WithLabelValues("api", "evicted_idle")); got != 1 {
		t.Errorf("evicted_idle = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(m.dropped); n != 2*len(Reasons) {
		t.Errorf("%d dropped series, want every reason of both listeners (%d)", n, 2*len(Reasons))
	}
}
