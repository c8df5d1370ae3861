package sim

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/vllm"
)

// storedHashes is a CacheObserver collecting stored block hashes.
type storedHashes struct {
	mu     sync.Mutex
	hashes []vllm.BlockHash
}

func (s *storedHashes) BlocksStored(_ *vllm.BlockHash, blocks []StoredBlock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range blocks {
		s.hashes = append(s.hashes, b.Hash)
	}
}
func (s *storedHashes) BlocksRemoved([]vllm.BlockHash) {}
func (s *storedHashes) AllBlocksCleared()              {}

// TestCachedBlocksHashLikeTheRouter is tier 2's premise (design §7.5): the
// router tokenizes through /tokenize, hashes with vllm.BlockHashes and the
// same PYTHONHASHSEED, and must arrive at the hashes the engine caches.
func TestCachedBlocksHashLikeTheRouter(t *testing.T) {
	obs := &storedHashes{}
	_, ts := newTestServer(t, testConfig(), WithCacheObserver(obs))
	chat := chatBody("which replica holds my prefix?", `,"max_tokens":1`)

	_, b := post(t, ts.URL+"/tokenize", chat)
	var tr vllm.TokenizeResponse
	if err := json.Unmarshal(b, &tr); err != nil {
		t.Fatal(err)
	}
	want, err := vllm.BlockHashes(vllm.NoneHash("0"), tr.Tokens, 16, nil)
	if err != nil || len(want) == 0 {
		t.Fatalf("%d router hashes, err %v", len(want), err)
	}
	if resp, b := post(t, ts.URL+"/v1/chat/completions", chat); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.hashes) < len(want) || !slices.Equal(obs.hashes[:len(want)], want) {
		t.Errorf("engine cached %v\nrouter computed %v", obs.hashes, want)
	}
}

func TestRunStopsWhileLoading(t *testing.T) {
	cfg := testConfig()
	cfg.StartupDelay = time.Hour
	cfg.Host, cfg.Port = "127.0.0.1", 0
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx); err != nil {
		t.Errorf("Run = %v, want nil for a stop while loading", err)
	}
}
