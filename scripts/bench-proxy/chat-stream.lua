-- wrk: a streamed chat completion for model bench (scripts/bench-proxy.sh).
-- X-Bench-Stream makes the canned engine answer with its SSE stream.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Bench-Stream"] = "1"
wrk.body = '{"model":"bench","stream":true,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello"}],"max_tokens":160}'
