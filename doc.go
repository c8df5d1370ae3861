// Package llmgw is a self-hosted gateway for serving LLMs on a GPU fleet: a
// Raft-replicated control plane, an agent per GPU node and a fleet of
// OpenAI-compatible routers. See docs/architecture.md.
package llmgw
