#!/usr/bin/env bash
# kv-event-lag.sh — issue 14's KV event lag figure of docs/benchmarks.md:
# `llmgwctl bench --workload shared-prefix` (the flags of bench-kv.sh) on
# `llmgw dev` with 4 simulated replicas publishing KV events, and the lag
# from each engine's event batch to the router's index
# (llmgw_router_kv_event_lag_seconds) and to the agent's send
# (llmgw_agent_kv_event_lag_seconds), p50 and p99 of each run, read from the
# histograms' buckets as Prometheus' histogram_quantile does (linear within
# a bucket; buckets are √2 apart, so a figure is good to about ±20 %).
# Every run starts from empty engine caches.
#
# Usage: scripts/kv-event-lag.sh [BIN_DIR [OUT_DIR]]
#   BIN_DIR  holds llmgw and llmgwctl (default bin)
#   OUT_DIR  gets every run's JSON, metrics and the logs (default kv-event-lag-out)
#   RUNS=3   runs (seeds); BASE=32000 the first of the loopback ports used
#            (BASE..BASE+6 and engines BASE+200..BASE+499); CONC=16 and
#            REQS=480 the bench's --concurrency and --requests (CONC=1: a
#            mostly quiet engine)
# Needs curl and jq.
set -euo pipefail

bin=$(cd "${1:-bin}" && pwd)
out=${2:-kv-event-lag-out}
runs=${RUNS:-3}
base=${BASE:-32000}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in curl jq "$bin/llmgw" "$bin/llmgwctl"; do
	command -v "$tool" >/dev/null || { echo "kv-event-lag.sh: $tool: not found" >&2; exit 2; }
done

ctl=("$bin/llmgwctl" --addr "127.0.0.1:$((base + 1))")
r1=http://127.0.0.1:$base
r1ops=http://127.0.0.1:$((base + 6)) # its operations port: /metrics
agent=http://127.0.0.1:$((base + 4))
pids=()
stop() {
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill -INT "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
}
trap stop EXIT

rm -rf "$out/data"
"$bin/llmgw" dev --replicas 4 --data-dir "$out/data" --http-addr "127.0.0.1:$base" --ops-addr "${r1ops#http://}" \
	--grpc-addr "127.0.0.1:$((base + 1))" --raft-addr "127.0.0.1:$((base + 2))" --control-http-addr "127.0.0.1:$((base + 3))" \
	--agent-http-addr "127.0.0.1:$((base + 4))" --agent-grpc-addr "127.0.0.1:$((base + 5))" \
	--port-range "$((base + 200))-$((base + 499))" >"$out/dev.log" 2>&1 &
pids+=($!)

waitReady() { # N: until exactly N replicas of demo are ready and none other
	for _ in $(seq 180); do
		kill -0 "${pids[0]}" 2>/dev/null || { echo "kv-event-lag.sh: llmgw dev exited; see $out/dev.log" >&2; return 1; }
		n=$("${ctl[@]}" replica list -o json 2>/dev/null |
			jq '[.[] | select(.model == "demo")] | (map(select(.state == "ready")) | length) as $r | if $r == length then $r else -1 end' 2>/dev/null || echo 0)
		[[ $n -eq $1 ]] && return 0
		sleep 0.5
	done
	echo "kv-event-lag.sh: replicas not ready; see $out/dev.log" >&2
	return 1
}

cat >"$out/tier2.yaml" <<EOT
name: demo
engine: sim
model: meta-llama/Llama-3.1-8B-Instruct
replicas: 4
gpus_per_replica: 1
profile: chat
kv_events: true
extra_args: ["--sim-decode-ms-per-token", "10", "--sim-prefill-us-per-token", "75",
             "--num-gpu-blocks-override", "256", "--max-model-len", "4096"]
EOT
waitReady 4
"${ctl[@]}" model delete demo >/dev/null
waitReady 0
"${ctl[@]}" model apply -f "$out/tier2.yaml" >/dev/null
waitReady 4

work=(--workload shared-prefix --groups 12 --system-words 1000 --prompt-words 100 --max-tokens 32
	--concurrency "${CONC:-16}" --requests "${REQS:-480}")

# quantiles BEFORE AFTER METRIC: p50 and p99 (ms) of the oldest-edge
# histogram's samples between two scrapes, and the sample count.
quantiles() {
	awk -v m="$3" '
	function le(line) {
		if (index(line, m "_bucket{") != 1 || index(line, "edge=\"oldest\"") == 0) return ""
		match(line, /le="[^"]*"/)
		return substr(line, RSTART + 4, RLENGTH - 5)
	}
	FILENAME == ARGV[1] { k = le($0); if (k != "") b[k] = $NF; next }
	{ k = le($0); if (k != "") { n++; bound[n] = k; cnt[n] = $NF - b[k] } } # ascending, +Inf last
	END {
		total = cnt[n]
		if (n == 0 || total == 0) { printf "-\t-\t0"; exit }
		for (qi = 1; qi <= 2; qi++) {
			rank = (qi == 1 ? 0.5 : 0.99) * total; prev = 0; lo = 0; v = bound[n - 1]
			for (i = 1; i < n; i++) {
				if (cnt[i] >= rank) { v = lo + (bound[i] - lo) * (rank - prev) / (cnt[i] - prev); break }
				prev = cnt[i]; lo = bound[i]
			}
			printf "%.1f\t", v * 1000
		}
		printf "%d", total
	}' "$1" "$2"
}

printf 'run\trouter_p50_ms\trouter_p99_ms\trouter_n\tagent_p50_ms\tagent_p99_ms\tagent_n\thit\tttft_p50_ms\tttft_p90_ms\tload1\n' >"$out/summary.txt"
for seed in $(seq "$runs"); do
	for a in $("${ctl[@]}" replica list -o json | jq -r '.[] | select(.model == "demo") | .address'); do
		curl -sf -XPOST "http://$a/reset_prefix_cache" -o /dev/null
	done
	sleep 1
	curl -sf "$r1ops/metrics" >"$out/r-$seed.0"
	curl -sf "$agent/metrics" >"$out/a-$seed.0"
	"$bin/llmgwctl" bench --target "tier2=$r1" --target-metrics "$r1ops" --model demo -q -o json "${work[@]}" --seed "$seed" >"$out/run-$seed.json"
	curl -sf "$r1ops/metrics" >"$out/r-$seed.1"
	curl -sf "$agent/metrics" >"$out/a-$seed.1"
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$seed" \
		"$(quantiles "$out/r-$seed.0" "$out/r-$seed.1" llmgw_router_kv_event_lag_seconds)" \
		"$(quantiles "$out/a-$seed.0" "$out/a-$seed.1" llmgw_agent_kv_event_lag_seconds)" \
		"$(jq -r '.cache_hit_share * 1000 | round / 1000' "$out/run-$seed.json")" \
		"$(jq -r '.ttft_seconds.p50 * 1e4 | round / 10' "$out/run-$seed.json")" \
		"$(jq -r '.ttft_seconds.p90 * 1e4 | round / 10' "$out/run-$seed.json")" \
		"$(cut -d' ' -f1 /proc/loadavg)" >>"$out/summary.txt"
done
column -t -s $'\t' "$out/summary.txt"
