package sim

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"testing"
)

// TestEmbeddings: vLLM's response shape for each input form, vectors of
// unit length that repeat for the same input and differ between inputs,
// base64 the same floats, and refusals for bad input.
func TestEmbeddings(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	type resp struct {
		Object string `json:"object"`
		Model  string `json:"model"`
		Data   []struct {
			Index     int             `json:"index"`
			Object    string          `json:"object"`
			Embedding json.RawMessage `json:"embedding"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	}
	get := func(body string) (int, resp) {
		r, b := post(t, ts.URL+"/v1/embeddings", body)
		var out resp
		if r.StatusCode == http.StatusOK {
			if err := json.Unmarshal(b, &out); err != nil {
				t.Fatalf("%s: %v", b, err)
			}
		}
		return r.StatusCode, out
	}
	floats := func(raw json.RawMessage) []float32 {
		var v []float32
		if err := json.Unmarshal(raw, &v); err == nil {
			return v
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatalf("embedding %s", raw)
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		v = make([]float32, len(b)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return v
	}
	tests := []struct {
		name, body string
		n, dim     int
	}{
		{"string", `{"model":"llama","input":"hello world"}`, 1, EmbeddingDim},
		{"strings", `{"model":"llama","input":["hello world","other"]}`, 2, EmbeddingDim},
		{"tokens", `{"model":"llama","input":[1,2,3]}`, 1, EmbeddingDim},
		{"token lists", `{"model":"llama","input":[[1,2],[3]]}`, 2, EmbeddingDim},
		{"dimensions", `{"model":"llama","input":"hello world","dimensions":8}`, 1, 8},
		{"base64", `{"model":"llama","input":["hello world","other"],"encoding_format":"base64"}`, 2, EmbeddingDim},
	}
	var first []float32
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out := get(tt.body)
			if code != http.StatusOK || out.Object != "list" || out.Model != "llama" || len(out.Data) != tt.n {
				t.Fatalf("code %d, %+v", code, out)
			}
			if out.Usage.PromptTokens <= 0 || out.Usage.TotalTokens != out.Usage.PromptTokens {
				t.Fatalf("usage %+v", out.Usage)
			}
			var vs [][]float32
			for i, d := range out.Data {
				v := floats(d.Embedding)
				if d.Index != i || d.Object != "embedding" || len(v) != tt.dim {
					t.Fatalf("datum %d: index %d object %q dim %d", i, d.Index, d.Object, len(v))
				}
				var norm float64
				for _, f := range v {
					norm += float64(f) * float64(f)
				}
				if math.Abs(norm-1) > 1e-4 {
					t.Fatalf("norm² %v", norm)
				}
				vs = append(vs, v)
			}
			if tt.n == 2 && vs[0][0] == vs[1][0] {
				t.Fatal("two inputs gave the same vector")
			}
			if tt.dim == EmbeddingDim && (tt.name == "string" || tt.name == "base64") {
				if first == nil {
					first = vs[0]
				} else if first[0] != vs[0][0] || first[EmbeddingDim-1] != vs[0][EmbeddingDim-1] {
					t.Fatal("the same input gave another vector")
				}
			}
		})
	}
	for _, body := range []string{`{"model":"llama"}`, `{"model":"llama","input":[]}`, `{"model":"llama","input":{}}`,
		`{"model":"llama","input":[999999]}`, `{"model":"llama","input":"x","dimensions":0}`,
		`{"model":"llama","input":"x","encoding_format":"bytes"}`, `{"model":"llama","input":`} {
		if code, _ := get(body); code != http.StatusBadRequest {
			t.Errorf("%s: code %d, want 400", body, code)
		}
	}
	if code, _ := get(`{"model":"nope","input":"x"}`); code != http.StatusNotFound {
		t.Errorf("unknown model: code %d, want 404", code)
	}
}
