# toolsidecar — the two commands of the README are `make demo` and `make test`.
GO      ?= go
PKGS    ?= ./...
FUZZTIME ?= 10s

.PHONY: all build demo test test-go browser core-servers test-node test-python node-build openai-node vet staticcheck fmt-check fuzz fuzz-long cover coresim clean \
	chart-lint chart-test static-build image workflow-lint bench soak loadgen loadgen-check

all: build

build:
	$(GO) build -buildvcs=auto -o bin/ ./cmd/...

## demo: embedded NATS, the Core simulator, demo workers, one scripted run.
demo:
	$(GO) run ./cmd/toolsidecar demo

## test: everything CI runs.
test: fmt-check vet staticcheck workflow-lint loadgen-check static-build node-build openai-node test-python test-node chart-test browser core-servers test-go

## test-go: the Go tests, the live view's browser test included (it fails
## instead of skipping when Chromium is missing). The README's Go worker is
## built offline against a module cache of its own holding only what the
## checkout's build and tests fetch, as on a machine whose cache was empty.
test-go:
	TSC_TEST_REQUIRE_BROWSER=1 TSC_TEST_REQUIRE_NGINX=1 TSC_TEST_FRESH_MODCACHE=1 $(GO) test -race -count=1 $(PKGS)

## browser: Debian's Chromium, for the live view's browser test, installed
## with apt-get when missing (as root, or through sudo).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
		{ $(SUDO) apt-get update -q && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

## core-servers: Debian's nginx and uvicorn, for the Core server matrix
## (testkit/coreservers: Core's shipped nginx front, its server), installed
## with apt-get when missing, as browser installs Chromium.
core-servers:
	@{ command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; } && /usr/bin/python3 -c 'import uvicorn' 2>/dev/null || \
		{ $(SUDO) apt-get update -q && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx python3-uvicorn; }

## node-build: install the Node worker's locked dependencies and compile it
## (the Go end-to-end test runs its example worker).
node-build: plugins/node/node_modules/.package-lock.json
	cd plugins/node && npm run build

plugins/node/node_modules/.package-lock.json: plugins/node/package-lock.json plugins/node/package.json
	cd plugins/node && npm ci --no-audit --no-fund

## openai-node: install the official openai and @anthropic-ai/sdk Node
## clients, locked, which openaiup's tests run as applications of
## /v1/chat/completions and /v1/messages.
openai-node: openaiup/testdata/node/node_modules/.package-lock.json

openaiup/testdata/node/node_modules/.package-lock.json: openaiup/testdata/node/package-lock.json openaiup/testdata/node/package.json
	cd openaiup/testdata/node && npm ci --no-audit --no-fund

## test-node: the Node worker's tests against a real NATS server.
test-node: node-build
	cd plugins/node && npm test

## test-python: the Python worker's tests: its logic against an in-memory
## connection and its sdist always; the real-NATS ones need nats-py and skip
## themselves (saying so) where it cannot be imported.
test-python:
	scripts/with-nats.sh python3 -m unittest discover -v -s plugins/python/tests

vet:
	$(GO) vet $(PKGS)

## staticcheck: a project-local staticcheck from the Go module proxy.
STATICCHECK_VERSION ?= v0.8.2

bin/staticcheck:
	GOBIN=$(CURDIR)/bin $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

staticcheck: bin/staticcheck
	bin/staticcheck $(PKGS)

## workflow-lint: the GitHub Actions workflows, checked by a project-local
## actionlint from the Go module proxy.
ACTIONLINT_VERSION ?= v1.7.12
bin/actionlint:
	GOBIN=$(CURDIR)/bin $(GO) install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION)

workflow-lint: bin/actionlint
	bin/actionlint .github/workflows/*.yml

fmt-check:
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## Helm: a project-local helm from the Go module proxy (no download site is
## needed), always with an explicit Kubernetes version.
HELM_VERSION ?= v4.3.2
KUBE_VERSION ?= 1.31.0
CHART        := deploy/helm/toolsidecar

bin/helm:
	GOBIN=$(CURDIR)/bin $(GO) install helm.sh/helm/v4/cmd/helm@$(HELM_VERSION)

APP_CHART    := deploy/helm/examples/assistant-app

chart-lint: bin/helm
	bin/helm lint $(CHART) --strict --kube-version $(KUBE_VERSION)
	for f in deploy/helm/examples/*.yaml; do \
		bin/helm lint $(CHART) --strict --kube-version $(KUBE_VERSION) -f $$f || exit 1; \
		bin/helm template rel $(CHART) --kube-version $(KUBE_VERSION) -f $$f > /dev/null || exit 1; \
	done
	# The example application chart takes this chart as a file:// dependency:
	# packaged afresh on each run, offline.
	bin/helm dependency update $(APP_CHART) --skip-refresh > /dev/null
	bin/helm lint $(APP_CHART) --strict --kube-version $(KUBE_VERSION)

## chart-test: render every mode and decode it strictly into the Kubernetes
## API types, and build the image twice and read it back (a Go module of
## its own under deploy/).
chart-test: chart-lint bin/staticcheck
	cd deploy && $(GO) vet ./... && ../bin/staticcheck ./... && HELM=$(CURDIR)/bin/helm $(GO) test -count=1 ./...

## loadgen: the load generator (a module of its own under loadgen/, for its
## plotting library): sidecar, Core simulator and worker as processes,
## N concurrent runs per level; prints the figures and writes the plot.
LOADGEN_LEVELS ?= 1,10,100,1000
LOADGEN_FLAGS  ?=
loadgen:
	cd loadgen && $(GO) run . -levels $(LOADGEN_LEVELS) -plot ../docs/loadgen.svg $(LOADGEN_FLAGS)

## loadgen-check: the load generator compiles and is vetted (make test).
loadgen-check: bin/staticcheck
	cd loadgen && $(GO) vet ./... && ../bin/staticcheck ./...

## static-build: the static binary, built as make image builds it.
static-build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w" -o bin/toolsidecar-static ./cmd/toolsidecar

## image: the container image, built without a container engine
## (deploy/image, go-containerregistry): an OCI image layout of linux/amd64
## and linux/arm64 in bin/image, and the linux/amd64 image for
## `docker load` in bin/toolsidecar-image.tar. Two builds of one commit are
## byte-identical.
image:
	cd deploy && $(GO) run ./mkimage -out ../bin/image -docker-tar ../bin/toolsidecar-image.tar

## bench: the benchmarks of BENCHMARKS.md (not part of make test).
bench:
	$(GO) test ./executor -run '^$$' -bench BenchmarkBatch -benchtime 20x
	$(GO) test ./bridge -run '^$$' -bench 'RawRequest$$|Dispatch$$|DispatchDurable$$|DispatchDurableUnsafe$$' -benchtime 20000x -count 3
	for i in 1 2 3; do $(GO) test ./bridge -run '^$$' -bench 'Parallel$$' -benchtime 20000x || exit 1; done

## soak: the property test of the loop's invariant over SOAK_SEEDS random
## seeds of load and Core faults (make test runs 3), then the durable-mode
## fault suite of RELIABILITY.md, each fault SOAK times (make test runs
## each once), with a summary per fault.
SOAK ?= 20
SOAK_SEEDS ?= 100
SOAK_TESTS := TestSIGKILLMidBatch|TestOpenAISIGKILL|TestNATSOutageMidBatch|TestWorkerSIGKILL|TestClusterNodeLoss|TestLeaseHolderKilled
soak:
	PROPERTY_SEEDS=$(SOAK_SEEDS) $(GO) test -race -count=1 -timeout 60m -run 'TestInvariantUnderLoadAndFaults|TestOpenAIInvariantUnderFaults' ./executor ./openaiup
	MATRIX=all SOAK_REPS=$(SOAK) $(GO) test -count=1 -timeout 60m -v -run '$(SOAK_TESTS)' ./cmd/toolsidecar ./sidecar | tee soak.log | sh scripts/soak-summary.sh

## fuzz: run every fuzz target for FUZZTIME (CI runs only their seeds);
## fuzz-long runs each for at least 10^6 executions (RELIABILITY.md).
FUZZ_TARGETS := ./core:FuzzDecodeChunk ./core:FuzzStream ./tool:FuzzParseManifest \
	./wire:FuzzDecodeOutcome ./config:FuzzParse ./server:FuzzDriveBody ./server:FuzzAPI ./internal/frames:FuzzReader \
	./internal/dupkey:FuzzFind ./sidecar:FuzzHostileDeclarer

fuzz:
	@for t in $(FUZZ_TARGETS); do \
		$(GO) test $${t%%:*} -run '^$$' -fuzz "^$${t##*:}$$" -fuzztime $(FUZZTIME) || exit 1; \
	done

fuzz-long:
	$(MAKE) fuzz FUZZTIME=1000000x

cover:
	$(GO) test -coverprofile=coverage.out ./core/... ./sim/coresim/...
	$(GO) tool cover -func=coverage.out | tail -1

## coresim: serve the Core simulator on 127.0.0.1:9000.
coresim:
	$(GO) run ./cmd/coresim --listen 127.0.0.1:9000

clean:
	rm -rf bin coverage.out soak.log plugins/node/dist plugins/node/node_modules
