package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/projectdavid/toolsidecar/sim/simserve"
)

// simCommand is "toolsidecar sim KIND": a simulator of Core or of a model
// API, served beside the sidecar so that each way in can be tried by hand
// without an account.
func simCommand(stdout, stderr io.Writer) *cobra.Command {
	var o simserve.Options
	cmd := &cobra.Command{
		Use:   "sim core|openai|responses|anthropic|openai-agents|anthropic-agents",
		Short: "serve a simulator of Core or of a model API, for trying the sidecar without either",
		Long: "Serve a simulator of Project David Core (core), of a Chat Completions API (openai), of the Responses API " +
			"(responses), of the Anthropic Messages API (anthropic), of the OpenAI Agents API (openai-agents) or of Anthropic " +
			"Managed Agents (anthropic-agents), with a scripted model.\n\n" +
			"The script (--script, YAML: docs/development.md) says what the model does each turn; by default it calls " +
			"get_flight_times, the tool examples/go-worker declares, three times in one batch, then answers quoting the results " +
			"(a hosted session blocks on the three calls until they are answered). " +
			"The first line printed says where it serves and the flags that point a sidecar at it.",
		ValidArgs: simserve.Kinds,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 || !slices.Contains(simserve.Kinds, args[0]) {
				return usageError{fmt.Sprintf("toolsidecar sim: name one simulator: %s", strings.Join(simserve.Kinds, ", "))}
			}
			return nil
		},
		RunE: func(_ *cobra.Command, args []string) error {
			o.Kind = args[0]
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if err := simserve.Serve(ctx, o, stdout); err != nil {
				fmt.Fprintf(stderr, "toolsidecar sim %s: %v\n", o.Kind, err)
				return exitError{1}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&o.Listen, "listen", "", "address to serve on (default: core 127.0.0.1:9000, openai :9001, responses :9002, anthropic :9003, openai-agents :9004, anthropic-agents :9005)")
	cmd.Flags().StringVar(&o.Script, "script", "", "what the model does, turn by turn (YAML); default: three get_flight_times calls, then an answer")
	_ = cmd.MarkFlagFilename("script", "yaml", "yml", "json")
	return cmd
}
