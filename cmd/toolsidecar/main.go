// Command toolsidecar executes LLM tool calls for Project David
// applications: see the README. Subcommands: run (default), demo, worker,
// check, tools.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/internal/demo"
	"github.com/projectdavid/toolsidecar/registry"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// setFlags collects repeated --set key=value overrides.
type setFlags []string

func (s *setFlags) String() string     { return strings.Join(*s, ",") }
func (s *setFlags) Set(v string) error { *s = append(*s, v); return nil }

func run(args []string, stdout, stderr io.Writer) int {
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("toolsidecar "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "configuration file (YAML)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	var sets setFlags
	fs.Var(&sets, "set", "override a key: --set core.url=http://core:9000 (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "toolsidecar: --log-level: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))

	switch cmd {
	case "demo":
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := demo.Run(ctx, stdout); err != nil {
			fmt.Fprintf(stderr, "toolsidecar demo: %v\n", err)
			return 1
		}
		return 0
	case "run", "worker", "check", "tools":
	default:
		fmt.Fprintf(stderr, "toolsidecar: unknown command %q (run, demo, worker, check, tools)\n", cmd)
		return 2
	}
	cfg, err := config.Load(*cfgPath, sets)
	if err != nil {
		fmt.Fprintf(stderr, "toolsidecar: %v\n", err)
		return 1
	}
	reg, err := registry.New(cfg.Tools, cfg.NATS.SubjectPrefix)
	if err != nil {
		fmt.Fprintf(stderr, "toolsidecar: %v\n", err)
		return 1
	}
	switch cmd {
	case "check":
		printTable(stdout, reg)
		return 0
	case "tools":
		return printTools(stdout, reg)
	case "worker":
		if err := worker(cfg, reg, log); err != nil {
			log.Error("toolsidecar worker stopped", "err", err)
			return 1
		}
		return 0
	}
	if err := daemon(cfg, *cfgPath, sets, reg, log); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("toolsidecar stopped", "err", err)
		return 1
	}
	return 0
}

func printTable(w io.Writer, reg *registry.Registry) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tROUTE\tSUBJECT\tTIMEOUT\tRETRIES\tSIDE EFFECTS")
	for _, t := range reg.Tools() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", t.Name, t.Route, t.Subject, t.Timeout, t.Retries, t.SideEffects)
	}
	tw.Flush()
	fmt.Fprintf(w, "configuration valid: %d tools\n", len(reg.Names()))
}
