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
	"bytes"
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

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
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
	// Echo answers {"echo": <args>} (the arguments with sorted keys)
	// instead of "<name> done".
	Echo bool
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
			out, err := execute(r.Context(), s.dir, tl, manifestOf(r.Body))
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
	for _, tl := range s.tools {
		fmt.Fprintf(&b, "  - {name: %s, side_effects: %s, timeout: %s", tl.Name, tl.SideEffects, timeout)
		if settings := s.settings(tl); settings != nil {
			js, _ := json.Marshal(settings) // JSON is YAML's flow style
			fmt.Fprintf(&b, ", route: %s, %s: %s", s.Route, s.Route, js)
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// EnvTools are the tools as the test kit's sidecars take them, each with
// the given timeout: with their route and its settings, or on route nats
// with the worker's handler.
func (s *Served) EnvTools(timeout time.Duration) []testenv.Tool {
	hs := s.Handlers()
	var out []testenv.Tool
	for _, tl := range s.tools {
		c := config.Tool{Name: tl.Name, SideEffects: tl.SideEffects, Timeout: timeout}
		if settings := s.settings(tl); settings != nil {
			c.Route, c.Settings = s.Route, map[string]any{s.Route: settings}
		}
		out = append(out, testenv.Tool{Config: c, Handler: hs[tl.Name]})
	}
	return out
}

// settings are a tool's settings on its route; nil on route nats.
func (s *Served) settings(tl Tool) map[string]any {
	bin, _ := os.Executable()
	var blocked, names, echo []string
	for _, t := range s.tools {
		names = append(names, t.Name)
		if t.Block {
			blocked = append(blocked, t.Name)
		}
		if t.Echo {
			echo = append(echo, t.Name)
		}
	}
	env := map[string]any{envRole: s.Route, envDir: s.dir, envBlocked: strings.Join(blocked, ","), envEcho: strings.Join(echo, ",")}
	switch s.Route {
	case Exec:
		env[envTools] = tl.Name
		return map[string]any{"command": []any{bin, "-test.run=^$"}, "env": env}
	case HTTP:
		return map[string]any{"url": s.srv.URL + "/" + tl.Name}
	case MCP:
		env[envTools] = strings.Join(names, ",")
		return map[string]any{"command": []any{bin, "-test.run=^$"}, "env": env, "tool": tl.Name}
	}
	return nil
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
			return execute(ctx, s.dir, tl, manifest{ActionID: c.ActionID, Args: c.Args})
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
	envEcho    = "TSC_MATRIX_ECHO"    // the tools that echo their arguments
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
		tl := Tool{Name: names[0], Block: slices.Contains(blocked, names[0]), Echo: slices.Contains(strings.Split(os.Getenv(envEcho), ","), names[0])}
		out, err := execute(context.Background(), dir, tl, manifestOf(os.Stdin))
		if err != nil {
			os.Exit(1)
		}
		_, _ = os.Stdout.Write(out)
		os.Exit(0)
	case MCP:
		srv := mcp.NewServer(&mcp.Implementation{Name: "matrix", Version: "1"}, nil)
		echo := strings.Split(os.Getenv(envEcho), ",")
		for _, name := range names {
			tl := Tool{Name: name, Block: slices.Contains(blocked, name), Echo: slices.Contains(echo, name)}
			srv.AddTool(&mcp.Tool{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`)},
				func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
					// MCP carries the arguments, not the call's identity.
					out, err := execute(ctx, dir, tl, manifest{Args: req.Params.Arguments})
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

// execute is every route's tool: it counts the execution (and its
// arguments), holds the first one of a blocked tool until the release
// file exists, waits the arguments' "ms" milliseconds, and answers.
func execute(ctx context.Context, dir string, tl Tool, m manifest) ([]byte, error) {
	args := normal(m.Args)
	f, err := os.OpenFile(filepath.Join(dir, tl.Name+".count"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = f.Write([]byte{'x'})
	f.Close()
	if err != nil {
		return nil, err
	}
	appendLine(filepath.Join(dir, tl.Name+".args"), args)
	appendLine(filepath.Join(dir, tl.Name+".actions"), []byte(m.ActionID))
	// The first is the execution that makes the marker: executions that
	// start together each count, and more than one could see a count of 1
	// only after the others had counted too.
	first := false
	if f, err := os.OpenFile(filepath.Join(dir, tl.Name+".first"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
		f.Close()
		first = true
	}
	for tl.Block && first {
		if _, err := os.Stat(filepath.Join(dir, "release")); err == nil {
			break
		}
		if sleep(ctx, 5*time.Millisecond) != nil {
			return nil, ctx.Err()
		}
	}
	var a struct{ Ms int }
	_ = json.Unmarshal(args, &a)
	if sleep(ctx, time.Duration(a.Ms)*time.Millisecond) != nil {
		return nil, ctx.Err()
	}
	appendLine(filepath.Join(dir, tl.Name+".done"), nil)
	if tl.Echo {
		return []byte(`{"echo": ` + string(args) + `}`), nil
	}
	return []byte(`"` + tl.Name + ` done"`), nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// appendLine appends line and a newline to the file at path.
func appendLine(path string, line []byte) {
	if f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
		_, _ = f.Write(append(line, '\n'))
		f.Close()
	}
}

// manifest is what a tool learns of its call.
type manifest struct {
	ActionID string          `json:"action_id"`
	Args     json.RawMessage `json:"args"`
}

// manifestOf reads a manifest: the body of an exec or http call.
func manifestOf(r io.Reader) manifest {
	var m manifest
	_ = json.NewDecoder(io.LimitReader(r, 16<<20)).Decode(&m)
	return m
}

// normal is JSON arguments as one line with sorted keys, as every route
// hands them over alike (an MCP server gets them re-encoded).
func normal(args []byte) []byte {
	var v any
	d := json.NewDecoder(bytes.NewReader(args))
	d.UseNumber()
	if d.Decode(&v) != nil {
		return []byte("{}")
	}
	out, _ := json.Marshal(v)
	return out
}

// RunsByAction counts the executions of the named tool by the action_id
// of their call; an MCP server is not told it, so route mcp counts all
// under "".
func (s *Served) RunsByAction(name string) map[string]int {
	b, _ := os.ReadFile(filepath.Join(s.dir, name+".actions"))
	out := map[string]int{}
	for line := range strings.Lines(string(b)) {
		out[strings.TrimSuffix(line, "\n")]++
	}
	return out
}

// Runs is how many times the named tool started with the given arguments
// (compared with sorted keys).
func (s *Served) Runs(name string, args []byte) int {
	b, _ := os.ReadFile(filepath.Join(s.dir, name+".args"))
	want := string(normal(args))
	n := 0
	for line := range strings.Lines(string(b)) {
		if strings.TrimSuffix(line, "\n") == want {
			n++
		}
	}
	return n
}

func count(dir, name string) int32 { return size(filepath.Join(dir, name+".count")) }

func size(path string) int32 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return int32(st.Size())
}
