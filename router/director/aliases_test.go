package director

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/tokenize"
)

// aliasTable holds models a, b and c, each with one replica (a0, b0, c0),
// the adapter a-sql held by a0, and model d without replicas.
func aliasTable() *table {
	mk := func(id, model string) *endpoint.Endpoint {
		return &endpoint.Endpoint{ReplicaID: id, UID: 1, Incarnation: 1, Model: model, Address: id + ":80"}
	}
	return &table{
		eps: map[string][]*endpoint.Endpoint{"a": {mk("a0", "a")}, "b": {mk("b0", "b")}, "c": {mk("c0", "c")}, "d": nil},
		models: []*llmgwv1.Model{{Name: "a", Engine: "vllm"}, {Name: "b", Engine: "vllm"}, {Name: "c", Engine: "vllm"},
			{Name: "d", Engine: "vllm"}},
		adapters: map[string]endpoint.AdapterRef{"a-sql": {Model: "a", Index: 0}},
		held:     map[string]string{"a0": "a-sql"},
		loads:    map[string]endpoint.Load{},
	}
}

func alias(name, sticky string, fallbacks []string, targets ...any) *llmgwv1.Alias {
	a := &llmgwv1.Alias{Name: name, Sticky: sticky, Fallbacks: fallbacks}
	for i := 0; i < len(targets); i += 2 {
		a.Targets = append(a.Targets, &llmgwv1.AliasTarget{Target: targets[i].(string), Weight: uint32(targets[i+1].(int))})
	}
	return a
}

// aliasDirector is a director over tb with aliases as, drawing with a
// seeded source.
func aliasDirector(t *testing.T, tb *table, reg prometheus.Registerer, as ...*llmgwv1.Alias) *Director {
	t.Helper()
	m := map[string]*llmgwv1.Alias{}
	for _, a := range as {
		m[a.Name] = a
	}
	rng := rand.New(rand.NewPCG(31, 2026))
	d := New(tb, &sched{}, noBreakers{}, reg, WithAliases(func() map[string]*llmgwv1.Alias { return m }, rng.Float64))
	t.Cleanup(d.Close)
	return d
}

// TestAliasSplit (issue 31): an alias 90/10 over 20,000 requests sends
// each target its share within ±1 percentage point, and the requests
// metric counts the same draws.
func TestAliasSplit(t *testing.T) {
	reg := prometheus.NewRegistry()
	d := aliasDirector(t, aliasTable(), reg, alias("prod", "", nil, "a", 90, "b", 10))
	const n = 20_000
	got := map[string]int{}
	for range n {
		tgt, err := d.ResolveFor(context.Background(), "prod", Caller{Key: "k", Session: "s"}, discard)
		if err != nil {
			t.Fatal(err)
		}
		if tgt.Name != "prod" || tgt.Alias != "prod" || tgt.Base != tgt.ServedName() || len(tgt.Endpoints) != 1 {
			t.Fatalf("target %+v", tgt)
		}
		got[tgt.Base]++
	}
	share := 100 * float64(got["a"]) / n
	t.Logf("90/10 over %d requests: a %d (%.2f %%), b %d", n, got["a"], share, got["b"])
	if math.Abs(share-90) > 1 || got["a"]+got["b"] != n {
		t.Fatalf("a got %.2f %% of %d requests (%v), want 90 ± 1", share, n, got)
	}
	for target, want := range got {
		if m := testkit.Metric(t, reg, "llmgw_router_alias_requests_total", testkit.Labels{"alias": "prod", "target": target}); int(m) != want {
			t.Errorf("requests metric for %s = %v, want %d", target, m, want)
		}
	}
}

// TestAliasSticky (issue 31): sticky by key, every request of a key goes
// to one target (100 %); the keys spread by weight; a weight change
// moves only keys the change must move, onto the target that grew; a
// request without a key is drawn by weight. Sticky by session alike.
func TestAliasSticky(t *testing.T) {
	byKey := alias("prod", "key", nil, "a", 90, "b", 10)
	d := aliasDirector(t, aliasTable(), nil, byKey)
	const keys, per = 2000, 10
	first := map[string]string{}
	onA := 0
	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		for i := range per {
			tgt, err := d.ResolveFor(context.Background(), "prod", Caller{Key: key, Session: fmt.Sprint(i)}, discard)
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				first[key] = tgt.Base
				if tgt.Base == "a" {
					onA++
				}
			} else if tgt.Base != first[key] {
				t.Fatalf("key %s went to %s, then %s", key, first[key], tgt.Base)
			}
		}
	}
	t.Logf("sticky 90/10: %d keys × %d requests, each key on one target; %.1f %% of keys on a", keys, per, 100*float64(onA)/keys)
	if share := 100 * float64(onA) / keys; math.Abs(share-90) > 3 {
		t.Fatalf("%.1f %% of keys on a, want about 90", share)
	}

	// 90/10 to 80/20: only keys of a move, onto b, about a tenth of all.
	byKey.Targets[0].Weight, byKey.Targets[1].Weight = 80, 20
	moved := 0
	for key, was := range first {
		tgt, _ := d.ResolveFor(context.Background(), "prod", Caller{Key: key}, discard)
		if tgt.Base != was {
			if was != "a" {
				t.Fatalf("key %s moved from %s to %s: a grown b takes keys, it gives none", key, was, tgt.Base)
			}
			moved++
		}
	}
	t.Logf("90/10 to 80/20: %.1f %% of keys moved, all from a to b", 100*float64(moved)/keys)
	if share := 100 * float64(moved) / keys; share < 7 || share > 13 {
		t.Fatalf("%.1f %% of keys moved for a 10-point weight change, want about 10", share)
	}

	// Sticky by session; a request without one is drawn by weight.
	bySession := alias("chat", "session", nil, "a", 1, "b", 1)
	d = aliasDirector(t, aliasTable(), nil, bySession)
	for s := range 200 {
		c := Caller{Key: "same-key", Session: fmt.Sprintf("s-%d", s)}
		want, _ := d.ResolveFor(context.Background(), "chat", c, discard)
		for range 5 {
			if got, _ := d.ResolveFor(context.Background(), "chat", c, discard); got.Base != want.Base {
				t.Fatalf("session %s went to %s, then %s", c.Session, want.Base, got.Base)
			}
		}
	}
	seen := map[string]bool{}
	for range 100 {
		tgt, _ := d.ResolveFor(context.Background(), "chat", Caller{Key: "same-key"}, discard)
		seen[tgt.Base] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Fatalf("requests without a session all went to %v, want both targets drawn", seen)
	}
}

// TestAliasFallbackOrder: the candidates are the drawn target, then the
// fallbacks in order; one gone, without a replica or overloaded is passed
// over (and counted); when none can serve, the first overloaded one, else
// the first that exists; a refusal the alias falls back on moves the
// request to the next candidate, and the chain ends.
func TestAliasFallbackOrder(t *testing.T) {
	stale := endpoint.Load{Saturated: true}
	full := endpoint.Load{Reading: endpoint.Reading{KVUsage: 0.97}}
	tests := []struct {
		name  string
		alias *llmgwv1.Alias
		loads map[string]endpoint.Load
		want  string // the first target served
		// then: the refusals and the targets the request falls back to
		refusals []int
		then     []string
		passed   map[string]string // target -> fallback reason counted at resolution
	}{
		{name: "the drawn target serves", alias: alias("p", "", []string{"b", "c"}, "a", 1), want: "a",
			refusals: []int{429, 503}, then: []string{"b", "c"}},
		{name: "the drawn target is a fallback too: not twice", alias: alias("p", "", []string{"a", "b"}, "a", 1), want: "a",
			refusals: []int{400}, then: []string{"b"}},
		{name: "no replica: the next", alias: alias("p", "", []string{"b"}, "d", 1), want: "b",
			passed: map[string]string{"d": reasonNoReplica}},
		{name: "a gone target is not drawn", alias: alias("p", "", []string{"c"}, "gone", 1), want: "c"},
		{name: "a gone fallback is passed over", alias: alias("p", "", []string{"gone", "c"}, "d", 1), want: "c",
			passed: map[string]string{"d": reasonNoReplica, "gone": reasonUnknown}},
		{name: "overloaded (stale): the next", alias: alias("p", "", []string{"b"}, "a", 1), loads: map[string]endpoint.Load{"a0": stale},
			want: "b", passed: map[string]string{"a": reasonOverloaded}},
		{name: "overloaded (KV full): the next", alias: alias("p", "", []string{"b"}, "a", 1), loads: map[string]endpoint.Load{"a0": full},
			want: "b", passed: map[string]string{"a": reasonOverloaded}},
		{name: "all overloaded: the first of them", alias: alias("p", "", []string{"b", "d"}, "a", 1),
			loads: map[string]endpoint.Load{"a0": stale, "b0": full}, want: "a"},
		{name: "none with a replica: the first, for its 503", alias: alias("p", "", nil, "d", 1), want: "d"},
		{name: "an adapter target", alias: alias("p", "", []string{"b"}, "a-sql", 1), want: "a-sql",
			refusals: []int{503}, then: []string{"b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := aliasTable()
			if tt.loads != nil {
				tb.loads = tt.loads
			}
			reg := prometheus.NewRegistry()
			d := aliasDirector(t, tb, reg, tt.alias)
			tgt, err := d.ResolveFor(context.Background(), "p", Caller{}, discard)
			if err != nil || tgt.ServedName() != tt.want {
				t.Fatalf("resolved %q (%v), want %s", tgt.ServedName(), err, tt.want)
			}
			for target, reason := range tt.passed {
				if n := testkit.Metric(t, reg, "llmgw_router_alias_fallbacks_total", testkit.Labels{"alias": "p", "target": target, "reason": reason}); n != 1 {
					t.Errorf("fallbacks{%s, %s} = %v, want 1", target, reason, n)
				}
			}
			for i, code := range tt.refusals {
				next, ok := d.Fallback(context.Background(), tgt, code, true, discard)
				if !ok || next.ServedName() != tt.then[i] || next.Name != "p" {
					t.Fatalf("after %d from %s: %q, %v; want %s", code, tgt.ServedName(), next.ServedName(), ok, tt.then[i])
				}
				tgt = next
			}
			if _, ok := d.Fallback(context.Background(), tgt, 503, true, discard); ok {
				t.Fatalf("a fallback past the last candidate %s", tgt.ServedName())
			}
		})
	}

	// Refusals an alias does not fall back on, and a model's request.
	d := aliasDirector(t, aliasTable(), nil, alias("p", "", []string{"b"}, "a", 1))
	tgt, _ := d.ResolveFor(context.Background(), "p", Caller{}, discard)
	for _, tc := range []struct {
		code     int
		diverted bool
	}{{400, false}, {500, true}, {http.StatusNotFound, true}, {499, false}} {
		if _, ok := d.Fallback(context.Background(), tgt, tc.code, tc.diverted, discard); ok {
			t.Errorf("fell back on %d (diverted %v)", tc.code, tc.diverted)
		}
	}
	if _, ok := d.Fallback(context.Background(), tgt, 502, false, discard); !ok {
		t.Error("no fallback when every replica tried failed (502)")
	}
	model, _ := d.ResolveFor(context.Background(), "a", Caller{}, discard)
	if _, ok := d.Fallback(context.Background(), model, 503, true, discard); ok || model.Alias != "" {
		t.Error("a model's request fell back")
	}
	// An alias whose every target and fallback is gone: 503, naming it.
	d = aliasDirector(t, aliasTable(), nil, alias("p", "", []string{"gone2"}, "gone", 1))
	if _, err := d.ResolveFor(context.Background(), "p", Caller{}, discard); err == nil || err.Status != 503 || err.Message == "" {
		t.Fatalf("an alias of nothing: %v, want 503", err)
	}
}

// TestAliasPrepare: the engine gets the request under its target's name,
// an adapter's own; Divert claims what an alias falls back on only while a
// candidate is left.
func TestAliasPrepare(t *testing.T) {
	d := aliasDirector(t, aliasTable(), nil, alias("p", "", []string{"b"}, "a-sql", 1))
	tgt, err := d.ResolveFor(context.Background(), "p", Caller{}, discard)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := d.Prepare(context.Background(), tgt, Input{Kind: tokenize.Chat, Body: []byte(`{"model":"p","messages":[]}`)})
	if err != nil || string(pl.Body) != `{"model":"a-sql","messages":[]}` {
		t.Fatalf("body %s (%v), want model a-sql", pl.Body, err)
	}
	if pl.Divert() == nil {
		t.Fatal("no Divert with a fallback left")
	}
	next, _ := d.Fallback(context.Background(), tgt, 429, true, discard)
	pl, _ = d.Prepare(context.Background(), next, Input{Kind: tokenize.Chat, Body: []byte(`{"model":"p","messages":[]}`)})
	if string(pl.Body) != `{"model":"b","messages":[]}` || pl.Divert() != nil {
		t.Fatalf("fallback body %s, divert %v; want model b and no divert (nothing left)", pl.Body, pl.Divert() != nil)
	}
	model, _ := d.ResolveFor(context.Background(), "a", Caller{}, discard)
	pl, _ = d.Prepare(context.Background(), model, Input{Kind: tokenize.Chat, Body: []byte(`{"model":"a"}`)})
	if string(pl.Body) != `{"model":"a"}` || pl.Divert() != nil {
		t.Fatalf("a model's body %s, divert %v: want it as sent", pl.Body, pl.Divert() != nil)
	}
}

// TestDivertable: 429 and 503, and a 400 refusing the context length in
// the words of vLLM's releases and llama.cpp's server; nothing else.
func TestDivertable(t *testing.T) {
	tests := []struct {
		code int
		body string
		want bool
	}{
		{429, `{}`, true},
		{503, ``, true},
		{400, `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. Please reduce the length of the input messages.","type":"BadRequestError","code":400}`, true},
		{400, `{"error":{"message":"'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is 4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778).","type":"BadRequestError","code":400}}`, true},
		{400, `{"error":{"message":"You passed 10243 input tokens and requested 6142 output tokens. However, the model's context length is only 16384 tokens, resulting in a maximum input length of 10242 tokens.","type":"BadRequestError","param":"input_tokens","code":400}}`, true},
		{400, `{"error":{"code":400,"message":"request (9412 tokens) exceeds the available context size (8192 tokens), try increasing it","type":"exceed_context_size_error"}}`, true},
		{400, `{"error":{"message":"temperature must be at most 2","type":"BadRequestError"}}`, false},
		{500, `maximum context length`, false},
		{404, `{}`, false},
	}
	for _, tt := range tests {
		if got := divertable(tt.code, []byte(tt.body)); got != tt.want {
			t.Errorf("divertable(%d, %s) = %v, want %v", tt.code, tt.body, got, tt.want)
		}
	}
}

// BenchmarkAliasResolve is an alias's stage 2 against a model's: the draw,
// or the sticky hash, and the candidate's lookup.
func BenchmarkAliasResolve(b *testing.B) {
	tb := aliasTable()
	for _, bc := range []struct {
		name, model string
		c           Caller
	}{{"model", "a", Caller{}}, {"alias", "prod", Caller{}}, {"alias_sticky", "sticky", Caller{Key: "team-key"}}} {
		b.Run(bc.name, func(b *testing.B) {
			m := map[string]*llmgwv1.Alias{"prod": alias("prod", "", []string{"c"}, "a", 90, "b", 10),
				"sticky": alias("sticky", "key", []string{"c"}, "a", 90, "b", 10)}
			d := New(tb, &sched{}, noBreakers{}, nil, WithAliases(func() map[string]*llmgwv1.Alias { return m }, nil))
			defer d.Close()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := d.ResolveFor(context.Background(), bc.model, bc.c, discard); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
