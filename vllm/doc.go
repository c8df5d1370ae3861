// Package vllm is what llmgw knows of vLLM's wire formats (design §3): metric
// names and labels, the /tokenize and /detokenize bodies, the OpenAI shapes
// vLLM serves, its error body, and its sha256_cbor prefix-cache block hash.
//
// It exists so the agent, the router and the simulator agree with vLLM — and
// with each other — by construction rather than by three copies of a string.
// Everything here is taken from vLLM's source (see the reference notes); it
// imports nothing else of llmgw.
package vllm
