package sim

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// EmbeddingDim is the length of the simulator's embeddings (a small
// sentence-embedding model's, as all-MiniLM-L6-v2): a request's
// `dimensions` may ask for fewer, as vLLM allows for matryoshka models.
const EmbeddingDim = 384

// embeddingRequest is what the simulator reads of vLLM's
// /v1/embeddings body: input is a string, a list of strings, a list of
// token ids or a list of such lists.
type embeddingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
}

// embeddingResponse is vLLM's EmbeddingResponse: object "list", one
// datum per input in order, usage counting the prompt only.
type embeddingResponse struct {
	ID      string           `json:"id"`
	Object  string           `json:"object"`
	Created int64            `json:"created"`
	Model   string           `json:"model"`
	Data    []embeddingDatum `json:"data"`
	Usage   embeddingUsage   `json:"usage"`
}

type embeddingDatum struct {
	Index  int    `json:"index"`
	Object string `json:"object"`
	// Embedding is []float32, or a base64 string of little-endian
	// float32s with encoding_format base64 (OpenAI's encoding).
	Embedding any `json:"embedding"`
}

type embeddingUsage struct {
	PromptTokens     int  `json:"prompt_tokens"`
	TotalTokens      int  `json:"total_tokens"`
	CompletionTokens int  `json:"completion_tokens"`
	Details          *int `json:"prompt_tokens_details"`
}

// handleEmbeddings is vLLM's pooling runner's /v1/embeddings: each input
// gets a deterministic unit vector derived from the model name and the
// input, so tests can tell inputs apart and repeat answers exactly.
// Embeddings take no time on the simulated GPU: they are for routing and
// wire-format tests, not load.
func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req embeddingRequest
	if err := json.Unmarshal(body, &req); err != nil {
		badRequest(w, "invalid JSON body: %v", err)
		return
	}
	if !s.checkModel(w, req.Model) {
		return
	}
	inputs, err := s.embeddingInputs(req.Input)
	if err != nil {
		badRequest(w, "input: %v", err)
		return
	}
	dim := EmbeddingDim
	if req.Dimensions != nil {
		if *req.Dimensions < 1 || *req.Dimensions > EmbeddingDim {
			badRequest(w, "dimensions must be between 1 and %d, got %d", EmbeddingDim, *req.Dimensions)
			return
		}
		dim = *req.Dimensions
	}
	if req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		badRequest(w, "encoding_format must be float or base64, got %q", req.EncodingFormat)
		return
	}
	model := s.responseModel(req.Model)
	out := embeddingResponse{ID: "embd-" + s.baseRequestID(r), Object: "list", Created: time.Now().Unix(),
		Model: model, Data: make([]embeddingDatum, len(inputs))}
	for i, in := range inputs {
		v := embedVector(model, in.key, dim)
		d := embeddingDatum{Index: i, Object: "embedding", Embedding: v}
		if req.EncodingFormat == "base64" {
			b := make([]byte, 4*len(v))
			for j, f := range v {
				binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(f))
			}
			d.Embedding = base64.StdEncoding.EncodeToString(b)
		}
		out.Data[i] = d
		out.Usage.PromptTokens += in.tokens
	}
	out.Usage.TotalTokens = out.Usage.PromptTokens
	writeJSON(w, http.StatusOK, out)
}

// embeddingInput is one input as the vector is derived from it: key
// spells it (the text, or the token ids), tokens counts it.
type embeddingInput struct {
	key    string
	tokens int
}

// embeddingInputs reads input in its four shapes.
func (s *Server) embeddingInputs(raw json.RawMessage) ([]embeddingInput, error) {
	text := func(t string) embeddingInput {
		return embeddingInput{key: "t:" + t, tokens: 1 + len(s.tok.Encode(t))}
	}
	ids := func(ts []int) (embeddingInput, error) {
		key := []byte("i:")
		for i, t := range ts {
			if t < 0 || t > TokenEOT {
				return embeddingInput{}, fmt.Errorf("token id %d out of vocabulary", t)
			}
			if i > 0 {
				key = append(key, ',')
			}
			key = strconv.AppendInt(key, int64(t), 10)
		}
		return embeddingInput{key: string(key), tokens: len(ts)}, nil
	}
	if len(raw) == 0 || string(raw) == "null" {
		return nil, fmt.Errorf("required")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []embeddingInput{text(one)}, nil
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil && len(many) > 0 {
		out := make([]embeddingInput, len(many))
		for i, t := range many {
			out[i] = text(t)
		}
		return out, nil
	}
	var toks []int
	if json.Unmarshal(raw, &toks) == nil && len(toks) > 0 {
		in, err := ids(toks)
		return []embeddingInput{in}, err
	}
	var batches [][]int
	if json.Unmarshal(raw, &batches) == nil && len(batches) > 0 {
		out := make([]embeddingInput, len(batches))
		for i, b := range batches {
			in, err := ids(b)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			out[i] = in
		}
		return out, nil
	}
	return nil, fmt.Errorf("must be a string, a non-empty list of strings, of token ids, or of token id lists")
}

// embedVector is the unit vector of dim floats for key under model: a
// SHA-256 seeded splitmix64 stream, normalised as vLLM normalises
// embeddings by default.
func embedVector(model, key string, dim int) []float32 {
	sum := sha256.Sum256([]byte(model + "\x00" + key))
	x := binary.LittleEndian.Uint64(sum[:8])
	v := make([]float32, dim)
	var norm float64
	for i := range v {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		f := float64(z>>11)/float64(1<<53)*2 - 1
		v[i] = float32(f)
		norm += f * f
	}
	norm = math.Sqrt(norm)
	for i := range v {
		v[i] = float32(float64(v[i]) / norm)
	}
	return v
}
