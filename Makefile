# llmgw — build, run, test. `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
BIN := bin
# golangci-lint at the version pinned in scripts/tools/go.mod (a module of its
# own, so its dependencies stay out of ours); `go tool` builds it once and
# keeps it in the build cache.
GOLANGCI_LINT := $(GO) tool -modfile=scripts/tools/go.mod golangci-lint

.PHONY: help build run test check proto fmt tidy lint vet importcheck protocheck clean rules bench

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

build: ## build llmgw and llmgwctl (static) into bin/
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/llmgw ./cmd/llmgw
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/llmgwctl ./cmd/llmgwctl

run: build ## start `llmgw dev`: the OpenAI API on :8080 over simulated replicas
	$(BIN)/llmgw dev

# -timeout is a guard against a hung test binary, not a budget: integration
# takes ~8 min on a quiet 2-core machine and ~12 min beside `stress --cpu 2`,
# so 25m leaves room on a shared CI machine while still ending a hang.
test: check rules ## the checks, the alert rules' tests, then every test with -race (what CI runs)
	$(GO) test -race -count=1 -timeout 25m ./...

# The cheap checks first, so a failure shows in seconds; lint runs every
# `go vet` analyzer (see .golangci.yml), so `vet` is not repeated here.
check: fmt tidy importcheck protocheck lint ## gofmt, go.mod/go.sum tidy, the import rules of design §3, generated code up to date, golangci-lint

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

tidy: ## fail when `go mod tidy` would change go.mod/go.sum (ours or scripts/tools'); prints the diff
	$(GO) mod tidy -diff
	$(GO) -C scripts/tools mod tidy -diff

# --allow-parallel-runners: on a shared machine another checkout's lint may
# hold golangci-lint's lock; running beside it beats failing the build.
lint: ## golangci-lint (pinned in scripts/tools/go.mod) with .golangci.yml
	$(GOLANGCI_LINT) run --allow-parallel-runners ./...

vet:
	$(GO) vet ./...

importcheck: ## the import rules of design §3 (table in scripts/importcheck/rules.go)
	$(GO) run ./scripts/importcheck

proto: ## regenerate proto/llmgw/v1 with Debian's protoc and the pinned plugins
	./scripts/proto.sh

protocheck: ## fail when regenerating would change proto/ (git diff against a snapshot; the tree is left as found)
	./scripts/proto.sh --check

clean:
	rm -rf $(BIN)

# The Prometheus configurations are checked for syntax only: the scraper
# certificates they name exist on a Prometheus host and after make compose-up
# (scripts/compose-prometheus.sh checks compose.yml whole, with them).
rules: ## promtool check rules and the alert rules' unit tests (deploy/prometheus; Debian's prometheus package)
	promtool check rules deploy/prometheus/llmgw-alerts.yml
	promtool check config --syntax-only deploy/prometheus/prometheus.yml
	promtool check config --syntax-only deploy/prometheus/compose.yml
	cd deploy/prometheus && promtool test rules llmgw-alerts_test.yml

# --- HA cluster (issue: Control-plane cluster) ---
# The compose tool: `docker compose` when the plugin is there, else docker-compose v1.
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
COMPOSE_FILE := deploy/compose/docker-compose.yml
IMAGE ?= llmgw:dev

.PHONY: image compose-up compose-down compose-prometheus bench-failover bench-fleet

image: build ## the FROM scratch image llmgw:dev, from the static binaries in bin/
	docker build -f deploy/docker/Dockerfile -t $(IMAGE) $(BIN)

compose-up: image ## 3 control nodes, 2 sim agents, 2 routers (router1 on 127.0.0.1:8080, router2 on :8081), TLS everywhere
	$(COMPOSE) -f $(COMPOSE_FILE) -p llmgw up -d
	@echo
	@echo "Every connection is mutual TLS; the certificates and gossip key are in deploy/compose/pki."
	@echo "Operate the cluster as its admin:"
	@echo "  export LLMGW_ADDR=127.0.0.1:7400 LLMGW_TLS_CA=$(CURDIR)/deploy/compose/pki/ca/ca.pem \\"
	@echo "    LLMGW_TLS_CERT=$(CURDIR)/deploy/compose/pki/admin/admin.pem LLMGW_TLS_KEY=$(CURDIR)/deploy/compose/pki/admin/admin-key.pem"
	@echo "Routers require an API key. Make one (the secret is printed once):"
	@echo "  $(BIN)/llmgwctl apikey create me"
	@echo "  curl -H 'Authorization: Bearer SECRET' http://127.0.0.1:8080/v1/models"

compose-down: ## stop the compose cluster and remove its containers and state (deploy/compose/pki is kept: rm -r it for new certificates)
	$(COMPOSE) -f $(COMPOSE_FILE) -p llmgw down -v --remove-orphans

compose-prometheus: compose-up ## Debian's Prometheus against the compose cluster with the shipped rules: every target up, every rule loaded, an alert fired by stopping an agent (~3 min)
	scripts/compose-prometheus.sh

bench-failover: ## kill -9 the leader of a 3-node cluster 100 times; time to a new leader and to the first write
	$(GO) run ./scripts/failoverbench $(BENCH_FLAGS)

bench-fleet: ## fleet-scale curves: 3 real servers, K routers, fake agents on the AgentService at rising KV event rates (docs/benchmarks.md "Fleet scale"; ~15 min)
	$(GO) run ./scripts/fleetsim $(BENCH_FLAGS)

.PHONY: soak
soak: ## the long failover variants (20 leader kills under load; reattach median and max) — LLMGW_SOAK=1
	LLMGW_SOAK=1 $(GO) test -count=1 -v -timeout 30m -run 'TestFailover' ./integration/

bench: build ## the scheduler figures of docs/benchmarks.md (~6 min; loopback ports 18380-18381, 17600-17605, 23000-23999; needs curl, jq)
	./scripts/bench-scheduler.sh $(BIN) bench-out
	$(GO) test -run XXX -bench BenchmarkPick -benchmem -count 3 ./router/scheduler

.PHONY: bench-security
bench-security: build ## the security figures of docs/benchmarks.md: TLS and API keys off vs on (~5 min; loopback ports 17800-17815, 18580-18581, 18590-18591, 25000-25199; needs curl, jq)
	./scripts/bench-security.sh $(BIN) bench-out/security
	$(GO) test -run XXX -bench 'BenchmarkCheck|BenchmarkHandlerAPIKey|BenchmarkServeStream' -benchmem -count 5 ./router/auth ./router/api
	$(GO) test -run XXX -bench BenchmarkConnect -benchmem -count 5 ./internal/mtls

.PHONY: bench-tenants
bench-tenants: build ## issue 28's must-shows: 3 servers, an agent, 3 routers; accuracy, isolation, budget, shadow, usage, cost (~10 min; loopback, free ports and 41000-41099)
	$(GO) run ./scripts/tenantbench --llmgw $(BIN)/llmgw --llmgwctl $(BIN)/llmgwctl $(BENCH_FLAGS)
	$(GO) test -run XXX -bench 'BenchmarkAdmit' -benchmem -count 5 ./router/quota
	$(GO) test -run XXX -bench 'BenchmarkLease' -benchmem -count 3 ./controlplane/quota

.PHONY: bench-flow
bench-flow: build ## issue 29's must-shows: a server, an agent with 8 simulated L4 replicas, 2 flow routers and one without; capacity, noisy neighbour, inversions, fairness, cost (~20 min; loopback, free ports and 42200-42299; JSON in bench-out/flowbench.json)
	$(GO) run ./scripts/flowbench --llmgw $(BIN)/llmgw --llmgwctl $(BIN)/llmgwctl $(BENCH_FLAGS)

.PHONY: bench-kv-wave2
bench-kv-wave2: build ## issue 14's must-show tables: fits, disrupted, pressure; two routers, SEEDS=10 per configuration (CONFIGS, default all six: rr tier1 tier2 tier2-spec tier2-cost tier2-noaff; ~35 min; loopback ports 33480-33481, 33700-33705, 33100-33399; needs curl, jq)
	./scripts/bench-kv-wave2.sh $(BIN) bench-out/kv-wave2

.PHONY: bench-kv-offload
bench-kv-offload: build ## issue 32's offload must-show: a working set 4 × a replica's GPU cache within its CPU tier, 32 groups returning in short bursts after idling past the 30 s home window, 4 replicas, tier-aware vs GPU-only credit, SEEDS=10 each (~45 min; WORKLOAD=bursts or steady for the earlier shapes; loopback ports 20480-20497, 20700-20705, 20100-20399; needs curl, jq)
	./scripts/bench-kv-offload.sh $(BIN) bench-out/kv-offload

.PHONY: bench-tracing bench-replay
bench-tracing: build ## issue 33's tracing cost on a simulated fleet: two routers, off and 10 % to an OTLP receiver, shared-prefix in a closed loop, ROUNDS=6 alternating (~15 min; loopback ports 22010-22103; needs curl, jq)
	./scripts/bench-tracing.sh $(BIN) bench-out/tracing

bench-replay: build ## issue 33's capture and replay: a live shared-prefix run captured, then replayed through a fresh fleet (DURATION=60m: ~2 h 10 min; loopback ports 21010-21099; needs curl, jq)
	./scripts/replay-bench.sh $(BIN) bench-out/replay

# --- Rolling upgrade (issue: Operations) ---
.PHONY: build-upgrade-old upgrade-test
UPGRADE_OLD_VERSION ?= v0.1.0

build-upgrade-old: ## the "old" llmgw of the upgrade test: this tree without the gated commands (-tags llmgw_upgrade_old), version $(UPGRADE_OLD_VERSION)
	CGO_ENABLED=0 $(GO) build -trimpath -tags llmgw_upgrade_old -ldflags '-s -w -X main.version=$(UPGRADE_OLD_VERSION)' -o $(BIN)/llmgw-old ./cmd/llmgw

upgrade-test: ## the rolling-upgrade test (old build → new, 3 servers, under load); LLMGW_SOAK=1 for 5 rounds
	$(GO) test -count=1 -v -timeout 20m -run 'TestRollingUpgrade' ./integration/
