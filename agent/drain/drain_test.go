package drain

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var base = time.Unix(1_700_000_000, 0)

// step is one published snapshot: at is its publish time (and the clock's
// reading while it is the latest); rl is the replica's reading, if listed.
type step struct {
	at time.Duration
	rl *llmgwv1.ReplicaLoad
}

// script publishes its steps one per Latest call, then ends the test's
// context: Wait must have decided by then.
type script struct {
	steps  []step
	i      int
	cur    time.Duration
	cancel context.CancelFunc
}

func (s *script) Latest() (*llmgwv1.LoadSnapshot, <-chan struct{}) {
	if s.i >= len(s.steps) {
		s.cancel()
		return &llmgwv1.LoadSnapshot{}, make(chan struct{})
	}
	st := s.steps[s.i]
	s.i++
	s.cur = st.at
	snap := &llmgwv1.LoadSnapshot{Node: "n1", UnixNano: base.Add(st.at).UnixNano()}
	if st.rl != nil {
		snap.Replicas = append(snap.Replicas, &llmgwv1.ReplicaLoad{ReplicaId: "m-0", Uid: 7, Incarnation: 1, ScrapedUnixNano: 1}, st.rl)
	}
	closed := make(chan struct{})
	close(closed)
	return snap, closed
}

// read is a reading of m-0 (uid 7) scraped at t.
func read(t time.Duration, inc uint64, running, waiting float64) *llmgwv1.ReplicaLoad {
	return &llmgwv1.ReplicaLoad{ReplicaId: "m-1", Uid: 7, Incarnation: inc, Running: running, Waiting: waiting,
		ScrapedUnixNano: base.Add(t).UnixNano()}
}

func TestWait(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name    string
		serving bool
		steps   []step
		want    Outcome // 0: still waiting when the script ends
	}{
		{"idle for the quiet period", true, []step{
			{0, read(0, 1, 0, 0)}, {500 * ms, read(500*ms, 1, 0, 0)}, {1000 * ms, read(1000*ms, 1, 0, 0)}}, Idle},
		{"idle but not yet for the quiet period", true, []step{
			{0, read(0, 1, 0, 0)}, {500 * ms, read(500*ms, 1, 0, 0)}, {999 * ms, read(999*ms, 1, 0, 0)}}, 0},
		{"a busy reading restarts the quiet period", true, []step{
			{0, read(0, 1, 0, 0)}, {500 * ms, read(500*ms, 1, 1, 0)}, {1000 * ms, read(1000*ms, 1, 0, 0)},
			{1900 * ms, read(1900*ms, 1, 0, 0)}}, 0},
		{"a waiting request is busy", true, []step{
			{0, read(0, 1, 0, 0)}, {500 * ms, read(500*ms, 1, 0, 2)}, {1000 * ms, read(1000*ms, 1, 0, 0)},
			{2000 * ms, read(2000*ms, 1, 0, 0)}}, Idle},
		{"a reading from before the drain does not count", true, []step{
			{0, read(-5*time.Second, 1, 0, 0)}, {1000 * ms, read(-5*time.Second, 1, 0, 0)}, {1500 * ms, read(1500*ms, 1, 0, 0)}}, 0},
		{"a stale reading repeated does not advance the quiet period", true, []step{
			{0, read(10*ms, 1, 0, 0)}, {3000 * ms, read(10*ms, 1, 0, 0)}}, 0},
		{"a restarted engine starts its own quiet period", true, []step{
			{0, read(0, 1, 0, 0)}, {600 * ms, read(600*ms, 2, 0, 0)}, {1200 * ms, read(1200*ms, 2, 0, 0)},
			{1600 * ms, read(1600*ms, 2, 0, 0)}}, Idle},
		{"unlisted while serving waits", true, []step{{0, nil}, {2000 * ms, nil}}, 0},
		{"unlisted and not serving stops at once", false, []step{{0, nil}}, NotServing},
		{"listed but never read, not serving", false, []step{{0, read(0, 1, 0, 0)}, {10 * ms, &llmgwv1.ReplicaLoad{ReplicaId: "m-1", Uid: 7, Incarnation: 1}}}, NotServing},
		{"another uid of the same id is not this replica", true, []step{
			{0, &llmgwv1.ReplicaLoad{ReplicaId: "m-1", Uid: 8, Incarnation: 1, ScrapedUnixNano: base.UnixNano()}},
			{2000 * ms, &llmgwv1.ReplicaLoad{ReplicaId: "m-1", Uid: 8, Incarnation: 1, ScrapedUnixNano: base.Add(2000 * ms).UnixNano()}}}, 0},
		{"busy until the timeout", true, []step{
			{0, read(0, 1, 3, 0)}, {59 * time.Second, read(59*time.Second, 1, 3, 0)}, {60 * time.Second, read(60*time.Second, 1, 3, 0)}}, TimedOut},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := &script{steps: tt.steps, cancel: cancel}
			cfg := Config{Quiet: time.Second, Timeout: time.Minute, Now: func() time.Time { return base.Add(s.cur) }}
			got, err := Wait(ctx, cfg, s, Replica{ID: "m-1", UID: 7, Serving: func() bool { return tt.serving }})
			if tt.want == 0 {
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("Wait = %v, %v; want still waiting (context.Canceled)", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Wait = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestWaitWithoutLoads(t *testing.T) {
	if _, err := Wait(context.Background(), DefaultConfig(), nil, Replica{ID: "m-1"}); !errors.Is(err, ErrNoLoads) {
		t.Fatalf("err = %v, want ErrNoLoads", err)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"defaults", DefaultConfig(), ""},
		{"zero quiet", Config{Timeout: time.Minute}, "--drain-quiet: must be positive, got 0s"},
		{"timeout below quiet", Config{Quiet: time.Second, Timeout: time.Millisecond}, "--drain-timeout: 1ms must be at least --drain-quiet 1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if got := ""; err != nil {
				got = err.Error()
				if got != tt.want {
					t.Fatalf("Validate = %q, want %q", got, tt.want)
				}
			} else if tt.want != "" {
				t.Fatalf("Validate = nil, want %q", tt.want)
			}
		})
	}
}
