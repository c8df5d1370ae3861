#!/usr/bin/env bash
# replay-bench.sh — issue 33's capture-and-replay check (docs/benchmarks.md
# "Capture and replay"): a live run of `llmgwctl bench --workload
# shared-prefix` on `llmgw dev` whose router captures its traffic
# (--capture-path), then the capture replayed (`llmgwctl bench --replay`)
# through a fresh simulated fleet of the same shape. It prints the two runs'
# cache-hit share and TTFT side by side, with the replay's over the live
# run's.
#
# Usage: scripts/replay-bench.sh [BIN_DIR [OUT_DIR]]
#   BIN_DIR   holds llmgw and llmgwctl (default bin, as `make build` leaves them)
#   OUT_DIR   gets both runs' JSON, the capture and the logs (default replay-bench-out)
#   DURATION=60m  how long the live run sends
#   RATE=8        its Poisson arrivals per second
#   SCRAPE=60     seconds between snapshots of the router's decisions (KV and
#                 prefix decisions, requests per replica, tokenize results,
#                 the index's size) and the engines' prefix-cache counters,
#                 in OUT_DIR/decisions-{live,replay}.tsv; 0 takes none
# Ports (loopback): 21010-21016, engines 21030-21099 (below the integration
# suite's pool, 24768-32767, so it may run beside the tests). Needs curl and jq.
# Everything it starts is stopped on exit, Ctrl-C included.
set -euo pipefail

bin=$(cd "${1:-bin}" && pwd)
out=${2:-replay-bench-out}
duration=${DURATION:-60m}
rate=${RATE:-8}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in curl jq "$bin/llmgw" "$bin/llmgwctl"; do
	command -v "$tool" >/dev/null || { echo "replay-bench.sh: $tool: not found" >&2; exit 2; }
done

ctl=("$bin/llmgwctl" --addr 127.0.0.1:21012)
api=http://127.0.0.1:21010
ops=http://127.0.0.1:21011
scrape_every=${SCRAPE:-60}
pid=
scraper=
stop() {
	if [[ -n $scraper ]]; then
		kill "$scraper" 2>/dev/null || true
		wait "$scraper" 2>/dev/null || true
		scraper=
	fi
	# SIGINT is dev's Ctrl-C: router (which closes the capture), agent and its engines, control.
	if [[ -n $pid ]]; then
		kill -INT "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
		pid=
	fi
}
trap stop EXIT

# dev NAME [ARGS...]: a fresh `llmgw dev` with 4 replicas.
dev() {
	local name=$1
	shift
	rm -rf "$out/data-$name"
	"$bin/llmgw" dev --replicas 4 --data-dir "$out/data-$name" --http-addr 127.0.0.1:21010 --ops-addr 127.0.0.1:21011 \
		--grpc-addr 127.0.0.1:21012 --raft-addr 127.0.0.1:21013 --control-http-addr 127.0.0.1:21014 \
		--agent-http-addr 127.0.0.1:21015 --agent-grpc-addr 127.0.0.1:21016 --port-range 21030-21099 "$@" >"$out/dev-$name.log" 2>&1 &
	pid=$!
}

# waitReady N: until N replicas of demo are ready and no other (120 s at most).
waitReady() {
	for _ in $(seq 240); do
		kill -0 "$pid" 2>/dev/null || { echo "replay-bench.sh: llmgw dev exited; see $out/dev-*.log" >&2; return 1; }
		n=$("${ctl[@]}" replica list -o json 2>/dev/null |
			jq '[.[] | select(.model == "demo")] | (map(select(.state == "ready")) | length) as $r | if $r == length then $r else -1 end' 2>/dev/null || echo 0)
		[[ $n -eq $1 ]] && return 0
		sleep 0.5
	done
	echo "replay-bench.sh: $1 replicas of demo not ready within 120 s; see $out/dev-*.log" >&2
	return 1
}

# The model: bench-kv.sh's tier-2 fleet (4 replicas of 256 blocks, fixed
# costs: prefill 75 µs per uncached token, decode 10 ms per token).
cat >"$out/demo.yaml" <<EOT
name: demo
engine: sim
model: meta-llama/Llama-3.1-8B-Instruct
replicas: 4
gpus_per_replica: 1
profile: chat
kv_events: true
extra_args: ["--sim-decode-ms-per-token", "10", "--sim-prefill-us-per-token", "75", "--num-gpu-blocks-override", "256", "--max-model-len", "4096"]
EOT

# scrape NAME: every $scrape_every s until stopped, the router's decision
# counters and each engine's prefix-cache counters, one "seconds source
# metric{labels} value" line each, so a run's routing can be followed over
# time (docs/benchmarks.md "Capture and replay": where a replay's routing
# leaves its ceiling).
scrape() {
	local file=$out/decisions-$1.tsv start=$SECONDS engines
	engines=$("${ctl[@]}" replica list -o json | jq -r '.[] | select(.model == "demo") | .address' | sort)
	: >"$file"
	while :; do
		local t=$((SECONDS - start))
		curl -fsS --max-time 5 "$ops/metrics" 2>/dev/null |
			grep -E '^(llmgw_kv_decisions_total|llmgw_prefix_decisions_total|llmgw_router_replica_requests_total|llmgw_router_tokenize_total|llmgw_router_kvindex_(blocks|entries)|llmgw_router_kv_pressure_decisions_total|llmgw_router_session_decisions_total)[{ ]' |
			sed "s/^/$t\trouter\t/" >>"$file" || true
		for e in $engines; do
			curl -fsS --max-time 5 "http://$e/metrics" 2>/dev/null |
				grep -E '^vllm:(prefix_cache_(queries|hits)_total|num_requests_(running|waiting)|kv_cache_usage_perc|num_preemptions_total)[{ ]' |
				sed "s/^/$t\t$e\t/" >>"$file" || true
		done
		sleep "$scrape_every"
	done
}
scraping() { # NAME: scrape in the background, if asked to
	if [[ $scrape_every -gt 0 ]]; then
		scrape "$1" &
		scraper=$!
	fi
}

fleet() { # NAME [DEV ARGS...]: a fresh fleet of the model, caches empty
	dev "$@"
	for _ in $(seq 120); do "${ctl[@]}" model list >/dev/null 2>&1 && break; sleep 0.5; done
	"${ctl[@]}" model delete demo >/dev/null 2>&1 || true
	"${ctl[@]}" model apply -f "$out/demo.yaml" >/dev/null
	waitReady 4
}

echo "live: shared-prefix at $rate req/s for $duration, captured"
rm -f "$out"/capture.jsonl*
fleet live --capture-path "$out/capture.jsonl"
scraping live
"${ctl[@]}" bench --target "live=$api" --target-metrics "$ops" --model demo -q -o json --workload shared-prefix \
	--groups 12 --system-words 1000 --prompt-words 100 --max-tokens 32 --rate "$rate" --duration "$duration" --seed 1 >"$out/live.json"
stop

files=$(ls -1 "$out"/capture.jsonl* | sort -V | paste -sd, -)
echo "replay: $(cat "$out"/capture.jsonl* | wc -l) lines in $files"
# The replay's router captures too (replay-capture.jsonl, never replayed):
# its records name the replica each request went to, beside the live
# capture's, request by request.
rm -f "$out"/replay-capture.jsonl*
fleet replay --capture-path "$out/replay-capture.jsonl"
scraping replay
"${ctl[@]}" bench --target "replay=$api" --target-metrics "$ops" --model demo -q -o json --replay "$files" >"$out/replay.json"
stop

jq -rn --slurpfile l "$out/live.json" --slurpfile r "$out/replay.json" '
	def row($n; $x): [$n, $x.requests, ($x.cache_hit_share * 1000 | round / 1000), ($x.cache_hit_ceiling * 1000 | round / 1000),
		($x.ttft_seconds.p50 * 1e4 | round / 10), ($x.ttft_seconds.p90 * 1e4 | round / 10), $x.errors,
		($x.router_decisions.kv.miss // 0), ($x.router_decisions.kv.tokenize_timeout // 0)] | @tsv;
	"run\trequests\thit\tceiling\tttft_p50_ms\tttft_p90_ms\terrors\tkv_miss\ttokenize_timeout",
	row("live"; $l[0]), row("replay"; $r[0]),
	(["replay/live", ($r[0].requests / $l[0].requests * 1000 | round / 1000),
	  ($r[0].cache_hit_share / $l[0].cache_hit_share * 1000 | round / 1000), "",
	  ($r[0].ttft_seconds.p50 / $l[0].ttft_seconds.p50 * 1000 | round / 1000),
	  ($r[0].ttft_seconds.p90 / $l[0].ttft_seconds.p90 * 1000 | round / 1000), "", "", ""] | @tsv)' | tee "$out/summary.txt" | column -t -s $'\t'
