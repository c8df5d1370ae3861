#!/usr/bin/env bash
# bench-scheduler.sh — the scheduler issue's "Must show" runs of
# docs/benchmarks.md ("## Scheduler"), end to end: it starts `llmgw dev` with
# 4 simulated replicas whose prefill cost and cache size make routing visible,
# runs
#   1. multi-turn, debug (round robin) against chat, RUNS seeds;
#   2. a hot prefix (shared-prefix, one system prompt in 80% of requests),
#      chat and debug, RUNS seeds, sampling each engine's in-flight;
#   3. multi-turn through one router and alternating over two, RUNS pairs;
# and prints one summary table per part, with the routers' own session and
# prefix decision counts (hit, new, load_override, ...) per run. Every run starts from empty engine
# caches (POST /reset_prefix_cache), so no run inherits another's hits.
#
# Usage: scripts/bench-scheduler.sh [BIN_DIR [OUT_DIR]]
#   BIN_DIR  holds llmgw and llmgwctl (default bin, as `make build` leaves them)
#   OUT_DIR  gets every run's JSON, in-flight samples and the logs (default bench-out)
#   RUNS=3   runs (seeds) per comparison
#   ENGINE_ARGS  the engines' timing flags, as YAML list items (default the
#            simple timing below; e.g. '"--sim-gpu", "a100-40gb"' for a GPU profile)
#   ROUTER_PORT=18380 ROUTER2_PORT=18381 CONTROL_PORT=17600 (it and the next 5)
#   ENGINE_PORTS=23000-23999  the loopback ports, to run beside another copy
# Ports (loopback): 18380-18381, 17600-17605, engines 23000-23999. Needs curl
# and jq. Takes about 6 minutes on 2 cores. Everything it starts is stopped
# on exit, Ctrl-C included.
set -euo pipefail

bin=$(cd "${1:-bin}" && pwd)
out=${2:-bench-out}
runs=${RUNS:-3}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in curl jq "$bin/llmgw" "$bin/llmgwctl"; do
	command -v "$tool" >/dev/null || { echo "bench-scheduler.sh: $tool: not found" >&2; exit 2; }
done

cp=${CONTROL_PORT:-17600}
ctl=("$bin/llmgwctl" --addr 127.0.0.1:$cp)
r1=http://127.0.0.1:${ROUTER_PORT:-18380}
r2=http://127.0.0.1:${ROUTER2_PORT:-18381}
# The routers' operations ports, where the bench reads their decisions.
r1ops=http://127.0.0.1:${ROUTER_OPS_PORT:-18382}
r2ops=http://127.0.0.1:${ROUTER2_OPS_PORT:-18383}
engineArgs=${ENGINE_ARGS:-'"--sim-decode-ms-per-token", "10", "--sim-prefill-us-per-token", "75"'}
pids=()
stop() {
	# Reverse start order: the second router, then dev (router, agent and
	# engines, control). SIGINT is dev's Ctrl-C: it stops its engines.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill -INT "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
}
trap stop EXIT

rm -rf "$out/data" "$out/r2"
"$bin/llmgw" dev --replicas 4 --data-dir "$out/data" --http-addr "${r1#http://}" --ops-addr "${r1ops#http://}" \
	--grpc-addr 127.0.0.1:$cp --raft-addr 127.0.0.1:$((cp + 1)) --control-http-addr 127.0.0.1:$((cp + 3)) \
	--agent-http-addr 127.0.0.1:$((cp + 4)) --agent-grpc-addr 127.0.0.1:$((cp + 5)) \
	--port-range "${ENGINE_PORTS:-23000-23999}" >"$out/dev.log" 2>&1 &
pids+=($!)

# waitReady N: until N replicas of demo are ready (60 s at most).
waitReady() {
	for _ in $(seq 120); do
		kill -0 "${pids[0]}" 2>/dev/null || { echo "bench-scheduler.sh: llmgw dev exited; see $out/dev.log" >&2; return 1; }
		n=$("${ctl[@]}" replica list -o json 2>/dev/null |
			jq '[.[] | select(.model == "demo" and .state == "ready")] | length' 2>/dev/null || echo 0)
		[[ $n -ge $1 ]] && return 0
		sleep 0.5
	done
	echo "bench-scheduler.sh: replicas not ready; see $out/dev.log" >&2
	return 1
}

# The engines: prefill 75 µs per uncached token (a ~1100-token prompt costs
# 83 ms), decode 10 ms per token, 384 blocks of cache (6144 tokens, about
# five long conversations).
for profile in chat debug; do
	cat >"$out/$profile.yaml" <<EOF
name: demo
engine: sim
model: meta-llama/Llama-3.1-8B-Instruct
replicas: 4
gpus_per_replica: 1
profile: $profile
extra_args: [$engineArgs,
             "--num-gpu-blocks-override", "384", "--max-model-len", "4096"]
EOF
done
waitReady 4
# dev applied its own demo model, and changed extra_args do not restart
# running replicas: replace the model once.
"${ctl[@]}" model delete demo >/dev/null
sleep 3
"${ctl[@]}" model apply -f "$out/chat.yaml" >/dev/null
sleep 2
waitReady 4

reset() {
	for a in $("${ctl[@]}" replica list -o json | jq -r '.[] | select(.model == "demo") | .address'); do
		curl -sf -XPOST "http://$a/reset_prefix_cache" -o /dev/null
	done
}
profile() { "${ctl[@]}" model apply -f "$out/$1.yaml" >/dev/null; sleep 2; }

# bench NAME ARGS...: one run, JSON to NAME.json, in-flight to NAME.inflight.
bench() {
	local name=$1
	shift
	reset
	"$here/inflight.sh" -a 127.0.0.1:$cp -m demo -c "$bin/llmgwctl" -- \
		"${ctl[@]}" bench --model demo -q -o json "$@" >"$out/$name.json" 2>"$out/$name.inflight"
}
multiturn=(--workload multi-turn --sessions 16 --turns 6 --prompt-words 100 --max-tokens 64 --concurrency 16 --requests 300)
hot=(--workload shared-prefix --groups 8 --hot-share 0.8 --system-words 1000 --prompt-words 100 --max-tokens 64 --concurrency 16 --requests 400)

# row NAME: one summary line from NAME.json and NAME.inflight.
row() {
	jq -r --arg n "$1" --arg infl "$(sed -n 's/.*max\/mean //p' "$out/$1.inflight")" \
		'[$n, (.cache_hit_share * 1000 | round / 1000), (.ttft_seconds.p50 * 1e4 | round / 10),
		  (.ttft_seconds.p90 * 1e4 | round / 10), (.ttft_seconds.p99 * 1e4 | round / 10),
		  (.throughput_rps * 10 | round / 10), .errors, (.replica_max_over_mean * 100 | round / 100), $infl,
		  (.router_decisions.session // {} | to_entries | map("\(.key)=\(.value)") | join(" ") | if . == "" then "-" else . end),
		  (.router_decisions.prefix // {} | to_entries | map("\(.key)=\(.value)") | join(" ") | if . == "" then "-" else . end)] | @tsv' "$out/$1.json"
}
header() { printf '\n%s\nrun\thit\tttft_p50_ms\tttft_p90_ms\tttft_p99_ms\treq_s\terrors\treq_max/mean\tinflight_max/mean\tsession\tprefix\n' "$1"; }

header "1. multi-turn: debug (round robin) vs chat" >"$out/summary.txt"
for seed in $(seq "$runs"); do
	for p in debug chat; do
		profile "$p"
		bench "mt-$p-$seed" --target "$p=$r1" --target-metrics "$r1ops" "${multiturn[@]}" --seed "$seed"
		row "mt-$p-$seed" >>"$out/summary.txt"
	done
done

header "2. hot prefix (80%): chat vs debug" >>"$out/summary.txt"
for p in chat debug; do
	profile "$p"
	for seed in $(seq "$runs"); do
		bench "hot-$p-$seed" --target "$p=$r1" --target-metrics "$r1ops" "${hot[@]}" --seed "$seed"
		row "hot-$p-$seed" >>"$out/summary.txt"
	done
done

header "3. multi-turn, chat: one router vs two behind a round-robin client" >>"$out/summary.txt"
profile chat
"$bin/llmgw" router --control 127.0.0.1:$cp --http-addr "${r2#http://}" --ops-addr "${r2ops#http://}" --id r2 --data-dir "$out/r2" >"$out/r2.log" 2>&1 &
pids+=($!)
for _ in $(seq 60); do curl -sf "$r2/readyz" >/dev/null && break; sleep 0.5; done
# The two halves of a pair run the same sessions (one seed), so the ratio
# compares routing, not how evenly two different sets of session ids happen
# to hash over 4 replicas (that alone moved one router's hit share from
# 0.74 to 0.65). Engine caches are reset before every run; the two-router
# half runs first, so whatever r1 remembers of the sessions can only help
# the one-router half: the ratio errs against two routers.
for i in $(seq "$runs"); do
	bench "two-$((40 + i))" --target "$r1" --target "$r2" --target-metrics "$r1ops" --target-metrics "$r2ops" --targets-round-robin "${multiturn[@]}" --seed $((40 + i))
	row "two-$((40 + i))" >>"$out/summary.txt"
	bench "one-$((40 + i))" --target "r1=$r1" --target-metrics "$r1ops" "${multiturn[@]}" --seed $((40 + i))
	row "one-$((40 + i))" >>"$out/summary.txt"
done
column -t -s $'\t' "$out/summary.txt"
