package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/vllm"
)

// The ceiling (issue 14, item 5): the cache-hit share an ideal router with
// unbounded caches would reach on a run's own request sequence, where each
// block is a miss only the first time any request of the run holds it. A
// measured hit share reads against it: 0.42 is poor when the ceiling is 0.95
// and near perfect when it is 0.45.
//
// It is computed from the engine's own tokenization (POST /tokenize with the
// request's messages, as the router's tier 2 does), not from words: only the
// engine knows its chat template, and a block boundary off by one token
// would change every hash after it. The router serves no /tokenize, so the
// bench asks an engine directly (Config.TokenizeURL, else the first engine
// Config.Engines lists, else the target itself, which works when the target
// is a vLLM server).

// Tokenizer returns the engine's tokens for a chat: with the generation
// prompt for a request's prompt, or with the final assistant message
// continued (no end of turn) for a prompt followed by its answer, which is
// what the engine's cache holds after decoding it.
type Tokenizer interface {
	Tokenize(ctx context.Context, model string, messages []Message, continueFinal bool) ([]int, error)
}

// maxTokenizeBytes bounds one /tokenize answer: a few MB is a prompt of
// hundreds of thousands of tokens.
const maxTokenizeBytes = 16 << 20

// HTTPTokenizer asks an engine's POST /tokenize (vLLM's API, which the
// simulator serves too).
type HTTPTokenizer struct {
	// URL is the engine's base, http://host:port.
	URL    string
	Client *http.Client
	APIKey string
}

// tokenizeBody is vLLM's chat form of /tokenize.
type tokenizeBody struct {
	Model                string    `json:"model,omitempty"`
	Messages             []Message `json:"messages"`
	AddGenerationPrompt  bool      `json:"add_generation_prompt"`
	ContinueFinalMessage bool      `json:"continue_final_message,omitempty"`
}

// Tokenize implements Tokenizer.
func (t HTTPTokenizer) Tokenize(ctx context.Context, model string, messages []Message, continueFinal bool) ([]int, error) {
	raw, err := json.Marshal(tokenizeBody{Model: model, Messages: messages, AddGenerationPrompt: !continueFinal, ContinueFinalMessage: continueFinal})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(t.URL, "/")+"/tokenize", bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("tokenize at %s: %w", t.URL, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if t.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+t.APIKey)
	}
	resp, err := t.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("tokenize at %s: %w", t.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenizeBytes+1))
	if err != nil {
		return nil, fmt.Errorf("tokenize at %s: %w", t.URL, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("tokenize at %s: status %d: %.200s", t.URL, resp.StatusCode, errorMessage(body))
	}
	if len(body) > maxTokenizeBytes {
		return nil, fmt.Errorf("tokenize at %s: answer over %d bytes", t.URL, maxTokenizeBytes)
	}
	var r struct {
		Count  int   `json:"count"`
		Tokens []int `json:"tokens"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("tokenize at %s: decoding the answer: %w", t.URL, err)
	}
	if r.Tokens == nil || (r.Count != 0 && r.Count != len(r.Tokens)) {
		return nil, fmt.Errorf("tokenize at %s: answer has count %d and %d tokens", t.URL, r.Count, len(r.Tokens))
	}
	return r.Tokens, nil
}

// blockSizeFromMetrics reads vllm:cache_config_info's block_size label from
// an engine's /metrics, the one place vLLM publishes it; 0 when absent.
func blockSizeFromMetrics(ctx context.Context, hc *http.Client, baseURL string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(baseURL, "/")+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s/metrics: status %d", baseURL, resp.StatusCode)
	}
	cc, _, err := vllm.ParseCacheConfig(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("%s/metrics: %w", baseURL, err)
	}
	return cc.BlockSize, nil
}

// ceilingInput is one successful request for the ceiling: its tokens, the
// tokens its engine held after answering it (prompt and answer; nil when
// the answer is not part of a later prompt), and what the engine reported.
type ceilingInput struct {
	start int64 // ordering key: when it was sent
	// firstToken is when its first token came (start + TTFT): its prefill
	// was done by then, so only blocks some other request could have
	// computed before it can be hits.
	firstToken   int64
	prompt       []int
	after        []int
	cachedTokens int
}

// ceiling is what computeCeiling found for a run.
type ceiling struct {
	// share is Σ ideal cached tokens / Σ prompt tokens.
	share float64
	// warmTokens are tokens the engines reported cached beyond what any
	// cold start allows: blocks no other request of the run was sent with
	// before the request's first token.
	warmTokens int
	// coldMisses are the prompt tokens an ideal router must compute.
	coldMisses int
}

// firstTwo keeps the two earliest requests that hold a block: the earliest
// other than a given request is then one of them.
type firstTwo struct {
	start [2]int64
	idx   [2]int
}

func (f *firstTwo) add(start int64, idx int) {
	switch {
	case f.idx[0] < 0 || start < f.start[0]:
		f.start[1], f.idx[1] = f.start[0], f.idx[0]
		f.start[0], f.idx[0] = start, idx
	case f.idx[1] < 0 || start < f.start[1]:
		f.start[1], f.idx[1] = start, idx
	}
}

// otherBefore reports whether a request other than idx holding the block
// was sent before t.
func (f *firstTwo) otherBefore(idx int, t int64) bool {
	for k := range 2 {
		if f.idx[k] >= 0 && f.idx[k] != idx {
			return f.start[k] < t
		}
	}
	return false
}

// computeCeiling runs the ideal router over the requests in the order they
// were sent: a request's cached tokens are its leading blocks that an
// earlier request already held, capped as vLLM caps a hit (the last prompt
// token is always computed, so at most (len-1)/blockSize blocks). A block is
// named by the hash of every token up to its end, as the engine's block
// hashes chain their parents, so equal blocks under different prefixes stay
// apart.
//
// Warmth is judged by a looser bound than the ideal: two requests sent a
// millisecond apart may reach the engine in the other order, so a hit is
// explained by any other request of the run sent before this one's first
// token. What no request can explain was in the cache before the run.
func computeCeiling(in []ceilingInput, blockSize int) ceiling {
	slices.SortStableFunc(in, func(a, b ceilingInput) int {
		switch {
		case a.start < b.start:
			return -1
		case a.start > b.start:
			return 1
		}
		return 0
	})
	seed := maphash.MakeSeed()
	hashes := make([][]uint64, len(in))
	holders := map[uint64]*firstTwo{}
	hold := func(h uint64, i int) {
		f := holders[h]
		if f == nil {
			f = &firstTwo{idx: [2]int{-1, -1}}
			holders[h] = f
		}
		f.add(in[i].start, i)
	}
	for i, r := range in {
		hashes[i] = blockHashes(seed, r.prompt, blockSize)
		for _, h := range hashes[i] {
			hold(h, i)
		}
		for _, h := range blockHashes(seed, r.after, blockSize) {
			hold(h, i)
		}
	}
	var prompt, ideal, warm int
	for i, r := range in {
		limit := 0
		if len(r.prompt) > 0 {
			limit = min(len(hashes[i]), (len(r.prompt)-1)/blockSize)
		}
		// Ideal: held by a request sent earlier (the order is by start,
		// so a holder with a smaller index or an equal start).
		hit := 0
		for hit < limit && holders[hashes[i][hit]].otherBefore(i, r.start+1) {
			hit++
		}
		// Possible: held by any other request sent before the first token.
		possible := hit
		for possible < limit && holders[hashes[i][possible]].otherBefore(i, max(r.firstToken, r.start+1)) {
			possible++
		}
		prompt += len(r.prompt)
		ideal += hit * blockSize
		warm += max(0, r.cachedTokens-possible*blockSize)
	}
	c := ceiling{warmTokens: warm, coldMisses: prompt - ideal}
	if prompt > 0 {
		c.share = float64(ideal) / float64(prompt)
	}
	return c
}

// blockHashes names the full blocks of tokens by their chained hashes.
func blockHashes(seed maphash.Seed, tokens []int, blockSize int) []uint64 {
	n := len(tokens) / blockSize
	out := make([]uint64, n)
	var parent uint64
	buf := make([]byte, 8*(blockSize+1))
	for b := range n {
		binary.LittleEndian.PutUint64(buf, parent)
		for i, t := range tokens[b*blockSize : (b+1)*blockSize] {
			binary.LittleEndian.PutUint64(buf[8*(i+1):], uint64(t))
		}
		parent = maphash.Bytes(seed, buf)
		out[b] = parent
	}
	return out
}

// warmThreshold is the share of a run's cold misses that, reported cached,
// marks the run as started on warm caches. Not zero: requests sent within
// microseconds of each other may reach the engine in the other order, so a
// cold run can beat the ideal by a block here and there; a warm cache beats
// it by every group's first prompt.
const warmThreshold = 0.05

// ErrWarm is wrapped by Run's error when a run it compares with others
// started on caches warmed before it (Config.AllowWarm lets it through).
var ErrWarm = errors.New("warm caches")

// isWarm applies warmThreshold.
func (c ceiling) isWarm() bool {
	return c.warmTokens > 0 && float64(c.warmTokens) > warmThreshold*float64(max(c.coldMisses, 1))
}

// ceilingWorkers tokenize a run's prompts in parallel: a few, since the
// engine answering is one of the fleet and the run is over.
const ceilingWorkers = 4

// addCeiling tokenizes a run's successful requests through the engine at
// tokURL and fills the report's ceiling and warm-start fields.
func addCeiling(ctx context.Context, cfg Config, tokURL string, samples []Sample, rep *Report) error {
	tok := HTTPTokenizer{URL: tokURL, Client: cfg.Client, APIKey: cfg.APIKey}
	bs := cfg.BlockSize
	if bs == 0 {
		mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := blockSizeFromMetrics(mctx, cfg.Client, tokURL)
		cancel()
		if bs = n; bs == 0 {
			bs = 16
			cfg.Logger.Info("block size not published by the tokenizing engine; assuming vLLM's 16 (--block-size)", "engine", tokURL, "err", err)
		}
	}
	var ok []Sample
	for _, s := range samples {
		if s.OK() && len(s.messages) > 0 {
			ok = append(ok, s)
		}
	}
	in := make([]ceilingInput, len(ok))
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range min(ceilingWorkers, len(ok)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(ok) || ctx.Err() != nil {
					return
				}
				var err error
				if in[i], err = ceilingOf(ctx, tok, ok[i]); err != nil {
					cancel(err) // the first error is the one worth reading
					return
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	c := computeCeiling(in, bs)
	rep.CacheHitCeiling = &c.share
	if c.share > 0 {
		r := rep.CacheHitShare / c.share
		rep.HitOverCeiling = &r
	}
	rep.BlockSize = bs
	rep.WarmCacheTokens = c.warmTokens
	rep.WarmStart = c.isWarm()
	return nil
}

// ceilingOf tokenizes one request: its prompt, and for a chat's turn the
// prompt with its answer, which the next turn resends and the engine cached
// as it decoded it.
func ceilingOf(ctx context.Context, tok Tokenizer, s Sample) (ceilingInput, error) {
	p, err := tok.Tokenize(ctx, s.Model, s.messages, false)
	if err != nil {
		return ceilingInput{}, err
	}
	first := s.Start + s.TTFT
	if s.TTFT == 0 {
		first = s.Start + s.E2E
	}
	in := ceilingInput{start: int64(s.Start), firstToken: int64(first), prompt: p, cachedTokens: s.CachedTokens}
	if s.SessionID != "" && s.answer != "" {
		msgs := append(slices.Clip(s.messages), Message{Role: "assistant", Content: s.answer})
		if in.after, err = tok.Tokenize(ctx, s.Model, msgs, true); err != nil {
			return ceilingInput{}, err
		}
	}
	return in, nil
}

// warmError names the runs that started warm, when there is anything to
// compare them with.
func warmError(runs []Report) error {
	if len(runs) < 2 {
		return nil
	}
	var warm []string
	for _, r := range runs {
		if r.WarmStart {
			warm = append(warm, fmt.Sprintf("%s (seed %d: %d tokens cached that no other request of the run had sent before)", r.Label, r.Seed, r.WarmCacheTokens))
		}
	}
	if len(warm) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s started on caches warmed before the run, so its figures are not comparable with the others'; "+
		"let --reset-caches empty the engines' caches before every run (the model's replicas from the control plane at --addr, or --engine URLs), "+
		"or pass --allow-warm to compare anyway", ErrWarm, strings.Join(warm, ", "))
}
