package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/wire"
)

// TestShippedConfigServesTheExampleWorkers: the daemon on the shipped
// config.yaml (only its addresses, store folder and Core's URL changed)
// issues the worker credentials, and the Go and Node example workers,
// started with nothing but the variable naming that file, connect to a
// server that refuses anonymous clients. Each declares its tool in its
// code: the Go one get_flight_times, whose entry in the file only sets
// policies, the Node one get_hotel_rates, which the file does not name.
// The daemon lists both as declared and a batch calling both reaches
// them. Without the variable, pointed at this server by NATS_URL alone, a
// worker is refused.
func TestShippedConfigServesTheExampleWorkers(t *testing.T) {
	node, err := filepath.Abs("../../plugins/node/dist/examples/worker.js")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(node); err != nil {
		t.Fatalf("%s missing: build the Node worker first (make node-build): %v", node, err)
	}
	goWorker := filepath.Join(t.TempDir(), "go-worker")
	if out, err := exec.Command("go", "build", "-o", goWorker, "../../examples/go-worker").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	sim, srv := coresim.NewServer(coresim.Config{APIKey: "k", Scenario: coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "get_flight_times", ArgsJSON: `{"departure": "LHR", "arrival": "JFK"}`},
			{Tool: "get_hotel_rates", ArgsJSON: `{"city": "Lisbon"}`}}},
		{Content: "five and a half hours"},
	}}})
	defer srv.Close()
	natsAddr, httpAddr, store := testenv.FreeAddr(t), testenv.FreeAddr(t), t.TempDir()
	p := &daemonProc{base: "http://" + httpAddr, natsURL: "nats://" + natsAddr}
	p.args = []string{"run", "--config", "../../config.yaml", "--set", "nats.embedded.listen=" + natsAddr, "--set", "nats.embedded.store_dir=" + store,
		"--set", "server.listen=" + httpAddr, "--set", "core.url=" + srv.URL}
	p.start(t)
	creds := filepath.Join(store, wire.CredentialsFile)
	if info, err := os.Stat(creds); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file: %v %v", info, err)
	}
	if !strings.Contains(p.stderr.String(), creds) {
		t.Errorf("the log does not name %s", creds)
	}
	// Only what a shell would pass on, without NATS_* or the variable.
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "NATS_") || strings.HasPrefix(kv, wire.CredentialsEnv+"=")
	})
	refused := exec.Command(goWorker)
	refused.Env = append(slices.Clone(env), "NATS_URL="+p.natsURL)
	if out, err := refused.CombinedOutput(); err == nil || !strings.Contains(string(out), "Authorization Violation") {
		t.Errorf("a worker without credentials: %v %s", err, out)
	}
	withCreds := append(slices.Clone(env), wire.CredentialsEnv+"="+creds)
	goCmd, nodeCmd := exec.Command(goWorker), exec.Command("node", node)
	goCmd.Env, nodeCmd.Env = withCreds, withCreds
	testenv.StartProcess(t, goCmd, `"msg":"serving"`)
	testenv.StartProcess(t, nodeCmd, "ready")

	tools := testenv.WaitDeclared(t, p.base, map[string]string{"get_flight_times": "go", "get_hotel_rates": "node"})
	if f := tools["get_flight_times"]; f.Source != "config+worker" || !strings.Contains(string(f.Function.Parameters), `"pattern":"^[A-Z]{3}$"`) {
		t.Errorf("get_flight_times listed as %+v: want the worker's schema under the file's policies", f)
	}
	if h := tools["get_hotel_rates"]; h.Source != "worker" || h.Function.Description != "Hotel rates in a city" {
		t.Errorf("get_hotel_rates listed as %+v", h)
	}

	run, msgID := newRun(t, srv.URL)
	res := <-p.drive(run, msgID)
	if res.err != nil || res.sum.Status != "completed" || len(res.sum.Calls) != 2 || !res.sum.Calls[0].OK || !res.sum.Calls[1].OK {
		t.Fatalf("drive: %v %+v\n%s", res.err, res.sum, p.stderr.String())
	}
	msgs := sim.ToolMessages(run.ThreadID)
	if len(msgs) != 2 || !strings.Contains(msgs[0].Content, `"route":"LHR-JFK"`) || !strings.Contains(msgs[1].Content, `"city":"Lisbon","nights":1`) {
		t.Fatalf("tool messages %+v", msgs)
	}
}
