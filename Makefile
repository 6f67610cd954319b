# quota — build, test and codegen entry points. `make test` is what CI runs.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
# A fresh root shell may not have Go on PATH.
export PATH := /usr/local/go/bin:$(HOME)/go/bin:$(PATH)

GO      ?= go
BIN_DIR := bin

.DEFAULT_GOAL := build
.PHONY: pg redis chromium etcdctl patroni podman image build proto proto-check vet test demo clean fuzz chaos sim readme docs-examples shoppers http-bench metrics-check

# A count of executions (Nx), not a duration: go1.26's fuzz coordinator can fail a run with
# "context deadline exceeded" when a duration ends mid-call (go.dev/issue/75804, fixed in 1.27).
FUZZTIME ?= 500000x
# Each fuzz target and its package; seed corpora are in the test files (f.Add) and, for any
# failure found, in the package's testdata/fuzz/ (commit those files).
FUZZ_TARGETS := FuzzCheckID:./transfer FuzzSplit:./transfer FuzzReserveRequest:./region/regionrpc FuzzParticipantRequests:./region/regionrpc \
	FuzzParseRegions:./cmd/quotad FuzzParsePairs:./cmd/quotactl \
	FuzzVerifyTicket:./admission FuzzParseKeyring:./admission FuzzParseEntry:./admission FuzzParseToken:./coordinator/coordhttp

## pg: install/start local PostgreSQL, create role quota/quota, max_connections>=300
pg:
	scripts/pg-setup.sh

## redis: install Debian's redis-server when missing (quotactl bench (g) and (h) start their own; the system service is left stopped)
redis:
	scripts/redis-setup.sh

## build: build ./cmd/... into bin/
build:
	@if [ -d cmd ] && [ -n "$$(find cmd -name '*.go' -print -quit)" ]; then \
		mkdir -p $(BIN_DIR); \
		echo "go build -o $(BIN_DIR)/ ./cmd/..."; \
		$(GO) build -o $(BIN_DIR)/ ./cmd/...; \
	else \
		echo "build: no cmd/ packages yet, nothing to build"; \
	fi

## proto: lint and regenerate proto/quota/v1/*.pb.go
proto:
	scripts/proto.sh

## proto-check: fail if the committed *.pb.go differ from freshly generated ones
proto-check:
	scripts/proto-check.sh

## vet: gofmt check (excluding *.pb.go) + go vet
vet:
	scripts/vet.sh

## podman: install Debian's podman, buildah and runc when missing (make image, the image step of make test; scripts/podman-setup.sh)
podman:
	scripts/podman-setup.sh

## image: build the OCI image quota:<git describe> (static quotad and quotactl on scratch, deploy/image/Containerfile) with podman and deploy/image/containers.conf
IMAGE_TAG ?= quota:$(shell git describe --always --dirty 2>/dev/null || echo unknown)
image:
	@ctx=$$(mktemp -d); trap 'rm -rf "$$ctx"' EXIT; \
	echo "CGO_ENABLED=0 go build -trimpath -ldflags=-s -w -o $$ctx/ ./cmd/quotad ./cmd/quotactl"; \
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o "$$ctx/" ./cmd/quotad ./cmd/quotactl; \
	cp deploy/image/Containerfile "$$ctx/"; \
	echo "podman build -t $(IMAGE_TAG)"; \
	CONTAINERS_CONF=$(CURDIR)/deploy/image/containers.conf timeout 300 podman build -q \
		--build-arg VERSION=$(IMAGE_TAG:quota:%=%) -t $(IMAGE_TAG) -f "$$ctx/Containerfile" "$$ctx"; \
	CONTAINERS_CONF=$(CURDIR)/deploy/image/containers.conf podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' $(IMAGE_TAG)

## patroni: install Debian's patroni when missing (deploy/local's databases on Patroni: cluster up --db-ha, the database failover tests; scripts/patroni-setup.sh)
patroni:
	scripts/patroni-setup.sh

## etcdctl: install Debian's etcd-client when missing (the etcd lock-down test's attacker, deploy/local's probes)
etcdctl:
	scripts/etcdctl-setup.sh

## chromium: install Debian's chromium when missing (the web console's browser test, scripts/chromium-setup.sh)
chromium:
	scripts/chromium-setup.sh

## test: race tests with QUOTA_VERIFY=1 against local PostgreSQL (with Patroni for deploy/local's region database failover, redis-server for the bench's peer and Debian's chromium for the console's browser test), then the simulation's 1,000 seeds, allocation pins, the flood measurements, the README's session, every doc's quotactl and curl examples, proto-check, vet, fuzz, metrics-check, the Kubernetes manifests' checks (deploy/kubernetes, a module of its own), the image (make image run as quotad dev under podman) and the systemd units (systemd-analyze verify and security)
test: pg redis chromium etcdctl patroni
	@declare -A res; fail=0; \
	step() { local name=$$1 t0=$$SECONDS; shift; echo "==> $$name"; \
		if "$$@"; then res[$$name]=ok; else res[$$name]=FAIL; fail=1; fi; \
		echo "==> $$name: $${res[$$name]} in $$(( SECONDS - t0 )) s"; }; \
	image_step() { scripts/podman-setup.sh && $(MAKE) --no-print-directory image IMAGE_TAG=$(IMAGE_TAG) && \
		QUOTA_IMAGE=$(IMAGE_TAG) $(GO) test -count=1 -timeout 5m -run '^TestImage$$' ./deploy/image/; }; \
	systemd_step() { command -v systemd-analyze >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null; } && \
		$(GO) test -count=1 -v -timeout 5m ./deploy/systemd/ | grep -v '^=== RUN'; }; \
	mkdir -p .cache; rm -f .cache/chaos-report.txt .cache/go-test.log .cache/flood.log; \
	scripts/promtool.sh --install >/dev/null || { echo "make test: installing promtool failed"; exit 1; }; \
	step go-test bash -o pipefail -c 'env QUOTA_VERIFY=1 QUOTA_CHAOS_REPORT=$(CURDIR)/.cache/chaos-report.txt \
		$(GO) test -race -count=1 -p 3 -timeout 30m ./... 2>&1 | tee .cache/go-test.log'; \
	if [ -f .cache/chaos-report.txt ]; then cat .cache/chaos-report.txt; fi; \
	step sim env GO=$(GO) scripts/run-tests.sh 2 -count=1 -run '^(TestSimulation|TestSimulationNational)$$' ./sim/; \
	step allocs env GO=$(GO) scripts/run-tests.sh 3 -count=1 -run '^(TestVerifyAllocs|TestDecodeReserveAllocs|TestSoldOutAnswerWithTicket)$$' \
		./admission/ ./region/regionhttp/ ./region/; \
	step flood bash -o pipefail -c "env QUOTA_FLOOD=1 GO=$(GO) scripts/run-tests.sh 2 -count=1 -run '^(TestStorefrontFloodIsBounded|TestStorefrontFloodLatency)\$$' ./cmd/internal/cluster/ 2>&1 | tee .cache/flood.log"; \
	step readme $(MAKE) --no-print-directory readme; \
	step docs-examples $(MAKE) --no-print-directory docs-examples; \
	step proto-check scripts/proto-check.sh; \
	step vet scripts/vet.sh; \
	step fuzz $(MAKE) --no-print-directory fuzz FUZZTIME=50000x; \
	step metrics-check scripts/promtool.sh; \
	step k8s-manifests bash -c 'cd deploy/kubernetes && $(GO) test -count=1 ./...'; \
	step image image_step; \
	step systemd systemd_step; \
	summary="go test: $${res[go-test]}, sim: $${res[sim]}, allocs: $${res[allocs]}, flood: $${res[flood]}, readme: $${res[readme]}, docs-examples: $${res[docs-examples]}, proto-check: $${res[proto-check]}, vet: $${res[vet]}, fuzz: $${res[fuzz]}, metrics-check: $${res[metrics-check]}, k8s-manifests: $${res[k8s-manifests]}, image: $${res[image]}, systemd: $${res[systemd]}"; \
	if [ $$fail -eq 0 ]; then echo "make test: PASS ($$summary)"; \
	else for log in .cache/go-test.log .cache/flood.log; do \
		[ -f $$log ] && grep -q -E '^(--- FAIL|panic:)' $$log || continue; \
		echo "make test: what failed in $$log (each failure's first lines; the whole output is above):"; \
		grep -E -A12 '^(--- FAIL|panic:)' $$log | cut -c1-300 | head -200; done; \
		echo "make test: FAIL ($$summary)"; exit 1; fi

## chaos: only the chaos suite (deploy/local TestChaos), e.g. `make chaos DURATION=30m SEED=42`
DURATION ?= 2m
SEED ?=
chaos: pg
	@d='$(DURATION)'; case $$d in \
		*h) m=$$(( $${d%h} * 60 ));; *m) m=$${d%m};; *s) m=$$(( $${d%s} / 60 ));; \
		*) echo "make chaos: DURATION=$$d: want a whole number of h, m or s"; exit 2;; esac; \
	echo "go test -run '^TestChaos$$' ./deploy/local/ (QUOTA_CHAOS_DURATION=$$d, timeout $$(( m + 15 ))m)"; \
	QUOTA_VERIFY=1 QUOTA_CHAOS_DURATION=$$d QUOTA_CHAOS_SEED='$(SEED)' \
		$(GO) test -race -count=1 -v -run '^TestChaos$$' -timeout "$$(( m + 15 ))m" ./deploy/local/

## db-failover: the whole database failover on Patroni (deploy/local TestLocalDatabaseFailover, QUOTA_DB_HA=1: every database on two PostgreSQL nodes, region us's primary killed twice and the ledger's once; about 3 minutes; make test runs one region's, TestLocalRegionDatabaseFailover)
.PHONY: db-failover
db-failover: pg etcdctl patroni
	QUOTA_DB_HA=1 $(GO) test -race -count=1 -v -run '^TestLocalDatabaseFailover$$' -timeout 15m ./deploy/local/

## sim: the deterministic simulation alone: `make sim SEEDS=100000 [FIRST=1] [SHAPE=national]`, or one seed: `make sim SEED=1234 [SHAPE=national]` (SHAPE=national: 12 regions, 3,000 pools)
SEEDS ?= 1000
FIRST ?= 1
SHAPE ?= default
sim:
	@case '$(SHAPE)' in default) per=500;; national) per=8;; *) echo "make sim: SHAPE=$(SHAPE): want default or national"; exit 2;; esac; \
	if [ -n '$(SEED)' ]; then set -- -seed '$(SEED)'; t=5; else set -- -seeds '$(SEEDS)' -first '$(FIRST)'; t=$$(( $(SEEDS) / per + 5 )); fi; \
	set -- -shape '$(SHAPE)' "$$@"; \
	echo "go test -run 'TestSimulation$$' ./sim/ $$* (timeout $${t}m)"; \
	$(GO) test -count=1 -v -run 'TestSimulation$$' -timeout "$${t}m" ./sim/ -args "$$@" | grep -v '^=== RUN'

## mutants: plant each known bug alone in a scratch copy of the tree and require `make sim` to catch it within 1,000 seeds (sim/mutants_test.go; docs/reliability.md, "Planted bugs")
.PHONY: mutants
mutants:
	$(GO) test -count=1 -v -run 'TestPlantedBugs$$' -timeout 30m ./sim/ -args -planted | grep -v '^=== RUN'

## http-bench: the storefront HTTP edge with wrk beside gRPC on one plaintext quotad dev (scripts/http-bench.sh; docs/http-benchmarks.md)
http-bench: pg build
	scripts/http-bench.sh

## metrics-check: promtool checks of deploy/prometheus (config, alert rules, their unit tests) and of the Grafana dashboard's queries (scripts/promtool.sh; installs Debian's prometheus package when promtool is missing)
metrics-check:
	scripts/promtool.sh

## readme: run the README's manual session as written against a fresh quotad dev (scripts/readme-session.sh)
readme: pg build
	scripts/readme-session.sh

## docs-examples: run every quotactl and curl example of README.md and docs/*.md against a fresh quotad dev per document (scripts/docs-examples.sh; a block marked `<!-- examples: skip: reason -->` is listed, not run)
docs-examples: pg build
	scripts/docs-examples.sh

## shoppers: the storefront acceptance at full size: 100,000 shoppers over three regions' HTTP waiting rooms for 10,000 units
shoppers: pg
	QUOTA_SHOPPERS=100000 QUOTA_SHOPPER_UNITS=10000 QUOTA_SHOPPERS_TIMING=1 $(GO) test -race -count=1 -v -run '^TestShoppersOverThreeRegions$$' -timeout 15m ./cmd/internal/cluster/

## demo: run the end-to-end demo (scripts/demo.sh)
demo: pg build
	@test -f scripts/demo.sh || { echo "demo: scripts/demo.sh does not exist yet"; exit 1; }
	bash scripts/demo.sh

## clean: remove build outputs, tool cache, test binaries and coverage files
clean:
	rm -rf $(BIN_DIR) .cache
	find . -type f -not -path './.git/*' \( -name '*.test' -o -name '*.coverprofile' -o -name '*.cov' \
		-o -name 'coverage.out' -o -name 'coverage.txt' -o -name 'coverage.html' -o -name 'cover.out' \) -print -delete

## fuzz: run every fuzz target for FUZZTIME executions (make test runs 50000 each)
fuzz:
	@for tp in $(FUZZ_TARGETS); do \
		t=$${tp%%:*}; p=$${tp#*:}; \
		echo "==> fuzz $$t ($$p, $(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $$p || exit 1; \
	done
