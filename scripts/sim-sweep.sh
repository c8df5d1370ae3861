#!/usr/bin/env bash
# sim-sweep.sh — issue 18's concurrency sweep against the GPU-timed simulator
# (docs/benchmarks.md "GPU-like simulator (issue 18)"): it starts
# `llmgw sim serve MODEL --sim-gpu GPU`, drives it with `llmgwctl bench`
# closed loops of CONC clients, fresh prompts of about IN tokens and OUT
# output tokens (the simulator always generates max_tokens: ignore_eos), and
# prints the columns of the issue's table, with the virtual-time prediction
# of scripts/simsweep beside it when PREDICT=1.
#
# Usage: scripts/sim-sweep.sh [BIN_DIR [OUT_DIR]]
#   BIN_DIR  holds llmgw and llmgwctl (default bin, as `make build` leaves them)
#   OUT_DIR  gets each level's bench JSON and the simulator's log (default bench-out/sim-sweep)
# Environment (defaults in brackets):
#   GPU [l4]  MODEL [Qwen/Qwen2.5-0.5B-Instruct]  UTIL [0.6]  MAX_LEN [8192]
#   IN [256]  OUT [128]  CONC ["1 2 4 8 16 32"]  PER [10] requests per client
#   PORT [34100] the simulator's loopback port  SIM_ARGS [] more simulator flags
# Bench columns are p50/p90/p99 (no p95). Needs jq. Ctrl-C stops everything.
set -euo pipefail

bin=$(cd "${1:-bin}" && pwd)
out=${2:-bench-out/sim-sweep}
mkdir -p "$out"
out=$(cd "$out" && pwd)
gpu=${GPU:-l4}
model=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
util=${UTIL:-0.6}
maxlen=${MAX_LEN:-8192}
in=${IN:-256}
outtok=${OUT:-128}
conc=${CONC:-1 2 4 8 16 32}
per=${PER:-10}
port=${PORT:-34100}
for tool in jq "$bin/llmgw" "$bin/llmgwctl"; do
	command -v "$tool" >/dev/null || { echo "sim-sweep.sh: $tool: not found" >&2; exit 2; }
done

# shellcheck disable=SC2086 # SIM_ARGS is a list of flags
"$bin/llmgw" sim serve "$model" --host 127.0.0.1 --port "$port" --served-model-name sweep \
	--sim-gpu "$gpu" --sim-load-scale 0 --gpu-memory-utilization "$util" --max-model-len "$maxlen" --log-level warn \
	${SIM_ARGS:-} >"$out/sim.log" 2>&1 &
sim=$!
trap 'kill "$sim" 2>/dev/null || true; wait "$sim" 2>/dev/null || true' EXIT
url=http://127.0.0.1:$port
for _ in $(seq 100); do
	curl -fs "$url/health" >/dev/null 2>&1 && break
	kill -0 "$sim" 2>/dev/null || { echo "sim-sweep.sh: the simulator exited; see $out/sim.log" >&2; exit 1; }
	sleep 0.1
done

# The bench's long-context workload sends one fresh document per request;
# the chat template and question add about 38 tokens to its words.
words=$((in - 38))
echo "sim-sweep: $model on $gpu (util $util), ~$in in / $outtok out, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| concurrency | req/s | out tok/s | TTFT p50 | TTFT p90 | ITL p50 | ITL p90 | E2E p50 | E2E p90 | prompt tokens |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for c in $conc; do
	curl -fs -X POST "$url/reset_prefix_cache" >/dev/null
	"$bin/llmgwctl" bench --target "$url" --engine "$url" --model sweep --workload long-context --shared-share -1 \
		--prompt-words "$words" --max-tokens "$outtok" --concurrency "$c" --requests $((c * per)) \
		--seed "$c" -q -o json >"$out/c$c.json"
	jq -r --arg c "$c" '"| \($c) | \(.throughput_rps*10|round/10) | \(.output_tokens_per_second|round) | " +
		"\(.ttft_seconds.p50*10000|round/10) | \(.ttft_seconds.p90*10000|round/10) | " +
		"\(.itl_seconds.p50*10000|round/10) | \(.itl_seconds.p90*10000|round/10) | " +
		"\(.e2e_seconds.p50*1000|round) | \(.e2e_seconds.p90*1000|round) | \(.prompt_tokens/.requests|round) |"' "$out/c$c.json"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ ${PREDICT:-0} == 1 ]]; then
	here=$(cd "$(dirname "$0")" && pwd)
	echo "virtual-time prediction (scripts/simsweep):"
	(cd "$here/.." && go run ./scripts/simsweep --gpu "$gpu" --model "$model" --gpu-memory-utilization "$util" \
		--max-model-len "$maxlen" --input-tokens "$in" --output-tokens "$outtok" \
		--concurrency "$(echo "$conc" | tr ' ' ,)" --requests-per-client "$per")
fi
