package vllm

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"strconv"
	"testing"
)

type vectors struct {
	BlockSize int `json:"block_size"`
	NoneHash  []struct {
		Seed string `json:"pythonhashseed"`
		CBOR string `json:"cbor"`
		Hash string `json:"hash"`
		Int  string `json:"int"`
	} `json:"none_hash"`
	CBORExamples []struct {
		Seed      string   `json:"pythonhashseed"`
		Tokens    string   `json:"tokens"`
		ExtraKeys []string `json:"extra_keys"`
		CBOR      string   `json:"cbor"`
	} `json:"cbor_examples"`
	Chains []struct {
		Seed      string   `json:"pythonhashseed"`
		Tokens    string   `json:"tokens"`
		ExtraKeys []string `json:"extra_keys"`
		LoRAName  string   `json:"lora_name"`
		CacheSalt string   `json:"cache_salt"`
		Blocks    []struct {
			Hash string `json:"hash"`
			Int  string `json:"int"`
		} `json:"blocks"`
	} `json:"chains"`
}

func loadVectors(t *testing.T) vectors {
	t.Helper()
	b, err := os.ReadFile("testdata/vllm-blockhash.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// tokenRange parses the vectors' "a..b" (inclusive).
func tokenRange(t *testing.T, s string) []int {
	t.Helper()
	var a, b int
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '.' && s[i+1] == '.' {
			var err1, err2 error
			a, err1 = strconv.Atoi(s[:i])
			b, err2 = strconv.Atoi(s[i+2:])
			if err1 != nil || err2 != nil {
				t.Fatalf("bad range %q", s)
			}
		}
	}
	var out []int
	for x := a; x <= b; x++ {
		out = append(out, x)
	}
	return out
}

func TestNoneHash(t *testing.T) {
	for _, tc := range loadVectors(t).NoneHash {
		t.Run(tc.Seed, func(t *testing.T) {
			h := NoneHash(tc.Seed)
			if h.String() != tc.Hash {
				t.Errorf("NoneHash(%q) = %s, want %s", tc.Seed, h, tc.Hash)
			}
			if got := strconv.FormatUint(h.Uint64(), 10); got != tc.Int {
				t.Errorf("Uint64 = %s, want %s", got, tc.Int)
			}
		})
	}
}

func TestHashBlockCBOR(t *testing.T) {
	for _, tc := range loadVectors(t).CBORExamples {
		want, _ := hex.DecodeString(tc.CBOR)
		var keys []any
		for _, k := range tc.ExtraKeys {
			keys = append(keys, k)
		}
		got, err := HashBlock(NoneHash(tc.Seed), tokenRange(t, tc.Tokens), keys)
		if err != nil {
			t.Fatal(err)
		}
		if got != BlockHash(sha256.Sum256(want)) {
			t.Errorf("HashBlock(%s) does not hash the expected CBOR", tc.Tokens)
		}
	}
}

func TestBlockHashChains(t *testing.T) {
	v := loadVectors(t)
	for i, tc := range v.Chains {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			extra := RequestExtraKeys(tc.LoRAName, tc.CacheSalt)
			if len(tc.ExtraKeys) > 0 {
				extra = func(int, int) []any {
					var keys []any
					for _, k := range tc.ExtraKeys {
						keys = append(keys, k)
					}
					return keys
				}
			}
			got, err := BlockHashes(NoneHash(tc.Seed), tokenRange(t, tc.Tokens), v.BlockSize, extra)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.Blocks) {
				t.Fatalf("%d blocks, want %d", len(got), len(tc.Blocks))
			}
			for j, b := range tc.Blocks {
				if got[j].String() != b.Hash {
					t.Errorf("block %d = %s, want %s", j, got[j], b.Hash)
				}
				if s := strconv.FormatUint(got[j].Uint64(), 10); s != b.Int {
					t.Errorf("block %d int = %s, want %s", j, s, b.Int)
				}
			}
		})
	}
}

func TestBlockHashesPartialAndErrors(t *testing.T) {
	tests := []struct {
		name      string
		tokens    int
		blockSize int
		extra     ExtraKeysFunc
		want      int
		wantErr   bool
	}{
		{"partial block dropped", 40, 16, nil, 2, false},
		{"shorter than a block", 15, 16, nil, 0, false},
		{"zero block size", 16, 0, nil, 0, true},
		{"unsupported extra key", 16, 16, func(int, int) []any { return []any{1.5} }, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := BlockHashes(NoneHash("0"), make([]int, tc.tokens), tc.blockSize, tc.extra)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if len(got) != tc.want {
				t.Errorf("%d hashes, want %d", len(got), tc.want)
			}
		})
	}
}

func TestCBORHeads(t *testing.T) {
	tests := []struct {
		v    any
		want string
	}{
		{0, "00"}, {23, "17"}, {24, "1818"}, {255, "18ff"}, {256, "190100"},
		{65536, "1a00010000"}, {int64(1) << 32, "1b0000000100000000"},
		{-1, "20"}, {-25, "3818"}, {"a", "6161"}, {[]byte{1}, "4101"},
		{[]any{"x", 1}, "82617801"}, {nil, "f6"},
	}
	for _, tc := range tests {
		var e cborEncoder
		if err := e.value(tc.v); err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(e.buf); got != tc.want {
			t.Errorf("cbor(%v) = %s, want %s", tc.v, got, tc.want)
		}
	}
}
