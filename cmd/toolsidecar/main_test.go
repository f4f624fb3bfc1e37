package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/matrix"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// TestMain lets the test binary act as the toolsidecar process for the
// subprocess tests.
func TestMain(m *testing.M) {
	matrix.Main()
	if os.Getenv("TSC_TEST_DAEMON") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

func TestCheckAndTools(t *testing.T) {
	// check and tools ask a sidecar running at the config's server.listen:
	// none runs at a free address, whatever else runs on the machine (the
	// README's test serves the shipped config's 127.0.0.1:8741).
	away := "server.listen=" + testenv.FreeAddr(t)
	var out, errOut bytes.Buffer
	if code := run([]string{"check", "--config", "../../config.yaml", "--set", away}, &out, &errOut); code != 0 {
		t.Fatalf("check exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "get_flight_times  config  nats") || !strings.Contains(out.String(), "configuration valid: 4 tools") {
		t.Errorf("check output:\n%s", out.String())
	}
	out.Reset()
	if code := run([]string{"tools", "--config", "../../config.yaml", "--set", away}, &out, &errOut); code != 0 {
		t.Fatalf("tools exit %d", code)
	}
	var tools []core.FunctionTool
	if err := json.Unmarshal(out.Bytes(), &tools); err != nil || len(tools) != 4 || tools[0].Type != "function" || tools[3].Function.Name != "search_hotels" {
		t.Fatalf("tools output %s: %v", out.String(), err)
	}
	dir := t.TempDir()
	// Claim-check on: the built-in read_tool_result is listed for the
	// assistant, after the configured tools.
	cc := filepath.Join(dir, "claim-check.yaml")
	os.WriteFile(cc, []byte("executor: {claim_check_bytes: 4096}\ntools:\n  - {name: report}\n"), 0o600)
	out.Reset()
	if code := run([]string{"tools", "--config", cc, "--set", away}, &out, &errOut); code != 0 {
		t.Fatalf("tools exit %d: %s", code, errOut.String())
	}
	tools = nil
	if err := json.Unmarshal(out.Bytes(), &tools); err != nil || len(tools) != 2 || tools[1].Function.Name != "read_tool_result" {
		t.Errorf("tools with claim-check %s: %v", out.String(), err)
	}
	for name, tc := range map[string]struct{ yaml, want string }{
		"duplicate": {"tools:\n  - {name: a}\n  - {name: a}\n", `tools[1].name: duplicate tool name "a"`},
		"route":     {"tools:\n  - {name: a, route: smoke}\n", `tools[0].route: unknown route "smoke"`},
		"schema":    {"tools:\n  - {name: a, parameters: {type: 12}}\n", "tools[0].parameters"},
		"key":       {"tools:\n  - {name: a, timeuot: 1s}\n", "line 2: tools[0].timeuot: unknown key (did you mean timeout?)"},
		"file":      {"core: {api_key_file: /no/such/key}\n", "core.api_key_file: open /no/such/key: no such file or directory"},
		"command":   {"tools:\n  - {name: a, route: exec, exec: {command: [no-such-binary-xyz]}}\n", `tools[0].exec.command: exec: "no-such-binary-xyz": executable file not found`},
		"listen":    {"server: {listen: garbage}\n", `line 1: server.listen: must be host:port`},
	} {
		p := filepath.Join(dir, name+".yaml")
		os.WriteFile(p, []byte(tc.yaml), 0o600)
		errOut.Reset()
		if code := run([]string{"check", "--config", p}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want 1 naming %q", name, code, errOut.String(), tc.want)
		}
	}
}

// TestConfigSchemaNotOfAnObject: a tools entry whose parameters are
// {"type": "string"} is a configuration error that check reports naming
// the tool and its key, and run refuses to start with the same text.
// Before, check passed the file and run panicked in the MCP server.
func TestConfigSchemaNotOfAnObject(t *testing.T) {
	p := newDaemonConfig(t, "http://127.0.0.1:1", "  - {name: ok}\n  - {name: stringy, parameters: {type: string}}\n")
	const want = `registry: invalid tool "stringy": tools[1].parameters: the schema's top must be of type "object" (a call's arguments are an object), not "string"`
	var out, errOut bytes.Buffer
	code := run([]string{"check", "--config", p.cfgPath}, &out, &errOut)
	if got := strings.TrimSpace(errOut.String()); code != 1 || got != "toolsidecar: "+want {
		t.Fatalf("check: exit %d, stderr %q; want 1 and %q", code, got, want)
	}
	cmd := exec.Command(os.Args[0], "run", "--config", p.cfgPath, "--log-format", "json")
	cmd.Env = append(os.Environ(), "TSC_TEST_DAEMON=1", "TOOLSIDECAR_CORE_API_KEY=k")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("run: %v, want exit 1; stderr:\n%s", err, stderr.String())
	}
	var failed []string
	for line := range strings.Lines(stderr.String()) {
		var rec struct{ Msg, Err string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "toolsidecar failed to start" {
			failed = append(failed, rec.Err)
		}
	}
	if len(failed) != 1 || failed[0] != want {
		t.Errorf("run logged %q, want it to fail to start with %q; stderr:\n%s", failed, want, stderr.String())
	}
}

// TestCLI: help lists every command and exits 0; each command has its own
// flags; stray arguments, a missing config for check and bad log flags are
// usage errors (exit 2) that say what to do; completion scripts come for
// bash, zsh and fish, and flags' values complete.
func TestCLI(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string // in stdout, or in stderr when code is not 0
		not  string // absent from the output
	}{
		{nil, 0, "Commands:", ""},
		{[]string{"--help"}, 0, "serve the exec and http tools", ""},
		{[]string{"-h"}, 0, "toolsidecar help COMMAND", ""},
		{[]string{"help"}, 0, "print the version, VCS revision", ""},
		{[]string{"help", "check"}, 0, "-config", "-log-format"},
		{[]string{"help", "run"}, 0, "-log-format", ""},
		{[]string{"help", "nope"}, 2, `unknown command "nope"`, ""},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`, ""},
		{[]string{"check", "config.yaml"}, 2, `unexpected argument "config.yaml" (did you mean --config config.yaml?)`, ""},
		{[]string{"check"}, 2, "--config FILE is required", ""},
		{[]string{"tools", "--log-level", "debug"}, 2, "toolsidecar tools: unknown flag: --log-level", ""},
		{[]string{"runs", "show"}, 2, "give one run id", ""},
		{[]string{"runs", "list", "-o", "yaml"}, 2, `--output "yaml" is not table or json`, ""},
		{[]string{"runs", "list", "--url", "ftp://x"}, 2, `--url "ftp://x" is not http(s)://host:port`, ""},
		{[]string{"completion", "bash"}, 0, "__start_toolsidecar", ""},
		{[]string{"completion", "zsh"}, 0, "#compdef toolsidecar", ""},
		{[]string{"completion", "fish"}, 0, "complete -c toolsidecar", ""},
		{[]string{"__complete", "run", "--log-level", ""}, 0, "debug\ninfo\nwarn\nerror", ""},
		{[]string{"run", "--log-format", "xml"}, 2, `--log-format: "xml" is not json or text`, ""},
		{[]string{"run", "--log-level", "loud"}, 2, "--log-level", ""},
		{[]string{"demo", "extra"}, 2, `unexpected argument "extra"`, ""},
	} {
		var out, errOut bytes.Buffer
		code := run(tc.args, &out, &errOut)
		got := out.String()
		if tc.code != 0 {
			got = errOut.String()
		}
		if code != tc.code || !strings.Contains(got, tc.out) || (tc.not != "" && strings.Contains(got, tc.not)) {
			t.Errorf("toolsidecar %v: exit %d, output %q; want exit %d with %q", tc.args, code, got, tc.code, tc.out)
		}
	}
}

// TestConfigCommand: `toolsidecar config` shows each key's effective value
// and where it came from, with the credentials of URLs redacted.
func TestConfigCommand(t *testing.T) {
	t.Setenv("TOOLSIDECAR_EXECUTOR_MAX_TURNS", "4")
	path := filepath.Join(t.TempDir(), "config.yaml")
	os.WriteFile(path, []byte("core: {url: \"http://core:9000\"}\n"), 0o600)
	var out, errOut bytes.Buffer
	if code := run([]string{"config", "--config", path, "--set", "nats.url=nats://u:secretpw@h:4222"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	rows := map[string][]string{}
	for line := range strings.Lines(out.String()) {
		if f := strings.Fields(line); len(f) >= 3 {
			rows[f[0]] = f[1:]
		}
	}
	for key, want := range map[string]string{"executor.max_turns": "4 env", "nats.url": "nats://u:xxxxx@h:4222 flag",
		"core.url": "http://core:9000 file", "server.max_drives": "512 default"} {
		if got := strings.Join(rows[key], " "); got != want {
			t.Errorf("%s: %q, want %q", key, got, want)
		}
	}
	if strings.Contains(out.String(), "secretpw") {
		t.Error("a URL's password was printed")
	}
}

// TestVersion builds the binary with VCS stamping (as make build does) and
// with a link-time version (as the image does): each prints what it
// carries, the revision included.
func TestVersion(t *testing.T) {
	rev, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "toolsidecar")
	build := exec.Command("go", "build", "-buildvcs=true", "-ldflags", "-X github.com/projectdavid/toolsidecar/internal/version.Version=v9.9.9", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, arg := range []string{"--version", "version"} {
		out, err := exec.Command(bin, arg).Output()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(out), "toolsidecar v9.9.9 (revision "+strings.TrimSpace(string(rev))) || !strings.Contains(string(out), runtime.Version()) {
			t.Errorf("%s printed %q, want v9.9.9, revision %s and %s", arg, out, rev, runtime.Version())
		}
	}
}

// daemonProc is the daemon run as a real process (this test binary, with
// TSC_TEST_DAEMON set), on fixed loopback ports so that a restart
// comes back where workers and clients expect it.
type daemonProc struct {
	cfgPath, base, natsURL string
	args                   []string // the command line; default: run --config cfgPath
	env                    []string // more environment: TOOLSIDECAR_ overrides
	cmd                    *exec.Cmd
	stderr                 *testenv.LogBuffer
}

// workerPassword is the password of the daemon's worker user "w".
const workerPassword = "worker-secret-8d1f"

func newDaemonConfig(t *testing.T, coreURL, tools string, extra ...string) *daemonProc {
	t.Helper()
	natsAddr, httpAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	dir := t.TempDir()
	p := &daemonProc{cfgPath: filepath.Join(dir, "config.yaml"), base: "http://" + httpAddr, natsURL: "nats://" + natsAddr}
	pwFile := filepath.Join(dir, "worker-password")
	os.WriteFile(pwFile, []byte(workerPassword+"\n"), 0o600)
	os.WriteFile(p.cfgPath, []byte(fmt.Sprintf("core: {url: %q}\n"+
		"nats: {embedded: {listen: %q, store_dir: %q, workers: [{name: w, password_file: %q, tools: [\"*\"]}]}}\n"+
		"server: {listen: %q, shutdown_timeout: 20s}\n%stools:\n%s",
		coreURL, natsAddr, filepath.Join(dir, "store"), pwFile, httpAddr, strings.Join(extra, ""), tools)), 0o600)
	return p
}

// start runs the daemon and waits until it is ready.
func (p *daemonProc) start(t *testing.T) {
	t.Helper()
	args := p.args
	if args == nil {
		args = []string{"run", "--config", p.cfgPath}
	}
	p.cmd = exec.Command(os.Args[0], args...)
	p.cmd.Env = append(append(os.Environ(), "TSC_TEST_DAEMON=1", "TOOLSIDECAR_CORE_API_KEY=k"), p.env...)
	p.stderr = &testenv.LogBuffer{}
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd := p.cmd
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(poll.Timeout); ; time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get(p.base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon was not ready after %s (last: %v); its log:\n%s", poll.Timeout, err, p.stderr.String())
		}
	}
}

// callsDone is how many calls of the named tool the daemon has seen end
// (toolsidecar_calls_total): their outcome is known to it, and, in durable
// mode, on its way to the ledger.
func (p *daemonProc) callsDone(t *testing.T, name string) int {
	t.Helper()
	resp, err := http.Get(p.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	n := 0
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "toolsidecar_calls_total{") && strings.Contains(line, `tool="`+name+`"`) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			n += int(v)
		}
	}
	return n
}

// settled waits until every execution of the named tools that returned
// has ended its call in the daemon, and a little more, so that a kill
// that follows finds the outcomes stored (an outcome written into the
// socket of a process that dies is lost: the read-only call then runs
// again, as it may, and the unsafe one is interrupted).
func (p *daemonProc) settled(t *testing.T, tools *matrix.Served, names ...string) {
	t.Helper()
	poll.Until(t, "the tools that returned to end their calls", func() bool {
		for _, name := range names {
			if int(tools.Done(name)) > p.callsDone(t, name) {
				return false
			}
		}
		return true
	})
	time.Sleep(50 * time.Millisecond)
}

type driveResult struct {
	sum executor.Summary
	err error
}

// drive posts a JSON drive of the run and delivers its summary.
func (p *daemonProc) drive(r core.Run, msgID string) <-chan driveResult {
	done := make(chan driveResult, 1)
	body, _ := json.Marshal(map[string]string{"thread_id": r.ThreadID, "assistant_id": r.AssistantID, "message_id": msgID, "model": "vllm/x"})
	go func() {
		resp, err := http.Post(p.base+"/v1/runs/"+r.ID+"/drive", "application/json", bytes.NewReader(body))
		if err != nil {
			done <- driveResult{err: err}
			return
		}
		defer resp.Body.Close()
		var s executor.Summary
		done <- driveResult{s, json.NewDecoder(resp.Body).Decode(&s)}
	}()
	return done
}

// newRun sets a run up on the simulator as an application does.
func newRun(t *testing.T, coreURL string) (core.Run, string) {
	t.Helper()
	cc, _ := core.New(core.Config{URL: coreURL, APIKey: "k"})
	r := testenv.SetUpRun(t, cc, nil)
	return core.Run{ID: r.RunID, ThreadID: r.ThreadID, AssistantID: r.AssistantID}, r.MessageID
}

// startWorker serves handlers from a connection that reconnects for ever,
// as a worker process beside a restarting sidecar does.
func startWorker(t *testing.T, natsURL string, handlers map[string]tool.Handler) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(natsURL, nats.UserInfo("w", workerPassword), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	natstest.WorkerOn(t, nc, "toolsidecar.tools", handlers)
	return nc
}

// TestSIGTERMDrainsBatch starts the daemon as a real process, sends SIGTERM
// while a batch runs, and checks that the batch finished and was submitted
// before the process exited 0, and that no further turn was requested.
func TestSIGTERMDrainsBatch(t *testing.T) {
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "slow", ArgsJSON: `{"n": 1}`}, {Tool: "slow", ArgsJSON: `{"n": 2}`}, {Tool: "slow", ArgsJSON: `{"n": 3}`}}},
		{Content: "never reached"},
	}}
	sim, srv := coresim.NewServer(coresim.Config{APIKey: "k", Scenario: sc})
	defer srv.Close()
	p := newDaemonConfig(t, srv.URL, "  - {name: slow, timeout: 10s}\n")
	p.start(t)
	var started atomic.Int32
	startWorker(t, p.natsURL, map[string]tool.Handler{"slow": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		started.Add(1)
		time.Sleep(400 * time.Millisecond) // ignores cancellation: must not be needed
		return []byte(`"done ` + string(c.Args) + `"`), nil
	}})
	run, msgID := newRun(t, srv.URL)
	done := p.drive(run, msgID)
	poll.Until(t, "the batch to start", func() bool { return started.Load() == 3 })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatalf("drive: %v\n%s", res.err, p.stderr.String())
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("process exit: %v\n%s", err, p.stderr.String())
	}
	if res.sum.Status != executor.StatusInterrupted || len(res.sum.Calls) != 3 {
		t.Fatalf("summary %+v", res.sum)
	}
	for _, c := range res.sum.Calls {
		if !c.OK || !c.Submitted {
			t.Errorf("call %+v not finished and submitted", c)
		}
	}
	msgs := sim.ToolMessages(run.ThreadID)
	acts := sim.Actions(run.ID)
	if len(msgs) != 3 || len(acts) != 3 {
		t.Fatalf("%d tool messages, %d actions", len(msgs), len(acts))
	}
	for _, a := range acts {
		if a.Status != core.ActionCompleted {
			t.Errorf("action %s %s", a.ID, a.Status)
		}
	}
	if n := sim.CountRequests("POST", "/v1/completions"); n != 1 {
		t.Errorf("%d completions requests, want 1", n)
	}
	if v := sim.Violations(); len(v) != 0 {
		t.Errorf("violations %v", v)
	}
	if !strings.Contains(p.stderr.String(), `"msg":"toolsidecar stopped"`) {
		t.Errorf("no clean stop in the log:\n%s", p.stderr.String())
	}
	if strings.Contains(p.stderr.String(), `"k"`) {
		t.Error("the API key appears in the log")
	}
}

// TestSIGTERMPastShutdownTimeout: a graceful stop is never worse than a
// crash. The tools of a batch (a read-only call and an unsafe one) outlast
// server.shutdown_timeout; past it the sidecar writes nothing more for
// them, tells no worker to stop, and exits 0, the drive answering
// "interrupted". Their Actions stay open, as a SIGKILL would leave them,
// the tools finish while the sidecar is away, and the next drive submits
// their real results: each ran once. Before, both were finalised
// cancelled at the deadline, and the unsafe call's effect was lost.
//
// Without durability the next drive does what it does after a SIGKILL: the
// read-only call runs again, the unsafe one is not run a second time and
// gets an "interrupted" outcome.
func TestSIGTERMPastShutdownTimeout(t *testing.T) {
	t.Run("durable", func(t *testing.T) { sigtermPastShutdownTimeout(t, "", 1, `"pay done"`) })
	t.Run("not durable", func(t *testing.T) {
		sigtermPastShutdownTimeout(t, "durability: {enabled: false}\n", 2, `"error_type":"interrupted"`)
	})
}

func sigtermPastShutdownTimeout(t *testing.T, extra string, wantLooks int32, wantPay string) {
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "look", ArgsJSON: `{}`}, {Tool: "pay", ArgsJSON: `{}`}}},
		{Content: "answer: {{results}}"},
	}}
	sim, srv := coresim.NewServer(coresim.Config{APIKey: "k", Scenario: sc})
	defer srv.Close()
	p := newDaemonConfig(t, srv.URL, "  - {name: look, side_effects: read_only, timeout: 30s}\n  - {name: pay, side_effects: unsafe, timeout: 30s}\n", extra)
	p.env = []string{"TOOLSIDECAR_SERVER_SHUTDOWN_TIMEOUT=500ms"}
	p.start(t)
	var looks, pays, cancelled atomic.Int32
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	defer release()
	block := func(n *atomic.Int32) tool.Handler {
		return func(ctx context.Context, c *tool.Call) ([]byte, error) {
			n.Add(1)
			select {
			case <-hold:
			case <-ctx.Done(): // a cancellation published by the sidecar
				cancelled.Add(1)
				<-hold
			}
			return []byte(`"` + c.Tool + ` done"`), nil
		}
	}
	nc := startWorker(t, p.natsURL, map[string]tool.Handler{"look": block(&looks), "pay": block(&pays)})
	run, msgID := newRun(t, srv.URL)
	first := p.drive(run, msgID)
	poll.Until(t, "both calls to run", func() bool { return looks.Load() == 1 && pays.Load() == 1 })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	res := <-first
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("process exit: %v\n%s", err, p.stderr.String())
	}
	if res.err != nil || res.sum.Status != executor.StatusInterrupted {
		t.Fatalf("the first drive %+v %v, want interrupted", res.sum, res.err)
	}
	if n := cancelled.Load(); n != 0 {
		t.Errorf("%d calls were cancelled in their workers; a crash cancels none", n)
	}
	if msgs := sim.ToolMessages(run.ThreadID); len(msgs) != 0 {
		t.Errorf("outputs written past the deadline: %v", msgs)
	}
	for _, a := range sim.Actions(run.ID) {
		if a.Status != core.ActionProcessing {
			t.Errorf("Action %s (%s) is %s after the stop, want processing, as a crash leaves it", a.ID, a.ToolName, a.Status)
		}
	}
	release() // the tools finish while the sidecar is away
	p.start(t)
	testenv.WaitLive(t, p.base, "look", "pay")
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	again := <-p.drive(run, msgID)
	if again.err != nil || again.sum.Status != executor.StatusCompleted {
		t.Fatalf("the second drive %+v %v\n%s", again.sum, again.err, p.stderr.String())
	}
	if pays.Load() != 1 || looks.Load() != wantLooks {
		t.Errorf("pay ran %d times, look %d; want 1 and %d", pays.Load(), looks.Load(), wantLooks)
	}
	testenv.AssertWholeBatches(t, sim, testenv.Run{RunID: run.ID, ThreadID: run.ThreadID}, 2)
	if msgs := sim.ToolMessages(run.ThreadID); !strings.Contains(msgs[1].Content, wantPay) {
		t.Errorf("the unsafe call's output %s, want it to contain %s", msgs[1].Content, wantPay)
	}
}

// killPoint is where in a batch of a read-only call (look) and an unsafe
// one (pay) the sidecar process is killed with SIGKILL.
type killPoint struct {
	name string
	// fault parks the sidecar at the point: a request to Core that hangs
	// (hit is called when it arrives); nil for a kill while the tools run.
	fault *coresim.Fault
	// hits is how many parked requests mean the sidecar is there.
	hits int
	// afterStart arms the fault once both tools have started (their
	// Actions are processing), so that it catches the final status only.
	afterStart bool
}

// TestSIGKILLMidBatch: the sidecar is killed with SIGKILL at several points
// of a batch, started again, and asked to drive the run again, with the
// tools on every route kind (make test runs a sample, make soak all). In
// durable mode (the default) nothing is lost and nothing runs twice: each
// tool ran once, its real result is the output (a reply that came while
// the sidecar was away was captured by JetStream; an outcome known before
// the kill was stored in the ledger, whatever the route; a call that never
// left is run now; an output already in Core is not posted again). A call
// in flight in the sidecar's own process (exec, http, mcp) dies with it:
// the read-only call runs again and the unsafe one, not run a second
// time, gets an "interrupted" outcome, as every call does without
// durability. Either way the run completes with exactly one output per
// call, every Action finalised, and an empty contract log. Each cell
// repeats testenv.SoakReps() times; make soak runs 20.
func TestSIGKILLMidBatch(t *testing.T) {
	park := func(method, path string, store bool, times int) *coresim.Fault {
		return &coresim.Fault{Method: method, Path: path, Store: store, Delay: time.Minute, Times: times}
	}
	for i, tc := range []struct {
		kill  killPoint
		extra string
		// inFlight: the kill comes while the tools run, so a call in the
		// sidecar's process loses its reply; lost: every reply is lost
		// (no durability).
		inFlight, lost bool
	}{
		{kill: killPoint{name: "before dispatch", fault: park("PUT", "/v1/actions/", true, 2), hits: 2}},
		{kill: killPoint{name: "during the tool"}, inFlight: true},
		{kill: killPoint{name: "after the reply", fault: park("POST", "/v1/messages/tools", false, 2), hits: 1}},
		{kill: killPoint{name: "between output and action", fault: park("PUT", "/v1/actions/", false, 2), hits: 1, afterStart: true}},
		{kill: killPoint{name: "during the tool, not durable"}, extra: "durability: {enabled: false}\n", inFlight: true, lost: true},
	} {
		for _, route := range matrix.Routes(i) {
			t.Run(tc.kill.name+"/route="+route, func(t *testing.T) {
				lost := tc.lost || (tc.inFlight && matrix.InProcess(route))
				looks, pay := int32(1), `"pay done"`
				if lost {
					looks, pay = 2, `"error_type":"interrupted"`
				}
				for i := range testenv.SoakReps() {
					resume := sigkillMidBatch(t, tc.kill, route, tc.extra, looks, pay)
					t.Logf("FAULT sigkill/%s/route=%s rep=%d resume_ms=%d", strings.ReplaceAll(tc.kill.name, " ", "_"), route, i, resume.Milliseconds())
					if t.Failed() {
						return
					}
				}
			})
		}
	}
}

// sigkillMidBatch runs one kill at kp, with the tools on route, and
// returns the time from the restart to the run's completion.
func sigkillMidBatch(t *testing.T, kp killPoint, route, extra string, wantLooks int32, wantPay string) time.Duration {
	t.Helper()
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "look", ArgsJSON: `{}`}, {Tool: "pay", ArgsJSON: `{}`}}},
		{Content: "answer: {{results}}"},
	}}
	sim, srv := coresim.NewServer(coresim.Config{APIKey: "k", Scenario: sc})
	defer srv.Close()
	// The first execution of each tool waits for the test.
	tools := matrix.Serve(t, route, matrix.Tool{Name: "look", SideEffects: "read_only", Block: true},
		matrix.Tool{Name: "pay", SideEffects: "unsafe", Block: true})
	p := newDaemonConfig(t, srv.URL, tools.Config("10s"), extra)
	p.start(t)
	var nc *nats.Conn
	if hs := tools.Handlers(); hs != nil {
		nc = startWorker(t, p.natsURL, hs)
	}
	hits := make(chan struct{}, 4)
	arm := func() {
		f := *kp.fault
		f.Hit = func() { hits <- struct{}{} }
		sim.AddFault(f)
	}
	if kp.fault != nil && !kp.afterStart {
		arm()
	}
	run, msgID := newRun(t, srv.URL)
	first := p.drive(run, msgID)
	if kp.fault == nil || kp.afterStart {
		poll.Until(t, "both calls to run", func() bool { return tools.Count("look") == 1 && tools.Count("pay") == 1 })
	}
	if kp.fault != nil {
		if kp.afterStart {
			arm()
		}
		tools.Release() // the tools must not be what holds the sidecar
		for range kp.hits {
			select {
			case <-hits:
			case <-time.After(poll.Timeout):
				t.Fatalf("the sidecar never reached %q\n%s", kp.name, p.stderr.String())
			}
		}
		// The calls that ran have returned, and their outcomes have
		// reached the server (a reply written into the socket of a server
		// that dies is lost: then the unsafe call is interrupted, as
		// RELIABILITY.md says).
		// At every parked point the read-only call has been sent (beside
		// its processing mark, at the earliest).
		poll.Until(t, "the tools that ran to return", func() bool {
			return tools.Done("look") == 1 && tools.Count("look") == 1 && tools.Done("pay") == tools.Count("pay")
		})
		p.settled(t, tools, "look", "pay")
		if nc != nil {
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	if res := <-first; res.err == nil {
		t.Fatalf("the first drive survived SIGKILL: %+v", res.sum)
	}
	tools.Release() // calls still running finish while the sidecar is away; a worker's replies wait in its buffer
	sim.ClearFaults()

	restarted := time.Now()
	p.start(t)
	if nc != nil {
		testenv.WaitLive(t, p.base, "look", "pay") // the worker reconnected
		if err := nc.Flush(); err != nil {         // the buffered replies have reached the server
			t.Fatal(err)
		}
	}
	res := <-p.drive(run, msgID)
	resume := time.Since(restarted)
	if res.err != nil || res.sum.Status != executor.StatusCompleted {
		t.Fatalf("second drive %+v %v\n%s", res.sum, res.err, p.stderr.String())
	}
	if n := tools.Count("pay"); n != 1 {
		t.Errorf("the unsafe tool ran %d times, want 1", n)
	}
	if n := tools.Count("look"); n != wantLooks {
		t.Errorf("the read-only tool ran %d times, want %d", n, wantLooks)
	}
	testenv.AssertWholeBatches(t, sim, testenv.Run{RunID: run.ID, ThreadID: run.ThreadID}, 2)
	if msgs := sim.ToolMessages(run.ThreadID); !strings.Contains(msgs[1].Content, wantPay) {
		t.Errorf("the unsafe call's output %s, want it to contain %s", msgs[1].Content, wantPay)
	}
	if r, _ := sim.Run(run.ID); r.Status != core.RunCompleted {
		t.Errorf("Core's run is %s", r.Status)
	}
	return resume
}

// TestLeaseHolderKilled: two sidecar processes share an external NATS
// server with JetStream. A run driven through sidecar A is driven again
// through sidecar B, which follows A; A is killed with SIGKILL while the
// unsafe tool runs, and the tool finishes while no sidecar listens. Once
// A's lease expires, B takes the run over: the real result captured by
// JetStream is the output, each tool ran once, every Action is finalised.
func TestLeaseHolderKilled(t *testing.T) {
	for i := range testenv.SoakReps() {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Logf("FAULT lease_holder_sigkill rep=%d resume_ms=%d", i, leaseHolderKilled(t, false).Milliseconds())
		})
	}
}

// TestLeaseHolderRestarted: as TestLeaseHolderKilled, but the lease TTL
// is ten minutes and A is started again under its instance ID after the
// kill. Its new incarnation frees the run at once: B takes it over and
// completes it long before the TTL, each tool run once.
func TestLeaseHolderRestarted(t *testing.T) {
	for i := range testenv.SoakReps() {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Logf("FAULT lease_holder_restarted rep=%d resume_ms=%d", i, leaseHolderKilled(t, true).Milliseconds())
		})
	}
}

// leaseHolderKilled runs it once and returns the time from the kill (or,
// with restart, from A's restart) to the run's completion through B.
func leaseHolderKilled(t *testing.T, restart bool) time.Duration {
	ns, err := embedded.Start(embedded.Config{Listen: "127.0.0.1:-1", StoreDir: t.TempDir(), AllowAnonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "look", ArgsJSON: `{}`}, {Tool: "pay", ArgsJSON: `{}`}}},
		{Content: "answer: {{results}}"},
	}}
	sim, srv := coresim.NewServer(coresim.Config{APIKey: "k", Scenario: sc})
	defer srv.Close()
	ttl := "2s"
	if restart {
		ttl = "10m" // longer than the test may wait: only the restart frees the run
	}
	side := func(instance string) *daemonProc {
		http := testenv.FreeAddr(t)
		p := &daemonProc{cfgPath: filepath.Join(t.TempDir(), "config.yaml"), base: "http://" + http, natsURL: ns.ClientURL()}
		os.WriteFile(p.cfgPath, []byte(fmt.Sprintf("instance_id: %s\ncore: {url: %q}\nnats: {url: %q}\n"+
			"durability: {lease_ttl: %s}\nserver: {listen: %q}\n"+
			"tools:\n  - {name: look, side_effects: read_only, timeout: 10s}\n  - {name: pay, side_effects: unsafe, timeout: 10s}\n",
			instance, srv.URL, ns.ClientURL(), ttl, http)), 0o600)
		p.start(t)
		return p
	}
	a, b := side("sc-a"), side("sc-b")
	var looks, pays atomic.Int32
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	defer release()
	wnc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer wnc.Close()
	count := func(n *atomic.Int32) tool.Handler {
		return func(ctx context.Context, c *tool.Call) ([]byte, error) {
			n.Add(1)
			<-hold
			return []byte(`"` + c.Tool + ` done"`), nil
		}
	}
	natstest.WorkerOn(t, wnc, "toolsidecar.tools", map[string]tool.Handler{"look": count(&looks), "pay": count(&pays)})
	run, msgID := newRun(t, srv.URL)
	first := a.drive(run, msgID)
	poll.Until(t, "both calls to run", func() bool { return looks.Load() == 1 && pays.Load() == 1 })
	second := b.drive(run, msgID)
	poll.Until(t, "B to follow A", func() bool { return strings.Contains(b.stderr.String(), "run driven by another sidecar: following it") })
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	a.cmd.Wait()
	<-first
	killed := time.Now()
	release() // the tools finish while no sidecar listens; JetStream keeps the replies
	if restart {
		a.start(t)
		killed = time.Now()
	}
	var res driveResult
	select {
	case res = <-second:
	case <-time.After(poll.Timeout):
		t.Fatalf("B did not take the run over\n%s", b.stderr.String())
	}
	if res.err != nil || res.sum.Status != executor.StatusCompleted {
		t.Fatalf("B's drive %+v %v\n%s", res.sum, res.err, b.stderr.String())
	}
	resume := time.Since(killed)
	if pays.Load() != 1 || looks.Load() != 1 {
		t.Errorf("pay ran %d times, look %d; want each once", pays.Load(), looks.Load())
	}
	testenv.AssertWholeBatches(t, sim, testenv.Run{RunID: run.ID, ThreadID: run.ThreadID}, 2)
	if msgs := sim.ToolMessages(run.ThreadID); msgs[1].Content != `"pay done"` {
		t.Errorf("the unsafe call's output %s, want its real result", msgs[1].Content)
	}
	if r, _ := sim.Run(run.ID); r.Status != core.RunCompleted {
		t.Errorf("Core's run is %s", r.Status)
	}
	return resume
}
