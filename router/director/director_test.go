package director

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/kvindex"
	"github.com/llmgw/llmgw/router/prefix"
	"github.com/llmgw/llmgw/router/scheduler"
	"github.com/llmgw/llmgw/router/tokenize"
	"github.com/llmgw/llmgw/vllm"
)

// The adapter loads the director starts run until Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// table is a fixed routing table.
type table struct {
	eps      map[string][]*endpoint.Endpoint
	models   []*llmgwv1.Model // sorted by name
	adapters map[string]endpoint.AdapterRef
	held     map[string]string // replica -> adapter it holds
	loads    map[string]endpoint.Load
}

func (t *table) Lookup(m string) ([]*endpoint.Endpoint, bool) { e, ok := t.eps[m]; return e, ok }
func (t *table) Models() []*llmgwv1.Model                     { return t.models }
func (t *table) Adapter(n string) (endpoint.AdapterRef, bool) { r, ok := t.adapters[n]; return r, ok }
func (t *table) Holds(e *endpoint.Endpoint, a string) bool    { return t.held[e.ReplicaID] == a }
func (t *table) Changed() <-chan struct{}                     { return make(chan struct{}) }
func (t *table) LoadOf(e *endpoint.Endpoint) endpoint.Load    { return t.loads[e.ReplicaID] }

// sched picks the first candidate and records what it was asked.
type sched struct {
	mu       sync.Mutex
	cands    [][]scheduler.Candidate
	observed []scheduler.Candidate
	// speculation is the profiles' Speculation setting.
	speculation bool
}

func (s *sched) ProfileFor(m *llmgwv1.Model) *scheduler.Profile {
	return &scheduler.Profile{Name: m.GetName(), Speculation: s.speculation}
}
func (s *sched) Pick(_ *scheduler.Profile, _ *scheduler.Request, c []scheduler.Candidate) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cands = append(s.cands, slices.Clone(c))
	if len(c) == 0 {
		return -1
	}
	return 0
}
func (s *sched) Observe(_ *scheduler.Profile, _ *scheduler.Request, c scheduler.Candidate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observed = append(s.observed, c)
}

type noBreakers struct{}

func (noBreakers) Peek(scheduler.Key) *breaker.Breaker { return nil }

var discard = slog.New(slog.DiscardHandler)

func ep(id string) *endpoint.Endpoint {
	return &endpoint.Endpoint{ReplicaID: id, UID: 1, Incarnation: 1, Model: "base", Address: id + ":80"}
}

func baseTable() *table {
	return &table{
		eps: map[string][]*endpoint.Endpoint{"base": {ep("r0"), ep("r1")}, "empty": nil},
		models: []*llmgwv1.Model{{Name: "base", Engine: "vllm"}, {Name: "empty"},
			{Name: "llama", Engine: "llamacpp"}},
		adapters: map[string]endpoint.AdapterRef{"sql": {Model: "base", Index: 1}, "orphan": {Model: "gone"}},
		held:     map[string]string{"r1": "sql"},
	}
}

func TestResolve(t *testing.T) {
	tests := []struct {
		name              string
		model             string
		wantStatus        int // 0: resolved
		wantBase, wantAd  string
		wantIndex         int
		wantEndpoints     []string
		wantModelFromDesc bool
	}{
		{name: "a model", model: "base", wantBase: "base", wantEndpoints: []string{"r0", "r1"}, wantModelFromDesc: true},
		{name: "a model without replicas", model: "empty", wantBase: "empty", wantEndpoints: nil, wantModelFromDesc: true},
		{name: "an adapter goes to its holders", model: "sql", wantBase: "base", wantAd: "sql", wantIndex: 1,
			wantEndpoints: []string{"r1"}, wantModelFromDesc: true},
		{name: "an unknown name", model: "nope", wantStatus: 404},
		{name: "an adapter of a vanished model", model: "orphan", wantStatus: 404},
	}
	d := New(baseTable(), &sched{}, noBreakers{}, nil)
	defer d.Close()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tgt, err := d.Resolve(context.Background(), tt.model, discard)
			if tt.wantStatus != 0 {
				if err == nil || err.Status != tt.wantStatus || tgt.Base != "" {
					t.Fatalf("Resolve = %+v, %v; want %d and no base", tgt, err, tt.wantStatus)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, e := range tgt.Endpoints {
				ids = append(ids, e.ReplicaID)
			}
			if tgt.Name != tt.model || tgt.Base != tt.wantBase || tgt.Adapter != tt.wantAd || tgt.AdapterIndex != tt.wantIndex ||
				!slices.Equal(ids, tt.wantEndpoints) || tgt.Model.GetName() != tt.wantBase {
				t.Fatalf("Resolve = %+v (endpoints %v)", tgt, ids)
			}
		})
	}
}

// TestResolveColdAdapterRefused: without WithAdapters, a cold adapter is a
// 503 at once, and the target still names the model for the metrics.
func TestResolveColdAdapterRefused(t *testing.T) {
	tb := baseTable()
	tb.held = nil
	d := New(tb, &sched{}, noBreakers{}, nil)
	defer d.Close()
	tgt, err := d.Resolve(context.Background(), "sql", discard)
	if err == nil || err.Status != 503 || err.Code != "adapter_unavailable" || err.RetryAfter != 1 {
		t.Fatalf("err = %+v, want 503 adapter_unavailable with Retry-After", err)
	}
	if tgt.Base != "base" || tgt.Adapter != "sql" {
		t.Fatalf("target %+v does not name the model and adapter", tgt)
	}
}

func TestPrepareBody(t *testing.T) {
	tests := []struct {
		name      string
		model     string // a model, or an adapter held by r1
		engine    string
		body      string
		stream    bool
		wantBody  string
		wantStrip bool
		wantErr   string // the param of a 400
	}{
		{"not streamed: as sent", "base", "vllm", `{"model":"base"}`, false, `{"model":"base"}`, false, ""},
		{"stream: usage asked and stripped", "base", "vllm", `{"model":"base","stream":true}`, true,
			`{"stream_options":{"include_usage":true},"model":"base","stream":true}`, true, ""},
		{"stream asking usage itself: as sent", "base", "vllm", `{"model":"base","stream":true,"stream_options":{"include_usage":true}}`, true,
			`{"model":"base","stream":true,"stream_options":{"include_usage":true}}`, false, ""},
		{"stream_options not an object", "base", "vllm", `{"model":"base","stream":true,"stream_options":3}`, true, "", false, "stream_options"},
		{"llama.cpp adapter: base model and lora index", "sql", "llamacpp", `{"model":"sql"}`, false,
			`{"lora":[{"id":1,"scale":1}],"model":"base"}`, false, ""},
		{"vLLM adapter: as sent", "sql", "vllm", `{"model":"sql"}`, false, `{"model":"sql"}`, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := baseTable()
			tb.models[0].Engine = tt.engine
			d := New(tb, &sched{}, noBreakers{}, nil)
			defer d.Close()
			tgt, aerr := d.Resolve(context.Background(), tt.model, discard)
			if aerr != nil {
				t.Fatal(aerr)
			}
			pl, aerr := d.Prepare(context.Background(), tgt, Input{ID: "q", Kind: tokenize.Chat, Body: []byte(tt.body), Stream: tt.stream})
			if tt.wantErr != "" {
				if aerr == nil || aerr.Status != 400 || aerr.Param != tt.wantErr {
					t.Fatalf("Prepare = %v, want a 400 for %s", aerr, tt.wantErr)
				}
				return
			}
			if aerr != nil {
				t.Fatal(aerr)
			}
			if string(pl.Body) != tt.wantBody || pl.StripUsage != tt.wantStrip {
				t.Fatalf("body %s strip %v, want %s strip %v", pl.Body, pl.StripUsage, tt.wantBody, tt.wantStrip)
			}
			// Without tier 2 only the usage at the answer's end is kept.
			if pl.req.KV != nil || pl.tail == nil || pl.tail.max != usageTail {
				t.Fatalf("tier 2 is off, yet KV %+v, tail %+v", pl.req.KV, pl.tail)
			}
		})
	}
}

// TestPreparePrefix: tier 1 keys on the sniffed prompt, within its bound.
func TestPreparePrefix(t *testing.T) {
	d := New(baseTable(), &sched{}, noBreakers{}, nil)
	defer d.Close()
	tgt, _ := d.Resolve(context.Background(), "base", discard)
	prompt := strings.Repeat("p", 200)
	pl, aerr := d.Prepare(context.Background(), tgt, Input{ID: "q", Session: "s1", Body: []byte(`{}`), Prompt: prompt})
	if aerr != nil {
		t.Fatal(aerr)
	}
	want := prefix.Hashes(nil, prompt, prefix.DefaultChunk, maxPrefixChunks)
	if !slices.Equal(pl.req.Prefix, want) || len(want) == 0 || pl.req.Session != "s1" || pl.req.Model != "base" || pl.req.ID != "q" {
		t.Fatalf("scheduler request %+v, want prefix %v", pl.req, want)
	}
	// A capture's view: without tier 2, tier 1's chunks are the blocks,
	// and they are the text's chunks either way.
	if h, size, tokens := pl.Blocks(); !slices.Equal(h, want) || size != prefix.DefaultChunk || tokens {
		t.Fatalf("blocks %v of %d (tokens %v), want tier 1's %v", h, size, tokens, want)
	}
	if h, size := pl.TextChunks(); !slices.Equal(h, want) || size != prefix.DefaultChunk {
		t.Fatalf("text chunks %v of %d, want %v", h, size, want)
	}
}

// index is a KV index that answers what it is told.
type index struct {
	status  map[string]kvindex.Status
	matches []kvindex.Match
	asked   [][]uint64
	// pendingAsked counts LookupPending calls; speculated and withdrawn
	// the replicas Speculate and Withdraw were called for.
	pendingAsked          int
	speculated, withdrawn []kvindex.Replica
}

// Lookup answers matches as confirmed blocks only, as kvindex does: a
// pending part is not counted.
func (x *index) Lookup(h []uint64, dst []kvindex.Match) []kvindex.Match {
	x.asked = append(x.asked, slices.Clone(h))
	for _, m := range x.matches {
		if m.Blocks -= m.Pending; m.Blocks > 0 {
			m.Pending = 0
			dst = append(dst, m)
		}
	}
	return dst
}
func (x *index) LookupPending(h []uint64, dst []kvindex.Match) []kvindex.Match {
	x.pendingAsked++
	x.asked = append(x.asked, slices.Clone(h))
	return append(dst, x.matches...)
}
func (x *index) Speculate(r kvindex.Replica, h []uint64) int {
	x.speculated = append(x.speculated, r)
	return len(h)
}
func (x *index) Withdraw(r kvindex.Replica, _ []uint64)  { x.withdrawn = append(x.withdrawn, r) }
func (x *index) Status(id string) (kvindex.Status, bool) { s, ok := x.status[id]; return s, ok }

type tokenizer struct {
	toks  []int
	err   error
	addrs []string
}

func (k *tokenizer) Tokenize(_ context.Context, addr string, _ tokenize.Request) ([]int, error) {
	k.addrs = append(k.addrs, addr)
	return k.toks, k.err
}

func status(id string, untrusted bool) kvindex.Status {
	return kvindex.Status{Replica: kvindex.Replica{ID: id, UID: 1, Incarnation: 1}, Untrusted: untrusted}
}

func TestPrepareTier2(t *testing.T) {
	toks := make([]int, 40) // two full blocks of 16, and a partial one
	for i := range toks {
		toks[i] = i
	}
	hashes, err := vllm.BlockHashes(vllm.NoneHash("0"), toks, 16, vllm.RequestExtraKeys("", "salt"))
	if err != nil {
		t.Fatal(err)
	}
	var low []uint64
	for _, h := range hashes {
		low = append(low, h.Uint64())
	}
	chat := `{"model":"base","messages":[{"role":"user","content":"hi"}],"cache_salt":"salt"}`
	tests := []struct {
		name      string
		kvEvents  bool
		body      string
		idx       *index
		tok       *tokenizer
		want      *scheduler.KVQuery
		wantAsked bool
	}{
		{name: "model not opted in", body: chat, idx: &index{}, tok: &tokenizer{toks: toks}},
		{name: "no replica reported", kvEvents: true, body: chat, idx: &index{}, tok: &tokenizer{toks: toks},
			want: &scheduler.KVQuery{Fallback: scheduler.KVNoData}},
		{name: "another incarnation reported", kvEvents: true, body: chat,
			idx: &index{status: map[string]kvindex.Status{"r0": {Replica: kvindex.Replica{ID: "r0", UID: 1, Incarnation: 2}}}},
			tok: &tokenizer{toks: toks}, want: &scheduler.KVQuery{Fallback: scheduler.KVNoData}},
		{name: "multimodal", kvEvents: true,
			body: `{"model":"base","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			idx:  &index{status: map[string]kvindex.Status{"r0": status("r0", false)}}, tok: &tokenizer{toks: toks},
			want: &scheduler.KVQuery{Fallback: scheduler.KVMultimodal}},
		{name: "over budget", kvEvents: true, body: chat, idx: &index{status: map[string]kvindex.Status{"r0": status("r0", false)}},
			tok: &tokenizer{err: tokenize.ErrTimeout}, want: &scheduler.KVQuery{Fallback: scheduler.KVTokenizeTimeout}},
		{name: "tokenize failed", kvEvents: true, body: chat, idx: &index{status: map[string]kvindex.Status{"r0": status("r0", false)}},
			tok: &tokenizer{err: io.ErrUnexpectedEOF}, want: &scheduler.KVQuery{Fallback: scheduler.KVTokenizeError}},
		{name: "under one block", kvEvents: true, body: chat, idx: &index{status: map[string]kvindex.Status{"r0": status("r0", false)}},
			tok: &tokenizer{toks: toks[:15]}, want: &scheduler.KVQuery{Fallback: scheduler.KVShortPrompt}},
		{name: "matches of the routed incarnations only; untrusted kept apart", kvEvents: true, body: chat,
			idx: &index{
				status: map[string]kvindex.Status{"r0": status("r0", false), "r1": status("r1", true)},
				matches: []kvindex.Match{
					{Replica: kvindex.Replica{ID: "r0", UID: 1, Incarnation: 1}, Blocks: 2},
					{Replica: kvindex.Replica{ID: "r1", UID: 1, Incarnation: 1}, Blocks: 1, Untrusted: true},
					{Replica: kvindex.Replica{ID: "r9", UID: 1, Incarnation: 1}, Blocks: 2},
				}},
			tok:       &tokenizer{toks: toks},
			want:      &scheduler.KVQuery{Matched: map[string]int{"r0": 2}, Total: 2, Untrusted: map[string]bool{"r1": true}, MinBlocks: 3, BlockSize: 16},
			wantAsked: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := baseTable()
			tb.models[0].KvEvents = tt.kvEvents
			tb.models[0].HashSeed = "0"
			d := New(tb, &sched{}, noBreakers{}, nil, WithKV(tt.idx, tt.tok, 3))
			defer d.Close()
			tgt, _ := d.Resolve(context.Background(), "base", discard)
			pl, aerr := d.Prepare(context.Background(), tgt, Input{Kind: tokenize.Chat, Body: []byte(tt.body)})
			if aerr != nil {
				t.Fatal(aerr)
			}
			got := pl.req.KV
			if (got == nil) != (tt.want == nil) {
				t.Fatalf("KV = %+v, want %+v", got, tt.want)
			}
			if got != nil && (got.Fallback != tt.want.Fallback || got.Total != tt.want.Total || got.MinBlocks != tt.want.MinBlocks ||
				got.BlockSize != tt.want.BlockSize || !mapsEqual(got.Matched, tt.want.Matched) || !mapsEqual(got.Untrusted, tt.want.Untrusted)) {
				t.Fatalf("KV = %+v, want %+v", got, tt.want)
			}
			if tt.wantAsked && (len(tt.idx.asked) != 1 || !slices.Equal(tt.idx.asked[0], low)) {
				t.Fatalf("index asked %v, want vLLM's hashes %v", tt.idx.asked, low)
			}
			// A tier-2 answer keeps enough of the answer to read its cached
			// tokens; any other only its usage.
			if wantTier2 := tt.want != nil && tt.want.Fallback == ""; (pl.tail.max > usageTail) != wantTier2 {
				t.Fatalf("tail of %d bytes kept; tier 2's (above %d): %v", pl.tail.max, usageTail, wantTier2)
			}
		})
	}
}

func mapsEqual[V comparable](a, b map[string]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestTokenizeOnLeastLoaded: tier 2 tokenizes on the replica with the
// least load by the scheduler's formula, a stale reading last.
func TestTokenizeOnLeastLoaded(t *testing.T) {
	tests := []struct {
		name  string
		loads map[string]endpoint.Load
		want  string
	}{
		{"waiting plus running", map[string]endpoint.Load{
			"r0": {Reading: endpoint.Reading{Waiting: 2, Running: 3}}, "r1": {Reading: endpoint.Reading{Waiting: 1, Running: 3}}}, "r1:80"},
		{"own in-flight count leads the scrape", map[string]endpoint.Load{
			"r0": {Reading: endpoint.Reading{Running: 1}, Inflight: 6}, "r1": {Reading: endpoint.Reading{Running: 4}}}, "r1:80"},
		{"saturated only if all are", map[string]endpoint.Load{
			"r0": {Saturated: true}, "r1": {Reading: endpoint.Reading{Waiting: 50}}}, "r1:80"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := baseTable()
			tb.models[0].KvEvents = true
			tb.loads = tt.loads
			tok := &tokenizer{toks: make([]int, 32)}
			d := New(tb, &sched{}, noBreakers{}, nil,
				WithKV(&index{status: map[string]kvindex.Status{"r0": status("r0", false)}}, tok, 1))
			defer d.Close()
			tgt, _ := d.Resolve(context.Background(), "base", discard)
			if _, aerr := d.Prepare(context.Background(), tgt, Input{Kind: tokenize.Chat,
				Body: []byte(`{"model":"base","messages":[{"role":"user","content":"hi"}]}`)}); aerr != nil {
				t.Fatal(aerr)
			}
			if !slices.Equal(tok.addrs, []string{tt.want}) {
				t.Fatalf("tokenized on %v, want %s", tok.addrs, tt.want)
			}
		})
	}
}

// TestPlanRoute: each attempt's candidates leave out those tried, carry
// their load, breaker and adapter; Accepted records the last one chosen.
func TestPlanRoute(t *testing.T) {
	tb := baseTable()
	tb.eps["base"] = append(tb.eps["base"], ep("r2"))
	tb.held = map[string]string{"r0": "sql", "r1": "sql", "r2": "sql"}
	tb.loads = map[string]endpoint.Load{"r1": {Reading: endpoint.Reading{Waiting: 3, KVUsage: 0.5}, Inflight: 2}}
	clk := time.Unix(100, 0)
	bcfg := breaker.DefaultConfig()
	bcfg.Failures, bcfg.Now = 1, func() time.Time { return clk }
	brs, err := breaker.NewSet(bcfg, func(k scheduler.Key) string { return k.ID }, nil)
	if err != nil {
		t.Fatal(err)
	}
	brs.Get(Key(ep("r2"))).Failure() // open, cooling down
	s := &sched{}
	d := New(tb, s, brs, nil)
	defer d.Close()
	tgt, _ := d.Resolve(context.Background(), "sql", discard)
	pl, aerr := d.Prepare(context.Background(), tgt, Input{Body: []byte(`{}`)})
	if aerr != nil {
		t.Fatal(aerr)
	}
	var tried []*endpoint.Endpoint
	for i, want := range []string{"r0", "r1", "r2"} {
		e, key := pl.Next(tried)
		if e == nil || e.ReplicaID != want || key != Key(e) {
			t.Fatalf("attempt %d: %v %+v, want %s", i, e, key, want)
		}
		tried = append(tried, e)
	}
	if e, _ := pl.Next(tried); e != nil {
		t.Fatalf("every replica tried, yet Next gave %s", e.ReplicaID)
	}
	second := s.cands[1]
	if len(s.cands[0]) != 3 || len(second) != 2 || len(s.cands[2]) != 1 {
		t.Fatalf("candidate counts %d %d %d, want 3 2 1", len(s.cands[0]), len(second), len(s.cands[2]))
	}
	if c := second[0]; c.Key.ID != "r1" || c.Waiting != 3 || c.KVUsage != 0.5 || c.Inflight != 2 || !c.HasAdapter || c.Breaker != scheduler.BreakerClosed {
		t.Fatalf("r1's candidate %+v", c)
	}
	if c := s.cands[2][0]; c.Key.ID != "r2" || c.Breaker != scheduler.BreakerCoolingDown {
		t.Fatalf("r2's candidate %+v, want its breaker cooling down", c)
	}
	pl.Accepted()
	if len(s.observed) != 1 || s.observed[0].Key.ID != "r2" {
		t.Fatalf("observed %+v, want the last replica chosen", s.observed)
	}
}

// TestDoneHoldsPredictionAgainstUsage: the engine's cached_tokens, in
// blocks, are counted against what the index promised for that replica.
func TestDoneHoldsPredictionAgainstUsage(t *testing.T) {
	tb := baseTable()
	tb.models[0].KvEvents = true
	idx := &index{status: map[string]kvindex.Status{"r0": status("r0", false)},
		matches: []kvindex.Match{{Replica: kvindex.Replica{ID: "r0", UID: 1, Incarnation: 1}, Blocks: 2}}}
	reg := prometheus.NewRegistry()
	d := New(tb, &sched{}, noBreakers{}, reg, WithKV(idx, &tokenizer{toks: make([]int, 48)}, 1))
	defer d.Close()
	tgt, _ := d.Resolve(context.Background(), "base", discard)
	pl, aerr := d.Prepare(context.Background(), tgt, Input{Kind: tokenize.Chat, Stream: true,
		Body: []byte(`{"model":"base","stream":true,"messages":[{"role":"user","content":"hi"}]}`)})
	if aerr != nil {
		t.Fatal(aerr)
	}
	io.WriteString(pl.Tail(), "data: {\"choices\":[{}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":48,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\ndata: [DONE]\n\n")
	pl.Done("r0", 200)
	if p, r := testkit.Metric(t, reg, "llmgw_router_kv_predicted_blocks_total", nil), testkit.Metric(t, reg, "llmgw_router_kv_reported_blocks_total", nil); p != 2 || r != 1 {
		t.Fatalf("predicted %v reported %v, want 2 and 1", p, r)
	}
	pl.Done("r0", 500) // an error answer reports nothing
	if p := testkit.Metric(t, reg, "llmgw_router_kv_predicted_blocks_total", nil); p != 2 {
		t.Fatalf("a 500 was accounted: predicted %v", p)
	}
}

func TestTailBuffer(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		want   string
	}{
		{"under the bound", []string{"ab", "cd"}, "abcd"},
		{"keeps the end", []string{"abc", "def", "g"}, "defg"},
		{"one write past the bound", []string{"abcdefgh"}, "efgh"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &tailBuffer{max: 4}
			for _, w := range tt.writes {
				if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			if string(b.b) != tt.want {
				t.Fatalf("kept %q, want %q", b.b, tt.want)
			}
		})
	}
}

// TestAttemptsSpeculateAndQueue: with tier 2's answer each attempt records
// the prompt's blocks as pending on its replica (when the profile
// speculates) and its prefill in the ledger the next requests' cost score
// reads; a retry withdraws the failed attempt's, the first byte of the
// answer ends the prefill.
func TestAttemptsSpeculateAndQueue(t *testing.T) {
	toks := make([]int, 40) // 2 full blocks, 40 tokens
	chat := `{"model":"base","messages":[{"role":"user","content":"hi"}]}`
	for _, speculation := range []bool{true, false} {
		t.Run(fmt.Sprint("speculation ", speculation), func(t *testing.T) {
			idx := &index{
				status:  map[string]kvindex.Status{"r0": status("r0", false), "r1": status("r1", false)},
				matches: []kvindex.Match{{Replica: kvindex.Replica{ID: "r1", UID: 1, Incarnation: 1}, Blocks: 1, Pending: 1}},
			}
			tb := baseTable()
			tb.models[0].KvEvents = true
			d := New(tb, &sched{speculation: speculation}, noBreakers{}, nil, WithKV(idx, &tokenizer{toks: toks}, 1))
			defer d.Close()
			prepare := func() *Plan {
				tgt, _ := d.Resolve(context.Background(), "base", discard)
				pl, aerr := d.Prepare(context.Background(), tgt, Input{Kind: tokenize.Chat, Body: []byte(chat)})
				if aerr != nil {
					t.Fatal(aerr)
				}
				return pl
			}
			pl := prepare()
			if got := pl.req.KV.Pending["r1"]; speculation != (got == 1) || speculation != (idx.pendingAsked == 1) {
				t.Fatalf("pending lookups %d, Pending[r1] = %d, with speculation %v", idx.pendingAsked, got, speculation)
			}
			first, _ := pl.Next(nil) // the fake scheduler picks the first: r0
			if first.ReplicaID != "r0" {
				t.Fatalf("first attempt on %s", first.ReplicaID)
			}
			// The next request sees r0's 40 tokens of prefill queued.
			if q := prepare().req.KV.Queued; q["r0"] != 40 || len(q) != 1 {
				t.Fatalf("queued = %v, want r0: 40", q)
			}
			second, _ := pl.Next([]*endpoint.Endpoint{first}) // r0 failed: r1, holding 1 block
			if second.ReplicaID != "r1" {
				t.Fatalf("second attempt on %s", second.ReplicaID)
			}
			// r1's own prefill: all 40 tokens, or 24 when its pending block counts.
			wantR1 := 40.0
			if speculation {
				wantR1 = 40 - 16
			}
			if q := prepare().req.KV.Queued; q["r1"] != wantR1 || len(q) != 1 {
				t.Fatalf("queued = %v, want only r1: %v (r0's withdrawn)", q, wantR1)
			}
			wantSpec, wantWithdrawn := []string{"r0", "r1"}, []string{"r0"}
			if !speculation {
				wantSpec, wantWithdrawn = nil, nil
			}
			if got := replicaIDs(idx.speculated); !slices.Equal(got, wantSpec) {
				t.Errorf("speculated on %v, want %v", got, wantSpec)
			}
			if got := replicaIDs(idx.withdrawn); !slices.Equal(got, wantWithdrawn) {
				t.Errorf("withdrawn on %v, want %v", got, wantWithdrawn)
			}
			// The answer's first byte: the prefill is done.
			_, _ = pl.Tail().Write([]byte("data: {}"))
			if q := prepare().req.KV.Queued; len(q) != 0 {
				t.Fatalf("queued after the first byte = %v, want none", q)
			}
			pl.Done("r1", 200)
			if got := replicaIDs(idx.withdrawn); !slices.Equal(got, wantWithdrawn) {
				t.Errorf("a success withdrew: %v", got)
			}
		})
	}
}

// TestPrefillLedgerAges: a send whose end the director never hears of
// stops counting after maxPrefillAge.
func TestPrefillLedgerAges(t *testing.T) {
	now := time.Unix(100, 0)
	l := newPrefillLedger(func() time.Time { return now })
	eps := []*endpoint.Endpoint{ep("r0"), ep("r1")}
	l.add("r0", 100)
	id := l.add("r0", 50)
	l.add("r1", 7)
	if q := l.queued(eps); q["r0"] != 150 || q["r1"] != 7 {
		t.Fatalf("queued = %v", q)
	}
	l.done("r0", id)
	l.done("r0", id) // again: no-op
	if q := l.queued(eps); q["r0"] != 100 {
		t.Fatalf("queued after done = %v", q)
	}
	now = now.Add(maxPrefillAge + time.Second)
	if q := l.queued(eps); len(q) != 0 || len(l.sends) != 0 {
		t.Fatalf("queued past the age = %v (sends %v)", q, l.sends)
	}
}

func replicaIDs(rs []kvindex.Replica) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

// TestPrepareTier2CacheSizes: tier 2's answer carries, for the cache-pressure
// rule, what each routed incarnation's cache holds by the index and can
// hold by its engine — only for replicas whose engine said its size and
// whose reported incarnation is the one routed.
func TestPrepareTier2CacheSizes(t *testing.T) {
	toks := make([]int, 40)
	tests := []struct {
		name         string
		sizes        map[string]uint64 // endpoints' KVCacheBlocks
		status       map[string]kvindex.Status
		wantHeld     map[string]int
		wantCapacity map[string]int
	}{
		{"both sized", map[string]uint64{"r0": 1024, "r1": 4096},
			map[string]kvindex.Status{"r0": withBlocks(status("r0", false), 700), "r1": withBlocks(status("r1", false), 12)},
			map[string]int{"r0": 700, "r1": 12}, map[string]int{"r0": 1024, "r1": 4096}},
		{"one engine did not say", map[string]uint64{"r0": 1024},
			map[string]kvindex.Status{"r0": withBlocks(status("r0", false), 700), "r1": withBlocks(status("r1", false), 12)},
			map[string]int{"r0": 700}, map[string]int{"r0": 1024}},
		{"another incarnation reported", map[string]uint64{"r0": 1024, "r1": 1024},
			map[string]kvindex.Status{"r0": withBlocks(status("r0", false), 700),
				"r1": {Replica: kvindex.Replica{ID: "r1", UID: 1, Incarnation: 2}, Blocks: 5}},
			map[string]int{"r0": 700}, map[string]int{"r0": 1024}},
		{"no sizes", nil, map[string]kvindex.Status{"r0": withBlocks(status("r0", false), 700)}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := baseTable()
			tb.models[0].KvEvents = true
			tb.models[0].HashSeed = "0"
			for _, e := range tb.eps["base"] {
				e.KVCacheBlocks = tt.sizes[e.ReplicaID]
			}
			d := New(tb, &sched{}, noBreakers{}, nil, WithKV(&index{status: tt.status}, &tokenizer{toks: toks}, 1))
			defer d.Close()
			tgt, _ := d.Resolve(context.Background(), "base", discard)
			pl, aerr := d.Prepare(context.Background(), tgt, Input{Kind: tokenize.Chat,
				Body: []byte(`{"model":"base","messages":[{"role":"user","content":"hi"}]}`)})
			if aerr != nil {
				t.Fatal(aerr)
			}
			q := pl.req.KV
			if q == nil || q.Fallback != "" {
				t.Fatalf("KV = %+v, want an answer", q)
			}
			if !mapsEqual(q.Held, tt.wantHeld) || !mapsEqual(q.Capacity, tt.wantCapacity) {
				t.Fatalf("held %v, capacity %v; want %v, %v", q.Held, q.Capacity, tt.wantHeld, tt.wantCapacity)
			}
		})
	}
}

func withBlocks(s kvindex.Status, n int) kvindex.Status { s.Blocks = n; return s }
