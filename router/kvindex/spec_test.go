package kvindex

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// fakeClock is the speculation's injected clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *fakeClock               { return &fakeClock{t: time.Unix(1000, 0)} }
func rep(id string, inc uint64) Replica  { return Replica{ID: id, UID: 1, Incarnation: inc} }
func specIndex(t testing.TB, c *fakeClock, cfg Config) *Index {
	t.Helper()
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = 1 << 20
	}
	cfg.Now = c.now
	x, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// pendingAnswer is LookupPending as replica → "blocks/pending".
func pendingAnswer(x *Index, hashes []uint64) map[string]string {
	out := map[string]string{}
	for _, m := range x.LookupPending(hashes, nil) {
		out[m.ID] = fmt.Sprintf("%d/%d", m.Blocks, m.Pending)
	}
	return out
}

// TestSpeculation: pending entries counted as held under the leading-blocks
// rule, and every way they end (design §7.5 step 6).
func TestSpeculation(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		// run applies updates and speculations, advancing the clock.
		run    func(x *Index, c *fakeClock)
		prompt []uint64
		want   map[string]string // LookupPending: "blocks/pending"
		// confirmedOnly is Lookup's answer (blocks), unaffected by pending.
		confirmedOnly map[string]int
		stats         SpecStats // Pending, Recorded, Confirmed, Expired; Dropped when set
	}{
		{name: "pending blocks extend a confirmed prefix",
			run: func(x *Index, _ *fakeClock) {
				_ = x.Apply("n", kv("a", 1, true, []uint64{1, 2}, nil))
				x.Speculate(rep("a", 1), []uint64{1, 2, 3, 4})
			},
			prompt: []uint64{1, 2, 3, 4}, want: map[string]string{"a": "4/2"}, confirmedOnly: map[string]int{"a": 2},
			stats: SpecStats{Pending: 2, Recorded: 2}},
		{name: "confirmed and pending mix; the first missing block ends it",
			run: func(x *Index, _ *fakeClock) {
				_ = x.Apply("n", kv("a", 1, true, []uint64{1, 3}, nil))
				x.Speculate(rep("a", 1), []uint64{2})
			},
			prompt: []uint64{1, 2, 3, 4}, want: map[string]string{"a": "3/1"}, confirmedOnly: map[string]int{"a": 1},
			stats: SpecStats{Pending: 1, Recorded: 1}},
		{name: "a replica holding nothing matches by its pending blocks alone",
			run: func(x *Index, _ *fakeClock) {
				_ = x.Apply("n", kv("a", 1, true, nil, nil))
				_ = x.Apply("n", kv("b", 1, true, []uint64{1}, nil))
				x.Speculate(rep("a", 1), []uint64{1, 2, 3})
			},
			prompt: []uint64{1, 2, 3}, want: map[string]string{"a": "3/3", "b": "1/0"}, confirmedOnly: map[string]int{"b": 1},
			stats: SpecStats{Pending: 3, Recorded: 3}},
		{name: "a store event confirms",
			run: func(x *Index, c *fakeClock) {
				_ = x.Apply("n", kv("a", 1, true, nil, nil))
				x.Speculate(rep("a", 1), []uint64{1, 2})
				c.add(300 * time.Millisecond)
				_ = x.Apply("n", kv("a", 1, false, []uint64{1, 2}, nil))
			},
			prompt: []uint64{1, 2}, want: map[string]string{"a": "2/0"}, confirmedOnly: map[string]int{"a": 2},
			stats: SpecStats{Recorded: 2, Confirmed: 2}},
		{name: "a removal event drops a pending block (stored, then evicted)",
			run: func(x *Index, _ *fakeClock) {
				_ = x.Apply("n", kv("a", 1, true, nil, nil))
				x.Speculate(rep("a", 1), []uint64{1, 2})
				_ = x.Apply("n", kv("a", 1, false, nil, []uint64{2}))
			},
			prompt: []uint64{1, 2}, want: map[string]string{"a": "1/1"}, confirmedOnly: map[string]int{},
			stats: SpecStats{Pending: 1, Recorded: 2, Dropped: map[string]uint64{DropRemoved: 1}}},
		{name: "a reset drops them",
			run: func(x *Index, _ *fakeClock) {
				_ = x.Apply("n", kv("a", 1, true, nil, nil))
				x.Speculate(rep("a", 1), []uint64{1, 2})
				_ = x.Apply("n", kv("a", 1, true, []uint64{1}, nil))
			},
			prompt: []uint64{1, 2}, want: map[string]string{"a": "1/0"}, confirmedOnly: map[string]int{"a": 1},
			stats: SpecStats{Recorded: 2, Dropped: map[string]uint64{DropReset: 2}}},
		{name: "an untrusted replica drops them and records none",
			run: func(x *Index, _ *fakeClock) {
				_ = x.Apply("n", kv("a", 1, true, nil, nil))
				x.Speculate(rep("a", 1), []uint64{1, 2})
				u := kv("a", 1, false, nil, nil)
				u.Untrusted = true
				_ = x.Apply("n", u)
				x.Speculate(rep("a", 1), []uint64{1, 2})
			},
			prompt: []uint64{1, 2}, want: map[string]string{}, confirmedOnly: map[string]int{},
			stats: SpecStats{Recorded: 2, Dropped: map[string]uint64{DropUntrusted: 2}}},
		{name: "a replica leaving the index drops them",
			run: func(x *Index, _ *fakeClock) {
				_ = x.Apply("n", kv("a", 1, true, nil, nil))
				x.Speculate(rep("a", 1), []uint64{1, 2})
				x.Retain(func(Replica) bool { return false })
			},
			prompt: []uint64{1, 2}, want: map[string]string{}, confirmedOnly: map[string]int{},
			stats: SpecStats{Recorded: 2, Dropped: map[string]uint64{DropReset: 2}}},
		{name: "another incarnation, or none known, gets nothing",
			run: func(x *Index, _ *fakeClock) {
				_ = x.Apply("n", kv("a", 1, true, nil, nil))
				x.Speculate(rep("a", 2), []uint64{1})
				x.Speculate(rep("zz", 1), []uint64{1})
			},
			prompt: []uint64{1}, want: map[string]string{}, confirmedOnly: map[string]int{},
			stats: SpecStats{}},
		{name: "blocks already held or pending are not recorded again",
			run: func(x *Index, _ *fakeClock) {
				_ = x.Apply("n", kv("a", 1, true, []uint64{1}, nil))
				x.Speculate(rep("a", 1), []uint64{1, 2})
				x.Speculate(rep("a", 1), []uint64{1, 2, 3})
			},
			prompt: []uint64{1, 2, 3}, want: map[string]string{"a": "3/2"}, confirmedOnly: map[string]int{"a": 1},
			stats: SpecStats{Pending: 2, Recorded: 2}},
		{name: "past the TTL they no longer count, and expire",
			run: func(x *Index, c *fakeClock) {
				_ = x.Apply("n", kv("a", 1, true, nil, nil))
				x.Speculate(rep("a", 1), []uint64{1, 2})
				c.add(defaultSpecTTLInitial + time.Microsecond)
				x.Expire()
			},
			prompt: []uint64{1, 2}, want: map[string]string{}, confirmedOnly: map[string]int{},
			stats: SpecStats{Recorded: 2, Expired: 2}},
		{name: "just inside the TTL they count",
			run: func(x *Index, c *fakeClock) {
				_ = x.Apply("n", kv("a", 1, true, nil, nil))
				x.Speculate(rep("a", 1), []uint64{1, 2})
				c.add(defaultSpecTTLInitial - time.Millisecond)
				x.Expire()
			},
			prompt: []uint64{1, 2}, want: map[string]string{"a": "2/2"}, confirmedOnly: map[string]int{},
			stats: SpecStats{Pending: 2, Recorded: 2}},
		{name: "a withdrawn attempt's entries go",
			run: func(x *Index, _ *fakeClock) {
				_ = x.Apply("n", kv("a", 1, true, nil, nil))
				x.Speculate(rep("a", 1), []uint64{1, 2})
				x.Withdraw(rep("a", 1), []uint64{1, 2})
			},
			prompt: []uint64{1, 2}, want: map[string]string{}, confirmedOnly: map[string]int{},
			stats: SpecStats{Recorded: 2, Dropped: map[string]uint64{DropWithdrawn: 2}}},
		{name: "per replica bound: the oldest goes",
			cfg: Config{SpecPendingPerReplica: 2},
			run: func(x *Index, c *fakeClock) {
				_ = x.Apply("n", kv("a", 1, true, nil, nil))
				x.Speculate(rep("a", 1), []uint64{1, 2})
				c.add(time.Millisecond)
				x.Speculate(rep("a", 1), []uint64{3})
			},
			prompt: []uint64{2, 3}, want: map[string]string{"a": "2/2"}, confirmedOnly: map[string]int{},
			stats: SpecStats{Pending: 2, Recorded: 3, Dropped: map[string]uint64{DropFull: 1}}},
		{name: "overall bound: the oldest of any replica goes",
			cfg: Config{SpecPending: 2},
			run: func(x *Index, c *fakeClock) {
				_ = x.Apply("n", kv("a", 1, true, nil, nil))
				_ = x.Apply("n", kv("b", 1, true, nil, nil))
				x.Speculate(rep("a", 1), []uint64{1})
				c.add(time.Millisecond)
				x.Speculate(rep("b", 1), []uint64{1})
				c.add(time.Millisecond)
				x.Speculate(rep("b", 1), []uint64{2})
			},
			prompt: []uint64{1, 2}, want: map[string]string{"b": "2/2"}, confirmedOnly: map[string]int{},
			stats: SpecStats{Pending: 2, Recorded: 3, Dropped: map[string]uint64{DropFull: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			x := specIndex(t, c, tt.cfg)
			tt.run(x, c)
			checkInvariants(t, x)
			checkSpecInvariants(t, x)
			if got := pendingAnswer(x, tt.prompt); !equalStrMaps(got, tt.want) {
				t.Errorf("LookupPending = %v, want %v", got, tt.want)
			}
			if got := answer(x, tt.prompt); !equalMaps(got, tt.confirmedOnly) {
				t.Errorf("Lookup = %v, want %v (pending must not count)", got, tt.confirmedOnly)
			}
			st := x.SpecStats()
			if st.Pending != tt.stats.Pending || st.Recorded != tt.stats.Recorded || st.Confirmed != tt.stats.Confirmed || st.Expired != tt.stats.Expired {
				t.Errorf("stats = %+v, want %+v", st, tt.stats)
			}
			for reason, n := range tt.stats.Dropped {
				if st.Dropped[reason] != n {
					t.Errorf("dropped[%s] = %d, want %d (all: %v)", reason, st.Dropped[reason], n, st.Dropped)
				}
			}
			// The confirmed set is what /debug/kvindex shows: never a pending block.
			if _, bs, ok := x.Blocks("a"); ok {
				for _, h := range bs {
					if x.replicas["a"].pending[h] != 0 {
						t.Errorf("block %d both confirmed and pending", h)
					}
				}
			}
		})
	}
}

// TestSpeculationTTLAdapts: the TTL follows twice the p99 of the measured
// lag from a send to its confirmation, within the configured bounds.
func TestSpeculationTTLAdapts(t *testing.T) {
	tests := []struct {
		name string
		lag  time.Duration
		cfg  Config
		want time.Duration
	}{
		{"twice the lag", 300 * time.Millisecond, Config{}, 600 * time.Millisecond},
		{"clamped to the minimum", 10 * time.Millisecond, Config{}, defaultSpecTTLMin},
		{"clamped to the maximum", 4 * time.Second, Config{SpecTTLMax: 5 * time.Second}, 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			x := specIndex(t, c, tt.cfg)
			_ = x.Apply("n", kv("a", 1, true, nil, nil))
			if got := x.SpecStats().TTL; got != defaultSpecTTLInitial {
				t.Fatalf("initial TTL %s, want %s", got, defaultSpecTTLInitial)
			}
			for i := range ttlEvery {
				h := uint64(100 + i)
				x.Speculate(rep("a", 1), []uint64{h})
				c.add(tt.lag)
				_ = x.Apply("n", kv("a", 1, false, []uint64{h}, nil))
			}
			if got := x.SpecStats().TTL; got != tt.want {
				t.Errorf("TTL after %d lags of %s = %s, want %s", ttlEvery, tt.lag, got, tt.want)
			}
		})
	}
}

func TestSpecConfigValidate(t *testing.T) {
	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{MaxEntries: 1, SpecTTLMin: -1}, "kv_speculation_ttl_min"},
		{Config{MaxEntries: 1, SpecTTLMax: -1}, "kv_speculation_ttl_max"},
		{Config{MaxEntries: 1, SpecTTLMin: 2 * time.Second, SpecTTLMax: time.Second}, "kv_speculation_ttl_min"},
		{Config{MaxEntries: 1, SpecPending: -1}, "kv_speculation_max_pending:"},
		{Config{MaxEntries: 1, SpecPendingPerReplica: -1}, "kv_speculation_max_pending_per_replica"},
		{DefaultConfig(), ""},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%+v: %v", tt.cfg, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%+v: error %v, want one naming %s", tt.cfg, err, tt.want)
		}
	}
}

// TestSpeculationRandom: random speculation, events, withdrawals, resets
// and clock steps against a naive model of pending entries.
func TestSpeculationRandom(t *testing.T) {
	c := newClock()
	x := specIndex(t, c, Config{SpecPendingPerReplica: 20, SpecPending: 50})
	rng := rand.New(rand.NewPCG(9, 10))
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		_ = x.Apply("n", kv(id, 1, true, nil, nil))
	}
	for range 5000 {
		id := ids[rng.IntN(len(ids))]
		hs := make([]uint64, 1+rng.IntN(6))
		for i := range hs {
			hs[i] = uint64(rng.IntN(40))
		}
		switch rng.IntN(6) {
		case 0, 1:
			x.Speculate(rep(id, 1), hs)
			// Speculate compacts: stale queue entries stay bounded by the live ones.
			if q, n := x.spec.queue.len(), x.spec.n; q > 2*n+64 {
				t.Fatalf("queue holds %d entries for %d pending", q, n)
			}
		case 2:
			_ = x.Apply("n", kv(id, 1, false, hs, nil))
		case 3:
			_ = x.Apply("n", kv(id, 1, false, nil, hs))
		case 4:
			x.Withdraw(rep(id, 1), hs)
		default:
			c.add(time.Duration(rng.IntN(300)) * time.Millisecond)
			if rng.IntN(20) == 0 {
				_ = x.Apply("n", kv(id, 1, true, nil, nil))
			}
		}
		checkSpecInvariants(t, x)
	}
	checkInvariants(t, x)
}

// checkSpecInvariants: the pending holders, per-replica maps and counts
// agree, within the bounds, and no block is both pending and confirmed.
func checkSpecInvariants(t testing.TB, x *Index) {
	t.Helper()
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := 0
	for _, r := range x.replicas {
		if len(r.pending) > x.cfg.SpecPendingPerReplica {
			t.Fatalf("replica %s: %d pending, bound %d", r.ID, len(r.pending), x.cfg.SpecPendingPerReplica)
		}
		for h := range r.pending {
			if r.blocks.has(h) {
				t.Fatalf("replica %s: %d both pending and confirmed", r.ID, h)
			}
			found := false
			for _, s := range x.spec.holders[h] {
				found = found || s == r.slot
			}
			if !found {
				t.Fatalf("replica %s: pending %d missing from holders", r.ID, h)
			}
		}
		n += len(r.pending)
	}
	m := 0
	for h, ss := range x.spec.holders {
		if len(ss) == 0 {
			t.Fatalf("empty pending holders kept for %d", h)
		}
		for _, s := range ss {
			if r := x.slots[s]; r == nil {
				t.Fatalf("pending %d on free slot %d", h, s)
			} else if _, ok := r.pending[h]; !ok {
				t.Fatalf("holders list %s pending %d; its map does not", r.ID, h)
			}
		}
		m += len(ss)
	}
	if n != x.spec.n || m != x.spec.n || n > x.cfg.SpecPending {
		t.Fatalf("pending count %d, maps %d, holders %d, bound %d", x.spec.n, n, m, x.cfg.SpecPending)
	}
}

func equalStrMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// BenchmarkLookupSpeculation: BenchmarkLookup's fleet, with each prompt
// also speculated on a replica that holds none of it — Lookup (confirmed
// only, today's path) against LookupPending in the same run.
func BenchmarkLookupSpeculation(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	x, ps := fleet(b, 1000, 2000, 256, rng)
	c := newClock()
	x.cfg.Now = c.now
	x.cfg.SpecPending = 1 << 30
	x.cfg.SpecPendingPerReplica = 1 << 30
	for i, p := range ps {
		// The index's own replicas r0..r999: speculate on one not holding it.
		x.Speculate(Replica{ID: "r" + itoa((i*7)%1000), UID: 1}, p)
	}
	b.Logf("pending entries: %d", x.SpecStats().Pending)
	for _, lk := range []struct {
		name string
		f    func([]uint64, []Match) []Match
	}{{"confirmed", x.Lookup}, {"pending", x.LookupPending}} {
		b.Run(lk.name, func(b *testing.B) { benchLookups(b, ps, lk.f) })
	}
}
