package sim

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/llmgw/llmgw/vllm"
)

// Special tokens, at Llama 3's ids so token dumps look familiar.
const (
	TokenBeginOfText = 128000
	TokenStartHeader = 128006
	TokenEndHeader   = 128007
	TokenEOT         = 128009
	// vocabBase and vocabSize bound ordinary token ids: below the
	// specials, above the byte range a real tokenizer reserves.
	vocabBase = 256
	vocabSize = 128000
	// maxLearned bounds the id→piece memory /detokenize uses, so a client
	// sending endless distinct words cannot grow the process without bound.
	maxLearned = 1 << 18
)

var specialTokens = []struct {
	text string
	id   int
}{
	{"<|begin_of_text|>", TokenBeginOfText},
	{"<|start_header_id|>", TokenStartHeader},
	{"<|end_header_id|>", TokenEndHeader},
	{"<|eot_id|>", TokenEOT},
}

// Tokenizer is a deterministic stand-in for a model's tokenizer: text is
// cut into pieces (a word with its leading space, a run of whitespace, one
// punctuation character, a special token) and each piece is given a stable
// id by hashing it. Equal text gives equal tokens on every replica and
// every run, which is all prefix caching and the router's hashing need.
//
// Decoding is best effort: it knows the pieces it has encoded (up to a
// bound) and the specials; an id it never produced decodes to "".
// Safe for concurrent use.
type Tokenizer struct {
	mu     sync.RWMutex
	pieces map[int]string
}

// NewTokenizer returns a tokenizer that knows only the special tokens.
func NewTokenizer() *Tokenizer {
	t := &Tokenizer{pieces: make(map[int]string)}
	for _, s := range specialTokens {
		t.pieces[s.id] = s.text
	}
	return t
}

// pieceID is the stable id of an ordinary piece.
func pieceID(p string) int {
	h := fnv.New64a()
	h.Write([]byte(p))
	return vocabBase + int(h.Sum64()%uint64(vocabSize-vocabBase))
}

// Encode turns text into token ids. Special-token strings inside the text
// become their ids, as Hugging Face tokenizers treat added special tokens.
func (t *Tokenizer) Encode(text string) []int {
	ids, _ := t.EncodePieces(text)
	return ids
}

// EncodePieces is Encode with each token's text: the pieces concatenate to
// text.
func (t *Tokenizer) EncodePieces(text string) ([]int, []string) {
	var ids []int
	var pieces []string
	var learned map[int]string
	for len(text) > 0 {
		piece, id := nextPiece(text)
		text = text[len(piece):]
		if id < 0 {
			id = pieceID(piece)
			if learned == nil {
				learned = make(map[int]string)
			}
			learned[id] = piece
		}
		ids = append(ids, id)
		pieces = append(pieces, piece)
	}
	if len(learned) > 0 {
		t.learn(learned)
	}
	return ids, pieces
}

func (t *Tokenizer) learn(m map[int]string) {
	t.mu.RLock()
	missing := false
	for id := range m {
		if _, ok := t.pieces[id]; !ok {
			missing = true
			break
		}
	}
	t.mu.RUnlock()
	if !missing {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, p := range m {
		if len(t.pieces) >= maxLearned {
			return
		}
		if _, ok := t.pieces[id]; !ok {
			t.pieces[id] = p
		}
	}
}

// nextPiece cuts the first piece off text; id is the special token's id,
// or -1 for an ordinary piece.
func nextPiece(text string) (string, int) {
	if text[0] == '<' {
		for _, s := range specialTokens {
			if strings.HasPrefix(text, s.text) {
				return s.text, s.id
			}
		}
	}
	r, size := utf8.DecodeRuneInString(text)
	isWord := func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }
	end := size
	switch {
	case r == ' ' && len(text) > 1:
		if r2, _ := utf8.DecodeRuneInString(text[1:]); isWord(r2) {
			end = 1 + wordLen(text[1:], isWord)
		} else {
			end = spaceLen(text)
		}
	case isWord(r):
		end = wordLen(text, isWord)
	case unicode.IsSpace(r):
		end = spaceLen(text)
	}
	return text[:end], -1
}

// wordLen is the length of the leading word, at most 16 bytes so long
// words cost several tokens as they do with real tokenizers.
func wordLen(s string, isWord func(rune) bool) int {
	n := 0
	for n < len(s) {
		r, size := utf8.DecodeRuneInString(s[n:])
		if !isWord(r) || n+size > 16 {
			break
		}
		n += size
	}
	if n == 0 {
		_, n = utf8.DecodeRuneInString(s)
	}
	return n
}

func spaceLen(s string) int {
	n := 0
	for n < len(s) {
		r, size := utf8.DecodeRuneInString(s[n:])
		if !unicode.IsSpace(r) {
			break
		}
		n += size
	}
	return n
}

// Decode is best-effort detokenization: unknown ids contribute nothing.
func (t *Tokenizer) Decode(ids []int) string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(t.pieces[id])
	}
	return b.String()
}

// TokenStrs renders ids as a byte-level BPE vocabulary would show them
// (space as "Ġ", newline as "Ċ"), for /tokenize's return_token_strs.
func (t *Tokenizer) TokenStrs(ids []int) []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]string, len(ids))
	r := strings.NewReplacer(" ", "Ġ", "\n", "Ċ")
	for i, id := range ids {
		out[i] = r.Replace(t.pieces[id])
	}
	return out
}

// ChatPrompt is what the chat template renders: the messages and every
// request field that changes the rendering.
type ChatPrompt struct {
	Messages             []vllm.ChatMessage
	AddGenerationPrompt  bool
	ContinueFinalMessage bool
	// Tools and TemplateKwargs change the prompt, as they do for real
	// templates; they are rendered canonically (keys sorted) so equal
	// values give equal tokens however the client ordered them.
	Tools          json.RawMessage
	TemplateKwargs json.RawMessage
}

// RenderChat is the simulator's chat template, shaped like Llama 3's:
//
//	<|begin_of_text|><|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>...
//
// followed, with AddGenerationPrompt, by the assistant's header. Tools and
// template kwargs, when given, come first in a system header.
func RenderChat(p ChatPrompt) (string, error) {
	var b strings.Builder
	b.WriteString("<|begin_of_text|>")
	header := func(role string) {
		b.WriteString("<|start_header_id|>")
		b.WriteString(role)
		b.WriteString("<|end_header_id|>\n\n")
	}
	tools, err := canonicalJSON(normalizeTools(p.Tools))
	if err != nil {
		return "", fmt.Errorf("tools: %w", err)
	}
	kwargs, err := canonicalJSON(p.TemplateKwargs)
	if err != nil {
		return "", fmt.Errorf("chat_template_kwargs: %w", err)
	}
	if tools != "" || kwargs != "" {
		header("system")
		if kwargs != "" {
			b.WriteString("Template options: " + kwargs + "\n")
		}
		if tools != "" {
			b.WriteString("Tools: " + tools + "\n")
		}
		b.WriteString("<|eot_id|>")
	}
	for i, m := range p.Messages {
		if m.Role == "" {
			return "", fmt.Errorf("messages[%d].role: required", i)
		}
		text, err := m.Text()
		if err != nil {
			return "", fmt.Errorf("messages[%d].%w", i, err)
		}
		header(m.Role)
		b.WriteString(text)
		if len(m.ToolCalls) > 0 && string(m.ToolCalls) != "null" {
			calls, err := canonicalJSON(m.ToolCalls)
			if err != nil {
				return "", fmt.Errorf("messages[%d].tool_calls: %w", i, err)
			}
			b.WriteString(calls)
		}
		if p.ContinueFinalMessage && i == len(p.Messages)-1 {
			break
		}
		b.WriteString("<|eot_id|>")
	}
	if p.AddGenerationPrompt {
		header("assistant")
	}
	return b.String(), nil
}

// normalizeTools gives function tools the form vLLM renders them in,
// whichever API they came from: each the model_dump of a chat tool,
// {"type":"function","function":{"name","description","parameters"}} with
// null for what is absent, so the same tools cost the same tokens in chat,
// Responses and Messages. Anything else is left as it is.
func normalizeTools(raw json.RawMessage) json.RawMessage {
	var tools []struct {
		Type     string `json:"type"`
		Function *struct {
			Name        string          `json:"name"`
			Description json.RawMessage `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		} `json:"function"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &tools) != nil {
		return raw
	}
	type fn struct {
		Name        string          `json:"name"`
		Description json.RawMessage `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	}
	out := make([]any, len(tools))
	for i, t := range tools {
		if t.Type != "function" || t.Function == nil {
			return raw
		}
		f := fn{Name: t.Function.Name, Description: t.Function.Description, Parameters: t.Function.Parameters}
		if len(f.Description) == 0 {
			f.Description = json.RawMessage("null")
		}
		if len(f.Parameters) == 0 {
			f.Parameters = json.RawMessage("null")
		}
		out[i] = struct {
			Type     string `json:"type"`
			Function fn     `json:"function"`
		}{"function", f}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return raw
	}
	return b
}

// canonicalJSON re-encodes raw with object keys sorted; "" for absent or
// null.
func canonicalJSON(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return string(b), nil
}
