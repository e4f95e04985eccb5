# fleetsync developer entry points. `make` (or `make help`) lists them.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

export GOTOOLCHAIN := local

GO ?= go
# The real servers the end-to-end tests run against, and the helm and kubectl
# that test/deploy renders and applies the manifests with, built into the
# tool cache (outside the checkout) by test/tools/build.sh.
STACK_TOOLS := kube-apiserver etcd consul helm kubectl
TEST_TIMEOUT ?= 30m
# What to test and extra go test flags, e.g.
#   make test PKGS=./test/smoke GOTESTFLAGS='-run Versions -v'
PKGS ?= ./...
GOTESTFLAGS ?=

.PHONY: help build image image-push test test-unit tools lint docs demo bench soak soak-test clean

help: ## List the targets (this message).
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# What `make build` stamps into the binary (fleetsync --version prints both).
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)

build: ## Build bin/fleetsync, stamped with VERSION (git describe --always --dirty) and COMMIT.
	$(GO) build -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o bin/fleetsync ./cmd/fleetsync

# The image `make image` builds and tags: repository fleetsync, tagged with
# the Helm chart's appVersion, the image the chart and the kustomize base
# deploy by default (test/image checks that the three agree). make
# image-push IMAGE=registry/name:tag pushes it elsewhere.
CHART_APP_VERSION := $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' deploy/helm/fleetsync/Chart.yaml)
IMAGE ?= fleetsync:$(CHART_APP_VERSION)
# Every time in the image (created, the files' mtimes) is this one, for
# reproducible digests: the commit's time unless SOURCE_DATE_EPOCH is set.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
PLATFORMS ?= linux/amd64,linux/arm64

image: ## Build the OCI image IMAGE for PLATFORMS into out/image, no container engine needed (deploy/README.md).
	$(GO) run ./deploy/image build -name $(IMAGE) -version $(VERSION) -commit $(COMMIT) -created $(SOURCE_DATE_EPOCH) -platforms $(PLATFORMS) -out out/image

image-push: ## Build the image and push it to IMAGE=registry/name:tag (credentials of docker login).
	@if [ "$(origin IMAGE)" = file ]; then echo "make image-push: name the target, e.g. IMAGE=registry.example.com/fleetsync:$(CHART_APP_VERSION)" >&2; exit 2; fi
	$(MAKE) --no-print-directory image
	$(GO) run ./deploy/image push -layout out/image/oci $(IMAGE)

test: tools ## Run every test (unit and end-to-end against real kube-apiserver, etcd and Consul) with -race.
	bin="$$(bash test/tools/build.sh $(STACK_TOOLS) 2>/dev/null)"; \
		FLEETSYNC_TOOLS_BIN="$$bin" $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(GOTESTFLAGS) $(PKGS)

test-unit: ## Run the unit tests only (-short: end-to-end tests skip, no servers start).
	$(GO) test -race -short $(GOTESTFLAGS) $(PKGS)

tools: ## Build (or reuse from the cache) kube-apiserver, etcd, consul, helm and kubectl for the tests.
	bash test/tools/build.sh $(STACK_TOOLS)

lint: ## gofmt (must list nothing), go vet and staticcheck.
	@out="$$(gofmt -l .)"; \
		if [ -n "$$out" ]; then echo "gofmt -l: these files need gofmt -w:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	"$$(bash test/tools/build.sh staticcheck)/staticcheck" ./...

# Every test that writes its doc under UPDATE_DOCS (test/repo checks that
# none is missing here).
docs: ## Regenerate the docs generated from the code (docs/configuration.md, docs/metrics.md); tests fail when they are stale.
	UPDATE_DOCS=1 $(GO) test -count=1 -run '^TestConfigurationDoc$$' ./cmd/fleetsync
	UPDATE_DOCS=1 $(GO) test -count=1 -run '^TestMetricsDoc$$' ./supervisor

demo: ## Run the demo (test/demo) against a local stack.
	$(GO) run ./test/demo

# Flags of the benchmark, e.g. make bench BENCH='--services=2000' (go run ./test/bench --help lists them).
BENCH ?=
bench: tools ## Benchmark against the real servers (test/bench) and replace docs/performance.md with the figures; BENCH='--quick' for a smoke run.
	$(GO) run ./test/bench --performance-doc=docs/performance.md $(BENCH)

# Flags of the soak, e.g. make soak SOAK='--quick' or SOAK='--duration 30m --seed 42'.
SOAK ?=
soak: tools ## Fault-injecting soak (test/soak) on a real 3-server Consul with an invariant checker; SOAK='--quick' for 2 minutes.
	bin="$$(bash test/tools/build.sh $(STACK_TOOLS) 2>/dev/null)"; \
		FLEETSYNC_TOOLS_BIN="$$bin" $(GO) run ./test/soak $(SOAK)

soak-test: tools ## The soak's 100 s test run alone (TestSoakQuick, -race; make test runs it too).
	bin="$$(bash test/tools/build.sh $(STACK_TOOLS) 2>/dev/null)"; \
		FLEETSYNC_TOOLS_BIN="$$bin" $(GO) test -race -count=1 -run TestSoakQuick -v ./test/soak

clean: ## Remove build outputs (bin/) and the Go test cache; the tool cache stays.
	rm -rf bin
	$(GO) clean -testcache
