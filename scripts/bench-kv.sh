#!/usr/bin/env bash
# bench-kv.sh — the "Precise prefix routing" issue's bench of
# docs/benchmarks.md: `llmgwctl bench --workload shared-prefix` on `llmgw dev`
# with 4 simulated replicas whose caches cannot hold every group, comparing
#   tier2  kv_events: true,  profile chat  (the Prefix scorer on the KV index)
#   tier1  kv_events: false, profile chat  (the router's approximate prefix tree)
#   rr     kv_events: false, profile debug (round robin)
# RUNS seeds each, and prints one summary table with the routers' prefix and
# kv decision counts. kv_events changes the engines' command line, so
# each configuration gets fresh replicas (delete, apply); every run
# starts from empty engine caches (POST /reset_prefix_cache).
#
# Usage: scripts/bench-kv.sh [BIN_DIR [OUT_DIR]]
#   BIN_DIR  holds llmgw and llmgwctl (default bin, as `make build` leaves them)
#   OUT_DIR  gets every run's JSON and the logs (default bench-kv-out)
#   RUNS=3   runs (seeds) per configuration
#   TIMING=simple  the engines' timing: simple (fixed costs) or gpu
# Ports (loopback): 18480, 17700-17705, engines 24000-24999. Needs curl and
# jq. Everything it starts is stopped on exit, Ctrl-C included.
set -euo pipefail

bin=$(cd "${1:-bin}" && pwd)
out=${2:-bench-kv-out}
runs=${RUNS:-3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in curl jq "$bin/llmgw" "$bin/llmgwctl"; do
	command -v "$tool" >/dev/null || { echo "bench-kv.sh: $tool: not found" >&2; exit 2; }
done

ctl=("$bin/llmgwctl" --addr 127.0.0.1:17700)
r1=http://127.0.0.1:18480
r1ops=http://127.0.0.1:18481 # its operations port: /metrics
pids=()
stop() {
	# SIGINT is dev's Ctrl-C: router, agent and its engines, control.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill -INT "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
}
trap stop EXIT

rm -rf "$out/data"
"$bin/llmgw" dev --replicas 4 --data-dir "$out/data" --http-addr 127.0.0.1:18480 --ops-addr 127.0.0.1:18481 \
	--grpc-addr 127.0.0.1:17700 --raft-addr 127.0.0.1:17701 --control-http-addr 127.0.0.1:17703 \
	--agent-http-addr 127.0.0.1:17704 --agent-grpc-addr 127.0.0.1:17705 --port-range 24000-24999 >"$out/dev.log" 2>&1 &
pids+=($!)

# waitReady N: until exactly N replicas of demo are ready and none other
# (90 s at most) — after a restart the old ones must be gone.
waitReady() {
	for _ in $(seq 180); do
		kill -0 "${pids[0]}" 2>/dev/null || { echo "bench-kv.sh: llmgw dev exited; see $out/dev.log" >&2; return 1; }
		n=$("${ctl[@]}" replica list -o json 2>/dev/null |
			jq '[.[] | select(.model == "demo")] | (map(select(.state == "ready")) | length) as $r | if $r == length then $r else -1 end' 2>/dev/null || echo 0)
		[[ $n -eq $1 ]] && return 0
		sleep 0.5
	done
	echo "bench-kv.sh: replicas not ready; see $out/dev.log" >&2
	return 1
}

# The engines: prefill 75 µs per uncached token (a ~1400-token prompt costs
# ~100 ms), decode 10 ms per token, 256 blocks of 16 tokens each (4096
# tokens: about three of the twelve ~1300-token system prompts per replica,
# so the fleet holds every group only if each lives on one replica).
# TIMING="gpu" runs the same cache on the GPU-like simulator instead
# (--sim-gpu a100-40gb: steps, a roofline; design §8).
timing='"--sim-decode-ms-per-token", "10", "--sim-prefill-us-per-token", "75"'
if [[ ${TIMING:-simple} == gpu ]]; then
	timing='"--sim-gpu", "a100-40gb"'
fi
model() { # NAME PROFILE KV_EVENTS
	cat >"$out/$1.yaml" <<EOT
name: demo
engine: sim
model: meta-llama/Llama-3.1-8B-Instruct
replicas: 4
gpus_per_replica: 1
profile: $2
kv_events: $3
extra_args: [$timing, "--num-gpu-blocks-override", "256", "--max-model-len", "4096"]
EOT
}
model tier2 chat true
model tier1 chat false
model rr debug false
waitReady 4

reset() {
	for a in $("${ctl[@]}" replica list -o json | jq -r '.[] | select(.model == "demo") | .address'); do
		curl -sf -XPOST "http://$a/reset_prefix_cache" -o /dev/null
	done
	sleep 1 # the agents' next 250 ms batches carry the AllBlocksCleared
}
work=(--workload shared-prefix --groups 12 --system-words 1000 --prompt-words 100 --max-tokens 32 --concurrency 16 --requests 480)

row() {
	jq -r --arg n "$1" \
		'[$n, (.cache_hit_share * 1000 | round / 1000), (.ttft_seconds.p50 * 1e4 | round / 10),
		  (.ttft_seconds.p90 * 1e4 | round / 10), (.ttft_seconds.p99 * 1e4 | round / 10),
		  (.throughput_rps * 10 | round / 10), .errors, (.replica_max_over_mean * 100 | round / 100),
		  (.router_decisions.prefix // {} | to_entries | map("\(.key)=\(.value)") | join(" ") | if . == "" then "-" else . end),
		  $kv] | @tsv' --arg kv "$(kvdiff "$out/$1.kv0" "$out/$1.kv1")" "$out/$1.json"
}
# kvs FILE: the router's llmgw_kv_decisions_total{decision} counts (the bench
# tool reads only session and prefix decisions); kvdiff BEFORE AFTER: the run's.
kvs() { curl -sf "$r1ops/metrics" | sed -n 's/^llmgw_kv_decisions_total{.*decision="\([a-z_]*\)".*} \([0-9.e+]*\)$/\1 \2/p' >"$1" || true; }
kvdiff() {
	awk 'FILENAME == ARGV[1] { b[$1] = $2; next } { d = $2 - b[$1]; if (d > 0) printf "%s%s=%d", (n++ ? " " : ""), $1, d } END { if (!n) printf "-" }' "$1" "$2"
}
printf 'run\thit\tttft_p50_ms\tttft_p90_ms\tttft_p99_ms\treq_s\terrors\treq_max/mean\tprefix\tkv\n' >"$out/summary.txt"
for cfg in tier2 tier1 rr; do
	# Each configuration on fresh replicas: delete, wait for none, apply.
	"${ctl[@]}" model delete demo >/dev/null
	waitReady 0
	"${ctl[@]}" model apply -f "$out/$cfg.yaml" >/dev/null
	waitReady 4
	for seed in $(seq "$runs"); do
		reset
		kvs "$out/$cfg-$seed.kv0"
		"${ctl[@]}" bench --target "$cfg=$r1" --target-metrics "$r1ops" --model demo -q -o json "${work[@]}" --seed "$seed" >"$out/$cfg-$seed.json"
		kvs "$out/$cfg-$seed.kv1"
		row "$cfg-$seed" >>"$out/summary.txt"
	done
done
column -t -s $'\t' "$out/summary.txt"
