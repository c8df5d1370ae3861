package openai

// API is one of the inference APIs the router serves (design §7.1): each
// names its prompt, its streamed events, its usage block and the shape of
// its errors differently, and everything the router reads of a body or an
// answer goes through the API it was sent to.
type API uint8

const (
	// Chat is POST /v1/chat/completions.
	Chat API = iota
	// Completions is POST /v1/completions.
	Completions
	// Embeddings is POST /v1/embeddings.
	Embeddings
	// Responses is OpenAI's Responses API, POST /v1/responses, as vLLM
	// serves it (vllm/entrypoints/openai/responses): one request, no
	// stored state the router follows.
	Responses
	// Messages is Anthropic's Messages API, POST /v1/messages, as vLLM
	// serves it (vllm/entrypoints/anthropic, vLLM ≥ 0.11).
	Messages
	// CountTokens is Anthropic's POST /v1/messages/count_tokens, which vLLM
	// answers from its own chat template: forwarded, never generated.
	CountTokens
)

// The paths of the APIs.
const (
	PathChat        = "/v1/chat/completions"
	PathCompletions = "/v1/completions"
	PathEmbeddings  = "/v1/embeddings"
	PathResponses   = "/v1/responses"
	PathMessages    = "/v1/messages"
	PathCountTokens = "/v1/messages/count_tokens"
)

// APIOf is the API served at path; false for any other path.
func APIOf(path string) (API, bool) {
	switch path {
	case PathChat:
		return Chat, true
	case PathCompletions:
		return Completions, true
	case PathEmbeddings:
		return Embeddings, true
	case PathResponses:
		return Responses, true
	case PathMessages:
		return Messages, true
	case PathCountTokens:
		return CountTokens, true
	}
	return 0, false
}

// Path is where the API is served.
func (a API) Path() string {
	switch a {
	case Chat:
		return PathChat
	case Completions:
		return PathCompletions
	case Embeddings:
		return PathEmbeddings
	case Responses:
		return PathResponses
	case Messages:
		return PathMessages
	case CountTokens:
		return PathCountTokens
	}
	return ""
}

// String names the API as logs and test names do: chat, completions,
// embeddings, responses, messages, count_tokens.
func (a API) String() string {
	switch a {
	case Chat:
		return "chat"
	case Completions:
		return "completions"
	case Embeddings:
		return "embeddings"
	case Responses:
		return "responses"
	case Messages:
		return "messages"
	case CountTokens:
		return "count_tokens"
	}
	return "unknown"
}

// Anthropic reports whether the API is Anthropic's: its errors are
// Anthropic's body (WriteErrorFor), its clients present keys as x-api-key.
func (a API) Anthropic() bool { return a == Messages || a == CountTokens }

// Generates reports whether the API runs a generation on the engine —
// what tenants' budgets, flow control and the engines' batches count —
// rather than answering at once from the tokenizer or the pooling runner.
func (a API) Generates() bool {
	switch a {
	case Chat, Completions, Responses, Messages:
		return true
	}
	return false
}

// StreamOptions reports whether the API takes OpenAI's
// stream_options.include_usage, which the router sets on streams to read
// the usage (design §7.1). The Responses API reports usage in its
// response.completed event and vLLM's Messages API always asks its chat
// stream for usage, so neither needs it — nor would either accept it.
func (a API) StreamOptions() bool { return a == Chat || a == Completions }
