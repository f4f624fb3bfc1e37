// Command coresim serves the Core simulator over HTTP for benchmarks and
// the load generator; "toolsidecar sim core" serves the same one, and the
// two share package simserve.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/projectdavid/toolsidecar/sim/simserve"
)

func main() { os.Exit(run()) }

func run() int {
	o := simserve.Options{Kind: "core"}
	flag.StringVar(&o.Listen, "listen", simserve.DefaultListen("core"), "address to serve on")
	flag.StringVar(&o.Script, "scenario", "", "scenario file (YAML or JSON); default: the flights demo")
	apiKeyFile := flag.String("api-key-file", "", "file holding the X-API-Key to require (default: none)")
	flag.BoolVar(&o.SplitWrites, "split-writes", false, "write each answer's head and body in two writes, as uvicorn does")
	flag.DurationVar(&o.MaxLatency, "max-latency", 0, "delay each request by a random time below this")
	flag.DurationVar(&o.KeepAlive, "keep-alive", 0, "close a kept connection idle this long (uvicorn: 5s; default: net/http's)")
	flag.Parse()
	if *apiKeyFile != "" {
		key, err := os.ReadFile(*apiKeyFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "coresim:", err)
			return 2
		}
		o.APIKey = strings.TrimSpace(string(key))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := simserve.Serve(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "coresim:", err)
		return 1
	}
	return 0
}
