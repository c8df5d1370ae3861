package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/llmgw/llmgw/router/capture"
)

// Replay is the workload of a router's capture (router/capture, design
// §10 "Replay"): each captured request becomes one request, sent at its
// captured time from the run's start (over ReplaySpeed), with a prompt
// made to share with the others exactly the blocks the captured prompts
// shared, of the captured lengths, asking for the captured output length.
// A policy can then be judged on yesterday's traffic instead of a
// synthetic shape.
const Replay = "replay"

// maxCaptureLine bounds one line of a capture: a record of a 128 Ki-token
// prompt's 8,192 block hashes is ~150 KB.
const maxCaptureLine = 4 << 20

// maxReplayTokens and maxReplayBlock bound what a capture's record may ask
// a replay to build: a 1 Mi-token prompt or answer (beyond any model's
// context today), a 4,096-token block.
const (
	maxReplayTokens = 1 << 20
	maxReplayBlock  = 4096
)

// Capture is a capture's records, ready to replay.
type Capture struct {
	// Records are the requests, in arrival order.
	Records []capture.Record
	// TextOnly counts the records tier 2 could not read (the live
	// router's tokenize call timed out or failed), whose blocks are tier
	// 1's text chunks; Lent those of them given the tier-2 blocks their
	// text shared with another record (lendBlocks). The others replay as
	// prompts of their own.
	TextOnly, Lent int
}

// LoadCapture reads the records of a capture's files, in arrival order. The
// files must be of one capture (one salt: block hashes of two captures are
// not comparable), as a router's rotated files are: pass path and its
// rotated path.1, path.2, … to replay all of it. Requests that failed
// before reaching a replica are kept: they were load too. A request only
// tier 1 saw is given the tier-2 blocks it shared, where the capture tells
// them (lendBlocks).
func LoadCapture(paths ...string) (Capture, error) {
	recs, err := loadRecords(paths)
	if err != nil {
		return Capture{}, err
	}
	textOnly, lent := lendBlocks(recs)
	return Capture{Records: recs, TextOnly: textOnly, Lent: lent}, nil
}

func loadRecords(paths []string) ([]capture.Record, error) {
	if len(paths) == 0 {
		return nil, errors.New("--replay: no file")
	}
	var salt string
	var recs []capture.Record
	for _, p := range paths {
		h, rs, err := readCapture(p)
		if err != nil {
			return nil, err
		}
		if salt != "" && h.Salt != salt {
			return nil, fmt.Errorf("--replay: %s is of another capture (salt %s, not %s): its block hashes cannot be compared", p, h.Salt, salt)
		}
		salt = h.Salt
		recs = append(recs, rs...)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("--replay: %s: no request recorded", strings.Join(paths, ", "))
	}
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].T < recs[j].T })
	return recs, nil
}

func readCapture(path string) (capture.Header, []capture.Record, error) {
	var h capture.Header
	f, err := os.Open(path)
	if err != nil {
		return h, nil, fmt.Errorf("--replay: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), maxCaptureLine)
	var recs []capture.Record
	for line := 1; sc.Scan(); line++ {
		if line == 1 {
			if err := json.Unmarshal(sc.Bytes(), &h); err != nil || h.Capture == 0 {
				return h, nil, fmt.Errorf("--replay: %s: not an llmgw capture (its first line is no header)", path)
			}
			if h.Capture != capture.Version {
				return h, nil, fmt.Errorf("--replay: %s: capture format %d; this llmgwctl reads %d", path, h.Capture, capture.Version)
			}
			continue
		}
		var r capture.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return h, nil, fmt.Errorf("--replay: %s line %d: %w", path, line, err)
		}
		if r.T < 0 || r.PromptTokens < 0 || r.PromptBytes < 0 || r.OutputTokens < 0 || r.MaxTokens < 0 || r.BlockSize < 0 || r.ChunkSize < 0 ||
			len(r.Blocks) > 0 && r.BlockSize == 0 || len(r.Chunks) > 0 && r.ChunkSize == 0 {
			return h, nil, fmt.Errorf("--replay: %s line %d: a negative figure, or blocks or chunks without a size", path, line)
		}
		// A replay builds prompts of these sizes: bound them before it does.
		if r.PromptTokens > maxReplayTokens || r.PromptBytes > 8*maxReplayTokens || r.OutputTokens > maxReplayTokens ||
			r.MaxTokens > maxReplayTokens || r.BlockSize > maxReplayBlock || r.ChunkSize > maxReplayBlock || len(r.Blocks)*r.BlockSize > maxReplayTokens*8 {
			return h, nil, fmt.Errorf("--replay: %s line %d: a prompt or answer past %d tokens, or a block past %d", path, line, maxReplayTokens, maxReplayBlock)
		}
		recs = append(recs, r)
	}
	if err := sc.Err(); err != nil {
		return h, nil, fmt.Errorf("--replay: %s: %w", path, err)
	}
	return h, recs, nil
}

// lendBlocks gives each record that only tier 1 saw — its blocks are tier
// 1's chunks of its text (Unit bytes), because the live router's tokenize
// call timed out — the tier-2 blocks that its text shared with a record
// tier 2 did read, and returns how many records were text-only and how
// many of them were lent blocks.
//
// Why: replayed as captured, such a record is words drawn from its
// chunks, a prompt sharing nothing with the tier-2 records of its own
// prefix. The live request found its group's prefix cached; the replayed
// one is ~a whole prompt of new blocks, placed as a new prefix and
// evicting another group's from a replica's cache — a handful of tokenize
// timeouts in an hour's capture moved groups between replicas and cost a
// replay routing the live run did not have (docs/benchmarks.md "Capture
// and replay").
//
// How: tier-2 records carry their text's chunks too (capture.Record.
// Chunks, chained as the blocks are, so one chunk stands for the text up
// to its end). The record sharing the most leading chunks with a
// text-only one lends its leading blocks, as many as fit in the shared
// text: its length in tokens estimated at the lender's tokens per byte,
// less a block for the estimate's error — and at least the blocks the
// live engine reported cached for the request (CachedTokens, which it
// did share), up to two past the estimate. A record whose chunks no
// other shares, or a capture without Chunks (an older router's), is left
// as it was.
func lendBlocks(recs []capture.Record) (textOnly, lent int) {
	type at struct{ rec, pos int }
	lenders := make(map[string]at)
	for i, r := range recs {
		if r.Unit != capture.UnitTokens || r.BlockSize <= 0 || r.ChunkSize <= 0 || r.PromptBytes <= 0 {
			continue
		}
		for pos, c := range r.Chunks {
			if _, ok := lenders[c]; !ok {
				lenders[c] = at{i, pos}
			}
		}
	}
	for i := range recs {
		r := &recs[i]
		if r.Unit != capture.UnitBytes || len(r.Blocks) == 0 {
			continue
		}
		textOnly++
		var from at
		shared := 0
		for k := len(r.Blocks) - 1; k >= 0; k-- {
			if a, ok := lenders[r.Blocks[k]]; ok && recs[a.rec].ChunkSize == r.BlockSize {
				from, shared = a, k+1
				break
			}
		}
		if shared == 0 {
			continue
		}
		d := recs[from.rec]
		perByte := float64(d.PromptTokens) / float64(d.PromptBytes)
		est := int(float64(shared*r.BlockSize)*perByte)/d.BlockSize - 1
		m := max(est, min(r.CachedTokens/d.BlockSize, est+2))
		m = min(m, len(d.Blocks))
		if m <= 0 {
			continue
		}
		if r.PromptTokens == 0 { // no usage (a failure): its body's size at the lender's rate
			r.PromptTokens = min(int(float64(r.PromptBytes)*perByte), maxReplayTokens)
		}
		r.Unit, r.BlockSize, r.Blocks = capture.UnitTokens, d.BlockSize, slices.Clone(d.Blocks[:m])
		lent++
	}
	for i := range recs {
		recs[i].Chunks = nil // read; a replay holds its records for the run
	}
	return textOnly, lent
}

// replay is the Replay workload over its records.
type replay struct {
	cfg  WorkloadConfig
	recs []capture.Record
	// tmpl is the engine's chat template around one user message, once
	// measured (measureTemplate); zero until then.
	tmpl chatTemplate
}

// chatTemplate is what the engine's chat template adds around a replayed
// prompt's one user message, in tokens: head before its text (the start
// of text and the user's header), tail after it (the end of the turn and
// the assistant's header). A captured prompt's length and blocks already
// count the live request's template, so a replay that added its own on
// top would send head + tail more tokens than were captured — all of them
// uncached, ~10 of a ~120-token uncached part on the simulator's Llama
// template, which is 8 % more prefill — and shift every block boundary by
// head against the captured ones.
type chatTemplate struct{ head, tail int }

// measureTemplate asks an engine's tokenizer for the template around one
// user message: the message left open (continue_final_message) is head
// plus its text, closed with the generation prompt it is head, text and
// tail. A one-word text and a two-word text check that a vocabulary word
// is one token, as the simulator's tokenizer makes it and the replay's
// alignment assumes; an engine whose tokenizer does not is an error, and
// the replay then goes on unaligned.
func measureTemplate(ctx context.Context, tok Tokenizer, model string) (chatTemplate, error) {
	probe := strings.Fields(words(rand.New(rand.NewPCG(1, 2)), 2))
	one, err := tok.Tokenize(ctx, model, []Message{{Role: "user", Content: probe[0]}}, true)
	if err != nil {
		return chatTemplate{}, err
	}
	two, err := tok.Tokenize(ctx, model, []Message{{Role: "user", Content: probe[0] + " " + probe[1]}}, true)
	if err != nil {
		return chatTemplate{}, err
	}
	closed, err := tok.Tokenize(ctx, model, []Message{{Role: "user", Content: probe[0]}}, false)
	if err != nil {
		return chatTemplate{}, err
	}
	if len(two)-len(one) != 1 || len(one) < 1 || len(closed) < len(one) {
		return chatTemplate{}, fmt.Errorf("the engine's tokenizer makes %q %d tokens and %q %d: a replayed word is not one token, so the captured blocks cannot be aligned",
			probe[0], len(one), probe[0]+" "+probe[1], len(two))
	}
	return chatTemplate{head: len(one) - 1, tail: len(closed) - len(one)}, nil
}

func (w *replay) Name() string { return Replay }
func (w *replay) Live() int    { return 0 }

// Len and At are the schedule the runner follows instead of its own
// arrivals: request n at At(n) from the run's start.
func (w *replay) Len() int { return len(w.recs) }
func (w *replay) At(n int) time.Duration {
	return time.Duration(w.recs[n].T / w.cfg.ReplaySpeed * float64(time.Second))
}

func (w *replay) Conversation(n int) Conversation {
	if n >= len(w.recs) {
		return &single{done: true}
	}
	r := w.recs[n]
	out := r.OutputTokens
	if out == 0 {
		out = r.MaxTokens // failed, or no usage: what it asked for
	}
	if out == 0 {
		out = w.cfg.MaxTokens
	}
	return &single{req: Request{Model: w.cfg.Model, Messages: []Message{{Role: "user", Content: replayPrompt(r, n, w.tmpl)}},
		SessionID: r.Session, MaxTokens: out, IgnoreEOS: true}}
}

// replayPrompt is a prompt with the captured one's sharing and length. A
// captured block hash stands for its block and everything before it, so
// the words of block i are drawn from a source seeded by block i's hash
// alone: two requests whose captured prompts shared their first k blocks
// get the same first k blocks of words and differ after.
//
// Tier 2's blocks are BlockSize tokens, and the engine's template (t) is
// part of them: the prompt as the engine sees it is t.head tokens, the
// text, t.tail tokens, PromptTokens in all, as captured; text word j (one
// vocabulary word is one token) is token t.head + j and is drawn from the
// source of the block that token falls in, so the replayed blocks are
// the captured blocks exactly, boundaries included. Past the last
// captured block the words are the request's own. Tier 1's chunks are
// BlockSize bytes of text, made of 7-byte words and a space, then the
// request's own words to the captured length.
func replayPrompt(r capture.Record, n int, t chatTemplate) string {
	own := func() *rand.Rand { return rand.New(rand.NewPCG(uint64(n), 1)) }
	var b strings.Builder
	add := func(rng *rand.Rand, k int) {
		if k <= 0 {
			return
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words(rng, k))
	}
	if r.Unit == capture.UnitBytes || r.BlockSize <= 0 {
		tokens := 0
		for _, h := range r.Blocks {
			k := max(1, r.BlockSize/8)
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(fixedWords(rand.New(rand.NewPCG(seedOf(h), 0)), k))
			tokens += k
		}
		rest := r.PromptTokens - tokens
		if r.PromptTokens == 0 && tokens == 0 {
			rest = max(1, r.PromptBytes/8) // no count known: the body's size in words, roughly
		}
		add(own(), rest)
		return b.String()
	}
	bs := r.BlockSize
	total := max(r.PromptTokens, len(r.Blocks)*bs) // no count known: the blocks, at least
	end := max(t.head+1, total-t.tail)             // the text's tokens are [t.head, end)
	for i, h := range r.Blocks {
		lo, hi := max(i*bs, t.head), min((i+1)*bs, end)
		add(rand.New(rand.NewPCG(seedOf(h), 0)), hi-lo)
	}
	add(own(), end-max(len(r.Blocks)*bs, t.head))
	return b.String()
}

// seedOf is a salted hash's seed.
func seedOf(h string) uint64 {
	f := fnv.New64a()
	f.Write([]byte(h))
	return f.Sum64()
}

// fixedWords is n words of 7 letters: 8 bytes each with the space.
func fixedWords(rng *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(n * 8)
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		for range 7 {
			b.WriteByte(byte('a' + rng.IntN(26)))
		}
	}
	return b.String()
}
