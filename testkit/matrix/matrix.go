// Package matrix serves test tools on every route kind, so that a
// guarantee is tested across the matrix of route kinds and upstream kinds
// by default, not on the one cell it was built with.
//
// A tool of the matrix counts its executions and, when asked, holds its
// first one until the test releases it. Both live in files, so that a tool
// run by a process the sidecar starts (route exec, an MCP stdio server)
// is counted and held as one in the test's own process is (a NATS worker,
// an HTTP tool server). A test binary that uses the exec or mcp route
// calls [Main] first in its TestMain: the sidecar starts that binary as
// the tool.
//
// make test runs a sample of each table's cells ([Routes]); MATRIX=all
// (make soak) runs every cell.
package matrix

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/projectdavid/toolsidecar/tool"
)

// Route kinds of the matrix.
const (
	NATS = "nats"
	Exec = "exec"
	HTTP = "http"
	MCP  = "mcp" // a stdio server
)

// AllRoutes are the route kinds every guarantee is tested on.
var AllRoutes = []string{NATS, Exec, HTTP, MCP}

// All reports whether every cell runs (MATRIX=all), not the sample.
func All() bool { return os.Getenv("MATRIX") == "all" }

// Routes are the route kinds that cell i of a table runs: every kind with
// MATRIX=all; otherwise two of them, one that leaves the sidecar's process
// or not in turn, so that the cells of a table cover every kind.
func Routes(i int) []string {
	if All() {
		return AllRoutes
	}
	n := len(AllRoutes)
	return []string{AllRoutes[i%n], AllRoutes[(i+2)%n]}
}

// InProcess reports whether a route's calls run in the sidecar's process:
// a call in flight dies with the sidecar, and its reply with it.
func InProcess(route string) bool { return route != NATS }

// Tool is a tool of the matrix.
type Tool struct {
	Name        string
	SideEffects string // read_only | idempotent | unsafe
	// Block holds the tool's first execution until [Served.Release].
	Block bool
}

// Served is a set of tools served on one route kind.
type Served struct {
	Route string
	dir   string
	tools []Tool
	srv   *httptest.Server // route http
}

// Serve serves tools on route, for one test.
func Serve(t testing.TB, route string, tools ...Tool) *Served {
	t.Helper()
	if !slices.Contains(AllRoutes, route) {
		t.Fatalf("matrix: no route kind %q", route)
	}
	s := &Served{Route: route, dir: t.TempDir(), tools: tools}
	if route == HTTP {
		s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			name := strings.TrimPrefix(r.URL.Path, "/")
			tl, ok := s.tool(name)
			if !ok {
				http.NotFound(w, r)
				return
			}
			_, _ = io.Copy(io.Discard, r.Body)
			out, err := execute(r.Context(), s.dir, tl.Name, tl.Block)
			if err != nil {
				return // the client has gone
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(out)
		}))
		t.Cleanup(s.srv.Close)
	}
	// Whatever holds a tool lets go at the end of the test.
	t.Cleanup(s.Release)
	return s
}

func (s *Served) tool(name string) (Tool, bool) {
	i := slices.IndexFunc(s.tools, func(t Tool) bool { return t.Name == name })
	if i < 0 {
		return Tool{}, false
	}
	return s.tools[i], true
}

// Config is the tools' entries of a config.yaml "tools:" list, each with
// the given timeout.
func (s *Served) Config(timeout string) string {
	var b strings.Builder
	bin, _ := os.Executable()
	var blocked []string
	var names []string
	for _, tl := range s.tools {
		names = append(names, tl.Name)
		if tl.Block {
			blocked = append(blocked, tl.Name)
		}
	}
	for _, tl := range s.tools {
		fmt.Fprintf(&b, "  - {name: %s, side_effects: %s, timeout: %s", tl.Name, tl.SideEffects, timeout)
		switch s.Route {
		case Exec:
			fmt.Fprintf(&b, `, route: exec, exec: {command: [%q, "-test.run=^$"], env: {%s: exec, %s: %q, %s: %q, %s: %q}}`,
				bin, envRole, envDir, s.dir, envTools, tl.Name, envBlocked, strings.Join(blocked, ","))
		case HTTP:
			fmt.Fprintf(&b, ", route: http, http: {url: %q}", s.srv.URL+"/"+tl.Name)
		case MCP:
			fmt.Fprintf(&b, `, route: mcp, mcp: {command: [%q, "-test.run=^$"], env: {%s: mcp, %s: %q, %s: %q, %s: %q}}`,
				bin, envRole, envDir, s.dir, envTools, strings.Join(names, ","), envBlocked, strings.Join(blocked, ","))
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// Handlers are the handlers a NATS worker serves the tools with (route
// nats); nil on the other routes, which need no worker.
func (s *Served) Handlers() map[string]tool.Handler {
	if s.Route != NATS {
		return nil
	}
	hs := map[string]tool.Handler{}
	for _, tl := range s.tools {
		hs[tl.Name] = func(ctx context.Context, c *tool.Call) ([]byte, error) {
			return execute(ctx, s.dir, tl.Name, tl.Block)
		}
	}
	return hs
}

// Count is how many times the named tool has started to execute.
func (s *Served) Count(name string) int32 { return count(s.dir, name) }

// Done is how many executions of the named tool have returned their result.
func (s *Served) Done(name string) int32 { return size(filepath.Join(s.dir, name+".done")) }

// Release lets the held executions go on; idempotent.
func (s *Served) Release() {
	_ = os.WriteFile(filepath.Join(s.dir, "release"), nil, 0o600)
}

// InProcess reports whether the tools' calls run in the sidecar's process.
func (s *Served) InProcess() bool { return InProcess(s.Route) }

// The environment of a tool process the sidecar starts.
const (
	envRole    = "TSC_MATRIX_ROLE" // exec | mcp
	envDir     = "TSC_MATRIX_DIR"
	envTools   = "TSC_MATRIX_TOOLS"   // the tool (exec) or tools (mcp, comma-separated)
	envBlocked = "TSC_MATRIX_BLOCKED" // the tools whose first execution is held
)

// Main makes this process the tool it was started as (route exec: one
// call on stdin, its result on stdout; route mcp: an MCP stdio server of
// the tools) and exits; it returns at once in any other process.
func Main() {
	role, ok := os.LookupEnv(envRole)
	if !ok {
		return
	}
	dir, blocked := os.Getenv(envDir), strings.Split(os.Getenv(envBlocked), ",")
	names := strings.Split(os.Getenv(envTools), ",")
	switch role {
	case Exec:
		_, _ = io.Copy(io.Discard, os.Stdin)
		out, err := execute(context.Background(), dir, names[0], slices.Contains(blocked, names[0]))
		if err != nil {
			os.Exit(1)
		}
		_, _ = os.Stdout.Write(out)
		os.Exit(0)
	case MCP:
		srv := mcp.NewServer(&mcp.Implementation{Name: "matrix", Version: "1"}, nil)
		for _, name := range names {
			block := slices.Contains(blocked, name)
			srv.AddTool(&mcp.Tool{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`)},
				func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
					out, err := execute(ctx, dir, name, block)
					if err != nil {
						return nil, err
					}
					return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(out)}}}, nil
				})
		}
		_ = srv.Run(context.Background(), &mcp.StdioTransport{})
		os.Exit(0)
	}
	os.Exit(2)
}

// execute is every route's tool: it counts the execution, holds the first
// one of a blocked tool until the release file exists, and answers
// "<name> done".
func execute(ctx context.Context, dir, name string, block bool) ([]byte, error) {
	f, err := os.OpenFile(filepath.Join(dir, name+".count"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = f.Write([]byte{'x'})
	f.Close()
	if err != nil {
		return nil, err
	}
	first := count(dir, name) == 1
	for block && first {
		if _, err := os.Stat(filepath.Join(dir, "release")); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	if f, err := os.OpenFile(filepath.Join(dir, name+".done"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
		_, _ = f.Write([]byte{'x'})
		f.Close()
	}
	return []byte(`"` + name + ` done"`), nil
}

func count(dir, name string) int32 { return size(filepath.Join(dir, name+".count")) }

func size(path string) int32 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return int32(st.Size())
}
