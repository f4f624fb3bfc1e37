// Command toolsidecar executes LLM tool calls for Project David
// applications: see the README. Subcommands: run (default), demo, worker,
// check, tools. The sidecar itself is assembled by package sidecar; this
// command parses flags, loads the configuration and handles signals.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/internal/demo"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/sidecar"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// setFlags collects repeated --set key=value overrides.
type setFlags []string

func (s *setFlags) String() string     { return strings.Join(*s, ",") }
func (s *setFlags) Set(v string) error { *s = append(*s, v); return nil }

// invocation is a parsed command line.
type invocation struct {
	cmd     string
	cfgPath string
	sets    []string
	log     *slog.Logger
}

// parse reads the subcommand and its flags; a non-zero code means exit.
func parse(args []string, stderr io.Writer) (invocation, int) {
	inv := invocation{cmd: "run"}
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		inv.cmd, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("toolsidecar "+inv.cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "configuration file (YAML)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	var sets setFlags
	fs.Var(&sets, "set", "override a key: --set core.url=http://core:9000 (repeatable)")
	if err := fs.Parse(args); err != nil {
		return inv, 2
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "toolsidecar: --log-level: %v\n", err)
		return inv, 2
	}
	inv.cfgPath, inv.sets = *cfgPath, sets
	inv.log = slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	return inv, 0
}

func run(args []string, stdout, stderr io.Writer) int {
	inv, code := parse(args, stderr)
	if code != 0 {
		return code
	}
	switch inv.cmd {
	case "demo":
		return runDemo(stdout, stderr)
	case "run", "worker", "check", "tools":
	default:
		fmt.Fprintf(stderr, "toolsidecar: unknown command %q (run, demo, worker, check, tools)\n", inv.cmd)
		return 2
	}
	cfg, err := config.Load(inv.cfgPath, inv.sets)
	if err != nil {
		fmt.Fprintf(stderr, "toolsidecar: %v\n", err)
		return 1
	}
	switch inv.cmd {
	case "check", "tools":
		return printRegistry(inv.cmd, cfg, stdout, stderr)
	case "worker":
		return exitCode(inv.log, "toolsidecar worker stopped", serveWorkers(cfg, inv.log))
	}
	return exitCode(inv.log, "toolsidecar stopped", daemon(cfg, inv))
}

func exitCode(log *slog.Logger, what string, err error) int {
	if err != nil {
		log.Error(what, "err", err)
		return 1
	}
	return 0
}

func runDemo(stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo.Run(ctx, stdout); err != nil {
		fmt.Fprintf(stderr, "toolsidecar demo: %v\n", err)
		return 1
	}
	return 0
}

// daemon runs the sidecar until SIGTERM or SIGINT, then shuts it down
// within server.shutdown_timeout. SIGHUP reloads the tools; a second
// SIGTERM or SIGINT exits at once.
func daemon(cfg config.Config, inv invocation) error {
	opts := []sidecar.Option{sidecar.WithLogger(inv.log)}
	if inv.cfgPath != "" {
		opts = append(opts, sidecar.WithReload(inv.cfgPath, inv.sets))
	}
	s, err := sidecar.New(cfg, opts...)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { handleSignals(done, sigs, cancel, s, inv.log) })
	err = s.Run(ctx)
	close(done)
	wg.Wait()
	return err
}

// handleSignals turns the first SIGTERM or SIGINT into a graceful stop (the
// second exits at once) and SIGHUP into a reload, until done is closed.
func handleSignals(done <-chan struct{}, sigs <-chan os.Signal, stop context.CancelFunc, s *sidecar.Sidecar, log *slog.Logger) {
	stopping := false
	for {
		select {
		case <-done:
			return
		case sig := <-sigs:
			switch {
			case sig == syscall.SIGHUP:
				_ = s.Reload()
			case stopping:
				log.Error("second signal: exiting now", "signal", sig.String())
				os.Exit(1)
			default:
				log.Info("signal received", "signal", sig.String())
				stopping = true
				stop()
			}
		}
	}
}

// serveWorkers runs `toolsidecar worker` until SIGTERM or SIGINT.
func serveWorkers(cfg config.Config, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return sidecar.ServeWorkers(ctx, cfg, log)
}

// printRegistry compiles the tools and prints them: check as a table, tools
// as Core's assistant tools array.
func printRegistry(cmd string, cfg config.Config, stdout, stderr io.Writer) int {
	reg, err := registry.New(cfg.Tools, cfg.NATS.SubjectPrefix)
	if err != nil {
		fmt.Fprintf(stderr, "toolsidecar: %v\n", err)
		return 1
	}
	if cmd == "tools" {
		return printTools(stdout, reg)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tROUTE\tSUBJECT\tTIMEOUT\tRETRIES\tSIDE EFFECTS")
	for _, t := range reg.Tools() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", t.Name, t.Route, t.Subject, t.Timeout, t.Retries, t.SideEffects)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "configuration valid: %d tools\n", len(reg.Names()))
	return 0
}
