package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/projectdavid/toolsidecar/coresim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/wire"
)

// TestShippedConfigServesTheExampleWorkers: the daemon on the shipped
// config.yaml (only its addresses, store folder and Core's URL changed)
// issues the worker credentials, and the Go and Node example workers,
// started with nothing but the variable naming that file, connect to a
// server that refuses anonymous clients; a run's call then reaches the Go
// one. Without the variable, pointed at this server by NATS_URL alone, a
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
		{Calls: []coresim.Call{{Tool: "get_flight_times", ArgsJSON: `{"departure": "LHR", "arrival": "JFK"}`}}},
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

	run, msgID := newRun(t, srv.URL)
	res := <-p.drive(run, msgID)
	if res.err != nil || res.sum.Status != "completed" || len(res.sum.Calls) != 1 || !res.sum.Calls[0].OK {
		t.Fatalf("drive: %v %+v\n%s", res.err, res.sum, p.stderr.String())
	}
	msgs := sim.ToolMessages(run.ThreadID)
	if len(msgs) != 1 || !strings.Contains(msgs[0].Content, `"route":"LHR-JFK"`) {
		t.Fatalf("tool messages %+v", msgs)
	}
}
