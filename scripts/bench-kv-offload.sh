#!/usr/bin/env bash
# bench-kv-offload.sh — issue 32's offload must-show, docs/benchmarks.md
# "Offload tier routing": a shared-prefix working set 4 × one replica's GPU
# cache and within every replica's CPU tier, its groups used in bursts (teams'
# system prompts: a few active at a time, each then idle for longer than the
# router's 30 s KV home window), on `llmgw dev` with 4 simulated replicas
# (Llama-3.1-8B on an A100-40GB, 256 GPU blocks of 16 tokens,
# --kv-offloading-size 2.5: 1,280 CPU blocks of 2 MiB, 1.25 × the working
# set), SEEDS seeds of two configurations:
#   tier     tier-aware credit, the router's defaults (kv_credit_cpu 0.8)
#   gpu      GPU-only credit: routers whose configuration file sets
#            kv_credit_cpu: 0 and kv_credit_storage: 0
# Each configuration has its own two `llmgw router`s (behind the bench's
# --targets-round-robin), all four started once against dev's control plane,
# so both see the same engines and index; the seeds alternate tier, gpu. The
# bench empties the engines' prefix caches and CPU tiers before every run
# (--reset-caches: /reset_prefix_cache?reset_external=true) and reports the
# cache_hit_ceiling; it prints and saves (summary.txt, .json, .svg) the
# seeds' summary: mean (range) and seed-by-seed wins of hit share,
# hit/ceiling, TTFT p50 and p90.
#
# Usage: scripts/bench-kv-offload.sh [BIN_DIR [OUT_DIR]]
#   BIN_DIR    holds llmgw and llmgwctl (default bin, as `make build` leaves them)
#   OUT_DIR    gets every run's JSON, the summary and the logs (default bench-out/kv-offload)
#   SEEDS=10   seeds per configuration
#   WORKLOAD=returning  32 small groups active in turn, in bursts of ~4
#              requests, so that a returning group's first requests are a
#              quarter of the traffic (the measurement of record, about
#              130 s a run); bursts: 8 groups in long bursts (about 100 s a
#              run); steady: the earlier shape, every group always
#              active (12 groups, 0.25 × the CPU tier of 8 GiB, a closed
#              loop of 16, about a minute a run)
#   REQUESTS=900  requests per steady run
#   CPU_CREDITS="0.5 1"  more configurations beside tier and gpu: cpuW,
#              routers with kv_credit_cpu W, to weigh the default against
# Ports (loopback): 20480-20497 (and 4 a CPU_CREDITS weight from 20506),
# 20700-20705, engines 20100-20399. Needs curl
# and jq. Everything it starts is stopped on exit, Ctrl-C included.
set -euo pipefail

bin=$(cd "${1:-bin}" && pwd)
out=${2:-bench-out/kv-offload}
seeds=${SEEDS:-10}
shape=${WORKLOAD:-returning}
requests=${REQUESTS:-900}
[[ $shape == bursts || $shape == returning || $shape == steady ]] ||
	{ echo "bench-kv-offload.sh: WORKLOAD=$shape: want bursts, returning or steady" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in curl jq "$bin/llmgw" "$bin/llmgwctl"; do
	command -v "$tool" >/dev/null || { echo "bench-kv-offload.sh: $tool: not found" >&2; exit 2; }
done
say() { echo "bench-kv-offload.sh: $(date -u +%H:%M:%S) $*" >&2; }
die() { say "$*"; exit 1; }

ctl=("$bin/llmgwctl" --addr 127.0.0.1:20700)
dev_pid=
router_pids=()
bench_pid=
stop() {
	# The bench, the routers (SIGTERM drains them), then dev (SIGINT is
	# its Ctrl-C: router, agent and its engines, control).
	[[ -n $bench_pid ]] && { kill "$bench_pid" 2>/dev/null || true; wait "$bench_pid" 2>/dev/null || true; }
	for p in "${router_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${router_pids[@]}"; do wait "$p" 2>/dev/null || true; done
	[[ -n $dev_pid ]] && { kill -INT "$dev_pid" 2>/dev/null || true; wait "$dev_pid" 2>/dev/null || true; }
}
trap stop EXIT
trap 'exit 130' INT TERM

rm -rf "$out/data" "$out"/router-*
"$bin/llmgw" dev --replicas 4 --gpus 8 --data-dir "$out/data" --http-addr 127.0.0.1:20480 --ops-addr 127.0.0.1:20482 \
	--grpc-addr 127.0.0.1:20700 --raft-addr 127.0.0.1:20701 --control-http-addr 127.0.0.1:20703 \
	--agent-http-addr 127.0.0.1:20704 --agent-grpc-addr 127.0.0.1:20705 --port-range 20100-20399 >"$out/dev.log" 2>&1 &
dev_pid=$!

# ready N: until exactly N replicas of demo are ready and none other (120 s
# at most).
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

# router NAME PORT [CONFIG]: one `llmgw router` on PORT (API) and PORT+1
# (operations), its own data dir, with CONFIG as its --config when given.
router() {
	local args=(--id "$1" --control 127.0.0.1:20700 --http-addr "127.0.0.1:$2" --ops-addr "127.0.0.1:$(($2 + 1))"
		--data-dir "$out/router-$1")
	[[ -n ${3:-} ]] && args+=(--config "$3")
	"$bin/llmgw" router "${args[@]}" >>"$out/router-$1.log" 2>&1 &
	router_pids+=($!)
	for _ in $(seq 120); do
		kill -0 "$!" 2>/dev/null || die "router $1 exited; see $out/router-$1.log"
		curl -sf "http://127.0.0.1:$2/readyz" -o /dev/null && return 0
		sleep 0.25
	done
	die "router $1 not ready within 30 s; see $out/router-$1.log"
}

# The engines: Llama-3.1-8B on an A100-40GB (dev's demo profile: a
# ~1,400-token prompt's prefill ~0.1 s, a CPU-tier hit's copy ~7 ms), 256 GPU
# blocks of 16 tokens (4,096 tokens) and a CPU tier of --kv-offloading-size
# GiB. A block is 2 MiB (32 layers × 8 KV heads × 128 dims × K and V × 2 bytes
# × 16 tokens), 512 to the GiB: returning's and bursts' 2.5 GiB is 1,280 blocks, 1.25 × their
# ~1,000-block working sets (every system prompt, once, with room for the
# requests' own tails, which the write-through tier stores too); steady's
# 8 GiB is 4,096 blocks.
offload_gib=2.5
[[ $shape == steady ]] && offload_gib=8
cat >"$out/demo.yaml" <<EOT
name: demo
engine: sim
model: meta-llama/Llama-3.1-8B-Instruct
replicas: 4
gpus_per_replica: 1
profile: chat
kv_events: true
extra_args: ["--sim-gpu", "a100-40gb", "--sim-load-scale", "0", "--num-gpu-blocks-override", "256",
             "--max-model-len", "4096", "--kv-offloading-size", "$offload_gib"]
EOT
printf 'kv_credit_cpu: 0\nkv_credit_storage: 0\n' >"$out/gpu-only.yaml"
# CPU_CREDITS="0.5 1": more configurations, cpuW with kv_credit_cpu W (and
# kv_credit_storage at most W), to weigh the default 0.8 against.
declare -A port=([tier]=20490 [gpu]=20494)
configs=(tier gpu)
p=20506
for w in ${CPU_CREDITS:-}; do
	[[ $w =~ ^(0(\.[0-9]+)?|1(\.0+)?)$ ]] || die "CPU_CREDITS: $w is not a weight in [0, 1]"
	printf 'kv_credit_cpu: %s\nkv_credit_storage: %s\n' "$w" "$(awk -v w="$w" 'BEGIN { print (w < 0.25 ? w : 0.25) }')" >"$out/cpu$w.yaml"
	port[cpu$w]=$p
	configs+=("cpu$w")
	p=$((p + 4))
done

say "starting llmgw dev and the routers, two a configuration (logs in $out)"
for _ in $(seq 240); do "${ctl[@]}" replica list >/dev/null 2>&1 && break; sleep 0.5; done
ready 4 # dev's own demo model first
"${ctl[@]}" model delete demo >/dev/null 2>&1 || true
ready 0
err=$("${ctl[@]}" model apply -f "$out/demo.yaml" 2>&1 >/dev/null) || die "model apply: $err"
ready 4
router tier1 20490
router tier2 20492
router gpu1 20494 "$out/gpu-only.yaml"
router gpu2 20496 "$out/gpu-only.yaml"
for c in "${configs[@]:2}"; do
	router "${c}a" "${port[$c]}" "$out/$c.yaml"
	router "${c}b" "$((port[$c] + 2))" "$out/$c.yaml"
done
echo "load average at start: $(cat /proc/loadavg)" | tee "$out/loadavg.txt" >&2

if [[ $shape == bursts ]]; then
	# 8 groups of a ~2,040-token system prompt (127 full blocks each): ~1,020
	# blocks, 4.0 × one replica's GPU cache, 0.8 × its CPU tier. 2 groups
	# active at a time (2 × 127 blocks: one replica's GPU cache), the pair
	# moving on every 96 requests: at 8 requests a second (an open loop, so
	# phases are seconds whatever the answers' speed) a phase is ~12 s and a
	# group idles 3 phases, ~36 s, past the router's 30 s home window, between
	# its bursts. 768 requests are 8 phases: two full cycles, ~96 s.
	workload=(--workload shared-prefix --groups 8 --active-groups 2 --rotate-every 96 --system-words 2020 --prompt-words 100
		--requests 768 --rate 8)
elif [[ $shape == returning ]]; then
	# 32 groups of a ~500-token system prompt (31 full blocks each): ~1,000
	# blocks, 4.0 × one replica's GPU cache, 0.8 × its CPU tier, each an
	# eighth of a GPU cache, so two groups on one replica never wait for
	# blocks. 4 groups active at a time, moving on every 16 requests: a
	# burst is ~4 requests, and at 3 requests a second a phase is ~5.3 s
	# and a group idles 7 phases, ~37 s, past the 30 s home window, between
	# bursts — every burst's first request (a quarter of the traffic) finds
	# its group only in a CPU tier. 384 requests are 3 cycles of 8 phases,
	# the first cold for both, ~130 s.
	workload=(--workload shared-prefix --groups 32 --active-groups 4 --rotate-every 16 --system-words 500 --prompt-words 100
		--requests 384 --rate 3)
else
	# 12 groups of a ~1,380-token system prompt: ~1,030 blocks, 4.0 × one
	# replica's GPU cache (the whole fleet's), 0.25 × its CPU tier, every
	# group always active.
	workload=(--workload shared-prefix --groups 12 --system-words 1360 --prompt-words 100 --requests "$requests" --concurrency 16)
fi
common=(--model demo --max-tokens 32 -q -o json --addr 127.0.0.1:20700)
for seed in $(seq "$seeds"); do
	for cfg in "${configs[@]}"; do
		p=${port[$cfg]}
		say "$cfg seed $seed (load $(cut -d' ' -f1-3 /proc/loadavg))"
		json=$out/offload-$cfg-$seed.json
		timeout 600 "$bin/llmgwctl" bench --target "$cfg=http://127.0.0.1:$p" --target "$cfg=http://127.0.0.1:$((p + 2))" \
			--target-metrics "http://127.0.0.1:$((p + 1))" --target-metrics "http://127.0.0.1:$((p + 3))" --targets-round-robin \
			"${common[@]}" "${workload[@]}" --seed "$seed" >"$json" 2>"$out/offload-$cfg-$seed.err" &
		bench_pid=$!
		rc=0
		wait "$bench_pid" || rc=$?
		bench_pid=
		((rc == 0)) || die "bench $cfg seed $seed failed (exit $rc): $(tail -3 "$out/offload-$cfg-$seed.err")"
	done
done
"$bin/llmgwctl" bench summarize --chart "$out/summary.svg" "$out"/offload-*.json >"$out/summary.txt"
"$bin/llmgwctl" bench summarize -o json "$out"/offload-*.json | jq '.summary' >"$out/summary.json"
echo "== offload (load average now $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$out/loadavg.txt" >&2
cat "$out/summary.txt"
