#!/usr/bin/env bash
# bench-lora.sh — the LoRA issue's "Must show" comparison of docs/benchmarks.md
# ("## LoRA adapters"), end to end: for each adapter_min_idle in MIN_IDLE it
# starts a control node (its --config setting adapter_min_idle), an agent and
# two routers — the components `llmgw dev` runs, as separate processes,
# because dev has no flag for the control plane's adapter settings — applies
# model lora (2 sim replicas, max_loaded_adapters 2, 6 adapters in
# directories), then runs RUNS pairs of
#   lora-mix  --adapters a,b,c,d,e,f (Zipf over six)
#   baseline  --adapters a          (one adapter)
# alternating over both routers (--targets-round-robin). Loads, unloads and
# evictions per minute come from counters read before and after each run:
# the simulators' GET /sim/adapters (loads, unloads summed over adapters and
# engines) and the control plane's llmgw_control_adapter_placements_total
# {action="evict"}. It prints one table with TTFT p50/p99 and the errors,
# 503s (the router's "every adapter busy", always with Retry-After) apart.
#
# Usage: scripts/bench-lora.sh [BIN_DIR [OUT_DIR]]
#   BIN_DIR  holds llmgw and llmgwctl (default bin, as `make build` leaves them)
#   OUT_DIR  gets every run's JSON, the counters and the logs (default bench-out/lora)
#   RUNS=3            pairs per adapter_min_idle
#   MIN_IDLE="2s"     adapter_min_idle values, space-separated (the default is 2s)
#   RATE=4 DURATION=30s  open-loop arrivals per second and run length
#   SETTLE=12         seconds of quiet before each run
#   RATES="4"        open-loop rates, space-separated (each runs RUNS pairs)
#   PORT_BASE=17700   control gRPC at PORT_BASE, raft +1, HTTP +3, agent +4
#                     and +5, routers +80 and +81 (operations ports +82 and +83), engines +100 to +199
# Needs curl and jq. Takes about RUNS × 2 × DURATION plus SETTLE, per run,
# and 20 s per MIN_IDLE value.
# Everything it starts is stopped on exit, Ctrl-C included.
set -euo pipefail

bin=$(cd "${1:-bin}" && pwd)
out=${2:-bench-out/lora}
runs=${RUNS:-3}
min_idles=${MIN_IDLE:-2s}
rates=${RATES:-${RATE:-4}}
base=${PORT_BASE:-17700}
duration=${DURATION:-30s}
settle=${SETTLE:-12}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in curl jq "$bin/llmgw" "$bin/llmgwctl"; do
	command -v "$tool" >/dev/null || { echo "bench-lora.sh: $tool: not found" >&2; exit 2; }
done

grpc=127.0.0.1:$base
ctl=("$bin/llmgwctl" --addr "$grpc")
r1=http://127.0.0.1:$((base + 80))
r2=http://127.0.0.1:$((base + 81))
# The routers' operations ports, where their /metrics is.
r1ops=http://127.0.0.1:$((base + 82))
r2ops=http://127.0.0.1:$((base + 83))
control_metrics=http://127.0.0.1:$((base + 3))/metrics
pids=()
stop() {
	# Reverse start order: the routers, then the agent (which stops its
	# engines: --stop-engines-on-exit), then the control node.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill -INT "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	pids=()
}
trap stop EXIT

# The adapters: directories, as the sim checks that a path exists.
mkdir -p "$out/adapters"
{
	cat <<EOF
name: lora
engine: sim
model: org/base
replicas: 2
gpus_per_replica: 1
max_loaded_adapters: 2
max_lora_rank: 16
adapters:
EOF
	for a in a b c d e f; do
		mkdir -p "$out/adapters/$a"
		echo "  - {name: $a, path: $out/adapters/$a}"
	done
	# 10 ms a token (32 tokens: ~0.3 s a request); a load takes 200 ms.
	echo 'extra_args: ["--sim-decode-ms-per-token", "10", "--sim-lora-load-delay", "200ms"]'
} >"$out/lora.yaml"

# waitReady: until both replicas of lora are ready and both routers serve it.
waitReady() {
	for _ in $(seq 120); do
		for p in "${pids[@]}"; do
			kill -0 "$p" 2>/dev/null || { echo "bench-lora.sh: a process exited; see $out/*.log" >&2; return 1; }
		done
		n=$("${ctl[@]}" replica list -o json 2>/dev/null |
			jq '[.[] | select(.model == "lora" and .state == "ready")] | length' 2>/dev/null || echo 0)
		if [[ $n -ge 2 ]]; then
			ok=1
			for r in "$r1" "$r2"; do
				code=$(curl -s -o /dev/null -w '%{http_code}' "$r/v1/chat/completions" -H 'content-type: application/json' \
					-d '{"model":"lora","messages":[{"role":"user","content":"x"}],"max_tokens":1}') || code=0
				[[ $code == 200 ]] || ok=0
			done
			[[ $ok == 1 ]] && return 0
		fi
		sleep 0.5
	done
	echo "bench-lora.sh: replicas not ready; see $out/*.log" >&2
	return 1
}

# counters: loads unloads evictions served-after-wait timed-out, summed over
# both engines, the plane and both routers' queues.
counters() {
	local loads=0 unloads=0 ev served=0 timedout=0 s t
	for a in $("${ctl[@]}" replica list -o json | jq -r '.[] | select(.model == "lora") | .address'); do
		read -r l u < <(curl -sf "http://$a/sim/adapters" | jq -r '[([.adapters[].loads] | add // 0), ([.adapters[].unloads] | add // 0)] | @tsv')
		loads=$((loads + l)) unloads=$((unloads + u))
	done
	ev=$(curl -sf "$control_metrics" | awk '/^llmgw_control_adapter_placements_total\{action="evict"\}/ {print $2}')
	for r in "$r1ops" "$r2ops"; do
		read -r s t < <(curl -sf "$r/metrics" | awk '/^llmgw_router_adapter_queue_requests_total/ {
			if ($0 ~ /result="served_after_wait"/) s += $2; if ($0 ~ /result="timed_out"/ || $0 ~ /result="queue_full"/) t += $2 }
			END {printf "%d %d\n", s, t}')
		served=$((served + s)) timedout=$((timedout + t))
	done
	echo "$loads $unloads ${ev:-0} $served $timedout"
}

# bench NAME ADAPTERS SEED RATE: one run, JSON to NAME.json, counters to NAME.counters.
bench() {
	local name=$1 adapters=$2 seed=$3 rate=$4
	# Let the previous run's tail pass first: evicted adapters are unloaded
	# after the agent's idle grace (5 s), and a load the engine refused while
	# full is retried after 5 s; without this the next run counts them.
	sleep "$settle"
	counters >"$out/$name.counters"
	"$bin/llmgwctl" bench --workload lora-mix --model lora --adapters "$adapters" --targets-round-robin \
		--target "$r1" --target "$r2" --target-metrics "$r1ops" --target-metrics "$r2ops" --rate "$rate" --duration "$duration" --requests 100000 \
		--max-tokens 32 --prompt-words 50 --system-words 200 --request-timeout 60s \
		--seed "$seed" -q -o json >"$out/$name.json"
	counters >>"$out/$name.counters"
}

# row NAME MIN_IDLE WORKLOAD RATE: one summary line from NAME.json and NAME.counters.
row() {
	local b a
	b=($(sed -n 1p "$out/$1.counters")) a=($(sed -n 2p "$out/$1.counters"))
	jq -r --arg n "$1" --arg idle "$2" --arg w "$3" \
		--argjson loads $((a[0] - b[0])) --argjson unloads $((a[1] - b[1])) --argjson evict $((a[2] - b[2])) \
		--argjson served $((a[3] - b[3])) --argjson timedout $((a[4] - b[4])) --arg rate "$4" \
		'(.duration_seconds / 60) as $min |
		 [$n, $idle, $rate, $w, .requests, (.ttft_seconds.p50 * 1e4 | round / 10), (.ttft_seconds.p99 * 1e4 | round / 10),
		  .errors, (.errors_by_kind.http_503 // 0), $served, $timedout, ($loads / $min * 10 | round / 10), ($unloads / $min * 10 | round / 10),
		  ($evict / $min * 10 | round / 10)] | @tsv' "$out/$1.json"
}

printf 'run\tadapter_min_idle\trate\tadapters\trequests\tttft_p50_ms\tttft_p99_ms\terrors\thttp_503\tserved_after_wait\twait_bound_503\tloads_min\tunloads_min\tevictions_min\n' >"$out/summary.txt"
for idle in $min_idles; do
	rm -rf "$out/data"
	mkdir -p "$out/data"
	echo "adapter_min_idle: $idle" >"$out/control-$idle.yaml"
	"$bin/llmgw" control --node-id c1 --bootstrap --config "$out/control-$idle.yaml" --data-dir "$out/data/control" \
		--grpc-addr "$grpc" --raft-addr "127.0.0.1:$((base + 1))" --http-addr "127.0.0.1:$((base + 3))" >"$out/control-$idle.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 60); do curl -sf "http://127.0.0.1:$((base + 3))/readyz" >/dev/null && break; sleep 0.5; done
	"$bin/llmgw" agent --node-id n1 --control "$grpc" --advertise-addr 127.0.0.1 --data-dir "$out/data/agent" \
		--http-addr "127.0.0.1:$((base + 4))" --grpc-addr "127.0.0.1:$((base + 5))" --gpus 2 --port-range "$((base + 100))-$((base + 199))" \
		--stop-engines-on-exit >"$out/agent-$idle.log" 2>&1 &
	pids+=($!)
	for r in 1 2; do
		"$bin/llmgw" router --id "r$r" --control "$grpc" --http-addr "127.0.0.1:$((base + 79 + r))" --ops-addr "127.0.0.1:$((base + 81 + r))" \
			--data-dir "$out/data/r$r" >"$out/r$r-$idle.log" 2>&1 &
		pids+=($!)
	done
	"${ctl[@]}" model apply -f "$out/lora.yaml" >/dev/null
	waitReady
	for rate in $rates; do
		for seed in $(seq "$runs"); do
			bench "mix-$idle-$rate-$seed" a,b,c,d,e,f "$seed" "$rate"
			row "mix-$idle-$rate-$seed" "$idle" "a-f (Zipf)" "$rate" >>"$out/summary.txt"
			bench "one-$idle-$rate-$seed" a "$seed" "$rate"
			row "one-$idle-$rate-$seed" "$idle" "a" "$rate" >>"$out/summary.txt"
		done
	done
	stop
done
column -t -s $'\t' "$out/summary.txt"
# Loads the engines refused because the replica was still full (the evicted
# adapter not yet unloaded): each answers the waiting requests 503.
for idle in $min_idles; do
	echo "adapter_min_idle $idle: $(grep -c 'adapter load refused by the engine' "$out/agent-$idle.log" || true) loads refused by a full engine"
done
