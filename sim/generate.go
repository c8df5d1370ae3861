package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/llmgw/llmgw/vllm"
)

// genRequest is a chat or completion request reduced to what the engine
// needs.
type genRequest struct {
	chat         bool
	model        string // as the client named it, echoed in responses
	tokens       []int
	maxTokens    int
	stream       bool
	includeUsage bool
	cacheSalt    string
	id           string
	// lora is the adapter the request named, "" for the base model.
	lora string
	// priority is vLLM's request priority (lower first).
	priority int
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
	g := genRequest{chat: true, model: s.responseModel(req.Model), tokens: s.tok.Encode(text),
		stream: req.Stream, cacheSalt: req.CacheSalt,
		includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
		id:           "chatcmpl-" + s.baseRequestID(r), lora: s.loraName(req.Model)}
	if !s.setMaxTokens(w, &g, maxTokens) || !s.setPriority(w, &g, req.Priority) {
		return
	}
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
	g := genRequest{model: s.responseModel(req.Model), tokens: tokens, stream: req.Stream,
		cacheSalt:    req.CacheSalt,
		includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
		id:           "cmpl-" + s.baseRequestID(r), lora: s.loraName(req.Model)}
	if !s.setMaxTokens(w, &g, req.MaxTokens) || !s.setPriority(w, &g, req.Priority) {
		return
	}
	s.serveGeneration(w, r, g)
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

// setPriority takes the request's priority, which vLLM's processor
// refuses unless the engine schedules by priority.
func (s *Server) setPriority(w http.ResponseWriter, g *genRequest, p int) bool {
	if p != 0 && s.cfg.SchedulingPolicy != "priority" {
		badRequest(w, "Got priority %d but Priority scheduling is not enabled.", p)
		return false
	}
	g.priority = p
	return true
}

// setMaxTokens applies the default and vLLM's context-length checks.
func (s *Server) setMaxTokens(w http.ResponseWriter, g *genRequest, asked *int) bool {
	n, maxLen := len(g.tokens), s.cfg.MaxModelLen
	if n >= maxLen {
		badRequest(w, "This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", maxLen, n)
		return false
	}
	g.maxTokens = s.cfg.DefaultMaxTokens
	if asked != nil {
		if *asked < 1 {
			badRequest(w, "max_tokens must be at least 1, got %d.", *asked)
			return false
		}
		g.maxTokens = *asked
	}
	if n+g.maxTokens > maxLen {
		if asked == nil {
			g.maxTokens = maxLen - n
			return true
		}
		badRequest(w, "'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
			g.maxTokens, maxLen, n, g.maxTokens, maxLen, n)
		return false
	}
	return true
}

// injectFault applies the fault knobs to an arriving request; true means
// it has been answered (or the server has crashed) and must not be served.
func (s *Server) injectFault(w http.ResponseWriter) (slowdown float64, handled bool) {
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
		writeError(w, vllm.NewError(status, vllm.ErrTypeInternalServer, "injected failure"))
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
	slowdown, handled := s.injectFault(w)
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
		writeError(w, vllm.NewError(http.StatusInternalServerError, vllm.ErrTypeInternalServer, err.Error()))
		return
	}
	arrival := s.clock.Now()
	act := s.lora.arrive(g.lora)
	defer act.done()
	if s.eng.gpu != nil {
		s.serveStepped(w, r, g, hashes, extra, arrival, act)
		return
	}
	ctx, abortedBy := context.WithCancelCause(ctx)
	defer abortedBy(nil)
	seq, err := s.eng.admit(ctx, func() { abortedBy(errEngineAborted) }, hashes, len(g.tokens), g.maxTokens)
	if err != nil {
		if engineAborted(ctx) {
			s.answerAborted(w, g, nil, nil, s.usage(g, 0, 0))
			return
		}
		log.Debug("request left the queue", "err", err)
		s.met.requestSuccess.WithLabelValues(vllm.FinishedAbort).Inc()
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
			s.answerAborted(w, g, nil, nil, s.usage(g, 0, seq.CachedTokens))
			return
		}
		s.met.requestSuccess.WithLabelValues(vllm.FinishedAbort).Inc()
		return
	}
	seq.commit(hashes, g.tokens)
	s.met.promptTokens.Add(float64(len(g.tokens)))

	ids, texts := s.generate(g.tokens, g.maxTokens)
	out := s.newStream(w, g)
	// The first token comes out of prefill; each later one costs a decode
	// step.
	for i := range ids {
		if i == 0 {
			s.met.ttft.Observe(s.clock.Now().Sub(arrival).Seconds())
		} else if err := s.clock.Sleep(ctx, scaled(s.cfg.DecodePerToken)); err != nil {
			if engineAborted(ctx) {
				s.answerAborted(w, g, out, texts[:i], s.usage(g, i, seq.CachedTokens))
				return
			}
			s.met.generationTokens.Add(float64(i))
			s.met.requestSuccess.WithLabelValues(vllm.FinishedAbort).Inc()
			return
		}
		if out != nil {
			last := i == len(ids)-1
			if err := out.token(texts[i], last); err != nil {
				log.Debug("client went away mid-stream", "err", err)
				s.met.generationTokens.Add(float64(i))
				s.met.requestSuccess.WithLabelValues(vllm.FinishedAbort).Inc()
				return
			}
		}
	}
	all := append(append(make([]int, 0, len(g.tokens)+len(ids)), g.tokens...), ids...)
	if allHashes, err := vllm.BlockHashes(s.noneHash, all, s.cfg.BlockSize, extra); err == nil {
		seq.commit(allHashes, all)
	}
	s.met.generationTokens.Add(float64(len(ids)))
	s.met.requestSuccess.WithLabelValues(vllm.FinishedLength).Inc()
	s.met.e2e.Observe(s.clock.Now().Sub(arrival).Seconds())
	log.Debug("request finished", "prompt_tokens", len(g.tokens), "cached_tokens", seq.CachedTokens)

	s.answer(w, g, out, texts, s.usage(g, len(ids), seq.CachedTokens), vllm.FinishedLength)
}

// usage is a request's usage after n completion tokens, cached of its
// prompt tokens from the prefix cache.
func (s *Server) usage(g genRequest, n, cached int) *vllm.Usage {
	u := &vllm.Usage{PromptTokens: len(g.tokens), CompletionTokens: n, TotalTokens: len(g.tokens) + n}
	if s.cfg.EnablePromptTokensDetails {
		u.PromptTokensDetails = &vllm.PromptTokensDetails{CachedTokens: cached}
	}
	return u
}

// engineAborted is whether the engine aborted the request of ctx (a sleep
// in mode abort), rather than its client leaving.
func engineAborted(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), errEngineAborted)
}

// answerAborted ends a request the engine aborted as vLLM does: with the
// tokens it had generated (texts; out has sent them, if streamed) and
// finish_reason "abort".
func (s *Server) answerAborted(w http.ResponseWriter, g genRequest, out streamWriter, texts []string, usage *vllm.Usage) {
	s.met.generationTokens.Add(float64(len(texts)))
	s.met.requestSuccess.WithLabelValues(vllm.FinishedAbort).Inc()
	s.log.Debug("request aborted by the engine", "request_id", g.id, "completion_tokens", len(texts))
	if out != nil {
		if err := out.finish(vllm.FinishedAbort); err != nil {
			return
		}
	}
	s.answer(w, g, out, texts, usage, vllm.FinishedAbort)
}

// newStream is the stream writer of a streamed request, nil otherwise.
func (s *Server) newStream(w http.ResponseWriter, g genRequest) streamWriter {
	if g.stream {
		return newSSE(w, g, s.created)
	}
	return nil
}

// answer ends a served request: the stream's usage and [DONE], or the
// whole completion with its finish reason.
func (s *Server) answer(w http.ResponseWriter, g genRequest, out streamWriter, texts []string, usage *vllm.Usage, finish string) {
	if out != nil {
		if g.includeUsage {
			_ = out.usage(usage)
		}
		_ = out.done()
		return
	}
	var text string
	for _, t := range texts {
		text += t
	}
	if g.chat {
		writeJSON(w, http.StatusOK, vllm.ChatCompletion{ID: g.id, Object: "chat.completion", Created: s.created,
			Model: g.model, Usage: usage, Choices: []vllm.ChatChoice{{
				Message:      vllm.AssistantMessage{Role: "assistant", Content: text, ToolCalls: []json.RawMessage{}},
				FinishReason: &finish, StopReason: json.RawMessage("null"),
			}}})
		return
	}
	writeJSON(w, http.StatusOK, vllm.Completion{ID: g.id, Object: "text_completion", Created: s.created,
		Model: g.model, Usage: usage, Choices: []vllm.CompletionChoice{{Text: text, FinishReason: &finish,
			StopReason: json.RawMessage("null")}}})
}

// streamWriter writes a response as server-sent events, each flushed as
// it is written so the client sees every token when it is produced.
type streamWriter interface {
	token(text string, last bool) error
	// finish ends the choice without a token, with a finish reason: how
	// vLLM's stream ends a request the engine aborted.
	finish(reason string) error
	usage(u *vllm.Usage) error
	done() error
}

type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	g       genRequest
	created int64
	started bool
}

func newSSE(w http.ResponseWriter, g genRequest, created int64) *sse {
	return &sse{w: w, rc: http.NewResponseController(w), g: g, created: created}
}

func (s *sse) event(v any) error {
	var b bytes.Buffer
	b.WriteString("data: ")
	if err := newJSONEncoder(&b).Encode(v); err != nil {
		return fmt.Errorf("encode chunk: %w", err)
	}
	b.WriteString("\n") // Encode ended the line; a blank line ends the event
	if _, err := s.w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("write chunk: %w", err)
	}
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("flush chunk: %w", err)
	}
	return nil
}

func (s *sse) start() error {
	if s.started {
		return nil
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	s.w.WriteHeader(http.StatusOK)
	if !s.g.chat {
		return nil
	}
	// vLLM's first chat chunk announces the role with empty content.
	empty := ""
	return s.event(vllm.ChatCompletionChunk{ID: s.g.id, Object: "chat.completion.chunk", Created: s.created,
		Model: s.g.model, Choices: []vllm.ChatChunkChoice{{Delta: vllm.ChatDelta{Role: "assistant", Content: &empty}}}})
}

// token sends one token; the last carries finish_reason, as vLLM's does.
func (s *sse) token(text string, last bool) error {
	if err := s.start(); err != nil {
		return err
	}
	var finish *string
	var stop json.RawMessage
	if last {
		f := vllm.FinishedLength
		finish, stop = &f, json.RawMessage("null")
	}
	if s.g.chat {
		return s.event(vllm.ChatCompletionChunk{ID: s.g.id, Object: "chat.completion.chunk", Created: s.created,
			Model: s.g.model, Choices: []vllm.ChatChunkChoice{{Delta: vllm.ChatDelta{Content: &text},
				FinishReason: finish, StopReason: stop}}})
	}
	return s.event(vllm.Completion{ID: s.g.id, Object: "text_completion", Created: s.created, Model: s.g.model,
		Choices: []vllm.CompletionChoice{{Text: text, FinishReason: finish, StopReason: stop}}})
}

func (s *sse) finish(reason string) error {
	if err := s.start(); err != nil {
		return err
	}
	empty := ""
	stop := json.RawMessage("null")
	if s.g.chat {
		return s.event(vllm.ChatCompletionChunk{ID: s.g.id, Object: "chat.completion.chunk", Created: s.created,
			Model: s.g.model, Choices: []vllm.ChatChunkChoice{{Delta: vllm.ChatDelta{Content: &empty},
				FinishReason: &reason, StopReason: stop}}})
	}
	return s.event(vllm.Completion{ID: s.g.id, Object: "text_completion", Created: s.created, Model: s.g.model,
		Choices: []vllm.CompletionChoice{{Text: empty, FinishReason: &reason, StopReason: stop}}})
}

// usage sends the stream's usage chunk: no choices, only usage.
func (s *sse) usage(u *vllm.Usage) error {
	if s.g.chat {
		return s.event(vllm.ChatCompletionChunk{ID: s.g.id, Object: "chat.completion.chunk", Created: s.created,
			Model: s.g.model, Choices: []vllm.ChatChunkChoice{}, Usage: u})
	}
	return s.event(vllm.Completion{ID: s.g.id, Object: "text_completion", Created: s.created, Model: s.g.model,
		Choices: []vllm.CompletionChoice{}, Usage: u})
}

func (s *sse) done() error {
	if _, err := fmt.Fprint(s.w, "data: [DONE]\n\n"); err != nil {
		return fmt.Errorf("write done: %w", err)
	}
	return s.rc.Flush()
}

// serveStepped serves a request on the stepped engine (GPU timing): the
// API server's overhead, then the step loop runs it with everything else,
// and each token is written when the step that made it ends.
func (s *Server) serveStepped(w http.ResponseWriter, r *http.Request, g genRequest,
	hashes []vllm.BlockHash, extra vllm.ExtraKeysFunc, arrival time.Time, act *loraActivity) {
	ctx := r.Context()
	abort := func() { s.met.requestSuccess.WithLabelValues(vllm.FinishedAbort).Inc() }
	if err := s.clock.Sleep(ctx, s.eng.api.enter(arrival).Sub(s.clock.Now())); err != nil {
		abort()
		return
	}
	ids, texts := s.generate(g.tokens, g.maxTokens)
	all := append(append(make([]int, 0, len(g.tokens)+len(ids)), g.tokens...), ids...)
	allHashes, err := vllm.BlockHashes(s.noneHash, all, s.cfg.BlockSize, extra)
	if err != nil {
		writeError(w, vllm.NewError(http.StatusInternalServerError, vllm.ErrTypeInternalServer, err.Error()))
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
	out := s.newStream(w, g)
	written, cached := 0, 0
	for {
		select {
		case <-seq.notify:
		case <-ctx.Done():
			if !engineAborted(ctx) {
				s.met.generationTokens.Add(float64(written))
				abort()
				return
			}
		}
		produced, c, scheduledAt, state := s.eng.progress(seq)
		if written == 0 && produced > 0 {
			act.run()
			cached = c
			s.met.queueTime.Observe(scheduledAt.Sub(arrival).Seconds())
			s.met.ttft.Observe(s.clock.Now().Sub(arrival).Seconds())
			s.met.prefixQueries.Add(float64(len(g.tokens)))
			s.met.prefixHits.Add(float64(cached))
			s.met.promptTokens.Add(float64(len(g.tokens)))
		}
		for ; written < produced; written++ {
			if out == nil {
				continue
			}
			if err := out.token(texts[written], written == len(ids)-1); err != nil {
				s.met.generationTokens.Add(float64(written))
				abort()
				return
			}
		}
		if state == seqAborted {
			s.answerAborted(w, g, out, texts[:written], s.usage(g, written, cached))
			return
		}
		if state == seqFinished {
			break
		}
	}
	s.met.generationTokens.Add(float64(len(ids)))
	s.met.requestSuccess.WithLabelValues(vllm.FinishedLength).Inc()
	s.met.e2e.Observe(s.clock.Now().Sub(arrival).Seconds())
	s.answer(w, g, out, texts, s.usage(g, len(ids), cached), vllm.FinishedLength)
}
