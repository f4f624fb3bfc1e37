package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/live"
)

// runsClient reads a running daemon's runs over its API.
type runsClient struct {
	url, token string
	hc         *http.Client
}

// runsFlags are the flags of `toolsidecar runs` and its commands.
type runsFlags struct {
	url, tokenFile, cfgPath, output string
}

// maxRunsBody bounds what the CLI reads of the daemon's answer.
const maxRunsBody = 64 << 20

func runsCommand(stdout, stderr io.Writer) *cobra.Command {
	var f runsFlags
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "list or show the runs a running daemon keeps (those in flight and the last server.ui_history)",
		Long: "List or show the runs a running daemon keeps: those in flight and the last server.ui_history, as its live view shows them.\n\n" +
			"The daemon is found at --url, or at the server.listen of --config. The API token comes from --token-file, " +
			"TOOLSIDECAR_TOKEN, or the server.operator_token_file (else server.auth_token_file) of --config. " +
			"The daemon lists the runs of the token's caller; the operator's token lists every run.",
		Args: cobra.NoArgs,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.url, "url", os.Getenv("TOOLSIDECAR_URL"), "the daemon's API, http://host:port (env TOOLSIDECAR_URL; default: --config's server.listen, else http://127.0.0.1:8741)")
	pf.StringVar(&f.tokenFile, "token-file", os.Getenv("TOOLSIDECAR_TOKEN_FILE"), "a file holding the API token (env TOOLSIDECAR_TOKEN_FILE; or the token itself in TOOLSIDECAR_TOKEN)")
	pf.StringVarP(&f.cfgPath, "config", "c", "", "the daemon's configuration file, for its address and token file")
	pf.StringVarP(&f.output, "output", "o", "table", "table or json")
	_ = cmd.MarkPersistentFlagFilename("config", "yaml", "yml")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]cobra.Completion{"table", "json"}, cobra.ShellCompDirectiveNoFileComp))
	for _, sub := range []*cobra.Command{f.listCommand(stdout), f.showCommand(stdout)} {
		run := sub.RunE
		sub.RunE = func(c *cobra.Command, args []string) error {
			if f.output != "table" && f.output != "json" {
				return usageError{fmt.Sprintf("toolsidecar runs %s: --output %q is not table or json", sub.Name(), f.output)}
			}
			if err := run(c, args); err != nil {
				var usage usageError
				if errors.As(err, &usage) {
					return err
				}
				fmt.Fprintf(stderr, "toolsidecar runs %s: %v\n", sub.Name(), err)
				return exitError{1}
			}
			return nil
		}
		cmd.AddCommand(sub)
	}
	return cmd
}

// listCommand is "toolsidecar runs list".
func (f *runsFlags) listCommand(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:               "list",
		Short:             "list the runs, the most recent first",
		Args:              cobra.NoArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			rc, err := f.client()
			if err != nil {
				return err
			}
			var got live.RunList
			if err := rc.get(c.Context(), "/v1/sidecar/runs", &got); err != nil {
				return err
			}
			if f.output == "json" {
				return writeIndented(stdout, got)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RUN\tSTATUS\tSTARTED\tTOOK\tTURNS\tCALLS\tERRORS")
			for _, r := range got.Runs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\n", r.ID, r.Status, stamp(r.Started), took(r.Started, r.Ended), r.Turns, r.Calls, r.Errors)
			}
			return tw.Flush()
		},
	}
}

// showCommand is "toolsidecar runs show RUN"; the run ids complete from
// the daemon, when it answers.
func (f *runsFlags) showCommand(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "show RUN",
		Short: "show one run: its turns, and each call with its outcome and timings",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Sprintf("toolsidecar runs show: give one run id (toolsidecar runs list shows them), not %d arguments", len(args))}
			}
			return nil
		},
		ValidArgsFunction: func(c *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			rc, err := f.client()
			if err != nil || len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var got live.RunList
			if rc.get(c.Context(), "/v1/sidecar/runs", &got) != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var ids []cobra.Completion
			for _, r := range got.Runs {
				ids = append(ids, cobra.CompletionWithDesc(r.ID, r.Status))
			}
			return ids, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(c *cobra.Command, args []string) error {
			rc, err := f.client()
			if err != nil {
				return err
			}
			var got live.Run
			if err := rc.get(c.Context(), "/v1/sidecar/runs/"+url.PathEscape(args[0]), &got); err != nil {
				return err
			}
			if f.output == "json" {
				return writeIndented(stdout, got)
			}
			return printRun(stdout, got)
		},
	}
}

// client resolves the daemon's address and token: the flags, then the
// environment, then the configuration file.
func (f runsFlags) client() (*runsClient, error) {
	rc := &runsClient{url: f.url, hc: &http.Client{Timeout: 30 * time.Second}}
	tokenFile := f.tokenFile
	if f.cfgPath != "" {
		cfg, err := config.Load(f.cfgPath, nil)
		if err != nil {
			return nil, err
		}
		if rc.url == "" {
			rc.url = "http://" + reachable(cfg.Server.Listen)
		}
		if tokenFile == "" && os.Getenv("TOOLSIDECAR_TOKEN") == "" {
			// The operator's token, where there is one: with any other a
			// request sees only the runs its own credentials drove.
			tokenFile = cmp.Or(cfg.Server.OperatorTokenFile, cfg.Server.AuthTokenFile)
		}
	}
	return rc.resolve(tokenFile)
}

// daemonOf is the client of the daemon that cfg configures, asked once
// within timeout.
func daemonOf(cfg config.Config, timeout time.Duration) (*runsClient, error) {
	rc := &runsClient{url: "http://" + reachable(cfg.Server.Listen), hc: &http.Client{Timeout: timeout}}
	tokenFile := ""
	if os.Getenv("TOOLSIDECAR_TOKEN") == "" {
		tokenFile = cfg.Server.AuthTokenFile
	}
	return rc.resolve(tokenFile)
}

// resolve checks the daemon's URL and reads its token: from tokenFile, or
// TOOLSIDECAR_TOKEN.
func (rc *runsClient) resolve(tokenFile string) (*runsClient, error) {
	if rc.url == "" {
		rc.url = "http://127.0.0.1:8741"
	}
	u, err := url.Parse(rc.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usageError{fmt.Sprintf("toolsidecar runs: --url %q is not http(s)://host:port", rc.url)}
	}
	rc.url = strings.TrimSuffix(rc.url, "/")
	rc.token = os.Getenv("TOOLSIDECAR_TOKEN")
	if tokenFile != "" {
		data, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("the API token: %w", err)
		}
		rc.token = strings.TrimSpace(string(data))
	}
	return rc, nil
}

// reachable is a listen address as a client dials it: a wildcard host is
// this machine.
func reachable(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// get reads one of the daemon's JSON answers into v; an error answer is
// reported with the daemon's own message.
func (rc *runsClient) get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rc.url+path, nil)
	if err != nil {
		return err
	}
	if rc.token != "" {
		req.Header.Set("Authorization", "Bearer "+rc.token)
	}
	resp, err := rc.hc.Do(req)
	if err != nil {
		return fmt.Errorf("the daemon at %s: %w", rc.url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxRunsBody))
	if err != nil {
		return fmt.Errorf("the daemon at %s: %w", rc.url, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		msg := strings.TrimSpace(string(body))
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		if resp.StatusCode == http.StatusNotFound && path == "/v1/sidecar/runs" {
			msg += " (the daemon keeps runs only with server.ui true)"
		}
		return fmt.Errorf("the daemon at %s answered %s: %s", rc.url, resp.Status, msg)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("the daemon at %s: %w", rc.url, err)
	}
	return nil
}

func writeIndented(w io.Writer, v any) error {
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(out))
	return err
}

// printRun writes a run, each turn, and each call's steps.
func printRun(w io.Writer, r live.Run) error {
	fmt.Fprintf(w, "run      %s\nstatus   %s\nstarted  %s\ntook     %s\ncalls    %d (%d errors)\n", r.ID, r.Status, stamp(r.Started), took(r.Started, r.Ended), r.Calls, r.Errors)
	if r.Error != "" {
		fmt.Fprintf(w, "error    %s\n", r.Error)
	}
	for _, t := range r.Turns {
		fmt.Fprintf(w, "\nturn %d, started %s, %d calls\n", t.N, stamp(t.Started), len(t.Calls))
		if len(t.Calls) == 0 {
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  TOOL_CALL_ID\tTOOL\tOUTCOME\tTOOK\tATTEMPTS\tDETAIL")
		for _, c := range t.Calls {
			detail := c.Error
			switch {
			case c.DedupedFrom != "":
				detail = "deduped from " + c.DedupedFrom
			case c.Approval != "":
				detail = strings.TrimSpace("approval " + c.Approval + " " + c.Approver)
			case detail == "":
				detail = c.Preview
			}
			// A validation error lists one problem a line: each goes on a
			// row of its own, under the detail, so the columns stay whole.
			first, rest, _ := strings.Cut(detail, "\n")
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%s\n", c.ToolCallID, c.Tool, orDash(c.Outcome, "running"), took(c.Dispatched, c.Finalised), max(c.Attempts, 1), first)
			for line := range strings.Lines(rest) {
				fmt.Fprintf(tw, "  \t\t\t\t\t  %s\n", strings.TrimRight(line, "\n"))
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// stamp is a Unix millisecond time with its date and zone.
func stamp(ms int64) string {
	if ms == 0 {
		return "-"
	}
	return time.UnixMilli(ms).Format("2006-01-02 15:04:05.000 MST")
}

// took is the time between two Unix millisecond times, or "-" while the
// second has not come.
func took(from, to int64) string {
	if from == 0 || to == 0 {
		return "-"
	}
	return (time.Duration(to-from) * time.Millisecond).String()
}

func orDash(s, empty string) string {
	if s == "" {
		return empty
	}
	return s
}
