// Command toolsidecar executes LLM tool calls for Project David
// applications: see the README and "toolsidecar help". The sidecar itself is assembled by package sidecar; this
// command parses flags, loads the configuration and handles signals.
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
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/projectdavid/toolsidecar/cmd/toolsidecar/internal/demo"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/internal/logging"
	"github.com/projectdavid/toolsidecar/internal/memlimit"
	"github.com/projectdavid/toolsidecar/internal/version"
	"github.com/projectdavid/toolsidecar/plugins"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/sidecar"
)

func main() {
	demo.MaybeServeMCP() // `toolsidecar demo` starts its MCP server as this binary again
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// setFlags collects repeated --set key=value overrides.
type setFlags []string

func (s *setFlags) String() string     { return strings.Join(*s, ",") }
func (s *setFlags) Set(v string) error { *s = append(*s, v); return nil }

// command is a subcommand: its one-line summary and which flags it takes.
type command struct {
	name, summary string
	config        bool // --config and --set
	logging       bool // --log-level and --log-format
}

// The standard library's flag package serves: one FlagSet per subcommand
// gives each its own flags and help, and the binary keeps no dependency
// for a handful of flags.
var commands = []command{
	{"run", "run the sidecar daemon", true, true},
	{"worker", "serve the exec and http tools over NATS, as a worker process", true, true},
	{"check", "validate a configuration file and print its tools", true, false},
	{"tools", "print the tools as Core's assistant tools array (for POST /v1/assistants)", true, false},
	{"config", "print the effective configuration: each key, its value and its source (default, file, env, flag)", true, false},
	{"demo", "run the whole loop on the embedded default: Core simulator, NATS, workers", false, false},
	{"version", "print the version, VCS revision and Go version", false, false},
	{"help", "show help for a command: toolsidecar help COMMAND", false, false},
}

func lookup(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// usage is the top-level help.
func usage(w io.Writer) {
	fmt.Fprintf(w, "toolsidecar executes the tool calls of Project David runs.\n\nUsage:\n  toolsidecar COMMAND [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nFlags:\n  -h, --help  show this help\n  --version   print the version\n\n"+
		"Run \"toolsidecar help COMMAND\" for a command's flags. See docs/configuration.md for the configuration.\n")
}

// invocation is a parsed command line.
type invocation struct {
	cmd     string
	cfgPath string
	sets    []string
	log     *slog.Logger
	refs    bool // check: open the files and find the programs named
	source  bool // tools: say where each tool is defined
}

// envOr is the environment variable's value, or def.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// flagSet builds a command's flags into inv.
func flagSet(c command, inv *invocation, stderr io.Writer) (*flag.FlagSet, func() error) {
	fs := flag.NewFlagSet("toolsidecar "+c.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: toolsidecar %s [flags]\n\n%s.\n", c.name, c.summary)
		if c.config || c.logging {
			fmt.Fprintf(stderr, "\nFlags:\n")
			fs.PrintDefaults()
		}
	}
	var sets setFlags
	if c.config {
		fs.StringVar(&inv.cfgPath, "config", "", "configuration file (YAML)")
		fs.Var(&sets, "set", "override a key: --set core.url=http://core:9000 (repeatable)")
	}
	if c.name == "tools" {
		fs.BoolVar(&inv.source, "source", false, "also say where each tool is defined (source, declared_by), as GET /v1/tools?source=1 does")
	}
	if c.name == "check" {
		fs.BoolVar(&inv.refs, "references", true, "also open the files and find the programs the configuration names (false where they exist only where it runs, as in a pod)")
	}
	level, format := new(string), new(string)
	if c.logging {
		fs.StringVar(level, "log-level", envOr("TOOLSIDECAR_LOG_LEVEL", "info"), "debug, info, warn or error (env TOOLSIDECAR_LOG_LEVEL)")
		fs.StringVar(format, "log-format", envOr("TOOLSIDECAR_LOG_FORMAT", "json"), "json or text (env TOOLSIDECAR_LOG_FORMAT)")
	}
	return fs, func() error {
		inv.sets = sets
		inv.log = slog.New(slog.DiscardHandler)
		if !c.logging {
			return nil
		}
		var lvl slog.Level
		if err := lvl.UnmarshalText([]byte(*level)); err != nil {
			return fmt.Errorf("--log-level: %w", err)
		}
		log, err := logging.New(stderr, *format, lvl)
		if err != nil {
			return fmt.Errorf("--log-format: %w", err)
		}
		inv.log = log
		return nil
	}
}

// parse reads the subcommand and its flags. done means exit with code
// (help and version exit 0; a usage error exits 2).
func parse(args []string, stdout, stderr io.Writer) (inv invocation, code int, done bool) {
	if len(args) == 0 {
		usage(stdout)
		return inv, 0, true
	}
	switch args[0] {
	case "-h", "-help", "--help":
		usage(stdout)
		return inv, 0, true
	case "-version", "--version", "version":
		fmt.Fprintln(stdout, version.Get())
		return inv, 0, true
	case "help":
		if len(args) == 1 {
			usage(stdout)
			return inv, 0, true
		}
		c, ok := lookup(args[1])
		if !ok {
			fmt.Fprintf(stderr, "toolsidecar: unknown command %q; run \"toolsidecar help\" for the list\n", args[1])
			return inv, 2, true
		}
		fs, _ := flagSet(c, &inv, stdout)
		fs.SetOutput(stdout)
		fs.Usage()
		return inv, 0, true
	}
	c, ok := lookup(args[0])
	if !ok {
		fmt.Fprintf(stderr, "toolsidecar: unknown command %q; run \"toolsidecar help\" for the list\n", args[0])
		return inv, 2, true
	}
	inv.cmd = c.name
	fs, finish := flagSet(c, &inv, stderr)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return inv, 0, true
		}
		return inv, 2, true
	}
	if fs.NArg() > 0 {
		hint := ""
		if c.config && (strings.HasSuffix(fs.Arg(0), ".yaml") || strings.HasSuffix(fs.Arg(0), ".yml")) {
			hint = fmt.Sprintf(" (did you mean --config %s?)", fs.Arg(0))
		}
		fmt.Fprintf(stderr, "toolsidecar %s: unexpected argument %q%s\n", c.name, fs.Arg(0), hint)
		return inv, 2, true
	}
	if err := finish(); err != nil {
		fmt.Fprintf(stderr, "toolsidecar %s: %v\n", c.name, err)
		return inv, 2, true
	}
	return inv, 0, false
}

func run(args []string, stdout, stderr io.Writer) int {
	inv, code, done := parse(args, stdout, stderr)
	if done {
		return code
	}
	if inv.cmd == "demo" {
		return runDemo(stdout, stderr)
	}
	if inv.cmd == "check" && inv.cfgPath == "" {
		fmt.Fprintln(stderr, "toolsidecar check: --config FILE is required: there is nothing to check without one")
		return 2
	}
	if inv.cmd == "config" {
		return printConfig(inv, stdout, stderr)
	}
	cfg, err := config.Load(inv.cfgPath, inv.sets)
	if err != nil {
		fmt.Fprintf(stderr, "toolsidecar %s: %v\n", inv.cmd, err)
		return 1
	}
	if inv.cmd == "run" || inv.cmd == "worker" {
		if limit, container, ok := memlimit.Set("/"); ok {
			inv.log.Info("memory limit set below the container's", "limit_mib", limit>>20, "container_mib", container>>20)
		}
	}
	switch inv.cmd {
	case "check", "tools":
		return printRegistry(inv, cfg, stdout, stderr)
	case "worker":
		return exitCode(inv.log, "toolsidecar worker", serveWorkers(cfg, inv.log))
	}
	if inv.cfgPath == "" {
		inv.log.Warn("no --config given: running on the defaults, with no tools")
	}
	return exitCode(inv.log, "toolsidecar", daemon(cfg, inv))
}

// exitCode logs a daemon's end: a failure to start and a failure while
// running read differently.
func exitCode(log *slog.Logger, what string, err error) int {
	var start *sidecar.StartError
	switch {
	case errors.As(err, &start):
		log.Error(what+" failed to start", "err", start.Err)
		return 1
	case err != nil:
		log.Error(what+" stopped on an error", "err", err)
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
	// SIGTERM stops a start that waits (for NATS, say) too.
	startCtx, stopStart := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	s, err := sidecar.Start(startCtx, cfg, opts...)
	stopStart()
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
				_ = s.Reload(context.Background())
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
func printRegistry(inv invocation, cfg config.Config, stdout, stderr io.Writer) int {
	kinds := plugins.Kinds(registry.Base(nil), plugins.Options{})
	defer kinds.Close() // the MCP servers an import started
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg, err := registry.New(ctx, cfg, kinds)
	if err == nil && (inv.cmd == "tools" || inv.refs) {
		reg, err = withDeclared(ctx, inv.cmd, cfg, reg, stderr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "toolsidecar: %v\n", err)
		return 1
	}
	if inv.cmd == "tools" {
		return printTools(stdout, reg, inv.source)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tSOURCE\tROUTE\tSUBJECT\tTIMEOUT\tRETRIES\tSIDE EFFECTS")
	for _, t := range reg.Tools() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", t.Name, t.Source, t.Route, t.Subject, t.Timeout, t.Retries, t.SideEffects)
	}
	tw.Flush()
	if problems := checkReferences(ctx, cfg, reg); inv.refs && len(problems) > 0 {
		fmt.Fprintf(stderr, "toolsidecar check: %d of the files and commands the configuration names are not usable:\n", len(problems))
		for _, p := range problems {
			fmt.Fprintf(stderr, "  %s\n", p)
		}
		return 1
	}
	fmt.Fprintf(stdout, "configuration valid: %d tools\n", len(reg.Names()))
	return 0
}

// withDeclared adds, as a start does, the tools that the workers on an
// external bus declare: a declaration the file contradicts is an error. A
// bus that cannot be reached (check run away from where the daemon runs)
// is only noted, as is the embedded server, which starts with the daemon.
func withDeclared(ctx context.Context, cmd string, cfg config.Config, reg *registry.Registry, stderr io.Writer) (*registry.Registry, error) {
	got, problems, read, err := sidecar.Redeclared(ctx, cfg, reg)
	var unreachable *sidecar.BusError
	switch {
	case errors.As(err, &unreachable):
		fmt.Fprintf(stderr, "toolsidecar %s: the tools workers declare in their code are not read: %v\n", cmd, err)
		return reg, nil
	case err != nil:
		return nil, err
	case !read && cmd == "check":
		fmt.Fprintln(stderr, "toolsidecar check: the tools workers declare in their code are not read: the embedded NATS server starts with the daemon "+
			"(GET /v1/tools?source=1 lists them), or nats.discover_interval is 0")
	}
	for _, p := range problems {
		fmt.Fprintf(stderr, "toolsidecar %s: a worker's declaration is left out: %s\n", cmd, p)
	}
	return got, nil
}

// checkReferences opens every file the configuration names, and asks each
// tool's route kind whether the tool can run here (exec: its program is
// found), as the daemon will when it needs them.
func checkReferences(ctx context.Context, cfg config.Config, reg *registry.Registry) []string {
	var problems []string
	for _, f := range cfg.Files() {
		fh, err := os.Open(f.Path)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", f.Key, err))
			continue
		}
		fh.Close()
	}
	for _, err := range reg.Check(ctx) {
		problems = append(problems, err.Error())
	}
	return problems
}

// printConfig prints every key with its effective value and its source.
func printConfig(inv invocation, stdout, stderr io.Writer) int {
	settings, err := config.Explain(inv.cfgPath, inv.sets)
	if err != nil {
		fmt.Fprintf(stderr, "toolsidecar config: %v\n", err)
		return 1
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tVALUE\tSOURCE")
	for _, st := range settings {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", st.Key, st.Value, st.Source)
	}
	tw.Flush()
	return 0
}
