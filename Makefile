# toolsidecar — the two commands of the README are `make demo` and `make test`.
GO      ?= go
PKGS    ?= ./...
FUZZTIME ?= 10s

.PHONY: all build demo test test-go vet fmt-check fuzz cover coresim clean

all: build

build:
	$(GO) build -o bin/ ./cmd/...

## demo: embedded NATS, the Core simulator, demo workers, one scripted run.
demo:
	$(GO) run ./cmd/toolsidecar demo

## test: everything CI runs.
test: fmt-check vet test-go

test-go:
	$(GO) test -race -count=1 $(PKGS)

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
	rm -rf bin coverage.out
