// Command coresim serves the Core simulator over HTTP for demos, benchmarks
// and worker authors.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/projectdavid/toolsidecar/sim/coresim"
)

func main() { os.Exit(run()) }

func run() int {
	listen := flag.String("listen", "127.0.0.1:9000", "address to serve on")
	scenario := flag.String("scenario", "", "scenario file (YAML or JSON); default: the flights demo")
	apiKeyFile := flag.String("api-key-file", "", "file holding the X-API-Key to require (default: none)")
	splitWrites := flag.Bool("split-writes", false, "write each answer's head and body in two writes, as uvicorn does")
	maxLatency := flag.Duration("max-latency", 0, "delay each request by a random time below this")
	keepAlive := flag.Duration("keep-alive", 0, "close a kept connection idle this long (uvicorn: 5s; default: net/http's)")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	sc := coresim.DefaultScenario()
	if *scenario != "" {
		var err error
		if sc, err = coresim.LoadScenario(*scenario); err != nil {
			log.Error("loading scenario", "err", err)
			return 2
		}
	}
	cfg := coresim.Config{Scenario: sc, SplitWrites: *splitWrites, MaxLatency: *maxLatency}
	if *apiKeyFile != "" {
		key, err := os.ReadFile(*apiKeyFile)
		if err != nil {
			log.Error("reading api key", "err", err)
			return 2
		}
		cfg.APIKey = string(trimSpace(key))
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("listen", "err", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Handler: coresim.New(cfg), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: *keepAlive}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fmt.Printf("coresim listening on http://%s (scenario %q)\n", ln.Addr(), sc.Name)
	select {
	case err := <-errc:
		log.Error("serve", "err", err)
		return 1
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("shutdown", "err", err)
		return 1
	}
	<-errc
	return 0
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}
