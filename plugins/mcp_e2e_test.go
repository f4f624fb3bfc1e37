package plugins_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/plugins"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// An MCP server's tools, imported from YAML, run in a whole sidecar as one
// batch: the outputs reach Core in call order, an isError result is an
// error outcome the model reads, and a call kept alive by its progress
// outlives its timeout.
func TestMCPToolsEndToEnd(t *testing.T) {
	t.Cleanup(plugins.StopMCP)
	yaml := fmt.Sprintf(`tools:
  - name: test-server
    route: mcp
    timeout: 500ms
    mcp: {command: [%q, "-test.run=^$"], env: {TSC_TEST_MCP_SERVER: ""}, import: true, prefix: "srv_"}
`, os.Args[0])
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	sc := coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{
		{Tool: "srv_echo", ArgsJSON: `{"departure": "LAX"}`}, {Tool: "srv_fail", ArgsJSON: `{}`},
		{Tool: "srv_slow", ArgsJSON: `{}`}, {Tool: "srv_echo", ArgsJSON: `{"departure": "SFO"}`}}}, {Content: "{{results}}"}}}
	env := testenv.Start(t, sc, testenv.Options{Config: func(c *config.Config) { c.Tools = cfg.Tools }})
	resp, err := http.Get(env.URL + "/v1/tools")
	if err != nil {
		t.Fatal(err)
	}
	listed, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(listed), `"name":"srv_echo"`) || !strings.Contains(string(listed), "the test server's slow") {
		t.Fatalf("GET /v1/tools does not list the imported tools: %s", listed)
	}
	run := env.NewRun()
	sum, msgs := env.DriveWhole(run, 4)
	testenv.AssertOutputs(t, msgs, `{"echo": {"departure":"LAX"}}`, `"error_type":"tool_error"`, "done", `{"echo": {"departure":"SFO"}}`)
	for _, c := range sum.Calls {
		if c.Tool == "srv_slow" && (c.DurationMS < 1000 || !c.OK) {
			t.Errorf("srv_slow: %+v: it should run past its 500ms timeout, kept alive by progress", c)
		}
	}
}

// A configuration reload adds an MCP server, with its tools read from it,
// and removes it, with its tools, without a restart.
func TestMCPServersReloaded(t *testing.T) {
	t.Cleanup(plugins.StopMCP)
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	write := func(s string) { // atomically, as editors and Kubernetes write
		if err := os.WriteFile(path+".tmp", []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	plain := "tools:\n  - name: a\n"
	withServer := plain + fmt.Sprintf("  - name: test-server\n    route: mcp\n    mcp: {command: [%q, \"-test.run=^$\"], env: {TSC_TEST_MCP_SERVER: \"\"}, import: true, prefix: \"srv_\"}\n", os.Args[0])
	write(plain)
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.New(context.Background(), cfg, plugins.TestKinds)
	if err != nil {
		t.Fatal(err)
	}
	live := registry.NewLive(reg)
	r := registry.NewReloader(path, nil, cfg, live, prometheus.NewRegistry(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(ctx, 10*time.Millisecond, nil) })
	defer func() { cancel(); wg.Wait() }()

	write(withServer)
	poll.Until(t, "the server's tools", func() bool { _, ok := live.Load().Lookup("srv_echo"); return ok })
	if n := len(live.Load().Names()); n != 9 {
		t.Errorf("%d tools after the server was added, want a and the server's 8", n)
	}
	write(plain)
	poll.Until(t, "the server's tools gone", func() bool { return len(live.Load().Names()) == 1 })
}
