package sim

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// GPUProfile is one accelerator as the roofline sees it (design §8): how
// much memory vLLM finds, how fast it streams it, and how fast its tensor
// cores multiply in BF16.
type GPUProfile struct {
	Name string
	// MemoryBytes is the device memory CUDA reports (torch.cuda.mem_get_info's
	// total, which vLLM multiplies by --gpu-memory-utilization): a little
	// under the datasheet's GB for the GDDR cards, the full GiB for HBM.
	MemoryBytes float64
	// Bandwidth is the datasheet memory bandwidth, bytes per second.
	Bandwidth float64
	// FLOPS is the datasheet dense BF16 tensor throughput (without 2:4
	// sparsity), per second.
	FLOPS float64
	// Device is the name vLLM's platform reports, lower case; vLLM picks its
	// batch defaults from it (EngineArgs.get_batch_defaults).
	Device string
	// HostLink is the datasheet bandwidth of the board's link to the host,
	// one direction, bytes per second: what loading weights onto the GPU,
	// and sleep mode's offload and reload of them (design §8 "Loading and
	// sleeping"), move over.
	HostLink float64
	// Disk is the read bandwidth of the node's model store, bytes per
	// second: a local NVMe SSD of the kind the clouds attach to these
	// boards. A start reads the weights from it first.
	Disk float64
	// BaseClock and BoostClock are the board's datasheet GPU clocks, MHz.
	// FLOPS is quoted at the boost clock; under a sustained dense tensor
	// load a board whose power limit is low for its silicon (the 72 W L4
	// above all, base 795 against boost 2040 MHz) runs well below it, one
	// with headroom (the 450 W RTX 4090, 2235 against 2520) close to it.
	// Calibration.ClockDerate says how far towards base the roofline
	// takes a board.
	BaseClock, BoostClock float64
	// FrontEnd, when set, replaces Calibration.RequestOverhead for this
	// profile: the API server's time for a request is the host CPU's, not
	// the GPU's, and the profile stands for a node, GPU and host. Only the
	// RTX 4090 has one of its own, fitted on its published sweep (a
	// desktop host; docs/benchmarks.md "Concurrency fidelity (issue 32)");
	// --sim-request-overhead replaces either.
	FrontEnd time.Duration
}

// sustainedFLOPS is the tensor throughput a long prefill step sees: FLOPS
// derated towards the base clock by (base/boost)^derate.
func (p GPUProfile) sustainedFLOPS(derate float64) float64 {
	if p.BaseClock <= 0 || p.BoostClock <= 0 || derate == 0 {
		return p.FLOPS
	}
	return p.FLOPS * math.Pow(p.BaseClock/p.BoostClock, derate)
}

const (
	gib = 1 << 30
	mib = 1 << 20
)

// gpuProfiles are the built-in profiles. Figures from the vendors'
// datasheets:
//   - l4: NVIDIA L4 datasheet — 24 GB GDDR6, 300 GB/s, BF16 tensor 242
//     TFLOPS with sparsity (121 dense).
//   - a10g: NVIDIA A10 datasheet (AWS's A10G is the same GA102 board with
//     the same memory) — 24 GB GDDR6, 600 GB/s, BF16 125 TFLOPS dense.
//   - a100-40gb, a100-80gb: NVIDIA A100 datasheet — 40 GB HBM2 1,555 GB/s,
//     80 GB HBM2e 2,039 GB/s (SXM); BF16 312 TFLOPS dense.
//   - h100-sxm: NVIDIA H100 datasheet — 80 GB HBM3, 3.35 TB/s, BF16 1,979
//     TFLOPS with sparsity (989 dense).
//   - h200: NVIDIA H200 datasheet — 141 GB HBM3e, 4.8 TB/s, BF16 989 dense.
//   - rtx4090: NVIDIA Ada Lovelace architecture whitepaper (RTX 4090) —
//     24 GB GDDR6X, 1,008 GB/s, BF16 tensor with FP32 accumulate 165.2
//     TFLOPS dense.
//
// Memory is what nvidia-smi reports for each board (L4 23,034 MiB, A10G
// 23,028 MiB, A100-40GB 40,960 MiB, A100-80GB 81,920 MiB, H100 81,559 MiB,
// H200 143,771 MiB, RTX 4090 24,564 MiB).
//
// The host link, from the same datasheets: PCIe Gen4 x16 (64 GB/s both
// ways, 32 GB/s each) on the L4, A10, A100 (SXM4 boards reach the host over
// PCIe Gen4 too) and RTX 4090; PCIe Gen5 x16 (128 GB/s, 64 GB/s each way) on
// the H100 SXM and H200. Copies reach HostLinkEfficiency of it
// (Calibration). The disk is a typical local NVMe SSD, PCIe Gen3 x4:
// about 3 GB/s sequential read (the instance-store drives of the clouds'
// L4, A10G and A100 instances are of this class; newer Gen4 drives read
// faster, which --sim-load-scale can stand for).
//
// Clocks (base / boost, MHz), from the same datasheets and NVIDIA's board
// specifications: L4 795 / 2040, A10 885 / 1695, A100 SXM4 1095 / 1410,
// H100 SXM5 1590 / 1980 (the H200, the same GH100 silicon, taken as the
// H100), RTX 4090 2235 / 2520.
var gpuProfiles = []GPUProfile{
	{"l4", 23034 * mib, 300e9, 121e12, "nvidia l4", pcieGen4x16, nvmeRead, 795, 2040, 0},
	{"a10g", 23028 * mib, 600e9, 125e12, "nvidia a10g", pcieGen4x16, nvmeRead, 885, 1695, 0},
	{"a100-40gb", 40960 * mib, 1555e9, 312e12, "nvidia a100-sxm4-40gb", pcieGen4x16, nvmeRead, 1095, 1410, 0},
	{"a100-80gb", 81920 * mib, 2039e9, 312e12, "nvidia a100-sxm4-80gb", pcieGen4x16, nvmeRead, 1095, 1410, 0},
	{"h100-sxm", 81559 * mib, 3350e9, 989e12, "nvidia h100 80gb hbm3", pcieGen5x16, nvmeRead, 1590, 1980, 0},
	{"h200", 143771 * mib, 4800e9, 989e12, "nvidia h200", pcieGen5x16, nvmeRead, 1590, 1980, 0},
	{"rtx4090", 24564 * mib, 1008e9, 165.2e12, "nvidia geforce rtx 4090", pcieGen4x16, nvmeRead, 2235, 2520, rtx4090FrontEnd},
}

// rtx4090FrontEnd is the RTX 4090 node's request overhead (GPUProfile.FrontEnd).
const rtx4090FrontEnd = 12 * time.Millisecond

// Host links and disks of the profiles, bytes per second (above).
const (
	pcieGen4x16 = 32e9
	pcieGen5x16 = 64e9
	nvmeRead    = 3e9
)

// GPUProfileNames lists the built-in profiles, for help and errors.
func GPUProfileNames() []string {
	names := make([]string, len(gpuProfiles))
	for i, p := range gpuProfiles {
		names[i] = p.Name
	}
	return names
}

// LookupGPU finds a built-in profile by name.
func LookupGPU(name string) (GPUProfile, bool) {
	for _, p := range gpuProfiles {
		if p.Name == strings.ToLower(name) {
			return p, true
		}
	}
	return GPUProfile{}, false
}

// ModelShape is what the roofline needs of a transformer: its weights and
// the sizes that decide the FLOPs of a token and the bytes of its KV.
type ModelShape struct {
	Params   float64 // all weights, embeddings included
	Layers   int
	Hidden   int
	Heads    int // query heads
	KVHeads  int
	HeadDim  int
	Vocab    int
	TiedEmbs bool // lm_head shares the embedding matrix (its bytes are read once)
}

// modelShapes are the built-in shapes, from each model's config.json on
// Hugging Face (hidden_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, head_dim, vocab_size, tie_word_embeddings) and its
// model card's parameter count. Keys are normalised ids (normalizeModelID).
var modelShapes = map[string]ModelShape{
	"qwen2.5-0.5b":    {0.494e9, 24, 896, 14, 2, 64, 151936, true},
	"qwen2.5-1.5b":    {1.54e9, 28, 1536, 12, 2, 128, 151936, true},
	"qwen2.5-7b":      {7.62e9, 28, 3584, 28, 4, 128, 152064, false},
	"qwen3-0.6b":      {0.596e9, 28, 1024, 16, 8, 128, 151936, true},
	"qwen3-8b":        {8.19e9, 36, 4096, 32, 8, 128, 151936, false},
	"llama-3.1-8b":    {8.03e9, 32, 4096, 32, 8, 128, 128256, false},
	"llama-3.2-1b":    {1.24e9, 16, 2048, 32, 8, 64, 128256, true},
	"llama-3.2-3b":    {3.21e9, 28, 3072, 24, 8, 128, 128256, true},
	"mistral-7b-v0.3": {7.25e9, 32, 4096, 32, 8, 128, 32768, false},
	"gemma-2-9b":      {9.24e9, 42, 3584, 16, 8, 256, 256000, true},
}

// ModelShapeNames lists the built-in shapes' ids.
func ModelShapeNames() []string {
	names := make([]string, 0, len(modelShapes))
	for k := range modelShapes {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// normalizeModelID maps a Hugging Face id or path to a modelShapes key:
// "meta-llama/Llama-3.1-8B-Instruct" → "llama-3.1-8b",
// "mistralai/Mistral-7B-Instruct-v0.3" → "mistral-7b-v0.3".
func normalizeModelID(id string) string {
	id = strings.ToLower(strings.TrimRight(id, "/"))
	if i := strings.LastIndex(id, "/"); i >= 0 {
		id = id[i+1:]
	}
	id = strings.TrimPrefix(id, "meta-")
	for _, suffix := range []string{"-instruct", "-it", "-chat", "-base"} {
		id = strings.Replace(id, suffix, "", 1)
	}
	return id
}

// ParseModelShape reads --sim-model-shape: a built-in id, or
// params=8.03e9,layers=32,hidden=4096,heads=32,kv_heads=8,head_dim=128,vocab=128256[,tied=true].
func ParseModelShape(s string) (ModelShape, error) {
	if m, ok := modelShapes[normalizeModelID(s)]; ok {
		return m, nil
	}
	if !strings.Contains(s, "=") {
		return ModelShape{}, fmt.Errorf("%q: not a built-in shape (%s) nor key=value pairs", s, strings.Join(ModelShapeNames(), ", "))
	}
	var m ModelShape
	ints := map[string]*int{"layers": &m.Layers, "hidden": &m.Hidden, "heads": &m.Heads,
		"kv_heads": &m.KVHeads, "head_dim": &m.HeadDim, "vocab": &m.Vocab}
	for _, kv := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		switch {
		case k == "params":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 {
				return m, fmt.Errorf("params=%q: must be a positive number", v)
			}
			m.Params = f
		case k == "tied":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return m, fmt.Errorf("tied=%q: must be true or false", v)
			}
			m.TiedEmbs = b
		case ints[k] != nil:
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return m, fmt.Errorf("%s=%q: must be a positive integer", k, v)
			}
			*ints[k] = n
		default:
			return m, fmt.Errorf("%q: unknown key (params, layers, hidden, heads, kv_heads, head_dim, vocab, tied)", k)
		}
	}
	for k, p := range ints {
		if *p == 0 {
			return m, fmt.Errorf("%s: missing", k)
		}
	}
	if m.Params == 0 {
		return m, fmt.Errorf("params: missing")
	}
	return m, nil
}

// kvBytesPerToken is one token's K and V over every layer in BF16.
func (m ModelShape) kvBytesPerToken() float64 {
	return float64(2 * m.Layers * m.KVHeads * m.HeadDim * 2)
}

// Calibration is the one set of roofline constants every profile and model
// shares (design §8). They were fitted to the issue-18 L4 sweep of
// Qwen2.5-0.5B-Instruct (docs/benchmarks.md "GPU-like simulator").
type Calibration struct {
	// MemEfficiency is the share of datasheet bandwidth a decode step's
	// weight and KV streaming reaches.
	MemEfficiency float64
	// ComputeEfficiency is the share of datasheet FLOPS a large GEMM
	// reaches; a model of hidden size h reaches ComputeEfficiency ×
	// h/(h+SmallGEMMHidden): narrow matrices keep tensor cores idle.
	ComputeEfficiency float64
	SmallGEMMHidden   float64
	// ClockDerate takes each board's FLOPS towards its base clock:
	// × (base/boost)^ClockDerate (GPUProfile.sustainedFLOPS). 0 is the
	// datasheet's boost figure for every board.
	ClockDerate float64
	// StepOverhead is the fixed CPU time of an engine step (scheduling,
	// input preparation, sampling launch); SeqOverhead is added per
	// sequence in the step (per-request bookkeeping, detokenising its
	// token, streaming it out).
	StepOverhead time.Duration
	SeqOverhead  time.Duration
	// RequestOverhead is the API server's time for a request before the
	// engine sees it: HTTP, chat template, tokenisation, IPC. RequestSerial
	// is the part of it done on the API server's one event loop, a request
	// at a time in arrival order (apiServer): requests that arrive together
	// wait for each other's. The rest varies by up to ±RequestJitter.
	RequestOverhead time.Duration
	RequestSerial   time.Duration
	RequestJitter   time.Duration
	// RequestTail, when set, adds to each request's overhead a draw from
	// an exponential distribution of that mean (seeded as the jitter).
	RequestTail time.Duration
	// NonTorchReserve and ActivationBytesPerToken are what vLLM's memory
	// profile subtracts besides the weights: CUDA context, NCCL and CUDA
	// graphs, and the peak activations of a max_num_batched_tokens forward
	// pass, per token and per unit of hidden size.
	NonTorchReserve         float64
	ActivationBytesPerToken float64
	// HostLinkEfficiency is the share of the host link's datasheet
	// bandwidth a large copy from or to pinned host memory reaches (CUDA's
	// bandwidthTest reaches about 25 of PCIe Gen4's 32 GB/s).
	HostLinkEfficiency float64
	// EngineStartup is what a vLLM start costs besides moving the weights:
	// the API server's and the engine core's processes and imports, CUDA
	// initialisation, the model's construction, torch.compile (from a
	// warm compile cache), the memory profile and CUDA-graph capture. An
	// estimate, not a fit: vLLM V1 logs tens of seconds for these on an 8B
	// model ("init engine (profile, create kv cache, warmup model) took
	// ..."), most of it CPU-bound and so much the same on every board; 20 s
	// is the low end of that. --sim-load-scale scales it with the rest.
	EngineStartup time.Duration
}

// DefaultCalibration is the fitted set.
var DefaultCalibration = Calibration{
	MemEfficiency:           0.80,
	ComputeEfficiency:       1.0,
	SmallGEMMHidden:         0,
	ClockDerate:             1.5,
	StepOverhead:            900 * time.Microsecond,
	SeqOverhead:             60 * time.Microsecond,
	RequestOverhead:         22 * time.Millisecond,
	RequestSerial:           1 * time.Millisecond,
	RequestJitter:           1 * time.Millisecond,
	RequestTail:             3 * time.Millisecond,
	NonTorchReserve:         1.0 * gib,
	ActivationBytesPerToken: 24 * 2, // × hidden: ~24 BF16 activations of hidden width per token at peak
	HostLinkEfficiency:      0.78,
	EngineStartup:           20 * time.Second,
}

// gpuModel prices engine steps on one profile for one model shape.
type gpuModel struct {
	gpu   GPUProfile
	shape ModelShape
	cal   Calibration
}

// stepWork is what one step computes, for the cost model: per sequence, the
// tokens it computes and the context before them.
type stepWork struct {
	seqs []seqWork
}

type seqWork struct {
	newTokens, context int
	// samples is true when the step ends the sequence's known tokens, so
	// the lm_head runs for its last position and a token is sampled.
	samples bool
	// loaded is how many of the context's tokens the step first copies in
	// from the CPU tier.
	loaded int
}

// weightBytes are the weights in BF16, read once per step.
func (g *gpuModel) weightBytes() float64 { return g.shape.Params * 2 }

// stepTime is the roofline: the larger of memory time and compute time,
// plus the fixed overheads, plus the copy of any KV loaded from the CPU tier
// over the host link (before the forward pass that needs it).
func (g *gpuModel) stepTime(w stepWork) time.Duration {
	if len(w.seqs) == 0 {
		return 0
	}
	m := g.shape
	kvTok := m.kvBytesPerToken()
	lmHead := float64(m.Vocab * m.Hidden)
	body := m.Params - lmHead // weights every token multiplies through
	if !m.TiedEmbs {
		body -= lmHead // the input embedding is a lookup, not a GEMM
	}
	attnWidth := float64(m.Heads * m.HeadDim)
	var tokens, samples, kvRead, attnFLOPs, loaded float64
	for _, s := range w.seqs {
		loaded += float64(s.loaded)
		n, c := float64(s.newTokens), float64(s.context)
		tokens += n
		if s.samples {
			samples++
		}
		kvRead += (c + n) * kvTok
		// QKᵀ and AV: 2 GEMMs × 2 FLOPs per MAC, causal within the chunk.
		attnFLOPs += 4 * float64(m.Layers) * attnWidth * n * (c + n/2)
	}
	bytes := g.weightBytes() + kvRead + tokens*kvTok
	flops := 2*body*tokens + 2*lmHead*samples + attnFLOPs
	h := float64(m.Hidden)
	eff := g.cal.ComputeEfficiency * h / (h + g.cal.SmallGEMMHidden)
	sec := math.Max(bytes/(g.gpu.Bandwidth*g.cal.MemEfficiency), flops/(g.gpu.sustainedFLOPS(g.cal.ClockDerate)*eff))
	sec += loaded * kvTok / (g.gpu.HostLink * g.cal.HostLinkEfficiency)
	return time.Duration(sec*float64(time.Second)) + g.cal.StepOverhead +
		time.Duration(len(w.seqs))*g.cal.SeqOverhead
}

// numGPUBlocks is vLLM's KV capacity: memory × utilisation, less the
// weights, the non-torch reserve and the profiled peak activations, over
// the bytes of a block (all layers' K and V for block_size tokens).
func (g *gpuModel) numGPUBlocks(util float64, blockSize, maxBatchedTokens int) int {
	act := float64(maxBatchedTokens) * float64(g.shape.Hidden) * g.cal.ActivationBytesPerToken
	avail := g.gpu.MemoryBytes*util - g.weightBytes() - g.cal.NonTorchReserve - act
	if avail <= 0 {
		return 0
	}
	return int(avail / (g.shape.kvBytesPerToken() * float64(blockSize)))
}

// LoadTimes are what moving a model's weights costs on a GPU profile
// (design §8 "Loading and sleeping"), before any --sim-load-scale.
type LoadTimes struct {
	// Start is a start to ready: the engine's fixed startup, the weights
	// read from disk and copied to the GPU. Every start reads the disk:
	// the simulator does not model the page cache.
	Start time.Duration
	// Sleep is sleep mode's level 1 offload: the weights copied from the
	// GPU to pinned host memory.
	Sleep time.Duration
	// Wake is a wake from level 1: the weights copied back.
	Wake time.Duration
}

// loadTimes prices the weights' moves: bytes over the disk's and the host
// link's bandwidth, one after the other, as vLLM's loader reads each
// tensor and then copies it to the device.
func (g *gpuModel) loadTimes() LoadTimes {
	w := g.weightBytes()
	link := g.gpu.HostLink * g.cal.HostLinkEfficiency
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	return LoadTimes{
		Start: g.cal.EngineStartup + sec(w/g.gpu.Disk) + sec(w/link),
		Sleep: sec(w / link),
		Wake:  sec(w / link),
	}
}

// batchDefaults are vLLM's max_num_batched_tokens and max_num_seqs for the
// OpenAI server (EngineArgs.get_batch_defaults): larger on ≥70 GiB devices
// that are not A100s.
func (p GPUProfile) batchDefaults() (tokens, seqs int) {
	if p.MemoryBytes >= 70*gib && !strings.Contains(p.Device, "a100") {
		return 8192, 1024
	}
	return 2048, 256
}
