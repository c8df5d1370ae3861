#!/usr/bin/env bash
# bench-proxy.sh — the side-by-side of docs/benchmarks.md ("The OpenAI
# surface and the data path (issue 15)"): what the router's data path costs
# against nginx and a plain Go reverse proxy, all three in front of the same
# engine, in the same run, pairs alternated.
#
# The engine is nginx answering a canned ~1 KB chat completion (or a canned
# 8-chunk stream) in no time (scripts/bench-proxy/nginx-engine.sh), started
# by the agent of a `llmgw dev` as the vllm driver's command: model bench,
# engine vllm, 1 replica, profile chat. In front of it:
#   nginx   proxy_pass with upstream keepalive (the limit);
#   go      net/http/httputil's reverse proxy (scripts/bench-proxy);
#   router  a `llmgw router` watching the dev's control plane, routing
#           model bench through its scheduler, breakers and metrics.
# (The dev's own router is not measured, only its control plane and agent
# are used; a separate router process takes flags dev does not pass.)
# For each of the non-streamed and streamed chat profiles it runs PAIRS
# rounds of wrk against the three (order rotated each round): 64
# connections for throughput, then 4 for latency, closed loop (each
# connection sends its next request as soon as it has its answer, so the
# 2 cores are as busy as wrk can make them: the machine's busy share
# during that run is printed as cpu@4, and the proxy's own CPU time per
# request as us/req@4), then 4 connections paced (each
# waits RATE_DELAY_MS between an answer and its next request, a load well
# under saturation: latency without queueing for the CPU).
#
# Usage: scripts/bench-proxy.sh [BIN_DIR]
#   BIN_DIR  holds llmgw and llmgwctl (default bin, as `make build` leaves them)
#   PAIRS=3 DURATION=10s  rounds per profile, length of each wrk run
#   PPROF=1   also serve the measured router's profiles on 127.0.0.1:36111
#   BASE_BIN=DIR  also measure the router of another build (its llmgw), as
#             "base", in the same rounds: before and after in one run
#   BASE_ENV="K=V ..."  the base router's extra environment (BASE_BIN
#             defaults to BIN_DIR when only this is set): the same build
#             under other runtime settings, e.g. BASE_ENV=GOMAXPROCS=1
#   RAW=1     also measure bench-proxy --raw, as "raw": a minimal HTTP/1.1
#             loop with no net/http (the floor of any Go proxy here), under
#             RAW_ENV="K=V ..." when set
#   RATE_DELAY_MS=1  the paced phase's wait per connection (0: no paced phase)
#   PROFILES="chat chat-stream"  which profiles, in order
#   PIN=1     the proxies on the last CPU, alone; wrk, the dev cluster and
#             its engine on the others (taskset): each proxy's own latency,
#             not its contention with the load generator for shared cores.
#             Go sizes GOMAXPROCS from the CPUs it may use, so every Go
#             proxy then runs with one P, as nginx runs one worker.
#   ROUTER_FLAGS="..."  extra flags for the measured router(s)
#   OUT=bench-out/proxy   wrk outputs and logs
# Ports (loopback): 36100-36106 (dev), 36110-36113 (routers and their
# operations ports: /metrics, and /debug/pprof/ with PPROF=1),
# 36120-36122 (nginx and Go proxies), engines 36200-36299. Needs wrk,
# nginx, curl, jq (and taskset for PIN=1).
# Everything it starts is stopped on exit, Ctrl-C included.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "${1:-bin}" && pwd)
pairs=${PAIRS:-3}
duration=${DURATION:-10s}
rate_delay=${RATE_DELAY_MS:-1}
read -r -a profiles <<<"${PROFILES:-chat chat-stream}"
base_bin=${BASE_BIN:+$(cd "$BASE_BIN" && pwd)}
read -r -a base_env <<<"${BASE_ENV:-}"
if [ -z "$base_bin" ] && [ ${#base_env[@]} -gt 0 ]; then base_bin=$bin; fi
read -r -a router_flags <<<"${ROUTER_FLAGS:-}"
out=${OUT:-bench-out/proxy}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in wrk nginx curl jq go "$bin/llmgw" "$bin/llmgwctl"; do
	command -v "$tool" >/dev/null || { echo "bench-proxy.sh: $tool: not found" >&2; exit 2; }
done

# on_load and on_proxy prefix a command to run it on the load generator's
# CPUs or on the proxies' (PIN=1); empty, it runs anywhere. (A prefix, not
# a function: taskset execs the command, so $! is the proxy's own pid.)
on_load=() on_proxy=()
if [ "${PIN:-}" = 1 ]; then
	command -v taskset >/dev/null || { echo "bench-proxy.sh: PIN=1 needs taskset" >&2; exit 2; }
	ncpu=$(nproc)
	[ "$ncpu" -ge 2 ] || { echo "bench-proxy.sh: PIN=1 needs 2 CPUs or more, have $ncpu" >&2; exit 2; }
	on_load=(taskset -c "0-$((ncpu - 2))") on_proxy=(taskset -c "$((ncpu - 1))")
fi

grpc=127.0.0.1:36101
ctl=("$bin/llmgwctl" --addr "$grpc")
router=127.0.0.1:36110
router_ops=127.0.0.1:36111
base_router=127.0.0.1:36112
nginx_proxy=127.0.0.1:36120
go_proxy=127.0.0.1:36121
raw_proxy=127.0.0.1:36122
read -r -a raw_env <<<"${RAW_ENV:-}"
pids=()
stop() {
	# TERM, not INT: a background job of a script starts with SIGINT ignored.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill -TERM "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	pids=()
}
trap stop EXIT

wait_http() { # url what
	for _ in $(seq 1 300); do
		curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
		sleep 0.2
	done
	echo "bench-proxy.sh: $2 never answered at $1" >&2
	exit 1
}

go build -o "$out/bench-proxy" "$here/bench-proxy"

"${on_load[@]}" "$bin/llmgw" dev --http-addr 127.0.0.1:36100 --ops-addr 127.0.0.1:36106 --grpc-addr "$grpc" --raft-addr 127.0.0.1:36102 \
	--control-http-addr 127.0.0.1:36103 --agent-http-addr 127.0.0.1:36104 --agent-grpc-addr 127.0.0.1:36105 \
	--data-dir "$out/dev" --port-range 36200-36299 --replicas 1 \
	--vllm-command "$here/bench-proxy/nginx-engine.sh" >"$out/dev.log" 2>&1 &
pids+=($!)
wait_http http://127.0.0.1:36100/readyz "llmgw dev"
cat >"$out/bench.yaml" <<EOF
name: bench
engine: vllm
model: bench
replicas: 1
gpus_per_replica: 1
profile: chat
EOF
"${ctl[@]}" model apply -f "$out/bench.yaml" >/dev/null
engine=
for _ in $(seq 1 300); do
	engine=$("${ctl[@]}" replica list -o json | jq -r '.[] | select(.model =="bench" and .state == "ready") | .address' | head -1)
	[ -n "$engine" ] && break
	sleep 0.2
done
[ -n "$engine" ] || { echo "bench-proxy.sh: the bench replica never became ready" >&2; exit 1; }

pprof=()
[ "${PPROF:-}" = 1 ] && pprof=(--pprof)
"${on_proxy[@]}" "$bin/llmgw" router --control "$grpc" --http-addr "$router" --ops-addr "$router_ops" --data-dir "$out/router" --log-level warn \
	"${pprof[@]}" "${router_flags[@]}" >"$out/router.log" 2>&1 &
pids+=($!)
declare -A proc=([$router]=$!) # each proxy's process, for its CPU time
targets=("$nginx_proxy" "$go_proxy" "$router")
if [ -n "$base_bin" ]; then
	# A base binary from before the operations port has no --ops-addr.
	base_ops=()
	"$base_bin/llmgw" router --help 2>&1 | grep -q -- --ops-addr && base_ops=(--ops-addr 127.0.0.1:36113)
	"${on_proxy[@]}" env "${base_env[@]}" "$base_bin/llmgw" router --control "$grpc" --http-addr "$base_router" "${base_ops[@]}" --data-dir "$out/base-router" --log-level warn \
		"${router_flags[@]}" >"$out/base-router.log" 2>&1 &
	pids+=($!)
	proc[$base_router]=$!
	targets+=("$base_router")
fi
"${on_proxy[@]}" "$out/bench-proxy" --listen "$go_proxy" --upstream "http://$engine" >"$out/go-proxy.log" 2>&1 &
pids+=($!)
proc[$go_proxy]=$!
if [ "${RAW:-}" = 1 ]; then
	"${on_proxy[@]}" env "${raw_env[@]}" "$out/bench-proxy" --raw --listen "$raw_proxy" --upstream "http://$engine" >"$out/raw-proxy.log" 2>&1 &
	pids+=($!)
	proc[$raw_proxy]=$!
	targets+=("$raw_proxy")
fi
mkdir -p "$out/nginx"
cat >"$out/nginx/nginx.conf" <<EOF
daemon off;
worker_processes 1;
pid $out/nginx/nginx.pid;
error_log stderr warn;
events { worker_connections 4096; }
http {
	access_log off;
	client_body_temp_path $out/nginx/body;
	proxy_temp_path $out/nginx/proxy;
	fastcgi_temp_path $out/nginx/fastcgi;
	uwsgi_temp_path $out/nginx/uwsgi;
	scgi_temp_path $out/nginx/scgi;
	keepalive_requests 1000000;
	upstream engine { server $engine; keepalive 64; }
	server {
		listen $nginx_proxy;
		location / {
			proxy_pass http://engine;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_buffering off;
		}
	}
}
EOF
"${on_proxy[@]}" nginx -p "$out/nginx" -c "$out/nginx/nginx.conf" -e stderr >"$out/nginx.log" 2>&1 &
pids+=($!)
proc[$nginx_proxy]=$! # the master; its worker is counted as its child

body='{"model":"bench","messages":[{"role":"user","content":"hi"}]}'
for target in "${targets[@]}"; do
	for _ in $(seq 1 300); do
		code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" "http://$target/v1/chat/completions" || true)
		[ "$code" = 200 ] && break
		sleep 0.2
	done
	[ "$code" = 200 ] || { echo "bench-proxy.sh: $target never routed to the engine (last $code)" >&2; exit 1; }
done

# The paced phase's scripts: the profile's request, and a wait before
# each next one (wrk's delay(), per connection).
for profile in chat chat-stream; do
	printf 'dofile("%s")\nfunction delay() return %d end\n' "$here/bench-proxy/$profile.lua" "$rate_delay" >"$out/$profile-paced.lua"
done

# busy: the machine's busy jiffies and all jiffies so far (/proc/stat).
busy() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat; }

# ticks pid: the CPU time (user and system, in clock ticks) of pid and
# its children (nginx's worker) so far.
ticks() {
	local t=0 p
	for p in "$1" $(pgrep -P "$1" || true); do
		t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
	done
	echo "$t"
}
hz=$(getconf CLK_TCK)

# wrk_run name target profile conns round [script] -> "rps p50_ms p99_ms non2xx cpu% proxy_us_per_request"
wrk_run() {
	local f="$out/$1-$3-c$4-$5${6:+-paced}.txt" b0 t0 b1 t1 c0 c1
	read -r b0 t0 <<<"$(busy)"
	c0=$(ticks "${proc[$2]}")
	"${on_load[@]}" wrk -t2 -c"$4" -d"$duration" --latency -s "${6:-$here/bench-proxy/$3.lua}" "http://$2/v1/chat/completions" >"$f"
	c1=$(ticks "${proc[$2]}")
	read -r b1 t1 <<<"$(busy)"
	echo "cpu $(((b1 - b0) * 100 / (t1 - t0)))" >>"$f"
	echo "proxy_ticks $((c1 - c0)) $hz" >>"$f"
	awk '
		function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
		/Requests\/sec/ { rps = $2 }
		/^ +50%/ { p50 = ms($2) }
		/^ +99%/ { p99 = ms($2) }
		/Non-2xx/ { bad = $NF }
		/requests in/ { n = $1 }
		/^cpu / { cpu = $2 }
		/^proxy_ticks / { us = n > 0 ? $2 * 1e6 / $3 / n : 0 }
		END { printf "%.0f %.3f %.3f %d %d %.0f\n", rps, p50, p99, bad, cpu, us }' "$f"
}

declare -A name=([$nginx_proxy]=nginx [$go_proxy]=go [$router]=router [$base_router]=base [$raw_proxy]=raw)
pinned=
[ ${#on_proxy[@]} -gt 0 ] && pinned="; PIN=1: the proxies on CPU ${on_proxy[2]}, wrk and the engine on ${on_load[2]}"
echo "load average before: $(cat /proc/loadavg)$pinned"
# cpu@4: the machine's busy share (both cores) during the closed-loop run
# at 4 connections; us/req@4: the proxy's own CPU time (user and system)
# per request in that run; @paced: 4 connections, RATE_DELAY_MS between
# requests.
printf '%-12s %-7s %5s %8s %8s %8s | %8s %8s %8s %6s %9s | %8s %8s %8s\n' profile proxy round \
	rps@64 p50@64 p99@64 rps@4 p50@4 p99@4 cpu@4 us/req@4 rps@paced p50@paced p99@paced
for profile in "${profiles[@]}"; do
	for round in $(seq 1 "$pairs"); do
		# Rotate the order each round, so no proxy always runs first.
		n=${#targets[@]} order=()
		for ((i = 0; i < n; i++)); do order+=("${targets[(i + round - 1) % n]}"); done
		for target in "${order[@]}"; do
			read -r rps64 p5064 p9964 bad64 _ <<<"$(wrk_run "${name[$target]}" "$target" "$profile" 64 "$round")"
			read -r rps4 p504 p994 bad4 cpu4 us4 <<<"$(wrk_run "${name[$target]}" "$target" "$profile" 4 "$round")"
			rpsp=- p50p=- p99p=- badp=0
			if [ "$rate_delay" != 0 ]; then
				read -r rpsp p50p p99p badp _ <<<"$(wrk_run "${name[$target]}" "$target" "$profile" 4 "$round" "$out/$profile-paced.lua")"
			fi
			if [ "$bad64" != 0 ] || [ "$bad4" != 0 ] || [ "$badp" != 0 ]; then
				echo "bench-proxy.sh: ${name[$target]} answered non-2xx ($bad64 at 64, $bad4 at 4 connections, $badp paced)" >&2
			fi
			printf '%-12s %-7s %5s %8s %8s %8s | %8s %8s %8s %5s%% %9s | %8s %8s %8s\n' "$profile" "${name[$target]}" "$round" \
				"$rps64" "$p5064" "$p9964" "$rps4" "$p504" "$p994" "$cpu4" "$us4" "$rpsp" "$p50p" "$p99p"
		done
	done
done
echo "load average after: $(cat /proc/loadavg)"
curl -s "http://$router_ops/metrics" | grep '^llmgw_router_requests_total' >"$out/router-requests.txt" || true
echo "router requests by status: $(awk '{split($0, a, "code=\""); split(a[2], b, "\""); n[b[1]] += $NF} END {for (c in n) printf "%s=%d ", c, n[c]}' "$out/router-requests.txt")"
