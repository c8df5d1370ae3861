#!/usr/bin/env bash
# bench-security.sh — the security issue's "Must show" comparison of
# docs/benchmarks.md ("## Security"), end to end: router throughput and
# latency with TLS and API keys off and on, side by side in one run. It
# starts two equivalent single-node stacks — a control node (--bootstrap),
# an agent running simulated engines, a router, as separate processes —
#   A  plain: plain-text gRPC and Raft, no API keys, the API over HTTP;
#   B  secured: mutual TLS on every cluster link (certificates from
#      `llmgwctl tls init`), an API key (`llmgwctl apikey create`, so the
#      router requires `Authorization: Bearer`), and the API over HTTPS
#      (--https-cert: the router's own certificate, which the bench trusts
#      with --ca-cert);
# applies one model to both (2 sim replicas, the same engine parameters),
# then runs `llmgwctl bench` against A and B alternately, PAIRS pairs, each
# pair with its own seed and the same workload for both halves, every run
# from empty engine caches (POST /reset_prefix_cache). It prints one table:
# throughput, TTFT p50/p99, end-to-end p50/p99 and errors per run, and the
# mean of each stack. Each stack has a second router that differs only in
# HTTPS (A's serves HTTPS, B's plain HTTP), and every pair also runs those
# two, so a second table splits B's difference into HTTPS and the rest
# (the API key; mutual TLS is on the cluster links, off the request path).
#
# Usage: scripts/bench-security.sh [BIN_DIR [OUT_DIR]]
#   BIN_DIR  holds llmgw and llmgwctl (default bin, as `make build` leaves them)
#   OUT_DIR  gets every run's JSON, the certificates and the logs (default bench-out/security)
#   PAIRS=5      A/B pairs
#   REQUESTS=500 requests per run (multi-turn, concurrency 8)
# Ports (loopback): A 17800-17805, 18580-18581 (operations 18585-18586); B 17810-17815, 18590-18591 (18595-18596);
# engines 25000-25199. Needs curl and jq. Takes about 4.5 minutes on 2 cores.
# Everything it starts is stopped on exit, Ctrl-C included.
set -euo pipefail

bin=$(cd "${1:-bin}" && pwd)
out=${2:-bench-out/security}
pairs=${PAIRS:-5}
requests=${REQUESTS:-500}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in curl jq "$bin/llmgw" "$bin/llmgwctl"; do
	command -v "$tool" >/dev/null || { echo "bench-security.sh: $tool: not found" >&2; exit 2; }
done

pids=()
stop() {
	# Reverse start order: routers, agents (which stop their engines:
	# --stop-engines-on-exit), control nodes.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill -INT "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	pids=()
}
trap stop EXIT

rm -rf "$out/data" "$out/pki"
rm -f "$out"/*.json "$out/load.txt"
mkdir -p "$out/data"
pki=$out/pki
"$bin/llmgwctl" tls init --dir "$pki" --server c1 --agent n1 --router r1,r2 --admin ops >/dev/null
tlsFlags() { echo --tls-ca "$pki/ca/ca.pem" --tls-cert "$pki/$1/$2.pem" --tls-key "$pki/$1/$2-key.pem"; }

ctlA=("$bin/llmgwctl" --addr 127.0.0.1:17800)
ctlB=("$bin/llmgwctl" --addr 127.0.0.1:17810 $(tlsFlags admin ops))
urlA=http://127.0.0.1:18580
urlB=https://127.0.0.1:18590
urlAs=https://127.0.0.1:18581 # A with HTTPS: no mutual TLS, no key
urlBh=http://127.0.0.1:18591  # B over HTTP: mutual TLS and the key, no HTTPS

# stack NAME BASE ROUTER_PORT ENGINES TLS: control, agent and router of one
# stack, ports BASE..BASE+5; TLS=1 adds mutual TLS and HTTPS. No gossip: a
# single server has no one to gossip with, and gossip is on no request's path.
stack() {
	local name=$1 base=$2 rport=$3 engines=$4 secure=$5 c=() a=() r=()
	if [[ $secure == 1 ]]; then
		c=($(tlsFlags server c1)) a=($(tlsFlags agent n1))
		r=($(tlsFlags router r1) --https-cert "$pki/router/r1.pem" --https-key "$pki/router/r1-key.pem")
	fi
	"$bin/llmgw" control --node-id c1 --bootstrap --data-dir "$out/data/$name/control" "${c[@]}" \
		--grpc-addr "127.0.0.1:$base" --raft-addr "127.0.0.1:$((base + 1))" --gossip-addr "" --http-addr "127.0.0.1:$((base + 3))" \
		>"$out/$name-control.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 60); do curl -sf "http://127.0.0.1:$((base + 3))/readyz" >/dev/null && break; sleep 0.5; done
	"$bin/llmgw" agent --node-id n1 --control "127.0.0.1:$base" --advertise-addr 127.0.0.1 "${a[@]}" \
		--data-dir "$out/data/$name/agent" --http-addr "127.0.0.1:$((base + 4))" --grpc-addr "127.0.0.1:$((base + 5))" \
		--gpus 2 --port-range "$engines" --stop-engines-on-exit >"$out/$name-agent.log" 2>&1 &
	pids+=($!)
	"$bin/llmgw" router --id r1 --control "127.0.0.1:$base" --http-addr "127.0.0.1:$rport" --ops-addr "127.0.0.1:$((rport + 5))" "${r[@]}" \
		--data-dir "$out/data/$name/router" >"$out/$name-router.log" 2>&1 &
	pids+=($!)
	# The second router, r2, serves the other way round: HTTPS in the
	# plain stack, HTTP in the secured one (its cluster links still mutual
	# TLS, the key still required), so part 2 can tell the parts apart.
	if [[ $secure == 1 ]]; then
		r=($(tlsFlags router r2))
	else
		r=(--https-cert "$pki/router/r2.pem" --https-key "$pki/router/r2-key.pem")
	fi
	"$bin/llmgw" router --id r2 --control "127.0.0.1:$base" --http-addr "127.0.0.1:$((rport + 1))" --ops-addr "127.0.0.1:$((rport + 6))" "${r[@]}" \
		--data-dir "$out/data/$name/router2" >"$out/$name-router2.log" 2>&1 &
	pids+=($!)
}

# The engines: prefill 75 µs per uncached token, decode 5 ms per token
# (32 tokens: ~0.2 s a request), the same for both stacks.
cat >"$out/demo.yaml" <<EOF
name: demo
engine: sim
model: meta-llama/Llama-3.1-8B-Instruct
replicas: 2
gpus_per_replica: 1
extra_args: ["--sim-decode-ms-per-token", "5", "--sim-prefill-us-per-token", "75", "--max-model-len", "4096"]
EOF

stack a 17800 18580 25000-25099 0
stack b 17810 18590 25100-25199 1
"${ctlA[@]}" model apply -f "$out/demo.yaml" >/dev/null
"${ctlB[@]}" model apply -f "$out/demo.yaml" >/dev/null
key=$("${ctlB[@]}" -o json apikey create bench | jq -r .secret)

# waitReady CTL URL CURL_ARGS...: until both replicas of demo are ready and
# the router answers a chat request 200 (60 s at most).
waitReady() {
	local -n ctl=$1
	local url=$2
	shift 2
	for _ in $(seq 120); do
		for p in "${pids[@]}"; do
			kill -0 "$p" 2>/dev/null || { echo "bench-security.sh: a process exited; see $out/*.log" >&2; return 1; }
		done
		n=$("${ctl[@]}" replica list -o json 2>/dev/null |
			jq '[.[] | select(.model == "demo" and .state == "ready")] | length' 2>/dev/null || echo 0)
		if [[ $n -ge 2 ]]; then
			code=$(curl -s -o /dev/null -w '%{http_code}' "$@" "$url/v1/chat/completions" -H 'content-type: application/json' \
				-d '{"model":"demo","messages":[{"role":"user","content":"x"}],"max_tokens":1}') || code=0
			[[ $code == 200 ]] && return 0
		fi
		sleep 0.5
	done
	echo "bench-security.sh: stack not ready at $url; see $out/*.log" >&2
	return 1
}
waitReady ctlA "$urlA"
waitReady ctlB "$urlB" --cacert "$pki/ca/ca.pem" -H "Authorization: Bearer $key"
waitReady ctlA "$urlAs" --cacert "$pki/ca/ca.pem"
waitReady ctlB "$urlBh" -H "Authorization: Bearer $key"
# B is what it claims: it answers 401 without the key, and its control node
# refuses a client with no certificate.
code=$(curl -s -o /dev/null -w '%{http_code}' --cacert "$pki/ca/ca.pem" "$urlB/v1/models")
[[ $code == 401 ]] || { echo "bench-security.sh: B answered $code without a key, want 401" >&2; exit 1; }
if "$bin/llmgwctl" --addr 127.0.0.1:17810 --timeout 3s replica list >/dev/null 2>&1; then
	echo "bench-security.sh: B's control node answered a plain-text client" >&2
	exit 1
fi

# reset CTL: empty every engine's prefix cache (the engines are plain HTTP
# in both stacks: the agent's engines are not behind TLS).
reset() {
	local -n ctl=$1
	for a in $("${ctl[@]}" replica list -o json | jq -r '.[] | select(.model == "demo") | .address'); do
		curl -sf -XPOST "http://$a/reset_prefix_cache" -o /dev/null
	done
}
workload=(--model demo --workload multi-turn --sessions 16 --turns 6 --prompt-words 100 --max-tokens 32
	--concurrency 8 --requests "$requests" -q -o json)

# row NAME: one summary line from NAME.json.
row() {
	jq -r --arg n "$1" '[$n, (.throughput_rps * 10 | round / 10),
		(.ttft_seconds.p50 * 1e4 | round / 10), (.ttft_seconds.p99 * 1e4 | round / 10),
		(.e2e_seconds.p50 * 1e4 | round / 10), (.e2e_seconds.p99 * 1e4 | round / 10), .errors] | @tsv' "$out/$1.json"
}
# mean STACK: the mean of every column over that stack's runs.
mean() {
	jq -rs --arg n "mean $1" '[$n, (map(.throughput_rps) | add / length * 10 | round / 10),
		(map(.ttft_seconds.p50) | add / length * 1e4 | round / 10), (map(.ttft_seconds.p99) | add / length * 1e4 | round / 10),
		(map(.e2e_seconds.p50) | add / length * 1e4 | round / 10), (map(.e2e_seconds.p99) | add / length * 1e4 | round / 10),
		(map(.errors) | add / length)] | @tsv' "$out/$1"-*.json
}

# One pair: A then B, then the two halves of the difference, A over HTTPS
# and B over HTTP; each from empty caches, all four with the pair's seed.
printf 'run\treq_s\tttft_p50_ms\tttft_p99_ms\te2e_p50_ms\te2e_p99_ms\terrors\n' >"$out/summary.txt"
cp "$out/summary.txt" "$out/parts.txt"
# --reset-caches=false: the script empties both clusters' caches itself
# (reset), and the bench's own reset would need cluster B's admin certificate.
for i in $(seq "$pairs"); do
	seed=$((60 + i))
	reset ctlA
	"$bin/llmgwctl" bench --reset-caches=false --target "plain=$urlA" "${workload[@]}" --seed "$seed" >"$out/A-$i.json"
	row "A-$i" >>"$out/summary.txt"
	reset ctlB
	"$bin/llmgwctl" bench --reset-caches=false --target "secure=$urlB" --ca-cert "$pki/ca/ca.pem" --api-key "$key" "${workload[@]}" \
		--seed "$seed" >"$out/B-$i.json"
	row "B-$i" >>"$out/summary.txt"
	reset ctlA
	"$bin/llmgwctl" bench --reset-caches=false --target "https=$urlAs" --ca-cert "$pki/ca/ca.pem" "${workload[@]}" --seed "$seed" >"$out/Ahttps-$i.json"
	reset ctlB
	"$bin/llmgwctl" bench --reset-caches=false --target "mtls+key=$urlBh" --api-key "$key" "${workload[@]}" --seed "$seed" >"$out/Bhttp-$i.json"
	echo "pair $i: $(uptime)" >>"$out/load.txt"
done
mean A >>"$out/summary.txt"
mean B >>"$out/summary.txt"
{
	mean A
	mean Ahttps
	mean Bhttp
	mean B
} >>"$out/parts.txt"
echo "1. A (plain) vs B (mutual TLS, API key, HTTPS), alternating"
column -t -s $'\t' "$out/summary.txt"
echo
echo "2. the parts, means: A, A with HTTPS (r2), B over HTTP (r2: mutual TLS and key), B"
column -t -s $'\t' "$out/parts.txt"
