#!/bin/sh
# nginx-engine.sh: an engine that answers in no time, for measuring the
# proxy alone. It takes vLLM's command line (`vllm serve MODEL --host H
# --port P ...`, as llmgw's agent runs an engine) and runs nginx on H:P
# answering every /v1/chat/completions with a canned ~1 KB chat completion
# (chat.json), or, when the request carries `X-Bench-Stream: 1`, a canned
# stream (chat.sse: 8 content chunks, a usage chunk, [DONE]); /health and
# vLLM's load gauges on /metrics let the agent mark it ready.
#
# scripts/bench-proxy.sh starts it through `llmgw dev --vllm-command`, so
# the engine is started by the agent and routed to like any replica.
# Nothing here is for production.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
host=127.0.0.1 port=
while [ $# -gt 0 ]; do
	case "$1" in
	--host) host=$2; shift ;;
	--port) port=$2; shift ;;
	esac
	shift
done
[ -n "$port" ] || { echo "nginx-engine.sh: no --port" >&2; exit 2; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/nginx-engine.XXXXXX")
mkdir -p "$dir/logs"
json=$(cat "$here/chat.json")
# nginx's return takes a quoted string: \n stays as written in chat.sse's
# JSON, real newlines end events.
sse=$(cat "$here/chat.sse"; printf x)
sse=${sse%x}
cat > "$dir/nginx.conf" <<CONF
daemon off;
worker_processes 1;
pid $dir/nginx.pid;
error_log stderr warn;
events { worker_connections 4096; }
http {
	access_log off;
	client_body_temp_path $dir/body;
	proxy_temp_path $dir/proxy;
	fastcgi_temp_path $dir/fastcgi;
	uwsgi_temp_path $dir/uwsgi;
	scgi_temp_path $dir/scgi;
	keepalive_requests 1000000;
	server {
		listen $host:$port reuseport;
		location = /v1/chat/completions {
			if (\$http_x_bench_stream = "1") { rewrite ^ /_sse last; }
			default_type application/json;
			return 200 '$json';
		}
		location = /_sse {
			internal;
			default_type text/event-stream;
			return 200 '$sse';
		}
		location = /health { return 200 ''; }
		location = /metrics {
			default_type text/plain;
			return 200 'vllm:num_requests_running{model_name="bench"} 0
vllm:num_requests_waiting{model_name="bench"} 0
vllm:kv_cache_usage_perc{model_name="bench"} 0
';
		}
	}
}
CONF
trap 'rm -rf "$dir"' EXIT
# Not exec: the trap must run. nginx stops on SIGTERM (fast) or SIGQUIT;
# pass the agent's signal on.
nginx -p "$dir" -c "$dir/nginx.conf" -e stderr &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid; rm -rf "$dir"; exit 0' TERM INT
wait $pid
