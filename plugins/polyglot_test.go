package plugins_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/plugins"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/wire"
	"github.com/projectdavid/toolsidecar/worker"
)

// startNodeWorker runs the Node example worker as the test worker user.
func startNodeWorker(t *testing.T, natsURL, password string) {
	t.Helper()
	script, _ := filepath.Abs("node/dist/examples/worker.js")
	if _, err := os.Stat(script); err != nil {
		t.Fatalf("%s missing: build the Node worker first (make node-build): %v", script, err)
	}
	cmd := exec.Command("node", script)
	cmd.Env = append(os.Environ(), "NATS_URL="+natsURL, "TOOLSIDECAR_PREFIX="+testenv.Prefix,
		"NATS_USER="+testenv.WorkerUser, "NATS_PASSWORD="+password)
	testenv.StartProcess(t, cmd, "ready")
}

// TestPolyglotBatch: one batch served at once by a Go worker, a Node
// worker, an exec tool (Python, standard library) and an http tool; every
// outcome is submitted in call order.
func TestPolyglotBatch(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m struct {
			Args struct{ City string } `json:"args"`
		}
		json.NewDecoder(r.Body).Decode(&m)
		io.WriteString(w, `{"forecast": "sunny", "city": "`+m.Args.City+`", "served_by": "http"}`)
	}))
	defer api.Close()
	script, _ := filepath.Abs("python/examples/exec_tool.py")
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{
			{Tool: "convert_currency", ArgsJSON: `{"usd": 100}`},
			{Tool: "get_hotel_rates", ArgsJSON: `{"city": "New York", "nights": 2}`},
			{Tool: "get_flight_times", ArgsJSON: `{"departure": "SFO", "arrival": "ORD"}`},
			{Tool: "get_weather", ArgsJSON: `{"city": "Boston"}`},
		}},
		{Content: "{{results}}"},
	}}
	env := testenv.New(t, sc,
		testenv.Tool{Config: config.Tool{Name: "convert_currency"}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
			return []byte(`{"eur": 92, "served_by": "go"}`), nil
		}},
		testenv.Tool{Config: config.Tool{Name: "get_hotel_rates"}}, // served by the Node worker
		testenv.Tool{Config: config.Tool{Name: "get_flight_times", Route: "exec", Settings: map[string]any{"exec": map[string]any{"command": []any{"python3", script}}}}},
		testenv.Tool{Config: config.Tool{Name: "get_weather", Route: "http", Settings: map[string]any{"http": map[string]any{"url": api.URL}}}},
	)
	startNodeWorker(t, env.NATSURL, env.WorkerPassword)
	run := env.NewRun()
	_, msgs := env.DriveWhole(run, 4)
	testenv.AssertOutputs(t, msgs, `"served_by": "go"`, `"served_by":"node"`, `"route": "SFO-ORD"`, `"served_by": "http"`)
}

// pythonWithNATS reports whether python3 can import nats-py's micro API
// (with the test's PYTHONPATH): the Python worker needs it.
func pythonWithNATS() bool {
	return exec.Command("python3", "-c", "import nats.micro").Run() == nil
}

// TestDeclaredInEveryLanguage: a Go, a Node and a Python worker each
// declare a tool only in their code, and the sidecar has no entry for
// any: it discovers all three, lists each as its worker's, and runs a
// batch calling them. The nats.go micro API finds the three services under
// one name. The Python worker needs nats-py, which CI's machine has no
// index to install from; there the test still checks that the Python
// example's declaration, as the library prints it, is one the sidecar
// compiles, and logs that the Python worker was left out.
func TestDeclaredInEveryLanguage(t *testing.T) {
	url := natstest.Start(t)
	withPython := pythonWithNATS()
	calls := []coresim.Call{
		{Tool: "convert_currency", ArgsJSON: `{"usd": 100}`},
		{Tool: "get_hotel_rates", ArgsJSON: `{"city": "New York", "nights": 2}`},
	}
	want := map[string]string{"convert_currency": "go", "get_hotel_rates": "node"}
	if withPython {
		calls = append(calls, coresim.Call{Tool: "get_weather", ArgsJSON: `{"city": "Boston"}`})
		want["get_weather"] = "python"
	} else {
		t.Log("the Python worker is left out: nats-py is not importable here (set PYTHONPATH to nats-py's nats/src)")
	}
	env := testenv.Start(t, coresim.Scenario{Turns: []coresim.Turn{{Calls: calls}, {Content: "{{results}}"}}},
		testenv.Options{NATS: func(n *config.NATS) { n.URL, n.DiscoverInterval = url, 100*time.Millisecond }})

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	w := worker.New(nc, testenv.Prefix)
	type convert struct {
		USD float64 `json:"usd" jsonschema:"the amount in US dollars"`
	}
	if err := worker.Declare(w, "convert_currency", worker.Spec{Description: "Dollars to euros", SideEffects: tool.ReadOnly},
		func(_ context.Context, _ *tool.Call, a convert) (map[string]any, error) {
			return map[string]any{"eur": a.USD * 0.92, "served_by": "go"}, nil
		}); err != nil {
		t.Fatal(err)
	}
	natstest.Serve(t, w)
	workerEnv := append(os.Environ(), "NATS_URL="+url, "TOOLSIDECAR_PREFIX="+testenv.Prefix)
	node, _ := filepath.Abs("node/dist/examples/worker.js")
	nodeCmd := exec.Command("node", node)
	nodeCmd.Env = workerEnv
	testenv.StartProcess(t, nodeCmd, "ready")
	if withPython {
		pyCmd := exec.Command("python3", "python/examples/nats_worker.py")
		pyCmd.Env = workerEnv
		testenv.StartProcess(t, pyCmd, "ready")
	}

	tools := testenv.WaitDeclared(t, env.URL, want)
	for name := range want {
		if tools[name].Source != "worker" || tools[name].Function.Description == "" || len(tools[name].Function.Parameters) < 20 {
			t.Errorf("%s listed as %+v", name, tools[name])
		}
	}
	_, msgs := env.DriveWhole(env.NewRun(), len(calls))
	outputs := []string{`"served_by":"go"`, `"served_by":"node"`, `"served_by": "python"`}
	testenv.AssertOutputs(t, msgs, outputs[:len(calls)]...)

	// `nats micro stats toolsidecar-worker`, through the nats.go micro API.
	stats, err := micro.ControlSubject(micro.StatsVerb, wire.ServiceName, "")
	if err != nil {
		t.Fatal(err)
	}
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(stats, inbox, nil); err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for len(served) < len(calls) {
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			t.Fatalf("micro stats of %s: %d services answered with the tools %v: %v", wire.ServiceName, len(served), served, err)
		}
		var s micro.Stats
		if err := json.Unmarshal(m.Data, &s); err != nil || s.Name != wire.ServiceName {
			t.Fatalf("stats %s: %v", m.Data, err)
		}
		for _, e := range s.Endpoints {
			if e.NumRequests > 0 {
				served[e.Name] = true
			}
		}
	}
	for _, c := range calls {
		if !served[c.Tool] {
			t.Errorf("micro stats: no service of %s counts a call of %s: %v", wire.ServiceName, c.Tool, served)
		}
	}
}

// TestPythonDeclarationCompiles: the Python example's declaration, as the
// library prints it for its endpoint's metadata, is one the sidecar reads
// and compiles (this runs where nats-py is missing too: declaring needs
// only the standard library).
func TestPythonDeclarationCompiles(t *testing.T) {
	cmd := exec.Command("python3", "-c", "import sys; sys.path.insert(0, 'python/examples'); import nats_worker; print(nats_worker.get_weather.declaration())")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	d, err := tool.ParseDeclaration("get_weather", out)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	reg, err := registry.New(context.Background(), cfg, plugins.Kinds(registry.Base(nil), plugins.Options{}),
		registry.Declared{Name: "get_weather", Declaration: d, By: []string{"python worker test"}})
	if err != nil {
		t.Fatal(err)
	}
	tl, _ := reg.Lookup("get_weather")
	if tl.SideEffects != config.ReadOnly || tl.Timeout != 10*time.Second || tl.Validate(json.RawMessage(`{"city": "Boston"}`)) != nil ||
		tl.Validate(json.RawMessage(`{"town": "Boston"}`)) == nil {
		t.Errorf("compiled %+v: want read_only, 10s, city required and nothing else", tl)
	}
}

// TestDeclaringWorkerKilled: the only worker of a tool declared in code
// (the Node example) is killed with SIGKILL. The sidecar stops serving the
// tool at its next look, and a run that calls it then gets a not_found
// outcome at once, submitted, its Action finalised, beside a call that
// succeeds. RELIABILITY.md records the time to the tool's removal.
func TestDeclaringWorkerKilled(t *testing.T) {
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "get_hotel_rates", ArgsJSON: `{"city": "Oslo"}`}, {Tool: "echo", ArgsJSON: `{"x": 1}`}}},
		{Content: "{{results}}"},
	}}
	env := testenv.Start(t, sc, testenv.Options{NATS: func(n *config.NATS) { n.DiscoverInterval = 100 * time.Millisecond }},
		testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo})
	node, _ := filepath.Abs("node/dist/examples/worker.js")
	cmd := exec.Command("node", node)
	cmd.Env = append(os.Environ(), "NATS_URL="+env.NATSURL, "TOOLSIDECAR_PREFIX="+testenv.Prefix,
		"NATS_USER="+testenv.WorkerUser, "NATS_PASSWORD="+env.WorkerPassword)
	testenv.StartProcess(t, cmd, "ready")
	testenv.WaitDeclared(t, env.URL, map[string]string{"get_hotel_rates": "node"})

	killed := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "get_hotel_rates gone with its worker", func() bool {
		_, listed := testenv.SourcedTools(t, env.URL)["get_hotel_rates"]
		return !listed
	})
	t.Logf("the tool left the registry %v after its last worker was killed (discover_interval 100ms)", time.Since(killed).Round(time.Millisecond))
	r := env.NewRun()
	sum, msgs := env.DriveWhole(r, 2)
	if len(sum.Calls) != 2 || sum.Calls[0].OK || sum.Calls[0].Attempts != 0 || !sum.Calls[1].OK {
		t.Errorf("calls %+v: want get_hotel_rates not dispatched, echo run", sum.Calls)
	}
	testenv.AssertOutputs(t, msgs, `not_found`, `"x"`)
}
