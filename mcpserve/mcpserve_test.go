package mcpserve_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/live"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// bearer adds the sidecar's API token to every request.
type bearer struct {
	token string
	rt    http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}

// connect opens an MCP session of the official Go SDK's client with the
// sidecar's /mcp.
func connect(t *testing.T, url, token string) (*mcp.ClientSession, error) {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	client := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{token, tr}}, DisableStandaloneSSE: true}, nil)
	if err == nil {
		t.Cleanup(func() { _ = cs.Close() })
	}
	return cs, err
}

// The registry served over MCP: an MCP client lists the tools with their
// class as annotations, and its calls run through the sidecar's dispatch
// to real workers, policies and metrics included.
func TestRegistryServedOverMCP(t *testing.T) {
	failing := func(context.Context, *tool.Call) ([]byte, error) {
		return nil, tool.NewError(tool.ToolFailed, "no seats left")
	}
	env := testenv.Start(t, coresim.Scenario{}, testenv.Options{Token: "tok", Server: func(s *config.Server) { s.MCP = true }},
		testenv.Tool{Config: config.Tool{Name: "echo", Description: "echoes", SideEffects: config.ReadOnly,
			Parameters: map[string]any{"type": "object", "required": []any{"x"}}}, Handler: testenv.Echo},
		testenv.Tool{Config: config.Tool{Name: "book", SideEffects: config.Unsafe, MaxCallsPerRun: 1, Timeout: time.Second}, Handler: failing})
	testenv.WaitLive(t, env.URL, "echo", "book")
	if _, err := connect(t, env.URL, "wrong"); err == nil {
		t.Fatal("an MCP client without the API token was let in")
	}
	cs, err := connect(t, env.URL, "tok")
	if err != nil {
		t.Fatal(err)
	}
	list, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	classes := map[string]bool{}
	for _, tl := range list.Tools {
		classes[tl.Name] = tl.Annotations != nil && tl.Annotations.ReadOnlyHint
	}
	if len(list.Tools) != 2 || !classes["echo"] || classes["book"] {
		t.Fatalf("tools/list: %+v", list.Tools)
	}
	call := func(name, args string) *mcp.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: json.RawMessage(args)})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res
	}
	text := func(r *mcp.CallToolResult) string { return r.Content[0].(*mcp.TextContent).Text }
	if r := call("echo", `{"x": 1}`); r.IsError || text(r) != `{"echo": {"x":1}}` {
		t.Errorf("echo: %+v %q", r, text(r))
	}
	if r := call("echo", `{}`); !r.IsError || !strings.Contains(text(r), `"error_type":"invalid_args"`) {
		t.Errorf("arguments against the schema: %q", text(r))
	}
	if r := call("book", `{}`); !r.IsError || !strings.Contains(text(r), "no seats left") {
		t.Errorf("a failing tool: %q", text(r))
	}
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ghost", Arguments: json.RawMessage(`{}`)}); err == nil {
		t.Error("a call of an unknown tool was not refused")
	}
	req, _ := http.NewRequest(http.MethodGet, env.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), `toolsidecar_calls_total{outcome="ok",tool="echo"} 1`) {
			err = errors.New("toolsidecar_calls_total does not count the MCP client's echo")
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	liveViewShows(t, env.URL, "tok", map[string]int{"echo ok": 1, "echo " + string(tool.InvalidArgs): 1, "book " + string(tool.ToolFailed): 1})
}

// TestToolTheSDKRefusesIsLeftOut: with server.mcp on, a tool that the
// registry takes but the MCP SDK refuses (an x-mcp-header annotation on a
// property that is an object: AddTool panics on it) is left out of the
// MCP server, from the configuration at start and from a real worker's
// declaration at a discovery alike. The sidecar stays up and ready, an
// MCP client lists and calls the good tools, and each bad one is counted
// once, not again when a later discovery replaces the registry. Before,
// the panic stopped the process.
func TestToolTheSDKRefusesIsLeftOut(t *testing.T) {
	headed := func(typ string) map[string]any {
		return map[string]any{"type": "object", "properties": map[string]any{"page": map[string]any{"type": typ, "x-mcp-header": "Page"}}}
	}
	env := testenv.Start(t, coresim.Scenario{}, testenv.Options{Server: func(s *config.Server) { s.MCP = true },
		NATS: func(n *config.NATS) { n.DiscoverInterval = 50 * time.Millisecond }},
		testenv.Tool{Config: config.Tool{Name: "echo", Parameters: headed("string")}, Handler: testenv.Echo},
		testenv.Tool{Config: config.Tool{Name: "headed", Parameters: headed("object")}, Handler: testenv.Echo})
	found := func(context.Context, *tool.Call, struct{}) (string, error) { return "found", nil }
	declare := func(names ...string) {
		nc, err := nats.Connect(env.NATSURL, nats.UserInfo(testenv.WorkerUser, env.WorkerPassword))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		w := worker.New(nc, testenv.Prefix)
		for _, name := range names {
			spec := worker.Spec{SideEffects: tool.ReadOnly}
			if name == "paged" {
				spec.Parameters = &jsonschema.Schema{Type: "object", Properties: map[string]*jsonschema.Schema{
					"page": {Type: "object", Extra: map[string]any{"x-mcp-header": "Page"}}}}
			}
			if err := worker.Declare(w, name, spec, found); err != nil {
				t.Fatal(err)
			}
		}
		natstest.Serve(t, w)
	}
	declare("lookup", "paged")
	poll.Until(t, "the worker's tools discovered", func() bool {
		tools := testenv.SourcedTools(t, env.URL)
		return tools["lookup"].Source != "" && tools["paged"].Source != ""
	})
	cs, err := connect(t, env.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	listed := func() []string {
		t.Helper()
		list, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, tl := range list.Tools {
			names = append(names, tl.Name)
		}
		slices.Sort(names)
		return names
	}
	// The MCP server's list follows the registry's change a moment after
	// discovery puts the tools in force.
	poll.Until(t, "tools/list of echo and lookup, without headed and paged", func() bool {
		return slices.Equal(listed(), []string{"echo", "lookup"})
	})
	if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "lookup", Arguments: json.RawMessage(`{}`)}); err != nil || res.IsError {
		t.Fatalf("lookup: %+v %v", res, err)
	}
	// A later discovery replaces the registry: the bad tools are left out
	// again, and not counted again.
	declare("more")
	poll.Until(t, "more served over MCP", func() bool { return slices.Contains(listed(), "more") })
	if got := listed(); !slices.Equal(got, []string{"echo", "lookup", "more"}) {
		t.Errorf("tools/list: %v", got)
	}
	resp, err := http.Get(env.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `toolsidecar_tools_left_out_total{consumer="mcp"} 2`+"\n") {
		t.Errorf("want headed and paged counted once each; /metrics has %q", grepLines(string(b), "left_out"))
	}
	if resp, err := http.Get(env.URL + "/readyz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("readyz: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}

// grepLines are the lines of s that contain sub.
func grepLines(s, sub string) []string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// liveViewShows reads the live view's snapshot (GET /ui/events) and
// checks that the MCP client's calls are there, each a finished run of
// its own (id mcp_…, status completed, one turn of one call), counted
// by "tool outcome".
func liveViewShows(t *testing.T, url, token string, want map[string]int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/ui/events", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var snap struct{ Runs []live.Run }
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			if err := json.Unmarshal([]byte(data), &snap); err != nil {
				t.Fatalf("the snapshot: %v", err)
			}
			break
		}
	}
	got := map[string]int{}
	for _, r := range snap.Runs {
		if !strings.HasPrefix(r.ID, "mcp_") || r.Status != "completed" || r.Ended == 0 || len(r.Turns) != 1 || len(r.Turns[0].Calls) != 1 {
			t.Errorf("run %s: status %q, ended %d, %d turns; want an MCP call's run, finished, of one turn of one call", r.ID, r.Status, r.Ended, len(r.Turns))
			continue
		}
		c := r.Turns[0].Calls[0]
		got[c.Tool+" "+c.Outcome]++
	}
	if !maps.Equal(got, want) {
		t.Errorf("the live view shows the MCP calls %v, want %v", got, want)
	}
}
