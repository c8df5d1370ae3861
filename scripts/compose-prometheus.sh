#!/usr/bin/env bash
# compose-prometheus.sh — a real Prometheus (Debian's package) against the
# compose cluster (`make compose-up` first; `make compose-prometheus` does
# both), with the shipped alert rules, checked end to end:
#   1. every target is up: 3 control servers, 2 agents, 2 routers (on their
#      operations ports, over mutual TLS with deploy/compose/pki's scraper
#      certificate), and every engine router1 lists for HTTP service
#      discovery (/sd/replicas, on the same port and terms);
#   2. every rule of deploy/prometheus/llmgw-alerts.yml is loaded and healthy;
#   3. stopping agent2 fires LlmgwAgentDisconnected for it (the rule's own
#      `for: 1m`, so this takes a minute or two), and agent2 is started again.
# Prometheus listens on 127.0.0.1:19090 (PROM_ADDR) and keeps its data in
# OUT_DIR (default compose-prometheus-out); it is stopped on exit, Ctrl-C
# included. Needs curl and jq.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-compose-prometheus-out}
addr=${PROM_ADDR:-127.0.0.1:19090}
if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
compose+=(-f deploy/compose/docker-compose.yml -p llmgw)
for tool in prometheus promtool curl jq docker; do
	command -v "$tool" >/dev/null || { echo "compose-prometheus.sh: $tool: not found" >&2; exit 2; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
api="http://$addr/api/v1"

pid=
stop() {
	[[ -n $pid ]] && { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
	# Leave the cluster as it was found: agent2 running.
	"${compose[@]}" start agent2 >/dev/null 2>&1 || true
}
trap stop EXIT

# waitFor SECONDS WHAT CMD...: until CMD succeeds, or fail saying WHAT did not happen.
waitFor() {
	local secs=$1 what=$2
	shift 2
	local deadline=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS >= deadline)); then
			echo "compose-prometheus.sh: after ${secs}s: $what" >&2
			return 1
		fi
		[[ -z $pid ]] || kill -0 "$pid" 2>/dev/null || { echo "compose-prometheus.sh: prometheus exited; see $out/prometheus.log" >&2; return 1; }
		sleep 1
	done
}

"${compose[@]}" ps --services --filter status=running 2>/dev/null | grep -qx router1 ||
	{ echo "compose-prometheus.sh: the compose cluster is not running (make compose-up)" >&2; exit 1; }
# The scraper certificate the router jobs present (the certs container
# makes it; the whole check below reads it).
waitFor 30 "no scraper certificate in deploy/compose/pki/scraper (the certs container makes it)" \
	test -s deploy/compose/pki/scraper/prometheus-key.pem
promtool check config deploy/prometheus/compose.yml >/dev/null

prometheus --config.file=deploy/prometheus/compose.yml --web.listen-address="$addr" \
	--storage.tsdb.path="$out/data" >"$out/prometheus.log" 2>&1 &
pid=$!
waitFor 60 "prometheus did not become ready on $addr" curl -sf "http://$addr/-/ready"

# 1. Targets: the demo model's replicas are the engines router1 lists.
engines=$(sed -n 's/^replicas: *\([0-9]*\).*/\1/p' deploy/compose/demo.yaml)
targetsUp() {
	curl -sf "$api/targets?state=active" | jq -e --argjson engines "$engines" '
		.data.activeTargets as $t
		| ([$t[] | select(.health == "up") | .labels.job] | group_by(.) | map({(.[0]): length}) | add) as $up
		| $up["llmgw-control"] == 3 and $up["llmgw-agent"] == 2 and $up["llmgw-router"] == 2
		  and $up["llmgw-engine"] == $engines and ($t | all(.health == "up"))'
}
waitFor 120 "not every target is up: want 3 control, 2 agent, 2 router and $engines engine targets up; see $api/targets" targetsUp
echo "targets up:"
curl -sf "$api/targets?state=active" | jq -r '.data.activeTargets[] | "  \(.labels.job)\t\(.scrapeUrl)\t\(.health)\t\(.labels.llmgw_replica // "")"' | sort

# 2. Rules: as many loaded as the file holds, every one healthy.
want=$(grep -c '^ *- alert:' deploy/prometheus/llmgw-alerts.yml)
rulesLoaded() {
	curl -sf "$api/rules" | jq -e --argjson want "$want" '[.data.groups[].rules[]] | length == $want and all(.health == "ok")'
}
waitFor 60 "want $want alert rules loaded and healthy; see $api/rules" rulesLoaded
echo "rules loaded: $want, all healthy"

# 3. An alert: stop agent2 and wait for LlmgwAgentDisconnected to fire for it.
"${compose[@]}" stop agent2 >/dev/null
stopped=$SECONDS
firing() {
	curl -sf "$api/alerts" | jq -e '.data.alerts | any(.labels.alertname == "LlmgwAgentDisconnected" and .labels.instance == "127.0.0.1:7414" and .state == "firing")'
}
waitFor 240 "LlmgwAgentDisconnected did not fire for agent2 (127.0.0.1:7414) after it was stopped; see $api/alerts" firing
echo "alert fired: LlmgwAgentDisconnected for agent2, $((SECONDS - stopped)) s after it was stopped"
"${compose[@]}" start agent2 >/dev/null
waitFor 120 "agent2's target did not come back up after it was started" targetsUp
echo "agent2 back: every target up again"
