package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/coresim"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/internal/poll"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

// TestMain lets the test binary act as the toolsidecar process for the
// subprocess tests.
func TestMain(m *testing.M) {
	if os.Getenv("TOOLSIDECAR_TEST_DAEMON") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

func TestCheckAndTools(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"check", "--config", "../../config.yaml"}, &out, &errOut); code != 0 {
		t.Fatalf("check exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "get_flight_times  nats") || !strings.Contains(out.String(), "configuration valid: 3 tools") {
		t.Errorf("check output:\n%s", out.String())
	}
	out.Reset()
	if code := run([]string{"tools", "--config", "../../config.yaml"}, &out, &errOut); code != 0 {
		t.Fatalf("tools exit %d", code)
	}
	var tools []core.FunctionTool
	if err := json.Unmarshal(out.Bytes(), &tools); err != nil || len(tools) != 3 || tools[0].Type != "function" || tools[2].Function.Name != "search_hotels" {
		t.Fatalf("tools output %s: %v", out.String(), err)
	}
	dir := t.TempDir()
	for name, tc := range map[string]struct{ yaml, want string }{
		"duplicate": {"tools:\n  - {name: a}\n  - {name: a}\n", `tools[1].name: duplicate tool name "a"`},
		"route":     {"tools:\n  - {name: a, route: smoke}\n", `tools[0].route: unknown route "smoke"`},
		"schema":    {"tools:\n  - {name: a, parameters: {type: 12}}\n", "tools[0].parameters"},
		"key":       {"tools:\n  - {name: a, timeuot: 1s}\n", "timeuot"},
	} {
		p := filepath.Join(dir, name+".yaml")
		os.WriteFile(p, []byte(tc.yaml), 0o600)
		errOut.Reset()
		if code := run([]string{"check", "--config", p}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want 1 naming %q", name, code, errOut.String(), tc.want)
		}
	}
	if code := run([]string{"frobnicate"}, &out, &errOut); code != 2 {
		t.Errorf("unknown command exit %d", code)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
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
	natsAddr, httpAddr := freePort(t), freePort(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf(`core: {url: %q}
nats: {embedded: {listen: %q}}
server: {listen: %q, shutdown_timeout: 20s}
tools:
  - {name: slow, timeout: 10s}
`, srv.URL, natsAddr, httpAddr)), 0o600)

	cmd := exec.Command(os.Args[0], "run", "--config", cfgPath)
	cmd.Env = append(os.Environ(), "TOOLSIDECAR_TEST_DAEMON=1", "TOOLSIDECAR_CORE_API_KEY=k")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	base := "http://" + httpAddr
	poll.Until(t, "readiness", func() bool {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})

	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var started atomic.Int32
	w := worker.New(nc, "toolsidecar.tools")
	w.Handle("slow", func(ctx context.Context, c *tool.Call) ([]byte, error) {
		started.Add(1)
		time.Sleep(400 * time.Millisecond) // ignores cancellation: must not be needed
		return []byte(`"done ` + string(c.Args) + `"`), nil
	})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())

	ctx := context.Background()
	cc, _ := core.New(core.Config{URL: srv.URL, APIKey: "k"})
	a, _ := cc.CreateAssistant(ctx, core.AssistantCreate{Name: "a", Model: "vllm/x"})
	th, _ := cc.CreateThread(ctx)
	msg, _ := cc.CreateMessage(ctx, th.ID, a.ID, "go")
	run, _ := cc.CreateRun(ctx, core.RunCreate{AssistantID: a.ID, ThreadID: th.ID})
	body, _ := json.Marshal(map[string]string{"thread_id": th.ID, "assistant_id": a.ID, "message_id": msg.ID, "model": "vllm/x"})
	type result struct {
		sum executor.Summary
		err error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.Post(base+"/v1/runs/"+run.ID+"/drive", "application/json", bytes.NewReader(body))
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		var s executor.Summary
		done <- result{s, json.NewDecoder(resp.Body).Decode(&s)}
	}()
	poll.Until(t, "the batch to start", func() bool { return started.Load() == 3 })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatalf("drive: %v\n%s", res.err, stderr.String())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("process exit: %v\n%s", err, stderr.String())
	}
	if res.sum.Status != executor.StatusInterrupted || len(res.sum.Calls) != 3 {
		t.Fatalf("summary %+v", res.sum)
	}
	for _, c := range res.sum.Calls {
		if !c.OK || !c.Submitted {
			t.Errorf("call %+v not finished and submitted", c)
		}
	}
	msgs := sim.ToolMessages(th.ID)
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
	if !strings.Contains(stderr.String(), `"msg":"toolsidecar stopped"`) {
		t.Errorf("no clean stop in the log:\n%s", stderr.String())
	}
	if strings.Contains(stderr.String(), `"k"`) {
		t.Error("the API key appears in the log")
	}
}

// syncBuffer is a bytes.Buffer safe for the process's writer goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
