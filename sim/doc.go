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
// Time passes in one of two ways. Simple timing sleeps each request its own
// prefill and decode, independently of every other. GPU timing (--sim-gpu)
// runs the engine as vLLM's V1 scheduler does — steps over the whole batch
// within a token budget, chunked prefill, preemption by recompute when KV
// blocks run out — each step priced by a roofline of the GPU and the
// model's shape, with the KV capacity derived from memory; so decode slows
// as the batch grows and one replica's long prefill delays every decode on
// it, which is what makes prefix hits and load-aware routing pay.
//
// With a GPU profile an engine also takes as long to start as vLLM would
// to load the model there, and its sleep mode moves the weights to host
// memory and back over the board's host link, so the cost of a cold start
// and of a wake can be measured against each other.
//
// Chat, completions, the Responses API and Anthropic's Messages API share
// one engine path (generate.go): each reads its request into the chat
// template's messages and writes its own answer through a responder
// (respond.go, responses.go, anthropic.go). What the model says is planned
// per request (output.go): deterministic text, or — when tools, a
// response_format or logprobs ask for it — tool calls and JSON valid
// against the request's schema (jsonschema.go), as vLLM's structured
// outputs and tool parsers shape them. A client that leaves, or stops
// reading a stream, has its request aborted and counted.
//
// The pieces: a Tokenizer and chat template (tokenizer.go), the prefix cache
// (cache.go), the admission queue (engine.go), the step loop (sched.go),
// the roofline and the load times (gpu.go), sleep mode (sleep.go), the
// closed-loop benchmark in virtual time (virtual.go), the HTTP server
// (server.go), the generation APIs (generate.go, respond.go, responses.go,
// anthropic.go, output.go, jsonschema.go), its metrics (metrics.go), and
// vLLM's flags (config.go, vllmflags.go).
package sim
