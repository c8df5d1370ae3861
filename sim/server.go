package sim

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmgw/llmgw/vllm"
)

// ErrCrashed is returned by Run and Serve when an injected crash
// (Faults.CrashAfter) killed the server; the command exits non-zero on it,
// as a crashed engine would.
var ErrCrashed = errors.New("sim: crashed by fault injection")

const (
	// maxBodyBytes bounds a request body; vLLM has no limit of its own,
	// but a simulator on a laptop should not be made to buffer gigabytes.
	maxBodyBytes = 32 << 20
	// shutdownGrace is how long Run waits for cancelled handlers to return.
	shutdownGrace = 5 * time.Second
)

// Server is one simulated vLLM engine and its HTTP API.
type Server struct {
	cfg      Config
	log      *slog.Logger
	clock    Clock
	tok      *Tokenizer
	eng      *engine
	kv       *kvPublisher // nil unless --kv-events-config enables events
	met      *metrics
	sleep    *sleeper
	lora     *loraSet
	noneHash vllm.BlockHash
	handler  http.Handler
	tracer   trace.Tracer // nil: requests are not traced (trace.go)
	// words are the pieces generated text is drawn from, and wordIDs
	// their token ids.
	wordIDs []int

	mu      sync.Mutex // guards rng, faults and arrived
	rng     *rand.Rand
	faults  Faults
	arrived int

	crashOnce sync.Once
	crashed   chan struct{}
}

// Option changes how New builds a Server; for tests and for wiring.
type Option func(*Server)

// WithClock replaces the wall clock (tests hold requests at chosen steps
// with it).
func WithClock(c Clock) Option { return func(s *Server) { s.clock = c } }

// WithCacheObserver tells o of every change of the prefix cache, in the
// shape of vLLM's KV events: the hook the KV-event publisher will use.
func WithCacheObserver(o CacheObserver) Option {
	return func(s *Server) { s.eng = newEngine(&s.cfg, o) }
}

// New builds a server from a valid configuration. It listens only in Run
// or Serve.
func New(cfg Config, log *slog.Logger, opts ...Option) (*Server, error) {
	cfg.Derive()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sim: config: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:     cfg,
		log:     log.With("model", cfg.ServedNames()[0]),
		clock:   realClock{},
		tok:     NewTokenizer(),
		rng:     rand.New(rand.NewPCG(uint64(cfg.Seed), 0x6c6c6d6777)),
		faults:  cfg.Faults,
		crashed: make(chan struct{}),
	}
	s.eng = newEngine(&s.cfg, nil)
	if kv, _ := cfg.KVEvents(); kv.Enabled() { // valid: checked above
		s.kv = newKVPublisher(&s.cfg, kv, s.log, func() time.Time { return s.clock.Now() }, s.currentFaults)
		s.eng = newEngine(&s.cfg, s.kv)
	}
	for _, o := range opts {
		o(s)
	}
	if cfg.PythonHashSeed == "" || cfg.PythonHashSeed == "random" {
		// vLLM draws NONE_HASH from os.urandom without a seed, so hashes
		// differ per process; so do ours.
		_, _ = crand.Read(s.noneHash[:])
		s.log.Warn("PYTHONHASHSEED is not set; block hashes will not be reproducible across replicas")
	} else {
		s.noneHash = vllm.NoneHash(cfg.PythonHashSeed)
	}
	s.met = newMetrics(&s.cfg, s.eng)
	s.sleep = newSleeper(prometheus.Labels{vllm.LabelModelName: cfg.ServedNames()[0], vllm.LabelEngine: "0"})
	s.met.reg.MustRegister(s.sleep.state)
	s.lora = newLoRASet(&s.cfg, func() float64 { return float64(s.clock.Now().UnixNano()) / 1e9 })
	if err := s.lora.loadStatic(cfg.LoRAModules); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	if cfg.EnableLoRA {
		// vLLM exposes it only with LoRA enabled.
		s.met.reg.MustRegister(newLoRAInfo(s.lora))
	}
	for _, w := range generatedWords {
		s.wordIDs = append(s.wordIDs, s.tok.Encode(" "+w)...)
	}
	s.handler = s.routes()
	return s, nil
}

// Handler is the server's HTTP API, for tests that serve it themselves.
// With GPU timing only Serve (or Run) runs the step loop, so requests
// through Handler alone wait for it.
func (s *Server) Handler() http.Handler { return s.handler }

// Run "loads the model" for its start time (Config.LoadTimes), listens on
// Host:Port and serves until ctx ends or an injected crash. A stop while
// loading returns nil. Until it listens, connections are refused, as
// vLLM's are while its engine core starts: vLLM binds its port at once but
// listens only once the engine is up.
func (s *Server) Run(ctx context.Context) error {
	start := s.cfg.LoadTimes().Start
	s.log.Info("loading simulated model", "load_time", start)
	if err := s.clock.Sleep(ctx, start); err != nil {
		return nil
	}
	addr := net.JoinHostPort(s.cfg.Host, strconv.Itoa(s.cfg.Port))
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("sim: listen on %s: %w", addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln (which it closes) until ctx ends or an injected
// crash, and returns only once every handler has returned.
//
// Shutdown order: in-flight requests are cancelled first (each handler
// then releases its sequence and returns, as vLLM aborts requests on
// SIGTERM), the listener is closed and idle connections dropped, and after
// shutdownGrace whatever is left is closed forcibly; the KV-event
// publisher, if any, stops last, once nothing can change the cache.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	tp, err := s.startTracing()
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer func() { // last: the spans of the requests cancelled below
		shCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		_ = tp.Shutdown(shCtx)
	}()
	stopKV, err := s.startKV()
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer stopKV() // after the HTTP server has stopped: see startKV
	stopSteps := s.startSteps()
	defer stopSteps() // before stopKV: the last step's cache changes are published
	reqCtx, cancelReqs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReqs()
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return reqCtx },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.log.Info("simulated engine serving", "addr", ln.Addr().String())
	select {
	case <-ctx.Done():
		cancelReqs()
		shCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		if err := srv.Shutdown(shCtx); err != nil {
			_ = srv.Close()
		}
		<-errc
		s.log.Info("simulated engine stopped")
		return nil
	case <-s.crashed:
		_ = srv.Close()
		cancelReqs()
		<-errc
		s.log.Error("simulated engine crashed (fault injection)")
		return ErrCrashed
	case err := <-errc:
		return fmt.Errorf("sim: serve: %w", err)
	}
}

// startSteps starts the step loop of a GPU-timed engine; stop ends it and
// returns once it has. Simple timing has no loop.
func (s *Server) startSteps() (stop func()) {
	if s.eng.gpu == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.eng.runSteps(ctx, s.clock, func() float64 { return s.currentFaults().Slowdown })
	}()
	return func() { cancel(); <-done }
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	mux.HandleFunc("POST /v1/completions", s.handleCompletion)
	mux.HandleFunc("POST /v1/responses", s.handleResponses)
	mux.HandleFunc("POST /v1/messages", s.handleMessages)
	mux.HandleFunc("POST /v1/messages/count_tokens", s.handleCountTokens)
	mux.HandleFunc("POST /v1/embeddings", s.handleEmbeddings)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("POST /tokenize", s.handleTokenize)
	mux.HandleFunc("POST /detokenize", s.handleDetokenize)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("POST /reset_prefix_cache", s.handleResetPrefixCache)
	if s.cfg.DevMode {
		// vLLM serves sleep mode's routes only with VLLM_SERVER_DEV_MODE.
		mux.HandleFunc("POST /sleep", s.handleSleep)
		mux.HandleFunc("POST /wake_up", s.handleWakeUp)
		mux.HandleFunc("GET /is_sleeping", s.handleIsSleeping)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.met.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /sim/faults", s.handleGetFaults)
	mux.HandleFunc("POST /sim/faults", s.handleSetFaults)
	mux.HandleFunc("GET /sim/blocks", s.handleBlocks)
	mux.HandleFunc("GET /sim/adapters", s.handleAdapters)
	if s.cfg.AllowRuntimeLoRAUpdating {
		// vLLM registers the runtime LoRA routes only then.
		mux.HandleFunc("POST /v1/load_lora_adapter", s.handleLoadLoRA)
		mux.HandleFunc("POST /v1/unload_lora_adapter", s.handleUnloadLoRA)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		// FastAPI's shape for an unknown route.
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	})
	return mux
}

// writeJSON writes v with status; a failure to write means the client has
// gone, and there is no one left to tell.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = newJSONEncoder(w).Encode(v)
}

// newJSONEncoder writes JSON as Python's json module does: "<" and ">"
// (in special tokens) are not escaped.
func newJSONEncoder(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc
}

func writeError(w http.ResponseWriter, e vllm.ErrorResponse) { writeJSON(w, e.Error.Code, e) }

func badRequest(w http.ResponseWriter, format string, args ...any) {
	writeError(w, vllm.NewError(http.StatusBadRequest, vllm.ErrTypeBadRequest, fmt.Sprintf(format, args...)))
}

// readBody reads a bounded body; on failure it has answered already.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			writeError(w, vllm.NewError(http.StatusRequestEntityTooLarge, vllm.ErrTypeBadRequest,
				fmt.Sprintf("request body exceeds %d bytes", maxBodyBytes)))
			return nil, false
		}
		badRequest(w, "reading request body: %v", err)
		return nil, false
	}
	return b, true
}

// checkModel answers 404 for a model this engine does not serve: neither
// a served name nor a loaded adapter. An empty name means the default
// model, as vLLM allows.
func (s *Server) checkModel(w http.ResponseWriter, model string) bool {
	if model == "" || slices.Contains(s.cfg.ServedNames(), model) {
		return true
	}
	if _, ok := s.lora.lookup(model); ok {
		return true
	}
	writeError(w, vllm.ModelNotFound(model))
	return false
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	list := vllm.ModelList{Object: "list"}
	// vLLM stamps each card with the time of the listing.
	created := s.clock.Now().Unix()
	for _, name := range s.cfg.ServedNames() {
		maxLen := s.cfg.MaxModelLen
		list.Data = append(list.Data, vllm.ModelCard{
			ID: name, Object: "model", Created: created, OwnedBy: "vllm",
			Root: s.cfg.Model, MaxModelLen: &maxLen,
			Permission: []vllm.ModelPermission{{
				ID: "modelperm-" + s.newID(), Object: "model_permission", Created: created,
				AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*",
			}},
		})
	}
	list.Data = append(list.Data, s.adapterCards()...)
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	req, err := vllm.DecodeTokenizeRequest(body)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	if !s.checkModel(w, req.Model) {
		return
	}
	var tokens []int
	if req.IsChat() {
		text, err := RenderChat(ChatPrompt{Messages: req.Messages, AddGenerationPrompt: req.AddGenerationPrompt,
			ContinueFinalMessage: req.ContinueFinalMessage, Tools: req.Tools, TemplateKwargs: req.ChatTemplateKwargs})
		if err != nil {
			badRequest(w, "%v", err)
			return
		}
		tokens = s.tok.Encode(text)
	} else {
		tokens = s.tok.Encode(*req.Prompt)
	}
	if req.AddSpecialTokens {
		tokens = append([]int{TokenBeginOfText}, tokens...)
	}
	resp := vllm.TokenizeResponse{Count: len(tokens), MaxModelLen: s.cfg.MaxModelLen, Tokens: tokens}
	if req.ReturnTokenStrs {
		resp.TokenStrs = s.tok.TokenStrs(tokens)
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req vllm.DetokenizeRequest
	if err := json.Unmarshal(body, &req); err != nil {
		badRequest(w, "%v", err)
		return
	}
	if !s.checkModel(w, req.Model) {
		return
	}
	for i, t := range req.Tokens {
		if t < 0 {
			badRequest(w, "tokens[%d]: %d: must not be negative", i, t)
			return
		}
	}
	writeJSON(w, http.StatusOK, vllm.DetokenizeResponse{Prompt: s.tok.Decode(req.Tokens)})
}

// handleResetPrefixCache is vLLM's POST /reset_prefix_cache. Its query
// reset_external=true (vLLM's, FastAPI's bool: true/1/yes/on) also empties
// the connector's cache, the CPU tier here; without it the tier is kept, as
// vLLM keeps a connector's.
func (s *Server) handleResetPrefixCache(w http.ResponseWriter, r *http.Request) {
	external := false
	switch strings.ToLower(r.URL.Query().Get("reset_external")) {
	case "", "false", "0", "no", "off":
	case "true", "1", "yes", "on":
		external = true
	default:
		badRequest(w, "reset_external: %q: not a boolean", r.URL.Query().Get("reset_external"))
		return
	}
	if err := s.eng.resetPrefixCache(external); err != nil {
		badRequest(w, "%v", err)
		return
	}
	s.log.Info("prefix cache reset")
	w.WriteHeader(http.StatusOK)
}

func (s *Server) handleGetFaults(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	f := s.faults
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, f)
}

func (s *Server) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var f Faults
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		badRequest(w, "faults: %v", err)
		return
	}
	if err := f.Validate(); err != nil {
		badRequest(w, "%v", err)
		return
	}
	s.mu.Lock()
	s.faults = f
	s.arrived = 0
	s.mu.Unlock()
	s.log.Warn("fault injection changed", "faults", fmt.Sprintf("%+v", f))
	writeJSON(w, http.StatusOK, f)
}

// newID is a request id suffix: random, but reproducible under Seed.
func (s *Server) newID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b [16]byte
	for i := range b {
		b[i] = byte(s.rng.Uint32())
	}
	return hex.EncodeToString(b[:])
}

// generatedWords are what the simulator "says": enough variety that
// outputs differ between prompts, all short enough to be one token.
var generatedWords = []string{
	"the", "model", "cache", "token", "router", "replica", "prefix", "block",
	"latency", "queue", "engine", "fleet", "request", "stream", "batch", "kernel",
	"is", "was", "will", "can", "and", "or", "of", "to", "in", "on", "with", "from",
	"fast", "warm", "cold", "shared", "long", "short", "simulated", "deterministic",
}

// generate is the completion for a prompt: deterministic in the prompt's
// tokens and the seed, so a retried request gets the same answer.
func (s *Server) generate(prompt []int, n int) ([]int, []string) {
	h := fnv.New64a()
	var b [8]byte
	for _, t := range prompt {
		for i := range b {
			b[i] = byte(uint64(t) >> (8 * i))
		}
		h.Write(b[:])
	}
	rng := rand.New(rand.NewPCG(h.Sum64(), uint64(s.cfg.Seed)))
	ids := make([]int, n)
	texts := make([]string, n)
	for i := range n {
		k := rng.IntN(len(generatedWords))
		ids[i] = s.wordIDs[k]
		texts[i] = " " + generatedWords[k]
	}
	return ids, texts
}
