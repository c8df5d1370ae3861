package sim

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/llmgw/llmgw/vllm"
)

// tierRecorder is a CacheObserver and TierObserver that writes down what
// it is told, GPU and CPU alike.
type tierRecorder struct {
	recorder
	cpu []string
}

func (r *tierRecorder) OffloadStored(h []vllm.BlockHash) {
	r.cpu = append(r.cpu, fmt.Sprintf("cpu stored %d", len(h)))
}

func (r *tierRecorder) OffloadRemoved(h []vllm.BlockHash) {
	r.cpu = append(r.cpu, fmt.Sprintf("cpu removed %d", len(h)))
}

// TestCPUTierLRUBound: the CPU tier stores every committed block
// (write-through), never holds more than its capacity, evicts the least
// recently used — a block loaded back counts as used — in one event per
// store, and serves a prefix the GPU cache has lost.
func TestCPUTierLRUBound(t *testing.T) {
	obs := &tierRecorder{}
	// GPU: 4 blocks; CPU: 6 blocks. Prompts of 3 blocks (12 tokens).
	c := newPrefixCache(4, true, obs).withCPUTier(6)
	a, ha := seqOf(t, 0, 12)
	b, hb := seqOf(t, 100, 12)
	d, hd := seqOf(t, 200, 12)
	run(t, c, a, ha, 0) // CPU: a a a
	run(t, c, b, hb, 0) // GPU evicts 2 of a's; CPU: a a a b b b
	if got := len(c.cpu.entries); got != 6 {
		t.Fatalf("CPU tier holds %d blocks, want 6", got)
	}
	// a's prefix: the GPU lost its tail, the CPU tier has all of it.
	gpu := c.hits(ha, len(a)+1, bs)
	if cpu := c.offloadHits(ha, gpu, len(a)+1, bs); gpu+cpu != 3 {
		t.Errorf("a's prefix: %d GPU + %d CPU hits, want 3 in all", gpu, cpu)
	}
	// That lookup touched a's blocks: d's store evicts b's three.
	run(t, c, d, hd, 0)
	if got := len(c.cpu.entries); got != 6 {
		t.Errorf("CPU tier holds %d blocks, want its capacity 6", got)
	}
	for i, h := range hb {
		if _, ok := c.cpu.entries[h]; ok {
			t.Errorf("b's block %d still in the CPU tier; the least recently used should have gone", i)
		}
	}
	for i, h := range ha {
		if _, ok := c.cpu.entries[h]; !ok {
			t.Errorf("a's block %d evicted from the CPU tier though it was just loaded", i)
		}
	}
	want := []string{"cpu stored 3", "cpu stored 3", "cpu removed 3", "cpu stored 3"}
	if !slices.Equal(obs.cpu, want) {
		t.Errorf("CPU events %v, want %v", obs.cpu, want)
	}
	// More new blocks than the tier holds: nothing stored, as vLLM's
	// prepare_store gives up.
	e, he := seqOf(t, 300, 4*7)
	small := newPrefixCache(16, true, obs).withCPUTier(6)
	obs.cpu = nil
	run(t, small, e, he, 0)
	if len(small.cpu.entries) != 0 || len(obs.cpu) != 0 {
		t.Errorf("7 blocks into a 6-block tier: %d stored, events %v; want none", len(small.cpu.entries), obs.cpu)
	}
}

// TestOffloadEventBytes: the CPU tier's events are the bytes vLLM's
// OffloadingConnector.take_events makes (vllm/distributed/kv_transfer/
// kv_connector/v1/offloading_connector.py over the LRU manager of
// vllm/v1/kv_offload/lru_manager.py): BlockStored(block_hashes,
// parent_block_hash=None, token_ids=[], block_size, lora_id=None,
// medium="CPU", lora_name=None) with extra_keys and group_idx left at
// None, and BlockRemoved(block_hashes, medium="CPU") — in map encoding
// (msgspec, omit_defaults) and array encoding alike.
func TestOffloadEventBytes(t *testing.T) {
	// The block hash of ../shared/vectors/vllm-kvevents.md's examples.
	raw, _ := hex.DecodeString("202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea")
	var h vllm.BlockHash
	copy(h[:], raw)
	cfg := DefaultConfig()
	cfg.BlockSize = 16
	for _, tc := range []struct {
		enc            vllm.Encoding
		stored, remove string
	}{
		{vllm.EncodingMap,
			"88a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cf2ceabcfae6d332ea" +
				"b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647390aa626c6f636b5f73697a6510" +
				"a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c0",
			"83a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf2ceabcfae6d332ea" +
				"a66d656469756da3435055"},
		// Arrays of vLLM's current length: every field, None as nil.
		{vllm.EncodingArray,
			"9cab426c6f636b53746f72656491cf2ceabcfae6d332eac09010c0a3435055c0c0c0c0c0",
			"94ac426c6f636b52656d6f76656491cf2ceabcfae6d332eaa3435055c0c0"},
	} {
		cfg.KVEventsEncoding = tc.enc
		p := newKVPublisher(&cfg, KVEventsConfig{}, slog.New(slog.DiscardHandler), time.Now, func() Faults { return Faults{} })
		p.OffloadStored([]vllm.BlockHash{h})
		p.OffloadRemoved([]vllm.BlockHash{h})
		payload, err := vllm.EncodeEventBatch(vllm.EventBatch{TS: 1700000000.5, Events: p.pending}, tc.enc)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{tc.stored, tc.remove} {
			w, _ := hex.DecodeString(want)
			if !bytes.Contains(payload, w) {
				t.Errorf("encoding %v: payload %x lacks %s", tc.enc, payload, want)
			}
		}
		batch, err := vllm.DecodeEventBatch(payload)
		if err != nil {
			t.Fatalf("encoding %v: %v", tc.enc, err)
		}
		st, ok := batch.Events[0].(*vllm.BlockStored)
		if !ok || st.OnGPU() || *st.Medium != vllm.MediumCPU {
			t.Errorf("encoding %v: first event %#v, want a BlockStored in CPU", tc.enc, batch.Events[0])
		}
		rm, ok := batch.Events[1].(*vllm.BlockRemoved)
		if !ok || rm.OnGPU() || *rm.Medium != vllm.MediumCPU {
			t.Errorf("encoding %v: second event %#v, want a BlockRemoved in CPU", tc.enc, batch.Events[1])
		}
	}
}

// TestOffloadHitCostsATransfer: a prompt whose prefix the GPU cache lost
// but the CPU tier holds is loaded over the host link rather than
// recomputed: its step is shorter than a recompute's, longer than a GPU
// hit's, by the bytes over the link; and the engine reports the loaded
// tokens as cached, as vLLM's num_cached_tokens counts a connector's.
func TestOffloadHitCostsATransfer(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Model, cfg.GPU, cfg.MaxModelLen = "meta-llama/Llama-3.1-8B-Instruct", "l4", 3072
	cfg.NumGPUBlocks, cfg.KVOffloadingSize = 200, 4 // 4 GiB: 32,768 tokens of the 8B's KV
	cfg.Derive()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.numCPUBlocks(), 4*gib/(128*1024*16); got != want {
		t.Errorf("4 GiB of CPU tier: %d blocks, want %d", got, want)
	}
	e := newEngine(&cfg, nil)
	prompt := func(first int) *gseq {
		t.Helper()
		all := make([]int, 2048+1)
		for i := range all {
			all[i] = first + i
		}
		hashes, err := vllm.BlockHashes(vllm.NoneHash("0"), all[:2048], cfg.BlockSize, nil)
		if err != nil {
			t.Fatal(err)
		}
		allHashes, _ := vllm.BlockHashes(vllm.NoneHash("0"), all, cfg.BlockSize, nil)
		return &gseq{hashes: hashes, allHashes: allHashes, all: all, promptLen: 2048, maxTokens: 1, cached: -1,
			notify: make(chan struct{}, 1)}
	}
	// serve runs one request alone to its end and returns its first
	// step's time and what it found cached.
	serve := func(s *gseq) (time.Duration, int) {
		t.Helper()
		e.wait = append(e.wait, s)
		var first time.Duration
		for s.state != seqFinished {
			items := e.scheduleStep(time.Unix(0, 0))
			if len(items) == 0 {
				t.Fatal("nothing scheduled")
			}
			d := e.gpu.stepTime(work(items))
			if first == 0 {
				first = d
			}
			e.finish(items)
		}
		return first, s.cached
	}
	cold, cached := serve(prompt(1))
	if cached != 0 {
		t.Fatalf("first run found %d tokens cached", cached)
	}
	warm, cached := serve(prompt(1))
	if cached != 2048-cfg.BlockSize {
		t.Fatalf("second run found %d tokens cached, want %d (GPU hit)", cached, 2048-cfg.BlockSize)
	}
	// Two other prompts of 2,048 tokens: the 200-block GPU cache loses the
	// first one's tail, then its head.
	serve(prompt(100000))
	serve(prompt(200000))
	if got := e.cache.hits(prompt(1).hashes, 2048, cfg.BlockSize); got != 0 {
		t.Fatalf("GPU still holds %d of the first prompt's blocks", got)
	}
	loaded, cached := serve(prompt(1))
	if cached != 2048-cfg.BlockSize {
		t.Errorf("after GPU eviction: %d tokens cached, want %d from the CPU tier", cached, 2048-cfg.BlockSize)
	}
	g := e.gpu
	link := time.Duration(float64(2048-cfg.BlockSize) * g.shape.kvBytesPerToken() /
		(g.gpu.HostLink * g.cal.HostLinkEfficiency) * float64(time.Second))
	t.Logf("first step of a 2,048-token prompt: recompute %v, GPU hit %v, CPU hit %v (copy %v)", cold, warm, loaded, link)
	if !(warm < loaded && loaded < cold) {
		t.Errorf("first step: GPU hit %v, CPU hit %v, recompute %v: want GPU < CPU < recompute", warm, loaded, cold)
	}
	if d := loaded - warm; d < link-time.Millisecond || d > link+time.Millisecond {
		t.Errorf("CPU hit costs %v over a GPU hit, want the copy's %v", d, link)
	}
}

// TestKVEventsMirrorBothTiers: a subscriber that applies the events of
// each medium to its own set — the agent's job with tiers, in miniature —
// ends with exactly the GPU cache and the CPU tier the simulator holds,
// after prompts that overflow both, in map and array encodings; the CPU
// set never exceeds the tier.
func TestKVEventsMirrorBothTiers(t *testing.T) {
	for _, enc := range []vllm.Encoding{vllm.EncodingMap, vllm.EncodingArray} {
		t.Run(fmt.Sprint(enc), func(t *testing.T) {
			const cpuBlocks = 10
			h := startKV(t, kvSetup{endpoint: "connect", topic: "kv", encoding: enc, cpuBlocks: cpuBlocks})
			gpu, cpu := map[uint64]bool{}, map[uint64]bool{}
			var next uint64
			var cpuEvents int
			drain := func() {
				n := h.settle()
				for ; next < n; next++ {
					_, _, payload := h.recv()
					b, err := vllm.DecodeEventBatch(payload)
					if err != nil {
						t.Fatal(err)
					}
					for _, ev := range b.Events {
						switch e := ev.(type) {
						case *vllm.BlockStored:
							m := gpu
							if !e.OnGPU() {
								m, cpuEvents = cpu, cpuEvents+1
								if e.ParentBlockHash != nil || len(e.TokenIDs) != 0 || e.GroupIdx != nil || e.BlockSize != 4 {
									t.Errorf("CPU BlockStored %+v: want no parent, tokens or group, block size 4", e)
								}
							}
							for _, x := range e.BlockHashes {
								m[x.Uint64()] = true
							}
						case *vllm.BlockRemoved:
							m := gpu
							if !e.OnGPU() {
								m, cpuEvents = cpu, cpuEvents+1
							}
							for _, x := range e.BlockHashes {
								if !m[x.Uint64()] {
									t.Errorf("removal of %d from %v, which was never stored there", x.Uint64(), *e.Medium)
								}
								delete(m, x.Uint64())
							}
						case *vllm.AllBlocksCleared:
							clear(gpu)
						}
					}
					if len(cpu) > cpuBlocks {
						t.Fatalf("the CPU mirror holds %d blocks, the tier %d", len(cpu), cpuBlocks)
					}
				}
			}
			sorted := func(m map[uint64]bool) []uint64 {
				out := make([]uint64, 0, len(m))
				for k := range m {
					out = append(out, k)
				}
				slices.Sort(out)
				return out
			}
			prompt := func(first, n int) []int {
				p := make([]int, n)
				for i := range p {
					p[i] = first*1000 + i
				}
				return p
			}
			// 24 GPU blocks of 4 tokens; prompts of 5–12 blocks overflow
			// the GPU, then the 10-block tier.
			for i, p := range [][]int{prompt(1, 20), prompt(2, 40), prompt(3, 48), prompt(1, 20), prompt(4, 44), prompt(2, 40)} {
				h.complete(p...)
				drain()
				blocks := h.blocks()
				if got := sorted(gpu); !slices.Equal(got, blocks.BlockHashes) {
					t.Fatalf("after request %d: GPU mirror %v, simulator %v", i, got, blocks.BlockHashes)
				}
				if got := sorted(cpu); !slices.Equal(got, blocks.CPUBlockHashes) && (len(got) > 0 || len(blocks.CPUBlockHashes) > 0) {
					t.Fatalf("after request %d: CPU mirror %v, simulator %v", i, got, blocks.CPUBlockHashes)
				}
			}
			if cpuEvents == 0 || len(cpu) != cpuBlocks {
				t.Errorf("%d CPU events, %d blocks in the CPU mirror: the tier was never filled", cpuEvents, len(cpu))
			}
		})
	}
}

// TestResetExternalEmptiesCPUTier: POST /reset_prefix_cache keeps the CPU
// tier, as vLLM keeps its connector's cache; with reset_external=true it
// empties it too (vLLM's reset_connector), so a bench that resets before
// every run starts on cold tiers. A value FastAPI would not read as a bool
// is refused.
func TestResetExternalEmptiesCPUTier(t *testing.T) {
	tests := []struct {
		query   string
		status  int
		cpuLeft bool
	}{
		{"", http.StatusOK, true},
		{"?reset_external=false", http.StatusOK, true},
		{"?reset_external=true", http.StatusOK, false},
		{"?reset_external=1", http.StatusOK, false},
		{"?reset_external=maybe", http.StatusBadRequest, true},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			cfg := testConfig()
			cfg.NumGPUBlocks, cfg.NumCPUBlocks, cfg.MaxModelLen = 8, 32, 128
			s, err := New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			toks, h := seqOf(t, 0, 4*bs)
			run(t, s.eng.cache, toks, h, 0)
			if len(s.eng.cache.cpu.entries) == 0 {
				t.Fatal("nothing stored in the CPU tier")
			}
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/reset_prefix_cache"+tt.query, nil))
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.status, rec.Body)
			}
			if left := len(s.eng.cache.cpu.entries) > 0; left != tt.cpuLeft {
				t.Errorf("CPU tier holds %d blocks after the reset; want some: %v", len(s.eng.cache.cpu.entries), tt.cpuLeft)
			}
		})
	}
}
