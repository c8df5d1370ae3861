-- wrk: a non-streamed chat completion for model bench (scripts/bench-proxy.sh).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"bench","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello"}],"max_tokens":160}'
