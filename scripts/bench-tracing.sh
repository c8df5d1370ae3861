#!/usr/bin/env bash
# bench-tracing.sh — issue 33's tracing cost as an operator sees it
# (docs/benchmarks.md "Tracing cost on a simulated fleet"): two `llmgw
# router`s over one `llmgw dev` fleet of 4 simulated replicas (dev's demo
# timing, Llama-3.1-8B on an A100), one with tracing off and one tracing
# 10 % of requests to an OTLP receiver (scripts/otlpsink, counting spans);
# `llmgwctl bench` runs the shared-prefix workload in a closed loop against
# each in turn, the order alternating round by round, caches reset before
# each run. It prints each round's throughput and TTFT p50 side by side,
# then the medians and the traced router's over the untraced one's.
#
# Usage: scripts/bench-tracing.sh [BIN_DIR [OUT_DIR]]
#   BIN_DIR   holds llmgw and llmgwctl (default bin)
#   OUT_DIR   gets each run's JSON and the logs (default bench-tracing-out)
#   ROUNDS=6        rounds (each runs both routers)
#   RUN=60s         how long each run sends
#   CONCURRENCY=16  the closed loop's clients
#   RATIO=0.1       the traced router's sampling ratio
#   CONTROL=1       the control: the second router untraced too, so the
#                   table shows what two identical routers differ by here
# Ports (loopback): dev 22010-22016, engines 22030-22099, the receiver 22020,
# the routers 22100-22103 (below the integration suite's pool, 24768-32767).
# Needs go (to build the receiver), curl and jq. Everything it starts is
# stopped on exit, Ctrl-C included.
set -euo pipefail

bin=$(cd "${1:-bin}" && pwd)
out=${2:-bench-tracing-out}
rounds=${ROUNDS:-6}
run=${RUN:-60s}
conc=${CONCURRENCY:-16}
ratio=${RATIO:-0.1}
mkdir -p "$out"
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
for tool in go curl jq "$bin/llmgw" "$bin/llmgwctl"; do
	command -v "$tool" >/dev/null || { echo "bench-tracing.sh: $tool: not found" >&2; exit 2; }
done
die() { echo "bench-tracing.sh: $*" >&2; exit 1; }

ctl=("$bin/llmgwctl" --addr 127.0.0.1:22012)
pids=()
stop() {
	# The routers and the receiver (SIGTERM), then dev (SIGINT is its Ctrl-C).
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill -TERM "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	pids=()
}
trap stop EXIT

(cd "$here" && go build -o "$out/otlpsink" ./scripts/otlpsink)
rm -rf "$out/data" "$out"/router-*
"$bin/llmgw" dev --replicas 4 --data-dir "$out/data" --http-addr 127.0.0.1:22010 --ops-addr 127.0.0.1:22011 \
	--grpc-addr 127.0.0.1:22012 --raft-addr 127.0.0.1:22013 --control-http-addr 127.0.0.1:22014 \
	--agent-http-addr 127.0.0.1:22015 --agent-grpc-addr 127.0.0.1:22016 --port-range 22030-22099 >"$out/dev.log" 2>&1 &
pids+=($!)
"$out/otlpsink" -addr 127.0.0.1:22020 >"$out/spans.txt" 2>"$out/otlpsink.log" &
pids+=($!)

# ready N: until N replicas of demo are ready (120 s at most).
ready() {
	local n=-1
	for _ in $(seq 240); do
		n=$("${ctl[@]}" replica list -o json 2>/dev/null | jq '[.[] | select(.model == "demo" and .state == "ready")] | length' 2>/dev/null || echo -1)
		[[ $n -eq $1 ]] && return 0
		sleep 0.5
	done
	die "waited 120 s for $1 ready replicas of demo (last count $n); see $out/dev.log"
}

# router NAME PORT [ARGS...]: one `llmgw router` on PORT (API) and PORT+1 (operations).
router() {
	local name=$1 port=$2
	shift 2
	"$bin/llmgw" router --id "$name" --control 127.0.0.1:22012 --http-addr "127.0.0.1:$port" --ops-addr "127.0.0.1:$((port + 1))" \
		--data-dir "$out/router-$name" "$@" >>"$out/router-$name.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 120); do
		kill -0 "$!" 2>/dev/null || die "router $name exited; see $out/router-$name.log"
		curl -sf "http://127.0.0.1:$port/readyz" -o /dev/null && return 0
		sleep 0.25
	done
	die "router $name not ready within 30 s; see $out/router-$name.log"
}

for _ in $(seq 240); do "${ctl[@]}" replica list >/dev/null 2>&1 && break; sleep 0.5; done
ready 4
router off 22100
if [[ ${CONTROL:-0} == 1 ]]; then
	router traced 22102 # named as the traced one, so the table reads the same
else
	router traced 22102 --otlp-traces-endpoint 127.0.0.1:22020 --trace-sampling-ratio "$ratio"
fi
echo "load average at start: $(cat /proc/loadavg)" | tee "$out/loadavg.txt" >&2

off=(--target off=http://127.0.0.1:22100 --target-metrics http://127.0.0.1:22101)
on=(--target traced=http://127.0.0.1:22102 --target-metrics http://127.0.0.1:22103)
for r in $(seq "$rounds"); do
	if ((r % 2)); then order=("${off[@]}" "${on[@]}"); else order=("${on[@]}" "${off[@]}"); fi
	"${ctl[@]}" bench "${order[@]}" --model demo -q -o json --workload shared-prefix --concurrency "$conc" \
		--duration "$run" --seed "$r" >"$out/round-$r.json" || die "round $r failed; see $out/round-$r.json"
	echo "round $r done ($(cut -d' ' -f1-3 /proc/loadavg))" >&2
done
echo "load average at end: $(cat /proc/loadavg)" | tee -a "$out/loadavg.txt" >&2
stop
spans=$(awk '/^spans/ {print $2}' "$out/spans.txt")

jq -rs --arg spans "${spans:-?}" '
	[.[] | .runs[]] as $runs |
	def of($l): [$runs[] | select(.label == $l)];
	def med(f): (map(f) | sort) as $s | if ($s | length) % 2 == 1 then $s[($s | length - 1) / 2] else ($s[($s | length) / 2 - 1] + $s[($s | length) / 2]) / 2 end;
	(of("off")) as $o | (of("traced")) as $t |
	"round\toff_rps\ttraced_rps\ttraced/off\toff_ttft_p50_ms\ttraced_ttft_p50_ms\tdiff_ms",
	(range(0; [$o, $t] | map(length) | min) as $i |
		[$i + 1, ($o[$i].throughput_rps * 100 | round / 100), ($t[$i].throughput_rps * 100 | round / 100),
		 ($t[$i].throughput_rps / $o[$i].throughput_rps * 10000 | round / 10000),
		 ($o[$i].ttft_seconds.p50 * 1e5 | round / 100), ($t[$i].ttft_seconds.p50 * 1e5 | round / 100),
		 (($t[$i].ttft_seconds.p50 - $o[$i].ttft_seconds.p50) * 1e5 | round / 100)] | @tsv),
	(["median", ($o | med(.throughput_rps) * 100 | round / 100), ($t | med(.throughput_rps) * 100 | round / 100),
	  (($t | med(.throughput_rps)) / ($o | med(.throughput_rps)) * 10000 | round / 10000),
	  ($o | med(.ttft_seconds.p50) * 1e5 | round / 100), ($t | med(.ttft_seconds.p50) * 1e5 | round / 100),
	  ((($t | med(.ttft_seconds.p50)) - ($o | med(.ttft_seconds.p50))) * 1e5 | round / 100)] | @tsv),
	"spans received: \($spans), two a sampled request (the traced router sent \($t | map(.requests) | add) requests)"' "$out"/round-*.json | tee "$out/summary.txt" | column -t -s $'\t'
