package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/llmgw/llmgw/vllm"
)

// genRequest is a generation request of any API (chat, completions,
// Responses, Messages) reduced to what the engine needs: every API goes
// through the same queue, prefix cache, KV events and timing, and differs
// only in how it reads the request and writes the answer (its responder).
type genRequest struct {
	model     string // as the client named it, echoed in responses
	tokens    []int
	cacheSalt string
	id        string
	// lora is the adapter the request named, "" for the base model.
	lora string
	// priority is vLLM's request priority (lower first).
	priority int
	// created is the request's arrival, in Unix seconds, as vLLM stamps
	// its answers.
	created int64
	// out is what the engine will generate; maxTokens is its length.
	out       *output
	maxTokens int
	resp      responder
	// writeErr writes an error in the API's shape (injected failures).
	writeErr func(http.ResponseWriter, vllm.ErrorResponse)
	// span is the request's llm_request span; nil when not traced (trace.go).
	span *reqSpan
}

// responder writes one API's answer as the engine produces it. Its writes
// to a stream go through an sseWriter, so a client that stops reading
// fails them (StreamWriteTimeout) and the request is aborted.
type responder interface {
	// begin is called when the request enters the engine: a Responses
	// stream opens here.
	begin() error
	// token streams output token i once it is produced; a no-op when not
	// streaming.
	token(i int) error
	// end answers the request once n tokens are out: finish is the
	// output's reason, or "abort" when the engine aborted it.
	end(n int, finish string, u usage) error
}

// usage is a request's token counts, from which each API builds its own
// usage object.
type usage struct {
	prompt, completion, cached int
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req vllm.ChatCompletionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		badRequest(w, "invalid JSON body: %v", err)
		return
	}
	if !s.checkModel(w, req.Model) {
		return
	}
	if len(req.Messages) == 0 {
		badRequest(w, "messages: at least one message is required")
		return
	}
	if req.N != nil && *req.N != 1 {
		badRequest(w, "n: only 1 is supported by the simulator")
		return
	}
	tools, err := parseChatTools(req.Tools, req.ToolChoice)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	if err := s.checkAutoTools(tools); err != nil {
		badRequest(w, "%v", err)
		return
	}
	format, err := parseResponseFormat(req.ResponseFormat)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	lp, err := s.chatLogprobsRequest(req.Logprobs, req.TopLogprobs)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	maxTokens := req.MaxTokens
	if req.MaxCompletionTokens != nil {
		maxTokens = req.MaxCompletionTokens
	}
	text, err := RenderChat(ChatPrompt{Messages: req.Messages,
		AddGenerationPrompt: req.AddGenerationPrompt == nil || *req.AddGenerationPrompt,
		Tools:               req.Tools, TemplateKwargs: req.ChatTemplateKwargs})
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	g := s.newGenRequest(req.Model, s.tok.Encode(text), req.CacheSalt, "chatcmpl-"+s.baseRequestID(r))
	if err := s.prepare(&g, maxTokens, req.Priority, planInput{messages: req.Messages, tools: tools,
		format: format, callIDPrefix: "chatcmpl-tool-"}); err != nil {
		badRequest(w, "%v", err)
		return
	}
	g.resp = s.newOpenAIResponder(w, &g, true, req.Stream, req.StreamOptions, lp)
	s.serveGeneration(w, r, g)
}

func (s *Server) handleCompletion(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req vllm.CompletionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		badRequest(w, "invalid JSON body: %v", err)
		return
	}
	if !s.checkModel(w, req.Model) {
		return
	}
	prompts, err := req.Prompts()
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	if len(prompts) != 1 || (req.N != nil && *req.N != 1) {
		badRequest(w, "prompt: one prompt and n=1 only are supported by the simulator")
		return
	}
	var tokens []int
	if p := prompts[0]; p.IsText {
		tokens = append([]int{TokenBeginOfText}, s.tok.Encode(p.Text)...)
	} else {
		for i, t := range p.Tokens {
			if t < 0 || t > TokenEOT {
				badRequest(w, "prompt[%d]: token id %d out of vocabulary", i, t)
				return
			}
		}
		tokens = p.Tokens
	}
	format, err := parseResponseFormat(req.ResponseFormat)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	lp := logprobsRequest{}
	if req.Logprobs != nil {
		if err := s.checkLogprobs(*req.Logprobs); err != nil {
			badRequest(w, "%v", err)
			return
		}
		lp = logprobsRequest{on: true, top: *req.Logprobs}
	}
	g := s.newGenRequest(req.Model, tokens, req.CacheSalt, "cmpl-"+s.baseRequestID(r))
	if err := s.prepare(&g, req.MaxTokens, req.Priority, planInput{format: format}); err != nil {
		badRequest(w, "%v", err)
		return
	}
	g.resp = s.newOpenAIResponder(w, &g, false, req.Stream, req.StreamOptions, lp)
	s.serveGeneration(w, r, g)
}

// logprobsRequest is whether a request wants logprobs, and how many
// alternatives at each position.
type logprobsRequest struct {
	on  bool
	top int
}

// chatLogprobsRequest reads chat's logprobs and top_logprobs with vLLM's
// checks (ChatCompletionRequest.check_logprobs and --max-logprobs).
func (s *Server) chatLogprobsRequest(on bool, top *int) (logprobsRequest, error) {
	n := 0
	if top != nil {
		n = *top
		if n != 0 && !on {
			return logprobsRequest{}, errors.New("when using `top_logprobs`, `logprobs` must be set to true.") //nolint:staticcheck // ST1005: vLLM's wording
		}
	}
	if !on {
		return logprobsRequest{}, nil
	}
	if err := s.checkLogprobs(n); err != nil {
		return logprobsRequest{}, err
	}
	return logprobsRequest{on: true, top: n}, nil
}

// checkAutoTools refuses tool_choice "auto" without the flags, with vLLM's
// message.
func (s *Server) checkAutoTools(t toolRequest) error {
	if t.mode == toolAuto && !s.cfg.EnableAutoToolChoice {
		return errors.New(`"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set`)
	}
	return nil
}

// newGenRequest starts a request arriving now.
func (s *Server) newGenRequest(model string, tokens []int, salt, id string) genRequest {
	return genRequest{model: s.responseModel(model), tokens: tokens, cacheSalt: salt, id: id,
		lora: s.loraName(model), created: s.clock.Now().Unix(), writeErr: writeError}
}

// prepare applies the context-length and priority checks and plans the
// output; an error is the request's fault (400).
func (s *Server) prepare(g *genRequest, asked *int, priority int, in planInput) error {
	textTokens, budget, err := s.tokenBudget(len(g.tokens), asked)
	if err != nil {
		return err
	}
	if err := s.checkPriority(priority); err != nil {
		return err
	}
	g.priority = priority
	in.prompt, in.textTokens, in.budget = g.tokens, textTokens, budget
	out, err := s.plan(in)
	if err != nil {
		return err
	}
	g.out, g.maxTokens = out, len(out.ids)
	return nil
}

// responseModel is the model name responses carry: the one asked for, or
// the first served name.
func (s *Server) responseModel(asked string) string {
	if asked != "" {
		return asked
	}
	return s.cfg.ServedNames()[0]
}

// baseRequestID is the client's X-Request-Id when given, as vLLM uses it.
func (s *Server) baseRequestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" {
		return id
	}
	return s.newID()
}

// checkPriority refuses a priority unless the engine schedules by it, as
// vLLM's processor does.
func (s *Server) checkPriority(p int) error {
	if p != 0 && s.cfg.SchedulingPolicy != "priority" {
		return fmt.Errorf("Got priority %d but Priority scheduling is not enabled.", p) //nolint:staticcheck // ST1005: vLLM's wording, verbatim
	}
	return nil
}

// tokenBudget applies vLLM's context-length checks to a prompt of n tokens
// and the max tokens asked: text is a text answer's length (the asked
// count, else --sim-default-max-tokens, within the context), budget what an
// output that ends by itself may take (the asked count, else the rest of
// the context, vLLM's default).
func (s *Server) tokenBudget(n int, asked *int) (text, budget int, err error) {
	maxLen := s.cfg.MaxModelLen
	if n >= maxLen {
		return 0, 0, fmt.Errorf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", maxLen, n) //nolint:staticcheck // ST1005: vLLM's wording
	}
	if asked == nil {
		return min(s.cfg.DefaultMaxTokens, maxLen-n), maxLen - n, nil
	}
	if *asked < 1 {
		return 0, 0, fmt.Errorf("max_tokens must be at least 1, got %d.", *asked) //nolint:staticcheck // ST1005: vLLM's wording
	}
	if n+*asked > maxLen {
		return 0, 0, fmt.Errorf("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).", //nolint:staticcheck // ST1005: vLLM's wording
			*asked, maxLen, n, *asked, maxLen, n)
	}
	return *asked, *asked, nil
}

// injectFault applies the fault knobs to an arriving request; true means
// it has been answered (or the server has crashed) and must not be served.
func (s *Server) injectFault(w http.ResponseWriter, g genRequest) (slowdown float64, handled bool) {
	s.mu.Lock()
	f := s.faults
	s.arrived++
	crash := f.CrashAfter > 0 && s.arrived >= f.CrashAfter
	fail := f.FailRate > 0 && s.rng.Float64() < f.FailRate
	s.mu.Unlock()
	if crash {
		s.crashOnce.Do(func() { close(s.crashed) })
		// Drop the connection without an answer, as a dying process does.
		panic(http.ErrAbortHandler)
	}
	if fail {
		status := f.FailStatus
		if status == 0 {
			status = http.StatusInternalServerError
		}
		g.writeErr(w, vllm.NewError(status, vllm.ErrTypeInternalServer, "injected failure"))
		return 0, true
	}
	if f.Slowdown == 0 {
		f.Slowdown = 1
	}
	return f.Slowdown, false
}

// serveGeneration runs a request through the engine: queue for a slot,
// prefill what the cache does not hold, decode token by token, answer.
func (s *Server) serveGeneration(w http.ResponseWriter, r *http.Request, g genRequest) {
	slowdown, handled := s.injectFault(w, g)
	if handled {
		return
	}
	ctx := r.Context()
	log := s.log.With("request_id", g.id)
	// The adapter's name is on every block's hash (vLLM since #27211), so
	// an adapter's prefixes never match the base model's.
	extra := vllm.RequestExtraKeys(g.lora, g.cacheSalt)
	hashes, err := vllm.BlockHashes(s.noneHash, g.tokens, s.cfg.BlockSize, extra)
	if err != nil {
		g.writeErr(w, vllm.NewError(http.StatusInternalServerError, vllm.ErrTypeInternalServer, err.Error()))
		return
	}
	arrival := s.clock.Now()
	g.span = s.startSpan(r, g, arrival)
	act := s.lora.arrive(g.lora)
	defer act.done()
	if err := g.resp.begin(); err != nil {
		s.clientGone(g, 0, err)
		return
	}
	if s.eng.gpu != nil {
		s.serveStepped(r, g, hashes, extra, arrival, act)
		return
	}
	ctx, abortedBy := context.WithCancelCause(ctx)
	defer abortedBy(nil)
	seq, err := s.eng.admit(ctx, func() { abortedBy(errEngineAborted) }, hashes, len(g.tokens), g.maxTokens)
	if err != nil {
		if engineAborted(ctx) {
			s.answerAborted(g, 0, 0)
			return
		}
		s.clientGone(g, 0, err)
		return
	}
	defer seq.release()
	act.run()
	if g.lora != "" {
		id, _ := s.lora.lookup(g.lora) // 0 if unloaded since: the events then say so
		seq.setLoRA(g.lora, id)
	}
	s.met.queueTime.Observe(s.clock.Now().Sub(arrival).Seconds())
	s.met.prefixQueries.Add(float64(len(g.tokens)))
	s.met.prefixHits.Add(float64(seq.CachedTokens))

	scaled := func(d time.Duration) time.Duration { return time.Duration(float64(d) * slowdown) }
	uncached := len(g.tokens) - seq.CachedTokens
	if err := s.clock.Sleep(ctx, scaled(time.Duration(uncached)*s.cfg.PrefillPerToken)); err != nil {
		if engineAborted(ctx) {
			s.answerAborted(g, 0, seq.CachedTokens)
			return
		}
		s.clientGone(g, 0, err)
		return
	}
	seq.commit(hashes, g.tokens)
	s.met.promptTokens.Add(float64(len(g.tokens)))

	// The first token comes out of prefill; each later one costs a decode
	// step.
	for i := range g.maxTokens {
		if i == 0 {
			s.met.ttft.Observe(s.clock.Now().Sub(arrival).Seconds())
			g.span.firstToken(s.clock.Now())
		} else if err := s.clock.Sleep(ctx, scaled(s.cfg.DecodePerToken)); err != nil {
			if engineAborted(ctx) {
				s.answerAborted(g, i, seq.CachedTokens)
				return
			}
			s.clientGone(g, i, err)
			return
		}
		if err := g.resp.token(i); err != nil {
			s.clientGone(g, i, err)
			return
		}
	}
	all := append(append(make([]int, 0, len(g.tokens)+g.maxTokens), g.tokens...), g.out.ids...)
	if allHashes, err := vllm.BlockHashes(s.noneHash, all, s.cfg.BlockSize, extra); err == nil {
		seq.commit(allHashes, all)
	}
	s.finished(g, arrival, seq.CachedTokens)
	log.Debug("request finished", "prompt_tokens", len(g.tokens), "cached_tokens", seq.CachedTokens)
}

// finished counts a request the engine completed and answers it.
func (s *Server) finished(g genRequest, arrival time.Time, cached int) {
	s.met.generationTokens.Add(float64(g.maxTokens))
	s.met.requestSuccess.WithLabelValues(g.out.finish).Inc()
	s.met.e2e.Observe(s.clock.Now().Sub(arrival).Seconds())
	u := usage{prompt: len(g.tokens), completion: g.maxTokens, cached: cached}
	_ = g.resp.end(g.maxTokens, g.out.finish, u)
	g.span.end(s.clock.Now(), u, g.out.finish, nil)
}

// clientGone counts a request whose client went away, or stopped reading
// its stream, after n tokens: the engine drops it, as vLLM aborts a request
// on disconnect.
func (s *Server) clientGone(g genRequest, n int, err error) {
	s.met.generationTokens.Add(float64(n))
	s.met.aborted.WithLabelValues(AbortReasonClient).Inc()
	s.log.Debug("client went away; request aborted", "request_id", g.id, "completion_tokens", n, "err", err)
	g.span.end(s.clock.Now(), usage{prompt: len(g.tokens), completion: n}, vllm.FinishedAbort, err)
}

// usage is a request's OpenAI usage after n completion tokens, cached of
// its prompt tokens from the prefix cache: prompt_tokens_details only with
// --enable-prompt-tokens-details, as vLLM.
func (s *Server) usage(u usage) *vllm.Usage {
	out := &vllm.Usage{PromptTokens: u.prompt, CompletionTokens: u.completion, TotalTokens: u.prompt + u.completion}
	if s.cfg.EnablePromptTokensDetails {
		out.PromptTokensDetails = &vllm.PromptTokensDetails{CachedTokens: u.cached}
	}
	return out
}

// engineAborted is whether the engine aborted the request of ctx (a sleep
// in mode abort), rather than its client leaving.
func engineAborted(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), errEngineAborted)
}

// answerAborted ends a request the engine aborted as vLLM does: with the
// n tokens it had generated (already streamed, if streaming) and
// finish_reason "abort".
func (s *Server) answerAborted(g genRequest, n, cached int) {
	s.met.generationTokens.Add(float64(n))
	s.met.requestSuccess.WithLabelValues(vllm.FinishedAbort).Inc()
	s.met.aborted.WithLabelValues(AbortReasonEngine).Inc()
	s.log.Debug("request aborted by the engine", "request_id", g.id, "completion_tokens", n)
	u := usage{prompt: len(g.tokens), completion: n, cached: cached}
	_ = g.resp.end(n, vllm.FinishedAbort, u)
	g.span.end(s.clock.Now(), u, vllm.FinishedAbort, nil)
}

// serveStepped serves a request on the stepped engine (GPU timing): the
// API server's overhead, then the step loop runs it with everything else,
// and each token is written when the step that made it ends.
func (s *Server) serveStepped(r *http.Request, g genRequest,
	hashes []vllm.BlockHash, extra vllm.ExtraKeysFunc, arrival time.Time, act *loraActivity) {
	ctx := r.Context()
	if err := s.clock.Sleep(ctx, s.eng.api.enter(arrival).Sub(s.clock.Now())); err != nil {
		s.clientGone(g, 0, err)
		return
	}
	all := append(append(make([]int, 0, len(g.tokens)+g.maxTokens), g.tokens...), g.out.ids...)
	allHashes, err := vllm.BlockHashes(s.noneHash, all, s.cfg.BlockSize, extra)
	if err != nil {
		s.clientGone(g, 0, err) // cannot happen: the prompt's hashes were computed
		return
	}
	var loraID int
	if g.lora != "" {
		loraID, _ = s.lora.lookup(g.lora) // 0 if unloaded since: the events then say so
	}
	ctx, abortedBy := context.WithCancelCause(ctx)
	defer abortedBy(nil)
	seq := s.eng.submit(func() { abortedBy(errEngineAborted) }, hashes, allHashes, all, len(g.tokens), g.maxTokens, g.lora, loraID, g.priority)
	defer s.eng.abort(seq) // a no-op once finished
	written, cached := 0, 0
	for {
		select {
		case <-seq.notify:
		case <-ctx.Done():
			if !engineAborted(ctx) {
				s.clientGone(g, written, context.Cause(ctx))
				return
			}
		}
		produced, c, scheduledAt, state := s.eng.progress(seq)
		if written == 0 && produced > 0 {
			act.run()
			cached = c
			s.met.queueTime.Observe(scheduledAt.Sub(arrival).Seconds())
			s.met.ttft.Observe(s.clock.Now().Sub(arrival).Seconds())
			g.span.firstToken(s.clock.Now())
			s.met.prefixQueries.Add(float64(len(g.tokens)))
			s.met.prefixHits.Add(float64(cached))
			s.met.promptTokens.Add(float64(len(g.tokens)))
		}
		for ; written < produced; written++ {
			if err := g.resp.token(written); err != nil {
				s.clientGone(g, written, err)
				return
			}
		}
		if state == seqAborted {
			s.answerAborted(g, written, cached)
			return
		}
		if state == seqFinished {
			break
		}
	}
	s.finished(g, arrival, cached)
}
