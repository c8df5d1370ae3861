package breaker

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a manual clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func TestBreaker(t *testing.T) {
	// Steps: f failure, s success, a acquire ok, x acquire refused,
	// w wait a cooldown, r release.
	tests := []struct {
		name  string
		steps string
		want  State
		due   bool
	}{
		{"fresh is closed", "", Closed, false},
		{"failures below the threshold", "ff", Closed, false},
		{"a success resets the count", "ffsff", Closed, false},
		{"threshold opens", "fff", Open, false},
		{"open refuses", "fffx", Open, false},
		{"cooldown makes a probe due", "fffw", Open, true},
		{"the probe half-opens, one at a time", "fffwax", HalfOpen, false},
		{"probe success closes", "fffwas", Closed, false},
		{"probe failure reopens", "fffwaf", Open, false},
		{"reopened waits a whole cooldown", "fffwafx", Open, false},
		{"and probes again", "fffwafwas", Closed, false},
		{"abandoned probe is due again", "fffwar", Open, true},
		{"closed after probe takes the full count again", "fffwasff", Closed, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &clock{t: time.Unix(1000, 0)}
			cfg := DefaultConfig()
			cfg.Now = clk.Now
			var trans []string
			b := New(cfg, func(from, to State) { trans = append(trans, from.String()+">"+to.String()) })
			for i, s := range tt.steps {
				switch s {
				case 'f':
					b.Failure()
				case 's':
					b.Success()
				case 'a':
					if err := b.Acquire(); err != nil {
						t.Fatalf("step %d: Acquire = %v, want ok", i, err)
					}
				case 'x':
					if err := b.Acquire(); !errors.Is(err, ErrOpen) {
						t.Fatalf("step %d: Acquire = %v, want ErrOpen", i, err)
					}
				case 'w':
					clk.Advance(cfg.Cooldown)
				case 'r':
					b.Release()
				}
			}
			st, due := b.View()
			if st != tt.want || due != tt.due {
				t.Fatalf("View = %s due %v, want %s due %v (transitions %v)", st, due, tt.want, tt.due, trans)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string // each problem's key, in order; nil: valid
	}{
		{"default", DefaultConfig(), nil},
		{"failures", Config{Failures: 0, Cooldown: time.Second}, []string{"breaker_failures"}},
		{"cooldown", Config{Failures: 1}, []string{"breaker_cooldown"}},
		{"both at once", Config{Failures: -1, Cooldown: -time.Second}, []string{"breaker_failures", "breaker_cooldown"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate = nil, want problems with %v", tt.want)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Fatalf("Validate = %q, want %d problems (%v)", err, len(tt.want), tt.want)
			}
			for i, key := range tt.want {
				if !strings.HasPrefix(lines[i], key+": ") {
					t.Errorf("problem %d = %q, want it to name %s", i, lines[i], key)
				}
			}
		})
	}
}

func TestSetMetricsAndRetain(t *testing.T) {
	type key struct {
		id  string
		inc int
	}
	reg := prometheus.NewRegistry()
	clk := &clock{t: time.Unix(1000, 0)}
	cfg := DefaultConfig()
	cfg.Failures, cfg.Now = 1, clk.Now
	s, err := NewSet(cfg, func(k key) string { return k.id }, reg)
	if err != nil {
		t.Fatal(err)
	}
	a, b := key{"a", 1}, key{"b", 1}
	if s.Peek(a) != nil {
		t.Fatal("Peek created a breaker")
	}
	s.Get(a).Failure()
	s.Get(b)
	if got := testkit.Metric(t, reg, "llmgw_router_breaker_state", testkit.Labels{"replica": "a"}); got != float64(Open) {
		t.Fatalf("state{a} = %v, want open", got)
	}
	if got := testkit.Metric(t, reg, "llmgw_router_breaker_transitions_total", testkit.Labels{"to": "open"}); got != 1 {
		t.Fatalf("transitions{open} = %v", got)
	}
	if s.Get(key{"a", 2}) == s.Get(a) {
		t.Fatal("a new incarnation shares the old breaker")
	}
	s.Retain(func(k key) bool { return k != a && k.id != "b" })
	if s.Len() != 1 || s.Peek(key{"a", 2}) == nil {
		t.Fatalf("after Retain: %d breakers", s.Len())
	}
	if n := count(t, reg, "llmgw_router_breaker_state"); n != 1 {
		t.Fatalf("state series = %d, want 1 (a's newer incarnation)", n)
	}
}

// count is the number of series of the family name (testkit reads values,
// not how many series there are).
func count(t *testing.T, g prometheus.Gatherer, name string) int {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.Metric)
		}
	}
	return 0
}
