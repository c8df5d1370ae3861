package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/router/capture"
)

// writeCapture writes a capture file of salt with recs.
func writeCapture(t *testing.T, dir, name, salt string, recs ...capture.Record) string {
	t.Helper()
	var b strings.Builder
	enc := json.NewEncoder(&b)
	if err := enc.Encode(capture.Header{Capture: capture.Version, Salt: salt}); err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestReplayPromptsShareWhatTheCaptureShared: prompts share exactly the
// leading blocks the captured ones shared, and have the captured lengths.
func TestReplayPromptsShareWhatTheCaptureShared(t *testing.T) {
	a := capture.Record{PromptTokens: 40, Unit: capture.UnitTokens, BlockSize: 16, Blocks: []string{"aa", "bb"}}
	b := capture.Record{PromptTokens: 50, Unit: capture.UnitTokens, BlockSize: 16, Blocks: []string{"aa", "cc", "dd"}}
	c := capture.Record{PromptTokens: 40, Unit: capture.UnitTokens, BlockSize: 16, Blocks: []string{"aa", "bb"}}
	pa, pb, pc := strings.Fields(replayPrompt(a, 0, chatTemplate{})), strings.Fields(replayPrompt(b, 1, chatTemplate{})), strings.Fields(replayPrompt(c, 2, chatTemplate{}))
	if len(pa) != 40 || len(pb) != 50 {
		t.Fatalf("lengths %d, %d words, want 40 and 50", len(pa), len(pb))
	}
	shared := func(x, y []string) int {
		n := 0
		for n < min(len(x), len(y)) && x[n] == y[n] {
			n++
		}
		return n
	}
	// One block in common; the second differs within its 16 words (a
	// chance match of a word or two is the vocabulary's, not a block's).
	if n := shared(pa, pb); n < 16 || n >= 32 {
		t.Fatalf("a and b share %d leading words, want the 16 of their one shared block", n)
	}
	// Two blocks in common; the tails are each request's own.
	if n := shared(pa, pc); n < 32 || n >= 40 {
		t.Fatalf("a and c share %d leading words, want the 32 of their two shared blocks and not their tails", n)
	}
	// Tier 1's chunks: 64 bytes of 7-letter words each.
	d := capture.Record{PromptBytes: 500, Unit: capture.UnitBytes, BlockSize: 64, Blocks: []string{"aa", "bb"}}
	if p := replayPrompt(d, 3, chatTemplate{}); !strings.HasPrefix(p, strings.Join(strings.Fields(p)[:16], " ")) || len(strings.Join(strings.Fields(p)[:16], " ")) != 127 {
		t.Fatalf("tier 1 prompt %q: want 2 chunks of 8 seven-letter words first", p)
	}
}

// wordTokenizer is an engine's tokenizer as the simulator's is: a word
// is one token, and the chat template adds head tokens before the last
// message's text and, closed with the generation prompt, tail after it.
// wide makes every word two tokens instead.
type wordTokenizer struct {
	head, tail int
	wide       bool
}

func (w wordTokenizer) tokens(text string, continueFinal bool) []string {
	out := make([]string, 0, w.head+w.tail)
	for range w.head {
		out = append(out, "<head>")
	}
	for _, f := range strings.Fields(text) {
		out = append(out, f)
		if w.wide {
			out = append(out, f+"#2")
		}
	}
	if !continueFinal {
		for range w.tail {
			out = append(out, "<tail>")
		}
	}
	return out
}

func (w wordTokenizer) Tokenize(_ context.Context, _ string, messages []Message, continueFinal bool) ([]int, error) {
	return make([]int, len(w.tokens(messages[len(messages)-1].Content, continueFinal))), nil
}

// TestReplayPromptsAlignToTheTemplate: with the engine's template
// measured, a replayed prompt as the engine sees it is the captured
// length, and its blocks are the captured blocks exactly: prompts share
// the blocks their captured ones shared, boundary to boundary, and no
// more.
func TestReplayPromptsAlignToTheTemplate(t *testing.T) {
	engine := wordTokenizer{head: 5, tail: 5}
	tmpl, err := measureTemplate(context.Background(), engine, "m")
	if err != nil || tmpl != (chatTemplate{head: 5, tail: 5}) {
		t.Fatalf("measureTemplate = %+v, %v; want head 5, tail 5", tmpl, err)
	}
	blocks := func(r capture.Record, n int) [][]string {
		toks := engine.tokens(replayPrompt(r, n, tmpl), false)
		if len(toks) != r.PromptTokens {
			t.Fatalf("record %d: the engine sees %d tokens, want the captured %d", n, len(toks), r.PromptTokens)
		}
		var out [][]string
		for i := 0; i+16 <= len(toks); i += 16 {
			out = append(out, toks[i:i+16])
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		a, b   capture.Record
		shared int
	}{
		{"one block of three", capture.Record{PromptTokens: 57, Blocks: []string{"x", "y", "z"}},
			capture.Record{PromptTokens: 60, Blocks: []string{"x", "q", "r"}}, 1},
		{"two blocks, tails own", capture.Record{PromptTokens: 40, Blocks: []string{"x", "y"}},
			capture.Record{PromptTokens: 47, Blocks: []string{"x", "y"}}, 2},
		{"none", capture.Record{PromptTokens: 33, Blocks: []string{"x", "y"}},
			capture.Record{PromptTokens: 33, Blocks: []string{"p", "y"}}, 0},
		{"a short prompt: the template's tail inside its last block", capture.Record{PromptTokens: 32, Blocks: []string{"x", "s"}},
			capture.Record{PromptTokens: 32, Blocks: []string{"x", "s"}}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.a.Unit, tc.a.BlockSize, tc.b.Unit, tc.b.BlockSize = capture.UnitTokens, 16, capture.UnitTokens, 16
			ba, bb := blocks(tc.a, 1), blocks(tc.b, 2)
			if len(ba) != len(tc.a.Blocks) || len(bb) != len(tc.b.Blocks) {
				t.Fatalf("%d and %d full blocks, want the captured %d and %d", len(ba), len(bb), len(tc.a.Blocks), len(tc.b.Blocks))
			}
			n := 0
			for n < min(len(ba), len(bb)) && slices.Equal(ba[n], bb[n]) {
				n++
			}
			if n != tc.shared {
				t.Fatalf("%d leading blocks shared, want %d", n, tc.shared)
			}
		})
	}
	if _, err := measureTemplate(context.Background(), wordTokenizer{head: 5, wide: true}, "m"); err == nil || !strings.Contains(err.Error(), "not one token") {
		t.Fatalf("a tokenizer of two tokens a word: %v, want an error saying a word is not one token", err)
	}
}

func TestLoadCapture(t *testing.T) {
	dir := t.TempDir()
	one := writeCapture(t, dir, "c", "s1", capture.Record{T: 2, Model: "m", PromptTokens: 10}, capture.Record{T: 0.5, Model: "m"})
	rotated := writeCapture(t, dir, "c.1", "s1", capture.Record{T: 1, Model: "m"})
	other := writeCapture(t, dir, "d", "s2", capture.Record{T: 1, Model: "m"})
	bad := writeCapture(t, dir, "e", "s1", capture.Record{T: 1, Blocks: []string{"x"}})
	badChunks := writeCapture(t, dir, "e2", "s1", capture.Record{T: 1, Chunks: []string{"x"}})
	empty := writeCapture(t, dir, "f", "s1")
	huge := writeCapture(t, dir, "h", "s1", capture.Record{T: 1, PromptTokens: 1 << 40})
	notCapture := filepath.Join(dir, "g")
	if err := os.WriteFile(notCapture, []byte(`{"hello":1}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	capt, err := LoadCapture(one, rotated)
	recs := capt.Records
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 || recs[0].T != 0.5 || recs[1].T != 1 || recs[2].T != 2 {
		t.Fatalf("records %+v, want three in arrival order", recs)
	}
	for _, tc := range []struct {
		paths []string
		want  string
	}{
		{[]string{one, other}, "is of another capture"},
		{[]string{bad}, "blocks or chunks without a size"},
		{[]string{badChunks}, "blocks or chunks without a size"},
		{[]string{empty}, "no request recorded"},
		{[]string{huge}, "past 1048576 tokens"},
		{[]string{notCapture}, "not an llmgw capture"},
		{[]string{filepath.Join(dir, "missing")}, "no such file"},
		{nil, "no file"},
	} {
		if _, err := LoadCapture(tc.paths...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LoadCapture(%v): %v, want %q", tc.paths, err, tc.want)
		}
	}
}

// TestRunReplay: every captured request is sent once, in capture order, with
// its session and its output length (ignore_eos).
func TestRunReplay(t *testing.T) {
	f := newFakeRouter()
	s := serve(t, f)
	cfg := testConfig(s.URL)
	var recs []capture.Record
	for i := range 12 {
		recs = append(recs, capture.Record{T: float64(i) * 0.05, Model: "captured", Session: []string{"s-a", "s-b"}[i%2],
			PromptTokens: 20, OutputTokens: 3, Unit: capture.UnitTokens, BlockSize: 16, Blocks: []string{"x"}, Status: 200})
	}
	cfg.Workload = WorkloadConfig{Name: Replay, Model: "m", Records: recs, ReplaySpeed: 10}
	cfg.Concurrency, cfg.Requests = 0, len(recs)
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	r := res.Runs[0]
	if r.Requests != 12 || r.Errors != 0 {
		t.Fatalf("requests %d errors %d %v, want 12 and 0", r.Requests, r.Errors, r.ErrorsByKind)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sessions["s-a"]) != 6 || len(f.sessions["s-b"]) != 6 {
		t.Fatalf("sessions %v, want 6 requests under each captured one", f.sessions)
	}
	if f.asked != 36 || f.eos != 12 {
		t.Fatalf("max_tokens %d in all, %d with ignore_eos; want the captured 3 for each of 12, all with ignore_eos", f.asked, f.eos)
	}
	// No engine to measure the template: the captured 20 tokens as words.
	if f.prompt != 12*20 {
		t.Fatalf("%d prompt words in all, want 12 × the captured 20 with no template known", f.prompt)
	}
}

// TestRunReplayAlignsToTheEngine: a replay measures the engine's template
// before it sends, and each prompt then leaves the template's tokens of
// the captured length to it.
func TestRunReplayAlignsToTheEngine(t *testing.T) {
	eng := &fakeEngine{head: 3, tail: 2}
	es := httptest.NewServer(eng)
	defer es.Close()
	f := newFakeRouter()
	cfg := testConfig(serve(t, f).URL)
	cfg.Engines = func(context.Context) ([]string, error) { return []string{es.URL}, nil }
	var recs []capture.Record
	for i := range 4 {
		recs = append(recs, capture.Record{T: float64(i) * 0.01, PromptTokens: 40, OutputTokens: 2, Unit: capture.UnitTokens, BlockSize: 16,
			Blocks: []string{"x", fmt.Sprint(i)}, Status: 200})
	}
	cfg.Workload = WorkloadConfig{Name: Replay, Model: "m", Records: recs, ReplaySpeed: 10}
	cfg.Concurrency, cfg.Requests = 0, len(recs)
	if _, err := Run(context.Background(), cfg); err != nil {
		t.Fatalf("Run: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.prompt != 4*(40-3-2) {
		t.Fatalf("%d prompt words in all, want 4 × (40 captured − 3 − 2 of the engine's template)", f.prompt)
	}
	if eng.cont == 0 {
		t.Fatal("the engine's template was never measured (no tokenization with continue_final_message)")
	}
}

func TestReplayValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  WorkloadConfig
		want string
	}{
		{WorkloadConfig{Name: Replay, Model: "m"}, "needs a capture's records"},
		{WorkloadConfig{Name: Replay, Model: "m", Records: []capture.Record{{}}, ReplaySpeed: -1}, "--replay-speed: must be positive"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if err := (WorkloadConfig{Name: Replay, Model: "m", Records: []capture.Record{{}}}).Validate(); err != nil {
		t.Errorf("speed left at 0 (1): %v", err)
	}
}

// TestLendBlocks: a request only tier 1 saw (its tokenize timed out) is
// given the leading tier-2 blocks of the request whose text shared the
// most leading chunks with it — as many as the shared text covers at the
// lender's tokens per byte less one, at least what its engine reported
// cached within two more — and then replays sharing them.
func TestLendBlocks(t *testing.T) {
	// The lender: 100 tokens in 400 bytes (a token per 4 bytes), 6 blocks
	// of 16 tokens, 6 chunks of 64 bytes.
	lender := capture.Record{PromptTokens: 100, PromptBytes: 400, Unit: capture.UnitTokens, BlockSize: 16,
		Blocks: []string{"b0", "b1", "b2", "b3", "b4", "b5"}, ChunkSize: 64, Chunks: []string{"c0", "c1", "c2", "c3", "c4", "c5"}}
	textOnly := func(tokens, bytes, cached int, chunks ...string) capture.Record {
		return capture.Record{PromptTokens: tokens, PromptBytes: bytes, CachedTokens: cached, Unit: capture.UnitBytes, BlockSize: 64, Blocks: chunks}
	}
	for _, tc := range []struct {
		name       string
		rec        capture.Record
		wantBlocks int // 0: not lent
		wantTokens int
	}{
		{"four chunks shared: 64 tokens, 3 blocks", textOnly(90, 380, 0, "c0", "c1", "c2", "c3", "x4"), 3, 90},
		{"its engine cached 4 blocks", textOnly(90, 380, 64, "c0", "c1", "c2", "c3", "x4"), 4, 90},
		{"cached past the estimate: two more at most", textOnly(200, 800, 160, "c0", "c1", "c2", "c3", "x4"), 5, 200},
		{"all six shared: no more than the lender has", textOnly(120, 500, 160, "c0", "c1", "c2", "c3", "c4", "c5", "x6"), 6, 120},
		{"one chunk shared: under a block", textOnly(90, 380, 0, "c0", "y1"), 0, 90},
		{"nothing shared", textOnly(90, 380, 0, "z0", "z1"), 0, 90},
		{"no usage (a failure): its length from its bytes", textOnly(0, 200, 0, "c0", "c1", "c2", "c3"), 3, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs := []capture.Record{lender, tc.rec}
			recs[0].Chunks = slices.Clone(lender.Chunks)
			n, lent := lendBlocks(recs)
			r := recs[1]
			if n != 1 || recs[0].Chunks != nil {
				t.Fatalf("%d text-only, chunks left %v: want 1, none", n, recs[0].Chunks)
			}
			if tc.wantBlocks == 0 {
				if lent != 0 || r.Unit != capture.UnitBytes || !slices.Equal(r.Blocks, tc.rec.Blocks) {
					t.Fatalf("lent %d, record %+v: want it as it was", lent, r)
				}
				return
			}
			if lent != 1 || r.Unit != capture.UnitTokens || r.BlockSize != 16 || !slices.Equal(r.Blocks, lender.Blocks[:tc.wantBlocks]) || r.PromptTokens != tc.wantTokens {
				t.Fatalf("lent %d, record %+v: want the lender's first %d blocks, %d tokens", lent, r, tc.wantBlocks, tc.wantTokens)
			}
			// Replayed, it shares those blocks' words with the lender.
			a, b := strings.Fields(replayPrompt(recs[0], 0, chatTemplate{})), strings.Fields(replayPrompt(r, 1, chatTemplate{}))
			k := tc.wantBlocks * 16
			// Past them the words differ (a block's worth: one word may agree by chance).
			next := func(w []string) []string { return w[min(k, len(w)):min(k+16, len(w))] }
			if len(b) != tc.wantTokens || !slices.Equal(a[:k], b[:k]) || len(next(a)) > 0 && slices.Equal(next(a), next(b)) {
				t.Fatalf("replayed: %d words, the first %d shared %v: want %d words, exactly %d shared", len(b), k, slices.Equal(a[:k], b[:k]), tc.wantTokens, k)
			}
		})
	}
}

// FuzzLoadCapture: any file is refused with an error or read into records
// within the replay's bounds, whose prompts can then be built.
func FuzzLoadCapture(f *testing.F) {
	hdr := `{"llmgw_capture":1,"salt":"s"}` + "\n"
	f.Add([]byte(hdr + `{"t":1,"prompt_tokens":40,"prompt_bytes":200,"unit":"tokens","block_size":16,"blocks":["a","b"],"chunk_size":64,"chunks":["c0","c1","c2"]}` + "\n" +
		`{"t":2,"prompt_tokens":40,"prompt_bytes":210,"cached_tokens":16,"unit":"bytes","block_size":64,"blocks":["c0","c1","c2","x"]}` + "\n"))
	f.Add([]byte(hdr + `{"t":1,"prompt_bytes":-5,"unit":"bytes","block_size":64,"blocks":["c0"]}` + "\n"))
	f.Add([]byte(hdr + `{"t":1,"unit":"bytes","block_size":1,"blocks":["c0"]}` + "\n" + `{"t":0,"unit":"tokens","block_size":4096,"prompt_bytes":1,"prompt_tokens":1048576,"blocks":["a"],"chunk_size":1,"chunks":["c0"]}` + "\n"))
	f.Add([]byte(hdr + `{"t":1,"unit":"tokens","block_size":16,"prompt_bytes":1,"prompt_tokens":1048576,"blocks":["a","b"],"chunk_size":64,"chunks":["c0","c1"]}` + "\n" +
		`{"t":2,"unit":"bytes","block_size":64,"prompt_bytes":8388608,"blocks":["c0","c1"]}` + "\n"))
	f.Add([]byte(`{"hello":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "c")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		capt, err := LoadCapture(path)
		if err != nil {
			return
		}
		if capt.Lent > capt.TextOnly || capt.TextOnly > len(capt.Records) {
			t.Fatalf("%d lent of %d text-only of %d", capt.Lent, capt.TextOnly, len(capt.Records))
		}
		for n, r := range capt.Records {
			if r.PromptTokens < 0 || r.PromptTokens > maxReplayTokens || r.BlockSize > maxReplayBlock {
				t.Fatalf("record %d out of bounds: %+v", n, r)
			}
			if len(replayPrompt(r, n, chatTemplate{head: 5, tail: 5})) > 16*maxReplayTokens {
				t.Fatalf("record %d: a prompt past its bound", n)
			}
		}
	})
}
