package limits

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/testkit"
)

func fromAddr(ip string, port int) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: port}})
}

func TestAcquire(t *testing.T) {
	cfg := Config{
		PerIdentity: map[Kind]Cap{Watch: {Max: 64, Setting: "--max-watch-streams-per-identity"}},
		PerAddress: map[Kind]Cap{
			Watch:  {Max: 2, Setting: "max_watch_streams_per_address"},
			Attach: {Max: 1, Setting: "max_agent_sessions_per_address"},
		},
	}
	type call struct {
		ctx     context.Context
		kind    Kind
		refused bool
	}
	a1, a2 := fromAddr("10.0.0.1", 1000), fromAddr("10.0.0.1", 2000)
	b := fromAddr("10.0.0.2", 1000)
	for _, tc := range []struct {
		name  string
		calls []call
	}{
		{"under the cap", []call{{a1, Watch, false}, {a2, Watch, false}}},
		{"one over, by address not port", []call{{a1, Watch, false}, {a2, Watch, false}, {a1, Watch, true}}},
		{"other address counted apart", []call{{a1, Watch, false}, {a1, Watch, false}, {b, Watch, false}}},
		{"kinds counted apart", []call{{a1, Watch, false}, {a1, Watch, false}, {a1, Attach, false}, {a1, Attach, true}}},
		{"no peer counts as unknown", []call{{context.Background(), Attach, false}, {context.Background(), Attach, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			l := New(cfg, reg)
			refused := 0
			for i, c := range tc.calls {
				_, err := l.Acquire(c.ctx, c.kind)
				if c.refused {
					refused++
					if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), cfg.PerAddress[c.kind].Setting) {
						t.Fatalf("call %d: got %v, want RESOURCE_EXHAUSTED naming %s", i, err, cfg.PerAddress[c.kind].Setting)
					}
				} else if err != nil {
					t.Fatalf("call %d: refused: %v", i, err)
				}
			}
			if got := testkit.Metric(t, reg, "llmgw_control_streams_refused_total", testkit.Labels{"kind": string(Watch), "by": "address"}) +
				testkit.Metric(t, reg, "llmgw_control_streams_refused_total", testkit.Labels{"kind": string(Attach), "by": "address"}); got != float64(refused) {
				t.Errorf("refused counter %v, want %d", got, refused)
			}
		})
	}
}

func TestReleaseFreesTheSlotOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := New(Config{PerAddress: map[Kind]Cap{Watch: {Max: 1, Setting: "x"}}}, reg)
	ctx := fromAddr("10.0.0.1", 1)
	release, err := l.Acquire(ctx, Watch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, Watch); err == nil {
		t.Fatal("second stream accepted over a cap of 1")
	}
	release()
	release() // a second call must not free a slot it does not hold
	r2, err := l.Acquire(ctx, Watch)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	if _, err := l.Acquire(ctx, Watch); err == nil {
		t.Fatal("a double release freed two slots")
	}
	r2()
	if got := testkit.Metric(t, reg, "llmgw_control_streams_open", testkit.Labels{"kind": string(Watch)}); got != 0 {
		t.Errorf("open gauge %v after every release, want 0", got)
	}
	if len(l.count) != 0 {
		t.Errorf("counts kept after every release: %v", l.count)
	}
}

func TestZeroMaxIsUncapped(t *testing.T) {
	l := New(Config{}, prometheus.NewRegistry())
	for i := range 1000 {
		if _, err := l.Acquire(fromAddr("10.0.0.1", i), Watch); err != nil {
			t.Fatalf("stream %d refused without a cap: %v", i, err)
		}
	}
}
