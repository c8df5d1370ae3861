package quota

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is an injected clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fakeLeader grants each claimed scope share (or, per scope kind, the
// share in shares), records the claims and the usage batches, and fails
// when told.
type fakeLeader struct {
	mu       sync.Mutex
	shares   map[llmgwv1.LimitKind]uint64
	fallback uint64
	term     time.Duration
	settling bool
	fail     error
	seq      uint64
	claims   []*llmgwv1.LeaseRequest
	batches  []*llmgwv1.RecordUsageCommand
	refuse   error
}

func (f *fakeLeader) Lease(_ context.Context, req *llmgwv1.LeaseRequest) (*llmgwv1.LeaseResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.claims = append(f.claims, req)
	if f.fail != nil {
		return nil, f.fail
	}
	if f.settling {
		return &llmgwv1.LeaseResponse{Settling: true, TermMs: f.term.Milliseconds()}, nil
	}
	resp := &llmgwv1.LeaseResponse{TermMs: f.term.Milliseconds()}
	for _, c := range req.Claims {
		f.seq++
		resp.Grants = append(resp.Grants, &llmgwv1.ShareGrant{Scope: c.Scope, Seq: f.seq, Share: f.shares[c.Scope.Kind], Fallback: f.fallback, Limit: 1000})
	}
	return resp, nil
}

func (f *fakeLeader) RecordUsage(_ context.Context, b *llmgwv1.RecordUsageCommand) (*llmgwv1.RecordUsageResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse != nil {
		return nil, f.refuse
	}
	if f.fail != nil {
		return nil, f.fail
	}
	f.batches = append(f.batches, b)
	return &llmgwv1.RecordUsageResponse{Revision: 1}, nil
}

func (f *fakeLeader) set(fn func(f *fakeLeader)) {
	f.mu.Lock()
	fn(f)
	f.mu.Unlock()
}

func newTestQuota(t testing.TB, tenants map[string]*llmgwv1.Tenant, f *fakeLeader, reg prometheus.Registerer) (*Quota, *clock) {
	t.Helper()
	c := &clock{now: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	q := New(Config{Router: "r1", Now: c.Now}, func() map[string]*llmgwv1.Tenant { return tenants }, f,
		slog.New(slog.DiscardHandler), reg)
	return q, c
}

func tenantWith(name string, l *llmgwv1.TenantLimits) *llmgwv1.Tenant {
	return &llmgwv1.Tenant{Name: name, Limits: l}
}

// TestAdmitRates: each rate refuses past its share's bucket, with the
// 429 naming the limit and a Retry-After; a tenant without limits, and a
// request without a key, pass.
func TestAdmitRates(t *testing.T) {
	cases := []struct {
		name    string
		limits  *llmgwv1.TenantLimits
		share   map[llmgwv1.LimitKind]uint64
		req     Request
		admits  int // admitted before the first refusal, at one instant
		errType string
	}{
		{"rpm", &llmgwv1.TenantLimits{Rpm: 1000}, map[llmgwv1.LimitKind]uint64{llmgwv1.LimitKind_LIMIT_KIND_RPM: 600},
			Request{Tenant: "a", Model: "m", Base: "m", Input: 10}, 20, "requests"},
		{"input tpm", &llmgwv1.TenantLimits{InputTpm: 100000}, map[llmgwv1.LimitKind]uint64{llmgwv1.LimitKind_LIMIT_KIND_INPUT_TPM: 30000},
			Request{Tenant: "a", Model: "m", Base: "m", Input: 100, InputExact: true}, 10, "tokens"},
		{"output tpm uses max_tokens under the mean", &llmgwv1.TenantLimits{OutputTpm: 100000}, map[llmgwv1.LimitKind]uint64{llmgwv1.LimitKind_LIMIT_KIND_OUTPUT_TPM: 3000},
			Request{Tenant: "a", Model: "m", Base: "m", Input: 100, MaxTokens: 10}, 10, "tokens"},
		{"concurrency", &llmgwv1.TenantLimits{Concurrency: 10}, map[llmgwv1.LimitKind]uint64{llmgwv1.LimitKind_LIMIT_KIND_CONCURRENCY: 3},
			Request{Tenant: "a", Model: "m", Base: "m", Input: 100}, 3, "requests"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeLeader{shares: tc.share, term: 10 * time.Second}
			q, _ := newTestQuota(t, map[string]*llmgwv1.Tenant{"a": tenantWith("a", tc.limits)}, f, nil)
			q.renew(context.Background())
			n := 0
			for {
				tk, refusal, _ := q.Admit(tc.req)
				if refusal != nil {
					if refusal.Status != 429 || refusal.Type != tc.errType || refusal.RetryAfter < 1 {
						t.Fatalf("refusal %+v: want 429 of type %s with Retry-After", refusal, tc.errType)
					}
					break
				}
				if tk == nil {
					t.Fatal("no ticket and no refusal")
				}
				n++
				if n > 1000 {
					t.Fatal("never refused")
				}
			}
			if n != tc.admits {
				t.Errorf("admitted %d before the first refusal, want %d", n, tc.admits)
			}
			// Another tenant, and no key at all, are not limited.
			for _, other := range []string{"b", ""} {
				if _, refusal, _ := q.Admit(Request{Tenant: other, Model: "m", Base: "m", Input: 100}); refusal != nil {
					t.Errorf("tenant %q refused: %v", other, refusal)
				}
			}
		})
	}
}

// TestRateRefills: a bucket refills at its share per minute, so a
// minute at a steady offered load admits the share (within the burst).
func TestRateRefills(t *testing.T) {
	f := &fakeLeader{shares: map[llmgwv1.LimitKind]uint64{llmgwv1.LimitKind_LIMIT_KIND_INPUT_TPM: 60000}, term: time.Hour}
	q, c := newTestQuota(t, map[string]*llmgwv1.Tenant{"a": tenantWith("a", &llmgwv1.TenantLimits{InputTpm: 60000})}, f, nil)
	q.renew(context.Background())
	admitted := 0
	for range 6000 { // 3× the share, every 10 ms for a minute
		c.Add(10 * time.Millisecond)
		tk, refusal, _ := q.Admit(Request{Tenant: "a", Model: "m", Base: "m", Input: 30, InputExact: true})
		if refusal == nil {
			admitted += 30
			tk.Settle(Usage{Input: 30, Output: 5, Known: true})
		}
	}
	if lo, hi := 60000*0.97, 60000*(1+burst)+30; float64(admitted) < lo || float64(admitted) > hi {
		t.Errorf("admitted %d input tokens in a minute, want the share 60000 (within %.0f..%.0f)", admitted, lo, hi)
	}
}

// TestSettleDebt: a request that used more than it reserved leaves the
// bucket in debt, paid back before the next is admitted.
func TestSettleDebt(t *testing.T) {
	f := &fakeLeader{shares: map[llmgwv1.LimitKind]uint64{llmgwv1.LimitKind_LIMIT_KIND_OUTPUT_TPM: 6000}, term: time.Hour}
	q, c := newTestQuota(t, map[string]*llmgwv1.Tenant{"a": tenantWith("a", &llmgwv1.TenantLimits{OutputTpm: 6000})}, f, nil)
	q.renew(context.Background())
	tk, refusal, _ := q.Admit(Request{Tenant: "a", Model: "m", Base: "m", Input: 10, MaxTokens: 50})
	if refusal != nil {
		t.Fatal(refusal)
	}
	tk.Settle(Usage{Input: 10, Output: 1000, Known: true}) // the bucket holds 200: 800 + 50 reserved in debt
	tk.Settle(Usage{Input: 10, Output: 1000, Known: true}) // a second settle does nothing
	if _, refusal, _ := q.Admit(Request{Tenant: "a", Model: "m", Base: "m", Input: 10, MaxTokens: 50}); refusal == nil {
		t.Fatal("admitted while in debt")
	}
	c.Add(9 * time.Second) // 900 tokens at 100/s: the debt of 800 paid, the bucket back above the reservation
	if _, refusal, _ := q.Admit(Request{Tenant: "a", Model: "m", Base: "m", Input: 10, MaxTokens: 50}); refusal != nil {
		t.Fatalf("refused once the debt was paid: %v", refusal)
	}
}

// TestNoShareYet: a scope never granted refuses (a second) and asks for a
// renewal at once; a failed renewal keeps the shares until the lease
// ends, then the fallback holds; a settling leader changes nothing.
func TestLeaseLifecycle(t *testing.T) {
	f := &fakeLeader{shares: map[llmgwv1.LimitKind]uint64{llmgwv1.LimitKind_LIMIT_KIND_CONCURRENCY: 5}, fallback: 1, term: 10 * time.Second}
	q, c := newTestQuota(t, map[string]*llmgwv1.Tenant{"a": tenantWith("a", &llmgwv1.TenantLimits{Concurrency: 9})}, f, nil)
	req := Request{Tenant: "a", Model: "m", Base: "m", Input: 1}
	if _, refusal, _ := q.Admit(req); refusal == nil || refusal.RetryAfter != 1 {
		t.Fatalf("admitted without a share: %v", refusal)
	}
	select {
	case <-q.kick:
	default:
		t.Fatal("a scope without a share did not ask for a renewal")
	}
	q.renew(context.Background())
	admit := func() int {
		n := 0
		var tks []*Ticket
		for {
			tk, refusal, _ := q.Admit(req)
			if refusal != nil {
				break
			}
			tks = append(tks, tk)
			n++
		}
		for _, tk := range tks {
			tk.Settle(Usage{})
		}
		return n
	}
	if n := admit(); n != 5 {
		t.Fatalf("admitted %d at once, want the share 5", n)
	}
	f.set(func(f *fakeLeader) { f.fail = errors.New("no leader") })
	q.renew(context.Background())
	c.Add(9 * time.Second)
	if n := admit(); n != 5 {
		t.Fatalf("admitted %d with the lease still running, want 5", n)
	}
	c.Add(2 * time.Second)
	if n := admit(); n != 1 {
		t.Fatalf("admitted %d once the lease ended, want the fallback 1", n)
	}
	f.set(func(f *fakeLeader) { f.fail, f.settling = nil, true })
	q.renew(context.Background())
	if n := admit(); n != 1 {
		t.Fatalf("admitted %d after a settling answer, want the fallback 1 still", n)
	}
	f.set(func(f *fakeLeader) { f.settling = false })
	q.renew(context.Background())
	if n := admit(); n != 5 {
		t.Fatalf("admitted %d after a new grant, want 5", n)
	}
}

// TestClaims: a renewal claims every scope of every defined tenant, with
// the share held, the grant held and the demand per minute.
func TestClaims(t *testing.T) {
	f := &fakeLeader{shares: map[llmgwv1.LimitKind]uint64{llmgwv1.LimitKind_LIMIT_KIND_RPM: 60, llmgwv1.LimitKind_LIMIT_KIND_DAILY_TOKENS: 5000}, term: 10 * time.Second}
	tn := &llmgwv1.Tenant{Name: "a", Limits: &llmgwv1.TenantLimits{Rpm: 100, DailyTokens: 100000},
		ModelLimits: []*llmgwv1.TenantModelLimits{{Model: "m", Limits: &llmgwv1.TenantLimits{Rpm: 50}}}}
	q, c := newTestQuota(t, map[string]*llmgwv1.Tenant{"a": tn}, f, nil)
	q.renew(context.Background())
	if n := len(f.claims[0].Claims); n != 3 {
		t.Fatalf("first renewal claimed %d scopes, want 3 (rpm, daily, m's rpm)", n)
	}
	for range 2 {
		tk, refusal, _ := q.Admit(Request{Tenant: "a", Model: "m", Base: "m", Input: 100, MaxTokens: 100, InputExact: true})
		if refusal != nil {
			t.Fatal(refusal)
		}
		tk.Settle(Usage{Input: 100, Output: 40, Known: true})
	}
	c.Add(2 * time.Second)
	q.renew(context.Background())
	byKind := map[string]*llmgwv1.ShareClaim{}
	for _, cl := range f.claims[1].Claims {
		byKind[cl.Scope.Model+"/"+cl.Scope.Kind.String()] = cl
	}
	rpm := byKind["/LIMIT_KIND_RPM"]
	if rpm.Held != 60 || rpm.GrantSeq == 0 || rpm.Demand != 60 { // 2 requests in 2 s
		t.Errorf("rpm claim %v: want held 60, a grant, demand 60/min", rpm)
	}
	daily := byKind["/LIMIT_KIND_DAILY_TOKENS"]
	// 5000 granted, 2 × 140 spent and not flushed: all still the router's.
	if daily.Held != 5000 {
		t.Errorf("daily claim held %d, want the slice 5000 (its unspent tokens plus those spent and not committed)", daily.Held)
	}
	if byKind["m/LIMIT_KIND_RPM"] == nil {
		t.Error("no claim for the model's own limit")
	}
	q.flush(context.Background())
	q.renew(context.Background())
	for _, cl := range f.claims[2].Claims {
		if cl.Scope.Kind == llmgwv1.LimitKind_LIMIT_KIND_DAILY_TOKENS && cl.Held != 5000-280+5000 {
			t.Errorf("daily held %d after the flush and a second slice, want %d", cl.Held, 5000-280+5000)
		}
	}
}

// TestBudget: a budget admits only what its slices hold, reserving
// max_tokens, and settles to the used tokens; an exhausted budget's
// refusal waits for the day's end; a new day voids the old slices.
func TestBudget(t *testing.T) {
	f := &fakeLeader{shares: map[llmgwv1.LimitKind]uint64{llmgwv1.LimitKind_LIMIT_KIND_DAILY_TOKENS: 1000}, term: time.Hour}
	q, c := newTestQuota(t, map[string]*llmgwv1.Tenant{"a": tenantWith("a", &llmgwv1.TenantLimits{DailyTokens: 1000})}, f, nil)
	q.renew(context.Background())
	req := Request{Tenant: "a", Model: "m", Base: "m", Input: 100, MaxTokens: 200, InputExact: true}
	var tks []*Ticket
	for range 3 {
		tk, refusal, _ := q.Admit(req)
		if refusal != nil {
			t.Fatal(refusal)
		}
		tks = append(tks, tk)
	}
	if _, refusal, _ := q.Admit(req); refusal == nil {
		t.Fatal("a fourth reservation of 300 passed a slice of 1000")
	}
	for _, tk := range tks {
		tk.Settle(Usage{Input: 100, Output: 50, Known: true}) // 150 each: 550 left
	}
	tk, refusal, _ := q.Admit(req)
	if refusal != nil {
		t.Fatalf("refused with 550 left: %v", refusal)
	}
	tk.Settle(Usage{Input: 100, Output: 50, Known: true})
	f.set(func(f *fakeLeader) { f.shares = map[llmgwv1.LimitKind]uint64{} })
	q.renew(context.Background()) // an empty slice: exhausted fleet-wide
	for range 2 {
		if tk, refusal, _ := q.Admit(req); refusal == nil {
			tk.Settle(Usage{Input: 100, Output: 50, Known: true})
		} else {
			if refusal.Code != "insufficient_quota" || refusal.RetryAfter < 3600 {
				t.Fatalf("refusal %+v: want insufficient_quota until the day's end", refusal)
			}
			break
		}
	}
	c.Add(14 * time.Hour) // the next day
	if _, refusal, _ := q.Admit(req); refusal == nil {
		t.Fatal("yesterday's slice admitted a request today")
	}
}

// TestShadow: a shadow tenant is never refused; its would-be refusals
// are counted, and the limits evolve as if they had been refused, so the
// count matches an enforcing run's.
func TestShadow(t *testing.T) {
	count := func(shadow bool) (refused, served int) {
		f := &fakeLeader{shares: map[llmgwv1.LimitKind]uint64{llmgwv1.LimitKind_LIMIT_KIND_RPM: 60}, term: time.Hour}
		tn := tenantWith("a", &llmgwv1.TenantLimits{Rpm: 60})
		tn.Shadow = shadow
		q, c := newTestQuota(t, map[string]*llmgwv1.Tenant{"a": tn}, f, nil)
		q.renew(context.Background())
		for range 600 {
			c.Add(100 * time.Millisecond)
			tk, refusal, _ := q.Admit(Request{Tenant: "a", Model: "m", Base: "m", Input: 1})
			if refusal != nil {
				refused++
				continue
			}
			served++
			tk.Settle(Usage{Input: 1, Output: 1, Known: true})
		}
		q.flush(context.Background())
		if shadow {
			var shadowRefused uint64
			for _, b := range f.batches {
				for _, r := range b.Rows {
					shadowRefused += r.Counts.ShadowRefused
				}
			}
			return int(shadowRefused), served
		}
		return refused, served
	}
	enforced, _ := count(false)
	shadowed, served := count(true)
	if enforced == 0 || shadowed != enforced || served != 600 {
		t.Errorf("enforcing refused %d; shadow counted %d and served %d of 600; want equal counts and all served", enforced, shadowed, served)
	}
}

// TestFlush: usage is metered per tenant × model × hour, sent in batches
// with rising seq; a failed batch is sent again whole (same seq) before a
// new one; a refused one is dropped; Run flushes once more when stopped.
func TestFlush(t *testing.T) {
	f := &fakeLeader{term: time.Hour}
	reg := prometheus.NewRegistry()
	q, c := newTestQuota(t, map[string]*llmgwv1.Tenant{}, f, reg)
	use := func(tenant string, in, out int) {
		tk, refusal, _ := q.Admit(Request{Tenant: tenant, Model: "m", Base: "m", Input: in})
		if refusal != nil {
			t.Fatal(refusal)
		}
		tk.Settle(Usage{Input: in, Cached: in / 2, Output: out, Known: true})
	}
	use("a", 10, 5)
	use("a", 10, 5)
	use("b", 7, 3)
	f.set(func(f *fakeLeader) { f.fail = errors.New("unavailable") })
	q.flush(context.Background())
	use("a", 1, 1) // after the failed batch: in the next one
	f.set(func(f *fakeLeader) { f.fail = nil })
	q.flush(context.Background())
	if len(f.batches) != 2 || f.batches[0].Seq != 1 || f.batches[1].Seq != 2 {
		t.Fatalf("batches %v: want seq 1 (sent again) then 2", f.batches)
	}
	first := f.batches[0].Rows
	if len(first) != 2 || first[0].Tenant != "a" || first[0].Counts.Requests != 2 || first[0].Counts.InputTokens != 20 ||
		first[0].Counts.CachedTokens != 10 || first[0].Counts.OutputTokens != 10 || first[0].HourUnix != c.Now().Unix()/3600*3600 {
		t.Errorf("first batch rows %v", first)
	}
	if got := testutil.ToFloat64(q.m.tenantTokens.WithLabelValues("a", "output")); got != 11 {
		t.Errorf("tenant a's output tokens metric %v, want 11", got)
	}
	use("a", 1, 1)
	f.set(func(f *fakeLeader) { f.refuse = ErrRefused })
	q.flush(context.Background())
	f.set(func(f *fakeLeader) { f.refuse = nil })
	use("b", 1, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = q.Run(ctx); close(done) }()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10 s of its context's end")
	}
	last := f.batches[len(f.batches)-1]
	if last.Seq != 4 || len(last.Rows) != 1 || last.Rows[0].Tenant != "b" {
		t.Errorf("last batch %v: want seq 4 (3 was refused and dropped) with b's request", last)
	}
}

// TestInputEstimate: without tier 2's tokens the input is estimated from
// the body's bytes, a quarter token a byte until answers teach the
// model's own ratio; a cut stream teaches nothing.
func TestInputEstimate(t *testing.T) {
	q, _ := newTestQuota(t, map[string]*llmgwv1.Tenant{}, &fakeLeader{term: time.Hour}, nil)
	req := Request{Tenant: "a", Model: "m", Base: "m", Bytes: 400}
	tk, _, _ := q.Admit(req)
	if tk.Input() != 100 {
		t.Fatalf("first estimate %d, want 400 bytes / 4", tk.Input())
	}
	tk.Settle(Usage{Input: 10, Output: 1, Known: true, Cut: true})
	tk, _, _ = q.Admit(req)
	if tk.Input() != 100 {
		t.Fatalf("estimate %d after a cut stream, want still 100", tk.Input())
	}
	tk.Settle(Usage{Input: 40, Output: 1, Known: true}) // 0.1 token a byte
	tk, _, _ = q.Admit(req)
	if tk.Input() != 40 {
		t.Errorf("estimate %d after an answer of 40 tokens for 400 bytes, want 40", tk.Input())
	}
}
