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

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/coresim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
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
