#!/usr/bin/env bash
# bench-kv-wave2.sh — the must-show scenarios of issue 14 ("Precise routing
# that pays"), docs/benchmarks.md "Precise routing that pays (issue 14)":
#   fits       8 groups whose working set fits 0.75 × the fleet's cache but
#              not one replica's
#   disrupted  the fits workload while, during the run, the second router
#              restarts, one engine's cache is reset and a fifth replica is
#              added (and removed again after the run)
#   pressure   scripts/bench-kv.sh's shape: 12 groups, about the whole
#              fleet's cache
# each on `llmgw dev` (4 simulated replicas) with two routers — dev's own and
# a second `llmgw router` — behind the bench's --targets-round-robin, SEEDS
# seeds per configuration. The engines' prefix caches are emptied before
# every run by the bench itself (--reset-caches, through the control plane)
# and every run reports cache_hit_ceiling. Per scenario it prints and saves
# (summary-SCENARIO.txt, .json, .svg) the seeds' summary: mean (range) and
# seed-by-seed wins of hit share, hit/ceiling, TTFT p50 and p90.
#
# Usage: scripts/bench-kv-wave2.sh [BIN_DIR [OUT_DIR]]
#   BIN_DIR    holds llmgw and llmgwctl (default bin, as `make build` leaves them)
#   OUT_DIR    gets every run's JSON, the summaries and the logs (default bench-out/kv-wave2)
#   SEEDS=10   seeds per configuration and scenario
#   SCENARIOS="fits disrupted pressure"
#   CONFIGS="rr tier1 tier2 tier2-spec tier2-cost tier2-noaff"   any of them
# Ports (loopback): 33480-33481, 33700-33705, engines 33100-33399. Needs curl
# and jq. Everything it starts is stopped on exit, Ctrl-C included.
set -euo pipefail

# The configurations' profile_overrides (a YAML flow mapping, empty for
# none). They select the tier-2 knobs (docs/scheduler.md "Tier 2's knobs"):
# tier2 is the share-of-blocks score with speculative indexing off,
# tier2-spec the default (the same score, speculation on, the KV affinity
# filter on: a hit goes to its prefix's primary only), tier2-cost the
# cost-aware score with speculation, tier2-noaff the default with the KV
# affinity filter off (as before it was the default). A router that does not know a key
# refuses the model, and the script stops at that apply with the control
# plane's error.
OVR_TIER2=${OVR_TIER2-"{speculation: false}"}
OVR_TIER2_SPEC=${OVR_TIER2_SPEC-}
OVR_TIER2_COST=${OVR_TIER2_COST-"{kv_score: cost}"}
OVR_TIER2_NOAFF=${OVR_TIER2_NOAFF-"{kv_affinity: false}"}

bin=$(cd "${1:-bin}" && pwd)
out=${2:-bench-out/kv-wave2}
seeds=${SEEDS:-10}
scenarios=${SCENARIOS:-fits disrupted pressure}
configs=${CONFIGS:-rr tier1 tier2 tier2-spec tier2-cost tier2-noaff}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in curl jq "$bin/llmgw" "$bin/llmgwctl"; do
	command -v "$tool" >/dev/null || { echo "bench-kv-wave2.sh: $tool: not found" >&2; exit 2; }
done
say() { echo "bench-kv-wave2.sh: $(date -u +%H:%M:%S) $*" >&2; }
die() { say "$*"; exit 1; }

ctl=("$bin/llmgwctl" --addr 127.0.0.1:33700)
r1=http://127.0.0.1:33480
r2addr=127.0.0.1:33481
r2=http://$r2addr
# The routers' operations ports (/metrics), apart from the API.
r1ops=http://127.0.0.1:33482
r2ops=http://127.0.0.1:33483
dev_pid=
r2_pid=
bench_pid=
stop() {
	# The bench, the second router (SIGTERM drains it), then dev (SIGINT
	# is its Ctrl-C: router, agent and its engines, control).
	[[ -n $bench_pid ]] && { kill "$bench_pid" 2>/dev/null || true; wait "$bench_pid" 2>/dev/null || true; }
	[[ -n $r2_pid ]] && { kill -TERM "$r2_pid" 2>/dev/null || true; wait "$r2_pid" 2>/dev/null || true; }
	[[ -n $dev_pid ]] && { kill -INT "$dev_pid" 2>/dev/null || true; wait "$dev_pid" 2>/dev/null || true; }
}
trap stop EXIT
trap 'exit 130' INT TERM

rm -rf "$out/data" "$out/r2data"
"$bin/llmgw" dev --replicas 4 --gpus 8 --data-dir "$out/data" --http-addr 127.0.0.1:33480 --ops-addr "${r1ops#http://}" \
	--grpc-addr 127.0.0.1:33700 --raft-addr 127.0.0.1:33701 --control-http-addr 127.0.0.1:33703 \
	--agent-http-addr 127.0.0.1:33704 --agent-grpc-addr 127.0.0.1:33705 --port-range 33100-33399 >"$out/dev.log" 2>&1 &
dev_pid=$!

# ready N [MODEL_MATCHES]: until exactly N replicas of demo are ready and
# none other (120 s at most) — after a delete or scale-down the old ones
# must be gone.
ready() {
	local n
	for _ in $(seq 240); do
		kill -0 "$dev_pid" 2>/dev/null || die "llmgw dev exited; see $out/dev.log"
		n=$("${ctl[@]}" replica list -o json 2>/dev/null |
			jq '[.[] | select(.model == "demo")] | (map(select(.state == "ready")) | length) as $r | if $r == length then $r else -1 end' 2>/dev/null || echo -2)
		[[ $n -eq $1 ]] && return 0
		sleep 0.5
	done
	die "waited 120 s for $1 ready replicas of demo (last count $n); see $out/dev.log"
}

# r2start: the second router, against dev's control plane; its own data
# dir, so a restart starts from its last state as a real one does.
r2start() {
	"$bin/llmgw" router --id r2 --control 127.0.0.1:33700 --http-addr "$r2addr" --ops-addr "${r2ops#http://}" \
		--data-dir "$out/r2data" >>"$out/r2.log" 2>&1 &
	r2_pid=$!
	for _ in $(seq 120); do
		kill -0 "$r2_pid" 2>/dev/null || die "the second router exited; see $out/r2.log"
		curl -sf "$r2/readyz" -o /dev/null && return 0
		sleep 0.25
	done
	die "the second router not ready within 30 s; see $out/r2.log"
}
r2stop() {
	kill -TERM "$r2_pid" 2>/dev/null || true
	wait "$r2_pid" 2>/dev/null || true
	r2_pid=
}
# r1ready: dev's router answers /readyz (30 s at most).
r1ready() {
	for _ in $(seq 120); do
		curl -sf "$r1/readyz" -o /dev/null && return 0
		sleep 0.25
	done
	die "dev's router not ready within 30 s; see $out/dev.log"
}

# The engines: prefill 75 µs per uncached token (a ~1400-token prompt costs
# ~100 ms), decode 10 ms per token, 256 blocks of 16 tokens each (4096
# tokens: about three of the ~1300-token system prompts per replica), as in
# scripts/bench-kv.sh.
model() { # FILE PROFILE KV_EVENTS OVERRIDES REPLICAS
	{
		cat <<EOT
name: demo
engine: sim
model: meta-llama/Llama-3.1-8B-Instruct
replicas: $5
gpus_per_replica: 1
profile: $2
kv_events: $3
extra_args: ["--sim-decode-ms-per-token", "10", "--sim-prefill-us-per-token", "75",
             "--num-gpu-blocks-override", "256", "--max-model-len", "4096"]
EOT
		if [[ -n $4 ]]; then echo "profile_overrides: $4"; fi
	} >"$1"
}
configure() { # CONFIG REPLICAS FILE
	case $1 in
	rr) model "$3" debug false "" "$2" ;;
	tier1) model "$3" chat false "" "$2" ;;
	tier2) model "$3" chat true "$OVR_TIER2" "$2" ;;
	tier2-spec) model "$3" chat true "$OVR_TIER2_SPEC" "$2" ;;
	tier2-cost) model "$3" chat true "$OVR_TIER2_COST" "$2" ;;
	tier2-noaff) model "$3" chat true "$OVR_TIER2_NOAFF" "$2" ;;
	*) die "CONFIGS: unknown configuration $1 (want rr tier1 tier2 tier2-spec tier2-cost tier2-noaff)" ;;
	esac
}
apply() { # FILE
	local err
	err=$("${ctl[@]}" model apply -f "$1" 2>&1 >/dev/null) || die "model apply $1: $err"
}

# Request counts keep the whole default run (3 scenarios × 5
# configurations × 10 seeds) near 40 minutes on 2 cores: about 15 s a run
# (six configurations, with tier 2 faster than before, about 35).
common=(--model demo --max-tokens 32 --concurrency 16 -q -o json --addr 127.0.0.1:33700)
workload() { # SCENARIO
	case $1 in
	fits) echo --workload shared-prefix --groups 8 --system-words 1000 --prompt-words 100 --requests 240 ;;
	disrupted) echo --workload shared-prefix --groups 8 --system-words 1000 --prompt-words 100 --requests 480 ;;
	pressure) echo --workload shared-prefix --groups 12 --system-words 1000 --prompt-words 100 --requests 320 ;;
	*) die "SCENARIOS: unknown scenario $1 (want fits disrupted pressure)" ;;
	esac
}

# bench CONFIG SCENARIO SEED: one run through both routers; 10 minutes at most.
bench() {
	local json=$out/$2-$1-$3.json
	# shellcheck disable=SC2046 # the workload's flags are words
	timeout 600 "$bin/llmgwctl" bench --target "$1=$r1" --target "$1=$r2" --target-metrics "$r1ops" --target-metrics "$r2ops" --targets-round-robin \
		"${common[@]}" $(workload "$2") --seed "$3" >"$json" 2>"$out/$2-$1-$3.err" &
	bench_pid=$!
}
bench_wait() { # CONFIG SCENARIO SEED
	local rc=0
	wait "$bench_pid" || rc=$?
	bench_pid=
	((rc == 0)) || die "bench $2/$1 seed $3 failed (exit $rc): $(tail -3 "$out/$2-$1-$3.err")"
}

# disrupt SEED: the disruptions, timed from the run's start, each only
# while the run still goes (a step after its end is logged, not done).
disrupt() {
	local t0=$SECONDS step how
	for step in "3 restart" "6 reset" "8 add"; do
		set -- $step
		while ((SECONDS - t0 < $1)); do sleep 0.2; done
		if ! kill -0 "$bench_pid" 2>/dev/null; then
			say "disrupted seed $SEED: the run ended before step '$2' at ${1}s; use more --requests"
			echo "seed $SEED: $2 skipped (run over)" >>"$out/disruptions.txt"
			continue
		fi
		case $2 in
		restart) r2stop; r2start ;;
		reset)
			local a
			a=$("${ctl[@]}" replica list -o json | jq -r '[.[] | select(.model == "demo" and .state == "ready") | .address] | sort | .[0]')
			# An engine refuses a reset while requests hold cached blocks,
			# which under this load is nearly always; after 1 s of
			# refusals it is crashed instead (the simulator's crash_after
			# fault): the agent restarts it with an empty cache, and its
			# KV event stream starts over — the harder case for an index.
			how=crash
			for _ in $(seq 20); do
				if curl -sf -XPOST "http://$a/reset_prefix_cache" -o /dev/null; then how=reset; break; fi
				sleep 0.05
			done
			if [[ $how == crash ]]; then
				curl -sf -XPOST "http://$a/sim/faults" -H 'Content-Type: application/json' -d '{"crash_after": 1}' -o /dev/null ||
					say "neither reset nor crash of $a accepted"
			fi
			set -- "$1" "$2 ($how $a)"
			;;
		add) configure "$CFG" 5 "$out/$CFG-5.yaml" && apply "$out/$CFG-5.yaml" ;;
		esac
		echo "seed $SEED: $2 at $((SECONDS - t0))s" >>"$out/disruptions.txt"
	done
}

say "starting llmgw dev and a second router (logs in $out)"
for _ in $(seq 240); do "${ctl[@]}" replica list >/dev/null 2>&1 && break; sleep 0.5; done
ready 4 # dev's own demo model first
r1ready
r2start
echo "load average at start: $(cat /proc/loadavg)" | tee "$out/loadavg.txt" >&2
for scn in $scenarios; do
	workload "$scn" >/dev/null
	for cfg in $configs; do
		# Each configuration on fresh replicas: kv_events changes the
		# engines' command line. Delete, wait for none, apply, wait for 4.
		configure "$cfg" 4 "$out/$cfg-4.yaml"
		"${ctl[@]}" model delete demo >/dev/null 2>&1 || true
		ready 0
		apply "$out/$cfg-4.yaml"
		ready 4
		for seed in $(seq "$seeds"); do
			say "$scn $cfg seed $seed (load $(cut -d' ' -f1-3 /proc/loadavg))"
			bench "$cfg" "$scn" "$seed"
			if [[ $scn == disrupted ]]; then
				CFG=$cfg SEED=$seed disrupt
			fi
			bench_wait "$cfg" "$scn" "$seed"
			if [[ $scn == disrupted ]]; then
				apply "$out/$cfg-4.yaml" # back to 4 for the next seed
				ready 4
			fi
		done
	done
	"$bin/llmgwctl" bench summarize --chart "$out/summary-$scn.svg" "$out/$scn"-*.json >"$out/summary-$scn.txt"
	"$bin/llmgwctl" bench summarize -o json "$out/$scn"-*.json | jq '.summary' >"$out/summary-$scn.json"
	echo "== $scn (load average now $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$out/loadavg.txt" >&2
	cat "$out/summary-$scn.txt"
done
