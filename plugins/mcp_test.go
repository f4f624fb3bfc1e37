package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/tool"
)

// envMCPServer makes the test binary an MCP server over stdio (see
// serveMCPIfAsked); its value is a file where the server writes "cancelled"
// when a call is cancelled.
const envMCPServer = "TSC_TEST_MCP_SERVER"

// envMCPHTTP makes the test binary serve testMCPServer over streamable
// HTTP, writing its URL into the file the variable names.
const envMCPHTTP = "TSC_TEST_MCP_HTTP"

// hugeResult is the size of the huge tool's result, far past any bound:
// 50 MiB, or 8 MiB under the race detector, which slows the server that
// builds it (BENCHMARKS.md has the 50 MiB figures, without it).
var hugeResult = map[bool]int{false: 50 << 20, true: 8 << 20}[raceEnabled]

// testMCPServer is an MCP server built with the official Go SDK, with a
// tool for each behaviour the route must handle.
func testMCPServer(cancelled string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "test-server", Version: "1"}, nil)
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	var annotations *mcp.ToolAnnotations
	add := func(name string, h mcp.ToolHandler) {
		s.AddTool(&mcp.Tool{Name: name, Description: "the test server's " + name, Annotations: annotations,
			InputSchema: json.RawMessage(`{"type":"object","properties":{"departure":{"type":"string"}}}`)}, h)
		annotations = nil
	}
	annotations = &mcp.ToolAnnotations{ReadOnlyHint: true}
	add("echo", func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return text(`{"echo": ` + string(req.Params.Arguments) + `}`), nil
	})
	add("fail", func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		r := text("no seats left")
		r.IsError = true
		return r, nil
	})
	add("empty", func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{}}, nil
	})
	annotations = &mcp.ToolAnnotations{IdempotentHint: true}
	add("slow", func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		for i := range 4 { // 1.2 s in all, past a 0.5 s timeout that each progress restarts
			select {
			case <-time.After(300 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: float64(i + 1)})
		}
		return text("done"), nil
	})
	add("hang", func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if cancelled != "" {
			_ = os.WriteFile(cancelled, []byte("started"), 0o600)
		}
		<-ctx.Done()
		if cancelled != "" {
			_ = os.WriteFile(cancelled, []byte("cancelled"), 0o600)
		}
		return nil, ctx.Err()
	})
	add("huge", func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return text(strings.Repeat("x", hugeResult)), nil
	})
	add("garbage", func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		fmt.Println("not JSON: a server that logs to its stdout")
		return text("ok"), nil
	})
	add("die", func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		os.Exit(3) // the server process dies in the middle of the call
		return nil, nil
	})
	return s
}

// serveMCPIfAsked serves testMCPServer over stdio and exits, when this
// process was started as an MCP server by a test.
func serveMCPIfAsked() {
	if file, ok := os.LookupEnv(envMCPDrip); ok {
		serveDripping(file)
	}
	if urlFile, ok := os.LookupEnv(envMCPHTTP); ok {
		srv := testMCPServer("")
		serveHTTP(urlFile, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	}
	cancelled, ok := os.LookupEnv(envMCPServer)
	if !ok {
		return
	}
	_ = testMCPServer(cancelled).Run(context.Background(), &mcp.StdioTransport{})
	os.Exit(0)
}

// serveHTTP serves h on a port of its own, writes its URL into urlFile, and
// exits.
func serveHTTP(urlFile string, h http.Handler) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.Exit(2)
	}
	_ = os.WriteFile(urlFile, []byte("http://"+ln.Addr().String()), 0o600)
	_ = http.Serve(ln, h)
	os.Exit(0)
}

// mcpTool is a tool of route mcp named t (as local wants it) that calls
// name on the server.
func mcpTool(server map[string]any, name string, timeout time.Duration) config.Tool {
	settings := map[string]any{"tool": name}
	for k, v := range server {
		settings[k] = v
	}
	return config.Tool{Route: "mcp", Timeout: timeout, Settings: map[string]any{"mcp": settings}}
}

func stdioServer(t *testing.T) (map[string]any, string) {
	cancelled := t.TempDir() + "/cancelled"
	return map[string]any{"command": []any{os.Args[0], "-test.run=^$"}, "env": map[string]any{envMCPServer: cancelled}}, cancelled
}

func TestMCPRoute(t *testing.T) {
	stdio, _ := stdioServer(t)
	srv := testMCPServer("")
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	t.Cleanup(StopMCP) // first: the sessions end before their server
	for _, server := range []struct {
		name     string
		settings map[string]any
	}{{"stdio", stdio}, {"http", map[string]any{"url": hs.URL}}} {
		t.Run(server.name, func(t *testing.T) {
			cases := []struct {
				tool    string
				timeout time.Duration
				want    string         // the result, when ok
				errType tool.ErrorType // the error's type, when not
			}{
				{"echo", 5 * time.Second, `{"echo": {"departure":"LAX","arrival":"JFK"}}`, ""},
				{"fail", 5 * time.Second, "", tool.ToolFailed},
				{"empty", 5 * time.Second, "", tool.WorkerCrash},
				{"slow", 500 * time.Millisecond, "done", ""},
				{"absent", 5 * time.Second, "", tool.ToolFailed},
			}
			for _, tc := range cases {
				o := dispatch(local(t, mcpTool(server.settings, tc.tool, tc.timeout)), tc.timeout)
				switch {
				case tc.errType == "" && (o.Err != nil || string(o.Data) != tc.want):
					t.Errorf("%s: %q %v, want %q", tc.tool, o.Data, o.Err, tc.want)
				case tc.errType != "" && (o.Err == nil || o.Err.Type != tc.errType):
					t.Errorf("%s: %q %v, want a %s", tc.tool, o.Data, o.Err, tc.errType)
				}
			}
		})
	}
}

// A stdio server that dies in the middle of a call: the call is a
// worker_crash, and the server is started again (after a short backoff)
// for the calls after.
func TestMCPServerDiesAndRestarts(t *testing.T) {
	stdio, _ := stdioServer(t)
	t.Cleanup(StopMCP)
	if o := dispatch(local(t, mcpTool(stdio, "die", 5*time.Second)), 5*time.Second); o.Err == nil || o.Err.Type != tool.WorkerCrash {
		t.Fatalf("a call whose server died: %q %v, want worker_crash", o.Data, o.Err)
	}
	echo := local(t, mcpTool(stdio, "echo", 5*time.Second))
	var o tool.Outcome
	poll.Until(t, "the server to be started again", func() bool {
		o = dispatch(echo, 5*time.Second)
		return o.Err == nil
	})
	if !strings.Contains(string(o.Data), "LAX") {
		t.Fatalf("after the restart: %q", o.Data)
	}
}

// A call cancelled by the sidecar is cancelled on the server too
// (notifications/cancelled), and is a cancelled outcome.
func TestMCPCancellationReachesTheServer(t *testing.T) {
	stdio, cancelled := stdioServer(t)
	t.Cleanup(StopMCP)
	l := local(t, mcpTool(stdio, "hang", 5*time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	outcome := make(chan tool.Outcome, 1)
	go func() {
		outcome <- l.Dispatch(ctx, tool.Request{Tool: "t", Body: []byte(manifest), ActionID: "act_1", Attempt: 1, Timeout: time.Minute})
	}()
	// Cancelled once the server has the call: a server slow to start (a
	// loaded machine) would otherwise never receive the call it is to see
	// cancelled.
	poll.Until(t, "the server to have the call", func() bool {
		b, _ := os.ReadFile(cancelled)
		return string(b) == "started"
	})
	cancel()
	o := <-outcome
	if o.Err == nil || o.Err.Type != tool.Cancelled {
		t.Fatalf("a cancelled call: %q %v", o.Data, o.Err)
	}
	poll.Until(t, "the server to see the cancellation", func() bool {
		b, _ := os.ReadFile(cancelled)
		return string(b) == "cancelled"
	})
}

// With import: true the server's tools are read into the registry: named
// with the prefix, described and validated as the server says, classed by
// their annotations, and callable.
func TestMCPImport(t *testing.T) {
	stdio, _ := stdioServer(t)
	t.Cleanup(StopMCP)
	settings := map[string]any{"import": true, "prefix": "srv_"}
	for k, v := range stdio {
		settings[k] = v
	}
	reg, err := compileTools([]config.Tool{{Name: "test-server", Route: "mcp", Timeout: 5 * time.Second, Settings: map[string]any{"mcp": settings}}}, "p")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"srv_echo": config.ReadOnly, "srv_slow": config.Idempotent, "srv_fail": config.Unsafe, "srv_die": config.Unsafe}
	for name, class := range want {
		def, ok := reg.Lookup(name)
		if !ok || def.SideEffects != class || def.Description != "the test server's "+strings.TrimPrefix(name, "srv_") {
			t.Errorf("%s: %+v, want side effects %s", name, def, class)
		}
	}
	if names := reg.Names(); len(names) != 8 {
		t.Errorf("imported %v, want the server's 8 tools", names)
	}
	def, _ := reg.Lookup("srv_echo")
	if err := def.Validate(json.RawMessage(`{"departure": 7}`)); err == nil {
		t.Error("the server's input schema is not applied")
	}
	l := NewLocal(registry.NewLive(reg), nil)
	o := l.Dispatch(context.Background(), tool.Request{Tool: "srv_echo", Body: []byte(manifest), ActionID: "act_1", Attempt: 1, Timeout: 5 * time.Second})
	if o.Err != nil || !strings.Contains(string(o.Data), `"departure":"LAX"`) {
		t.Fatalf("imported tool: %q %v", o.Data, o.Err)
	}
}
