// Package sim is the engine simulator (design §8): an HTTP server that speaks
// vLLM's OpenAI-compatible protocol faithfully enough that the agent and the
// router cannot tell it from vLLM, on machines with no GPU.
//
// Faithful where routing can see it, and nowhere else. The text it
// generates is nonsense, but deterministic; what is modelled with care is
// what a router's decisions change: a prefix cache of num_gpu_blocks blocks
// hashed exactly as vLLM hashes them (sha256_cbor) with LRU eviction, a
// prefill cost proportional to the tokens the cache did not supply, a
// per-token decode cost, and at most max_num_seqs sequences running with the
// rest waiting in FIFO order. So sending a request to the replica that holds
// its prefix shows up in time to first token, and in cached_tokens, as it
// would on GPUs.
//
// The pieces: a Tokenizer and chat template (tokenizer.go), the prefix cache
// (cache.go), the admission queue (engine.go), the HTTP server
// (server.go) and its metrics (metrics.go).
package sim
