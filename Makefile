# toolsidecar — the two commands of the README are `make demo` and `make test`.
GO      ?= go
PKGS    ?= ./...
FUZZTIME ?= 10s

.PHONY: all build demo test test-go test-node test-python node-build vet fmt-check fuzz cover coresim clean

all: build

build:
	$(GO) build -o bin/ ./cmd/...

## demo: embedded NATS, the Core simulator, demo workers, one scripted run.
demo:
	$(GO) run ./cmd/toolsidecar demo

## test: everything CI runs.
test: fmt-check vet node-build test-python test-node test-go

test-go:
	$(GO) test -race -count=1 $(PKGS)

## node-build: install the Node worker's locked dependencies and compile it
## (the Go end-to-end test runs its example worker).
node-build: plugins/node/node_modules/.package-lock.json
	cd plugins/node && npm run build

plugins/node/node_modules/.package-lock.json: plugins/node/package-lock.json plugins/node/package.json
	cd plugins/node && npm ci --no-audit --no-fund

## test-node: the Node worker's tests against a real NATS server.
test-node: node-build
	cd plugins/node && npm test

## test-python: the Python worker's tests; they need nats-py, and skip
## themselves (saying so) where it cannot be imported.
test-python:
	scripts/with-nats.sh python3 -m unittest discover -v -s plugins/python/tests

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## fuzz: run the chunk decoder fuzzers for a while (CI runs only their seeds).
fuzz:
	$(GO) test ./core -run '^$$' -fuzz FuzzDecodeChunk -fuzztime $(FUZZTIME)
	$(GO) test ./core -run '^$$' -fuzz FuzzStream -fuzztime $(FUZZTIME)

cover:
	$(GO) test -coverprofile=coverage.out ./core/... ./coresim/...
	$(GO) tool cover -func=coverage.out | tail -1

## coresim: serve the Core simulator on 127.0.0.1:9000.
coresim:
	$(GO) run ./cmd/coresim --listen 127.0.0.1:9000

clean:
	rm -rf bin coverage.out plugins/node/dist plugins/node/node_modules
