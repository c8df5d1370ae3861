package bench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/llmgw/llmgw/router/capture"
)

// Workload names accepted by WorkloadConfig.Name (design §10).
const (
	SharedPrefix = "shared-prefix"
	MultiTurn    = "multi-turn"
	LongContext  = "long-context"
	LoRAMix      = "lora-mix"
	AgentSession = "agent-session"
)

// workloadNames are the accepted names, in the order help text lists them.
var workloadNames = []string{SharedPrefix, MultiTurn, LongContext, LoRAMix, AgentSession, Replay}

// WorkloadNames returns the workload names in a stable order.
func WorkloadNames() []string { return slices.Clone(workloadNames) }

// Message is one chat message as the OpenAI API takes it.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Request is one call the benchmark makes, held in chat form: the run's
// --api decides whether it goes out as chat completions, Messages or
// Responses (see encodeBody), so runs of different workloads differ only in
// the shape of their prompts and runs of different APIs only in the wire.
type Request struct {
	Model    string
	Messages []Message
	// SessionID goes out as X-Session-ID, the router's affinity key
	// (design §7.1); empty sends no header.
	SessionID string
	MaxTokens int
	// IgnoreEOS asks the engine for exactly MaxTokens (vLLM's ignore_eos,
	// chat only): a replay reproduces the captured output lengths.
	IgnoreEOS bool
}

// Conversation is a sequence of requests in which a later one may depend on
// the answers to earlier ones, as a chat's history does. The runner holds a
// conversation for one turn at a time — Next, the request, then Reply — so an
// implementation needs no locking.
type Conversation interface {
	// Next returns the next request, or false when the conversation is over.
	Next() (Request, bool)
	// Reply tells the conversation how the request from the last Next went:
	// the assistant's text when ok, and ok=false when it failed, in which
	// case the turn is dropped from the history so the next one is still a
	// well-formed chat.
	Reply(answer string, ok bool)
}

// Workload generates conversations. The requests of conversation n depend
// only on the config (seed included), n and the replies the conversation was
// given, so two runs with one seed send the same prompts whatever the timing.
type Workload interface {
	Name() string
	// Conversation returns conversation n (n ≥ 0). Safe for concurrent use.
	Conversation(n int) Conversation
	// Live is how many conversations are open at once: the runner keeps that
	// many going and starts conversation Live, Live+1, ... as earlier ones
	// finish. Zero means conversations are independent single requests,
	// started as fast as the load allows.
	Live() int
}

// WorkloadConfig chooses and shapes a workload. Zero values take the
// workload's own default (see each field); flags are named after the fields.
type WorkloadConfig struct {
	// Name is one of SharedPrefix, MultiTurn, LongContext, LoRAMix, AgentSession.
	Name string
	// Model goes in every request's `model`; lora-mix draws adapters instead.
	Model string
	// Seed makes the prompts reproducible.
	Seed uint64
	// MaxTokens bounds each answer. Default 128.
	MaxTokens int
	// Groups is how many shared system prompts shared-prefix and lora-mix
	// draw from (default 8), and how many shared documents long-context
	// reuses (default 2).
	Groups int
	// SystemWords is the length of a shared system prompt, in words (about
	// tokens for the simulator). Default 1000 for shared-prefix and
	// lora-mix, as inference-perf's shared-prefix shape; 200 for multi-turn.
	SystemWords int
	// PromptWords is the length of each request's own part: the question
	// (default 100), a multi-turn user message (default 50), or a
	// long-context document (default 4000).
	PromptWords int
	// Sessions is how many multi-turn chats or agent sessions run at once
	// (default 8), and Turns how many turns each has (default 5 for
	// multi-turn, 30 for agent-session).
	Sessions int
	Turns    int
	// SharedShare is the share of long-context requests that reuse one of
	// the Groups shared documents rather than a fresh one. Default 0.25;
	// negative means none.
	SharedShare float64
	// HotShare makes one shared-prefix (or lora-mix) system prompt hot: that
	// share of requests, in [0, 1], use group 0's prompt and the rest draw
	// uniformly from the other groups. It is the skew a router must absorb
	// without piling the hot prefix onto one replica (one application's
	// system prompt in most traffic). Zero draws every group alike.
	HotShare float64
	// ActiveGroups > 0 makes shared-prefix (or lora-mix) groups active in
	// turn, as teams' system prompts are used in bursts: requests draw only
	// from ActiveGroups of the Groups at a time, and the active set moves on
	// every RotateEvery requests, so (when ActiveGroups divides Groups) a
	// group is idle for (Groups/ActiveGroups − 1)·RotateEvery requests
	// between its bursts. Counted in requests, not seconds, so conversation
	// n's prompt still depends on the seed and n alone; under --rate R a
	// phase lasts RotateEvery/R seconds. Zero: every group always active.
	ActiveGroups int
	RotateEvery  int
	// SessionTag, when set, goes into every session id (X-Session-ID),
	// so runs with one seed can send the same prompts under different
	// sessions; the runner sets one per run. Empty: bench-SEED-N.
	SessionTag string
	// Adapters are the adapter names lora-mix puts in `model`, drawn by a
	// Zipf law (s=1) so the first is the most popular.
	Adapters []string
	// Records are the replay's requests (LoadCapture), and ReplaySpeed
	// how much faster than captured they are sent (default 1).
	Records     []capture.Record
	ReplaySpeed float64
}

// withDefaults resolves the zero values for the chosen workload.
func (c WorkloadConfig) withDefaults() WorkloadConfig {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.MaxTokens, 128)
	switch c.Name {
	case SharedPrefix, LoRAMix:
		def(&c.Groups, 8)
		def(&c.SystemWords, 1000)
		def(&c.PromptWords, 100)
	case MultiTurn:
		def(&c.SystemWords, 200)
		def(&c.PromptWords, 50)
		def(&c.Sessions, 8)
		def(&c.Turns, 5)
	case AgentSession:
		def(&c.SystemWords, 1000)
		def(&c.PromptWords, 60)
		def(&c.Sessions, 8)
		def(&c.Turns, 30)
	case LongContext:
		def(&c.Groups, 2)
		def(&c.PromptWords, 4000)
		if c.SharedShare == 0 {
			c.SharedShare = 0.25
		}
		if c.SharedShare < 0 {
			c.SharedShare = 0
		}
	}
	if c.ReplaySpeed == 0 {
		c.ReplaySpeed = 1
	}
	return c
}

// Validate reports the first field at fault, named as its flag.
func (c WorkloadConfig) Validate() error {
	if !slices.Contains(workloadNames, c.Name) {
		return fmt.Errorf("--workload: %q is not one of %s", c.Name, strings.Join(workloadNames, ", "))
	}
	c = c.withDefaults()
	for _, f := range []struct {
		name string
		v    int
	}{
		{"--max-tokens", c.MaxTokens}, {"--groups", c.Groups}, {"--system-words", c.SystemWords},
		{"--prompt-words", c.PromptWords}, {"--sessions", c.Sessions}, {"--turns", c.Turns},
	} {
		if f.v < 0 {
			return fmt.Errorf("%s: must not be negative, got %d", f.name, f.v)
		}
	}
	if c.SharedShare > 1 {
		return fmt.Errorf("--shared-share: must be at most 1, got %g", c.SharedShare)
	}
	if !(c.HotShare >= 0 && c.HotShare <= 1) { // NaN fails too
		return fmt.Errorf("--hot-share: must be in [0, 1], got %g", c.HotShare)
	}
	if c.HotShare > 0 && c.Name != SharedPrefix && c.Name != LoRAMix {
		return fmt.Errorf("--hot-share: applies to %s and %s only, not %s", SharedPrefix, LoRAMix, c.Name)
	}
	if err := c.validateRotation(); err != nil {
		return err
	}
	if c.Name == Replay {
		if len(c.Records) == 0 {
			return errors.New("--replay: the replay workload needs a capture's records")
		}
		if !(c.ReplaySpeed > 0) {
			return fmt.Errorf("--replay-speed: must be positive, got %g", c.ReplaySpeed)
		}
	}
	if c.Name == LoRAMix {
		if len(c.Adapters) == 0 {
			return errors.New("--adapters: lora-mix needs at least one adapter name")
		}
		for _, a := range c.Adapters {
			if strings.TrimSpace(a) == "" {
				return errors.New("--adapters: an adapter name is empty")
			}
		}
	} else if c.Model == "" {
		return errors.New("--model: required")
	}
	return nil
}

// validateRotation checks --active-groups and --rotate-every (c has its
// defaults).
func (c WorkloadConfig) validateRotation() error {
	switch {
	case c.ActiveGroups == 0 && c.RotateEvery == 0:
		return nil
	case c.Name != SharedPrefix && c.Name != LoRAMix:
		return fmt.Errorf("--active-groups, --rotate-every: apply to %s and %s only, not %s", SharedPrefix, LoRAMix, c.Name)
	case c.ActiveGroups < 0 || c.ActiveGroups > c.Groups:
		return fmt.Errorf("--active-groups: must be in [0, --groups %d], got %d", c.Groups, c.ActiveGroups)
	case c.RotateEvery < 0:
		return fmt.Errorf("--rotate-every: must not be negative, got %d", c.RotateEvery)
	case (c.ActiveGroups > 0) != (c.RotateEvery > 0):
		return errors.New("--active-groups, --rotate-every: set both or neither")
	case c.HotShare > 0:
		return errors.New("--active-groups, --hot-share: choose one shape of skew")
	}
	return nil
}

// NewWorkload builds the workload the config names.
func NewWorkload(c WorkloadConfig) (Workload, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	switch c.Name {
	case SharedPrefix, LoRAMix:
		w := &sharedPrefix{cfg: c, systems: make([]string, c.Groups)}
		for g := range w.systems {
			w.systems[g] = words(rngFor(c.Seed, streamGroup, g), c.SystemWords)
		}
		if c.Name == LoRAMix {
			w.zipf = zipfWeights(len(c.Adapters))
		}
		return w, nil
	case Replay:
		return &replay{cfg: c, recs: c.Records}, nil
	case MultiTurn, AgentSession:
		return &multiTurn{cfg: c, system: words(rngFor(c.Seed, streamGroup, 0), c.SystemWords)}, nil
	default: // LongContext, Validate has ruled out the rest
		w := &longContext{cfg: c, docs: make([]string, c.Groups)}
		for g := range w.docs {
			w.docs[g] = words(rngFor(c.Seed, streamGroup, g), c.PromptWords)
		}
		return w, nil
	}
}

// Streams keep the random draws for shared parts (system prompts, shared
// documents) apart from per-conversation ones, so changing how many requests
// run never changes a group's prompt.
const (
	streamGroup uint64 = iota + 1
	streamConversation
)

func rngFor(seed, stream uint64, i int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, stream<<48^uint64(i)))
}

// single is a conversation of one request.
type single struct {
	req  Request
	done bool
}

func (s *single) Next() (Request, bool) {
	if s.done {
		return Request{}, false
	}
	s.done = true
	return s.req, true
}

func (s *single) Reply(string, bool) {}

// sharedPrefix is inference-perf's shared-prefix shape: each request picks a
// group at random and sends the group's long system prompt followed by its own
// short question, so a router that keeps a group on one replica turns most of
// each prompt into cache hits. With adapters set it is lora-mix: the same
// prompts, with `model` an adapter drawn by popularity.
type sharedPrefix struct {
	cfg     WorkloadConfig
	systems []string
	zipf    []float64 // cumulative; nil for shared-prefix
}

func (w *sharedPrefix) Name() string { return w.cfg.Name }
func (w *sharedPrefix) Live() int    { return 0 }

func (w *sharedPrefix) Conversation(n int) Conversation {
	rng := rngFor(w.cfg.Seed, streamConversation, n)
	g := w.group(n, rng)
	model := w.cfg.Model
	if w.zipf != nil {
		model = w.cfg.Adapters[pick(rng, w.zipf)]
	}
	return &single{req: Request{
		Model: model,
		Messages: []Message{
			{Role: "system", Content: w.systems[g]},
			{Role: "user", Content: words(rng, w.cfg.PromptWords)},
		},
		MaxTokens: w.cfg.MaxTokens,
	}}
}

// group draws request n's system prompt. Without a hot share or rotation
// it is one draw, as it always was, so earlier seeds keep their prompts.
// With rotation, phase p = n / RotateEvery has groups p·K … p·K+K−1
// (mod Groups) active, K = ActiveGroups, and the draw is among them.
func (w *sharedPrefix) group(n int, rng *rand.Rand) int {
	if k := w.cfg.ActiveGroups; k > 0 {
		phase := n / w.cfg.RotateEvery
		return (phase*k + rng.IntN(k)) % len(w.systems)
	}
	if w.cfg.HotShare == 0 {
		return rng.IntN(len(w.systems))
	}
	if len(w.systems) == 1 || rng.Float64() < w.cfg.HotShare {
		return 0
	}
	return 1 + rng.IntN(len(w.systems)-1)
}

// longContext sends documents of several thousand words with a short
// question; a few documents recur, most are fresh, so it measures prefill
// under load more than cache reuse.
type longContext struct {
	cfg  WorkloadConfig
	docs []string
}

func (w *longContext) Name() string { return w.cfg.Name }
func (w *longContext) Live() int    { return 0 }

func (w *longContext) Conversation(n int) Conversation {
	rng := rngFor(w.cfg.Seed, streamConversation, n)
	var doc string
	if len(w.docs) > 0 && rng.Float64() < w.cfg.SharedShare {
		doc = w.docs[rng.IntN(len(w.docs))]
	} else {
		doc = words(rng, w.cfg.PromptWords)
	}
	return &single{req: Request{
		Model:     w.cfg.Model,
		Messages:  []Message{{Role: "user", Content: "Read this document.\n\n" + doc + "\n\nQuestion: " + words(rng, 20)}},
		MaxTokens: w.cfg.MaxTokens,
	}}
}

// multiTurn is a set of chats whose history grows: every turn resends the
// whole conversation so far — the real answers received included — plus a
// new user message, under the session's X-Session-ID. All sessions share one
// system prompt, as the users of one application do.
//
// As agent-session it is a coding agent's loop: a long system prompt (the
// agent's instructions and tool descriptions), then 30 turns in which the
// agent resends everything so far with the newest tool output, the shape
// that makes an agent's traffic nearly all prefix. The tool output is sent
// as user text rather than tool_result blocks so that the three APIs render
// one conversation to the same tokens (the chat form has no tool_call id
// the Messages form could keep), which the ceiling, tokenized as chat,
// relies on.
type multiTurn struct {
	cfg    WorkloadConfig
	system string
}

func (w *multiTurn) Name() string { return w.cfg.Name }
func (w *multiTurn) Live() int    { return w.cfg.Sessions }

func (w *multiTurn) Conversation(n int) Conversation {
	return &session{
		w:       w,
		id:      sessionID(w.cfg, n),
		rng:     rngFor(w.cfg.Seed, streamConversation, n),
		history: []Message{{Role: "system", Content: w.system}},
	}
}

func sessionID(c WorkloadConfig, n int) string {
	if c.SessionTag == "" {
		return fmt.Sprintf("bench-%d-%d", c.Seed, n)
	}
	return fmt.Sprintf("bench-%s-%d-%d", c.SessionTag, c.Seed, n)
}

type session struct {
	w       *multiTurn
	id      string
	rng     *rand.Rand
	history []Message
	turn    int
}

func (s *session) Next() (Request, bool) {
	if s.turn >= s.w.cfg.Turns {
		return Request{}, false
	}
	s.turn++
	text := words(s.rng, s.w.cfg.PromptWords)
	if s.w.cfg.Name == AgentSession {
		text = agentTurn(s.turn, text)
	}
	s.history = append(s.history, Message{Role: "user", Content: text})
	return Request{
		Model:     s.w.cfg.Model,
		Messages:  slices.Clip(s.history),
		SessionID: s.id,
		MaxTokens: s.w.cfg.MaxTokens,
	}, true
}

func (s *session) Reply(answer string, ok bool) {
	if !ok {
		s.history = s.history[:len(s.history)-1]
		return
	}
	s.history = append(s.history, Message{Role: "assistant", Content: answer})
}

// agentTurn dresses turn t's (t ≥ 1) words as what a coding agent sends:
// the task first, then the output of the tool it last ran.
func agentTurn(t int, text string) string {
	if t == 1 {
		return "Task: " + text
	}
	return fmt.Sprintf("Tool output (step %d):\n%s", t-1, text)
}

// zipfWeights returns the cumulative weights of a Zipf law with s=1 over n
// items: item k is drawn in proportion to 1/(k+1).
func zipfWeights(n int) []float64 {
	cum := make([]float64, n)
	total := 0.0
	for k := range n {
		total += 1 / float64(k+1)
		cum[k] = total
	}
	for k := range cum {
		cum[k] /= total
	}
	return cum
}

// pick draws an index from cumulative weights ending in 1.
func pick(rng *rand.Rand, cum []float64) int {
	x := rng.Float64()
	i, _ := slices.BinarySearch(cum, x)
	return min(i, len(cum)-1)
}

// words returns n words drawn from a small vocabulary: close to one token per
// word for the simulator's tokenizer and for real ones, which keeps
// --prompt-words a fair proxy for prompt length.
func words(rng *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(n * 7)
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[rng.IntN(len(vocabulary))])
	}
	return b.String()
}

var vocabulary = strings.Fields(`
the of and to in is was for on that with as by at from his her they this
are be have had not but what all were when we there can an your which their
said if do will each about how up out them then she many some so these would
other into has more two like him see time could no make than first been its
who now people my made over did down only way find use may water long little
very after words called just where most know get through back much go good
new write our used me man too any day same right look think also around
another came come work three word must because does part even place well
such here take why things help put years different away again off went old
number great tell men say small every found still between name should home
big give air line set own under read last never us left end along while
might next sound below saw something thought both few those always looked
show large often together asked house world going want school important
until form food keep children feet land side without boy once animals life
enough took sometimes four head above kind began almost live page got earth
need far hand high year mother light parts country father let night
following picture being study second eyes soon times story boys since white
days ever paper hard near sentence better best across during today others
sure means knew its try told young miles sun ways thing whole hear example
heard several change answer room sea against top turned learn point city
play toward five using himself usually money seen car morning`)
