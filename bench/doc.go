// Package bench drives routers with a named workload over the OpenAI API and
// reports what a person comparing routing policies looks at: time to first
// token, inter-token latency, end-to-end latency, throughput, errors, the
// share of prompt tokens served from the prefix cache, and how requests
// spread over replicas (design §10).
//
// It speaks plain HTTP and parses the SSE stream by hand rather than through
// an SDK, because the numbers that matter are per chunk: an SDK that hands
// back a finished message has already thrown the timing away.
//
// The pieces are separate so each can be tested without a network: a Workload
// generates request sequences from a seed, Arrivals draws the open loop's
// Poisson gaps from an injected source, Run schedules requests and records a
// Sample per request, and Summarize turns samples into a Report that prints
// as a table, as JSON, or as an SVG chart.
package bench
