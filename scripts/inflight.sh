#!/usr/bin/env bash
# inflight.sh — how evenly a run loads the replicas, seen from the engines.
#
# The router's X-Llmgw-Replica counts say where requests went, not how long
# they stayed: a replica handed the long prompts can pile up with the same
# request count as its peers. So while COMMAND runs (typically `llmgwctl
# bench`), this samples every replica engine's own queue —
# vllm:num_requests_running + vllm:num_requests_waiting from its /metrics —
# and prints each replica's time-averaged in-flight count and the fleet's
# max/mean of those averages (1 is even; the scheduler issue asks ≤ 1.5 for a
# hot prefix). Engine addresses come from `llmgwctl replica list -o json`, the
# control plane's view, so the script works for any router in front.
#
# Usage: scripts/inflight.sh [-a CONTROL_ADDR] [-m MODEL] [-i SECONDS] [-c LLMGWCTL] -- COMMAND [ARGS...]
#   -a  control plane gRPC address (default $LLMGW_ADDR or 127.0.0.1:7400)
#   -m  only this model's replicas (default: all ready replicas)
#   -i  sampling interval in seconds (default 0.1)
#   -c  the llmgwctl binary (default: llmgwctl on PATH)
# The summary goes to stderr, so COMMAND's stdout (e.g. -o json) stays clean.
# Needs curl and jq. Exits with COMMAND's status.
set -euo pipefail

addr=${LLMGW_ADDR:-127.0.0.1:7400}
model=""
interval=0.1
ctl=llmgwctl
while getopts "a:m:i:c:h" opt; do
	case $opt in
	a) addr=$OPTARG ;;
	m) model=$OPTARG ;;
	i) interval=$OPTARG ;;
	c) ctl=$OPTARG ;;
	*) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[[ ${1:-} == -- ]] && shift
if [[ $# -eq 0 ]]; then
	echo "inflight.sh: COMMAND: required (scripts/inflight.sh -h for usage)" >&2
	exit 2
fi
for tool in curl jq; do
	command -v "$tool" >/dev/null || { echo "inflight.sh: $tool: not found" >&2; exit 2; }
done

# "id address" per ready replica, in id order.
replicas=$("$ctl" --addr "$addr" replica list -o json | jq -r --arg m "$model" '
	.[] | select(.state == "ready" and ($m == "" or .model == $m))
	| "\(.id) \(.address)"' | sort)
if [[ -z $replicas ]]; then
	echo "inflight.sh: no ready replicas${model:+ of model $model} at $addr" >&2
	exit 1
fi

samples=$(mktemp)
trap 'rm -f "$samples"' EXIT

# One line per round: "<unix seconds> <id>=<running+waiting> ...". A replica
# whose /metrics does not answer is recorded as "-" and left out of its mean.
sample() {
	while :; do
		local line
		line=$(date +%s.%N)
		while read -r id a; do
			n=$(curl -s --max-time 1 "http://$a/metrics" | awk '
				/^vllm:num_requests_(running|waiting)[{ ]/ { s += $NF; seen = 1 }
				END { if (seen) printf "%d", s; else printf "-" }') || n=-
			line+=" $id=$n"
		done <<<"$replicas"
		echo "$line" >>"$samples"
		sleep "$interval"
	done
}
sample &
sampler=$!

status=0
"$@" || status=$?
kill "$sampler" 2>/dev/null || true
wait "$sampler" 2>/dev/null || true

# Each round's reading stands for the time until the next round, so a slow
# round (a busy machine) weighs what it should; the last round has no
# successor and is dropped.
awk '
	{
		t[NR] = $1
		for (i = 2; i <= NF; i++) {
			split($i, kv, "=")
			v[NR, kv[1]] = kv[2]
			if (!(kv[1] in seen)) { seen[kv[1]] = 1; order[++n] = kv[1] }
		}
	}
	END {
		if (NR < 2) { print "inflight.sh: fewer than two samples; run longer" > "/dev/stderr"; exit 1 }
		printf "%-12s %8s %10s %6s\n", "REPLICA", "SAMPLES", "AVG_INFL", "PEAK"
		sum = 0; max = 0
		for (k = 1; k <= n; k++) {
			id = order[k]; w = 0; a = 0; peak = 0; cnt = 0
			for (r = 1; r < NR; r++) {
				x = v[r, id]
				if (x == "-" || x == "") continue
				dt = t[r + 1] - t[r]; w += dt; a += x * dt; cnt++
				if (x + 0 > peak) peak = x + 0
			}
			avg[id] = (w > 0) ? a / w : 0
			printf "%-12s %8d %10.2f %6d\n", id, cnt, avg[id], peak
			sum += avg[id]; if (avg[id] > max) max = avg[id]
		}
		mean = sum / n
		printf "in-flight time-averaged: mean %.2f, max %.2f, max/mean %.2f\n", mean, max, (mean > 0) ? max / mean : 0
	}' "$samples" >&2
exit "$status"
