// Command toolsidecar executes LLM tool calls for Project David
// applications: see the README and "toolsidecar help". The sidecar itself is assembled by package sidecar; this
// command parses flags, loads the configuration and handles signals.
package main

import (
	"context"
	"errors"
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

	"github.com/spf13/cobra"

	"github.com/projectdavid/toolsidecar/cmd/toolsidecar/internal/demo"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/internal/logging"
	"github.com/projectdavid/toolsidecar/internal/memlimit"
	"github.com/projectdavid/toolsidecar/internal/version"
	"github.com/projectdavid/toolsidecar/plugins"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/tool"
)

func main() {
	demo.MaybeServeMCP() // `toolsidecar demo` starts its MCP server as this binary again
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// invocation is a parsed command line.
type invocation struct {
	cmd     string
	cfgPath string
	sets    []string
	log     *slog.Logger
	refs    bool // check: open the files and find the programs named
	source  bool // tools: say where each tool is defined
	level   string
	format  string
}

// envOr is the environment variable's value, or def.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// exitError ends a command with its exit code; its message, if any, was
// printed already.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// usageError is a command line the command cannot take (exit 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// The command tree is cobra's: it gives each command its flags and help,
// and generates the shell completion scripts (bash, zsh, fish, PowerShell)
// from the tree, run ids included, as kubectl, helm and gh do. kong has
// no completion of its own.
func newRoot(inv *invocation, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "toolsidecar",
		Short: "toolsidecar executes the tool calls of Project David runs",
		Long: "toolsidecar executes the tool calls of Project David runs.\n\n" +
			"See docs/configuration.md for the configuration, and \"toolsidecar completion --help\" for shell completion.",
		Version:       version.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{fmt.Sprintf("%s: %v", c.CommandPath(), err)}
	})
	root.SetHelpCommand(helpCommand())
	for _, sc := range subcommands(inv, stdout, stderr) {
		root.AddCommand(sc.command(inv, stderr))
	}
	root.AddCommand(runsCommand(stdout, stderr), simCommand(stdout, stderr))
	return root
}

// helpCommand is "toolsidecar help COMMAND", which refuses a command that
// does not exist instead of printing the root's help.
func helpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND]",
		Short: "show help for a command: toolsidecar help COMMAND",
		Args:  cobra.MaximumNArgs(2),
		ValidArgsFunction: func(c *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			var names []cobra.Completion
			for _, sub := range c.Root().Commands() {
				if sub.IsAvailableCommand() {
					names = append(names, sub.Name())
				}
			}
			return names, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(c *cobra.Command, args []string) error {
			target, rest, err := c.Root().Find(args)
			if err != nil || len(rest) > 0 {
				return usageError{fmt.Sprintf("toolsidecar: unknown command %q; run \"toolsidecar help\" for the list", strings.Join(args, " "))}
			}
			return target.Help()
		},
	}
}

// subcommand is one of the commands that take no argument: whether it
// reads a configuration and logs, what it runs, and its own flags.
type subcommand struct {
	name, short     string
	config, logging bool
	run             func() int
	extra           func(*cobra.Command)
}

func subcommands(inv *invocation, stdout, stderr io.Writer) []subcommand {
	loaded := func() int { return runLoaded(*inv, stdout, stderr) }
	return []subcommand{
		{"run", "run the sidecar daemon", true, true, loaded, nil},
		{"worker", "serve the exec and http tools over NATS, as a worker process", true, true, loaded, nil},
		{"check", "validate a configuration file and print its tools", true, false, loaded, func(c *cobra.Command) {
			c.Flags().BoolVar(&inv.refs, "references", true, "also open the files and find the programs the configuration names (false where they exist only where it runs, as in a pod)")
		}},
		{"tools", "print the tools as Core's assistant tools array (for POST /v1/assistants)", true, false, loaded, func(c *cobra.Command) {
			c.Flags().BoolVar(&inv.source, "source", false, "also say where each tool is defined (source, declared_by), as GET /v1/tools?source=1 does")
		}},
		{"config", "print the effective configuration: each key, its value and its source (default, file, env, flag)", true, false, func() int { return printConfig(*inv, stdout, stderr) }, nil},
		{"demo", "run the whole loop on the embedded default: Core simulator, NATS, workers", false, false, func() int { return runDemo(stdout, stderr) }, nil},
		{"version", "print the version, VCS revision and Go version", false, false, func() int { fmt.Fprintln(stdout, version.Get()); return 0 }, nil},
	}
}

// command is the subcommand as cobra's, with the flags it takes.
func (sc subcommand) command(inv *invocation, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   sc.name,
		Short: sc.short,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			hint := ""
			if sc.config && (strings.HasSuffix(args[0], ".yaml") || strings.HasSuffix(args[0], ".yml")) {
				hint = fmt.Sprintf(" (did you mean --config %s?)", args[0])
			}
			return usageError{fmt.Sprintf("toolsidecar %s: unexpected argument %q%s", sc.name, args[0], hint)}
		},
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, _ []string) error {
			inv.cmd = sc.name
			if err := inv.finish(sc.logging, stderr); err != nil {
				return usageError{fmt.Sprintf("toolsidecar %s: %v", sc.name, err)}
			}
			if code := sc.run(); code != 0 {
				return exitError{code}
			}
			return nil
		},
	}
	if sc.config {
		cmd.Flags().StringVarP(&inv.cfgPath, "config", "c", "", "configuration file (YAML)")
		cmd.Flags().StringArrayVar(&inv.sets, "set", nil, "override a key: --set core.url=http://core:9000 (repeatable)")
		_ = cmd.MarkFlagFilename("config", "yaml", "yml")
	}
	if sc.logging {
		cmd.Flags().StringVar(&inv.level, "log-level", envOr("TOOLSIDECAR_LOG_LEVEL", "info"), "debug, info, warn or error (env TOOLSIDECAR_LOG_LEVEL)")
		cmd.Flags().StringVar(&inv.format, "log-format", envOr("TOOLSIDECAR_LOG_FORMAT", "json"), "json or text (env TOOLSIDECAR_LOG_FORMAT)")
		_ = cmd.RegisterFlagCompletionFunc("log-level", cobra.FixedCompletions([]cobra.Completion{"debug", "info", "warn", "error"}, cobra.ShellCompDirectiveNoFileComp))
		_ = cmd.RegisterFlagCompletionFunc("log-format", cobra.FixedCompletions([]cobra.Completion{"json", "text"}, cobra.ShellCompDirectiveNoFileComp))
	}
	if sc.extra != nil {
		sc.extra(cmd)
	}
	return cmd
}

// finish builds the logger the flags ask for.
func (inv *invocation) finish(logs bool, stderr io.Writer) error {
	inv.log = slog.New(slog.DiscardHandler)
	if !logs {
		return nil
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(inv.level)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log, err := logging.New(stderr, inv.format, lvl)
	if err != nil {
		return fmt.Errorf("--log-format: %w", err)
	}
	inv.log = log
	return nil
}

// run parses the command line and runs the command: exit 0, 1 when the
// command failed, 2 for a command line it cannot take.
func run(args []string, stdout, stderr io.Writer) int {
	var inv invocation
	root := newRoot(&inv, stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	var exit exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.code
	}
	var usage usageError
	if !errors.As(err, &usage) {
		// cobra's own: an unknown command, mostly.
		err = usageError{fmt.Sprintf("toolsidecar: %v; run \"toolsidecar help\" for the list", err)}
	}
	fmt.Fprintln(stderr, err)
	return 2
}

// runLoaded loads the configuration and runs the command that needs it.
func runLoaded(inv invocation, stdout, stderr io.Writer) int {
	if inv.cmd == "check" && inv.cfgPath == "" {
		fmt.Fprintln(stderr, "toolsidecar check: --config FILE is required: there is nothing to check without one")
		return 2
	}
	cfg, err := config.Load(inv.cfgPath, inv.sets)
	if err != nil {
		fmt.Fprintf(stderr, "toolsidecar %s: %v\n", inv.cmd, err)
		return 1
	}
	if inv.cmd == "run" || inv.cmd == "worker" {
		if limit, container, ok := memlimit.Set(); ok {
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
		if cfg.NATS.URL == "" && cfg.NATS.DiscoverInterval > 0 {
			if list, ok := fromDaemon(ctx, cfg, stderr); ok {
				return printTools(stdout, list, inv.source)
			}
		}
		return printTools(stdout, reg.SourcedTools(), inv.source)
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
	if idle, how := unserved(ctx, cfg, reg); len(idle) > 0 {
		fmt.Fprintf(stderr, "toolsidecar check: warning: no worker was seen declaring %s (%s): a call gets not_found unless a worker serves %s.<tool>; "+
			"a worker declares its tools in its code (docs/tools.md), or the tool takes another route (exec, http, mcp)\n",
			strings.Join(idle, ", "), how, cfg.NATS.SubjectPrefix)
	}
	printSyncPolicy(ctx, cfg, stderr)
	fmt.Fprintf(stdout, "configuration valid: %d tools\n", len(reg.Names()))
	return 0
}

// printSyncPolicy says what check could learn of an external NATS's
// JetStream sync policy: durable mode's promises hold only where each
// write is on disk before it is acknowledged.
func printSyncPolicy(ctx context.Context, cfg config.Config, stderr io.Writer) {
	say, warn, err := sidecar.SyncPolicy(ctx, cfg)
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "toolsidecar check: the sync policy of NATS is not read: %v\n", err)
	case warn:
		fmt.Fprintf(stderr, "toolsidecar check: warning: %s\n", say)
	case say != "":
		fmt.Fprintf(stderr, "toolsidecar check: %s\n", say)
	}
}

// unserved lists the tools on the nats route that the configuration alone
// defines: no worker was seen declaring them, in the running daemon's
// registry when one answers, else among the declarations read from the
// bus. how says where workers were looked for.
func unserved(ctx context.Context, cfg config.Config, reg *registry.Registry) (names []string, how string) {
	sources := map[string]string{}
	for _, t := range reg.Tools() {
		sources[t.Name] = t.Source
	}
	how = "the workers on " + cfg.NATS.URL
	if cfg.NATS.URL == "" {
		how = "no daemon answered, and its embedded NATS server starts with it"
	}
	rc, err := daemonOf(cfg, 2*time.Second)
	var live []tool.SourcedTool
	if err == nil && rc.get(ctx, "/v1/tools?source=1", &live) == nil {
		how = "the running daemon's tools"
		for _, t := range live {
			sources[t.Function.Name] = t.Source
		}
	}
	for _, t := range reg.Tools() {
		if t.Route == "nats" && sources[t.Name] == registry.SourceConfig {
			names = append(names, t.Name)
		}
	}
	return names, how
}

// withDeclared adds, as a start does, the tools that the workers on an
// external bus declare: a declaration the file contradicts is left out,
// as the daemon leaves it out, and check fails on it. A
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
	if cmd == "check" && len(problems) > 0 {
		// The daemon serves without them (and starts); check says so.
		return nil, fmt.Errorf("%d of the workers' declarations would be left out", len(problems))
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
