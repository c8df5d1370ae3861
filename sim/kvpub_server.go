package sim

import (
	"context"
	"net/http"
	"slices"

	"github.com/llmgw/llmgw/vllm"
)

// startKV opens the KV-event sockets and starts the publisher, when
// --kv-events-config enables it; stop ends it and returns once its
// goroutines have. Serve calls stop after the HTTP server has stopped, so
// the last batch holds every change; after an injected crash stop sends
// nothing more, as a dead engine would not.
func (s *Server) startKV() (stop func(), err error) {
	if s.kv == nil {
		return func() {}, nil
	}
	if err := s.kv.open(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.kv.run(ctx, s.crashed)
	}()
	return func() { cancel(); <-done }, nil
}

// currentFaults is the fault settings now in force (they change through
// POST /sim/faults).
func (s *Server) currentFaults() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults
}

// CachedBlocks is the set of blocks the prefix cache holds — exactly what
// the KV events published so far describe — ordered by their int form.
func (s *Server) CachedBlocks() []vllm.BlockHash {
	s.eng.mu.Lock()
	out := make([]vllm.BlockHash, 0, len(s.eng.cache.entries))
	for h := range s.eng.cache.entries {
		out = append(out, h)
	}
	s.eng.mu.Unlock()
	sortHashes(out)
	return out
}

// CachedCPUBlocks is CachedBlocks for the CPU tier (--kv-offloading-size):
// the blocks it holds, in the same order; none without a tier.
func (s *Server) CachedCPUBlocks() []vllm.BlockHash {
	s.eng.mu.Lock()
	var out []vllm.BlockHash
	if t := s.eng.cache.cpu; t != nil {
		out = make([]vllm.BlockHash, 0, len(t.entries))
		for h := range t.entries {
			out = append(out, h)
		}
	}
	s.eng.mu.Unlock()
	sortHashes(out)
	return out
}

// sortHashes orders hashes by their int event form, then their bytes.
func sortHashes(out []vllm.BlockHash) {
	slices.SortFunc(out, func(a, b vllm.BlockHash) int {
		if c := compareUint64(a.Uint64(), b.Uint64()); c != 0 {
			return c
		}
		return slices.Compare(a[:], b[:])
	})
}

func compareUint64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// BlocksResponse is GET /sim/blocks: the cached blocks as int event hashes
// (sorted) and as full digests (hex, in the same order). A test compares
// it with what a KV-event subscriber has mirrored.
type BlocksResponse struct {
	BlockHashes []uint64 `json:"block_hashes"`
	Digests     []string `json:"digests"`
	// CPUBlockHashes are the CPU tier's blocks (--kv-offloading-size), in
	// the same form; absent without a tier.
	CPUBlockHashes []uint64 `json:"cpu_block_hashes,omitempty"`
}

func (s *Server) handleBlocks(w http.ResponseWriter, _ *http.Request) {
	blocks := s.CachedBlocks()
	resp := BlocksResponse{BlockHashes: make([]uint64, len(blocks)), Digests: make([]string, len(blocks))}
	for i, h := range blocks {
		resp.BlockHashes[i], resp.Digests[i] = h.Uint64(), h.String()
	}
	for _, h := range s.CachedCPUBlocks() {
		resp.CPUBlockHashes = append(resp.CPUBlockHashes, h.Uint64())
	}
	writeJSON(w, http.StatusOK, resp)
}
