package director

import (
	"context"
	"io"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/router/kvindex"
	"github.com/llmgw/llmgw/router/openai"
	"github.com/llmgw/llmgw/router/tokenize"
	"github.com/llmgw/llmgw/vllm"
)

// TestPrepareAPIs: a stream of the Responses or Messages API is sent as
// the client wrote it (neither takes stream_options; both report usage on
// their own), and tier 2 tokenizes each API in its own form, count_tokens
// not at all; vLLM's Messages API takes no cache_salt, so its blocks are
// hashed unsalted.
func TestPrepareAPIs(t *testing.T) {
	toks := make([]int, 32)
	for i := range toks {
		toks[i] = i
	}
	low := func(salt string) []uint64 {
		hs, err := vllm.BlockHashes(vllm.NoneHash("0"), toks, 16, vllm.RequestExtraKeys("", salt))
		if err != nil {
			t.Fatal(err)
		}
		var out []uint64
		for _, h := range hs {
			out = append(out, h.Uint64())
		}
		return out
	}
	tests := []struct {
		name       string
		api        openai.API
		kind       tokenize.Kind
		body       string
		wantStrip  bool
		wantHashes []uint64 // nil: tier 2 not asked
	}{
		{"chat", openai.Chat, tokenize.Chat, `{"model":"base","stream":true,"cache_salt":"s","messages":[{"role":"user","content":"hi"}]}`, true, low("s")},
		{"responses", openai.Responses, tokenize.Responses, `{"model":"base","stream":true,"cache_salt":"s","input":"hi"}`, false, low("s")},
		{"messages", openai.Messages, tokenize.Messages, `{"model":"base","stream":true,"cache_salt":"s","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, false, low("")},
		{"count_tokens", openai.CountTokens, tokenize.None, `{"model":"base","messages":[{"role":"user","content":"hi"}]}`, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := baseTable()
			tb.models[0].KvEvents = true
			tb.models[0].HashSeed = "0"
			idx := &index{status: map[string]kvindex.Status{"r0": status("r0", false)}}
			tok := &tokenizer{toks: toks}
			d := New(tb, &sched{}, noBreakers{}, nil, WithKV(idx, tok, 1))
			defer d.Close()
			tgt, _ := d.Resolve(context.Background(), "base", discard)
			stream := tt.api != openai.CountTokens
			pl, aerr := d.Prepare(context.Background(), tgt, Input{Kind: tt.kind, API: tt.api, Body: []byte(tt.body), Stream: stream})
			if aerr != nil {
				t.Fatal(aerr)
			}
			if pl.StripUsage != tt.wantStrip || (!tt.wantStrip && string(pl.Body) != tt.body) {
				t.Fatalf("body %s strip %v, want the client's (strip %v)", pl.Body, pl.StripUsage, tt.wantStrip)
			}
			if tt.wantHashes == nil {
				if len(tok.addrs) != 0 || pl.req.KV != nil {
					t.Fatalf("tier 2 asked for count_tokens: %v %+v", tok.addrs, pl.req.KV)
				}
				return
			}
			if len(idx.asked) != 1 || !slices.Equal(idx.asked[0], tt.wantHashes) {
				t.Fatalf("index asked %v, want %v", idx.asked, tt.wantHashes)
			}
		})
	}
}

// TestDoneReadsEachAPIsUsage: the output tokens and tier 2's cached
// tokens are read from each API's own usage block.
func TestDoneReadsEachAPIsUsage(t *testing.T) {
	tests := []struct {
		api  openai.API
		tail string
	}{
		{openai.Responses, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":48,\"input_tokens_details\":{\"cached_tokens\":16},\"output_tokens\":7}}}\n\n"},
		{openai.Messages, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":32,\"output_tokens\":7,\"cache_read_input_tokens\":16}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
	}
	for _, tt := range tests {
		t.Run(tt.api.String(), func(t *testing.T) {
			tb := baseTable()
			tb.models[0].KvEvents = true
			idx := &index{status: map[string]kvindex.Status{"r0": status("r0", false)},
				matches: []kvindex.Match{{Replica: kvindex.Replica{ID: "r0", UID: 1, Incarnation: 1}, Blocks: 2}}}
			reg := prometheus.NewRegistry()
			d := New(tb, &sched{}, noBreakers{}, reg, WithKV(idx, &tokenizer{toks: make([]int, 48)}, 1))
			defer d.Close()
			tgt, _ := d.Resolve(context.Background(), "base", discard)
			pl, aerr := d.Prepare(context.Background(), tgt, Input{Kind: tokenize.Messages, API: tt.api, Stream: true,
				Body: []byte(`{"model":"base","stream":true,"max_tokens":9,"input":"hi","messages":[{"role":"user","content":"hi"}]}`)})
			if aerr != nil {
				t.Fatal(aerr)
			}
			io.WriteString(pl.Tail(), tt.tail)
			if u, ok := pl.Usage(); !ok || u.PromptTokens != 48 || u.CompletionTokens != 7 {
				t.Fatalf("usage %+v %v", u, ok)
			}
			if out, ok := pl.Done("r0", 200); !ok || out != 7 {
				t.Fatalf("output tokens %d %v, want 7", out, ok)
			}
			if p, r := testkit.Metric(t, reg, "llmgw_router_kv_predicted_blocks_total", nil), testkit.Metric(t, reg, "llmgw_router_kv_reported_blocks_total", nil); p != 2 || r != 1 {
				t.Fatalf("predicted %v reported %v, want 2 and 1", p, r)
			}
		})
	}
}
