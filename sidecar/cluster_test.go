package sidecar_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/coresim"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/internal/natstest"
	"github.com/projectdavid/toolsidecar/internal/poll"
	"github.com/projectdavid/toolsidecar/internal/testenv"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

// The worker process of the cluster test: this test binary, started with
// TOOLSIDECAR_TEST_WORKER set to the NATS server list. Each execution
// appends "tool action_id" to the file TOOLSIDECAR_TEST_EXEC_LOG, so that
// the test counts executions across processes.
const (
	workerEnv  = "TOOLSIDECAR_TEST_WORKER"
	execLogEnv = "TOOLSIDECAR_TEST_EXEC_LOG"
)

// workerMain serves look and pay (400 ms each) until SIGTERM.
func workerMain() int {
	nc, err := nats.Connect(os.Getenv(workerEnv), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	defer nc.Close()
	log, err := os.OpenFile(os.Getenv(execLogEnv), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	defer log.Close()
	w := worker.New(nc, testenv.Prefix)
	h := func(ctx context.Context, c *tool.Call) ([]byte, error) {
		fmt.Fprintf(log, "%s %s\n", c.Tool, c.ActionID) // one write: atomic with O_APPEND
		select {
		case <-time.After(400 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return []byte(`"` + c.Tool + ` done"`), nil
	}
	w.Handle("look", h)
	w.Handle("pay", h)
	if err := w.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	<-sigs
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = w.Stop(ctx)
	return 0
}

// startWorkerProcess runs workerMain in a process of its own.
func startWorkerProcess(t *testing.T, urls, execLog string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerEnv+"="+urls, execLogEnv+"="+execLog)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
}

// executions reads the workers' log: how often each action ran, by tool.
func executions(t *testing.T, path string) (byAction map[string]int, total int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	byAction = map[string]int{}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) == 2 {
			byAction[f[0]+" "+f[1]]++
			total++
		}
	}
	return byAction, total
}

// TestClusterNodeLoss: a 3-node NATS cluster holds the ledger, the reply
// stream and the run leases at 3 replicas; 2 sidecars drive 6 runs (and
// each run is driven again through the other sidecar, as an application
// retrying against another replica does) with 2 worker processes. The
// node that leads the reply stream is shut down while the first batch
// runs. Every run completes with exactly one output per call and every
// Action finalised, and no unsafe call runs twice.
func TestClusterNodeLoss(t *testing.T) {
	cl := natstest.StartCluster(t, 3)
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "look", ArgsJSON: `{}`}, {Tool: "pay", ArgsJSON: `{}`}, {Tool: "look", ArgsJSON: `{"again":1}`}}},
		{Content: "done: {{results}}"}}}
	sim, srv := coresim.NewServer(coresim.Config{APIKey: testenv.APIKey, Scenario: sc})
	defer srv.Close()
	var sidecars []*sidecar.Sidecar
	for _, name := range []string{"sc-a", "sc-b"} {
		cfg, _ := testenv.Config(t, srv.URL, testenv.Options{}, []testenv.Tool{
			{Config: config.Tool{Name: "look", SideEffects: config.ReadOnly, Timeout: 5 * time.Second}},
			{Config: config.Tool{Name: "pay", SideEffects: config.Unsafe, Timeout: 5 * time.Second}}})
		cfg.NATS.URL, cfg.InstanceID = cl.URL(), name
		cfg.Durability.Replicas = 3
		sidecars = append(sidecars, startOn(t, cfg))
	}
	execLog := t.TempDir() + "/exec.log"
	startWorkerProcess(t, cl.URL(), execLog)
	startWorkerProcess(t, cl.URL(), execLog)
	cc, _ := core.New(core.Config{URL: srv.URL, APIKey: testenv.APIKey})
	poll.Until(t, "both workers to serve", func() bool {
		resp, err := http.Get("http://" + sidecars[0].Addr() + "/readyz?live=1")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), `"tools_live":["look","pay"]`)
	})

	const runs = 6
	type result struct {
		run testenv.Run
		sum executor.Summary
	}
	results := make(chan result, 2*runs)
	var all []testenv.Run
	for i := range runs {
		r := testenv.SetUpRun(t, cc, nil)
		all = append(all, r)
		for k := range 2 { // driven through both sidecars, the first one first
			s := sidecars[(i+k)%2]
			go func() { sum, _ := s.Drive(context.Background(), r.Request(), nil); results <- result{r, sum} }()
		}
	}
	poll.Until(t, "calls to be running", func() bool { _, n := executions(t, execLog); return n >= runs })
	victim := cl.StreamLeader(strings.ToUpper(testenv.Prefix) + "_REPLIES")
	if victim == nil {
		t.Fatal("no leader of the reply stream")
	}
	lost := time.Now()
	victim.Shutdown()
	for range 2 * runs {
		res := <-results
		if res.sum.Status != executor.StatusCompleted {
			t.Errorf("run %s: %s (%s)", res.run.RunID, res.sum.Status, res.sum.Error)
		}
	}
	t.Logf("all runs completed %s after the node loss", time.Since(lost).Round(time.Millisecond))
	byAction, total := executions(t, execLog)
	for key, n := range byAction {
		if strings.HasPrefix(key, "pay ") && n != 1 {
			t.Errorf("unsafe call %s ran %d times", key, n)
		}
	}
	for _, r := range all {
		acts, msgs := sim.Actions(r.RunID), sim.ToolMessages(r.ThreadID)
		if len(acts) != 3 || len(msgs) != 3 {
			t.Errorf("run %s: %d actions, %d tool messages; want 3 of each", r.RunID, len(acts), len(msgs))
			continue
		}
		for i, a := range acts {
			if msgs[i].ToolCallID != a.ToolCallID || (a.Status != core.ActionCompleted && a.Status != core.ActionFailed) {
				t.Errorf("run %s: action %+v, message %+v", r.RunID, a, msgs[i])
			}
		}
	}
	if v := sim.Violations(); len(v) != 0 {
		t.Errorf("violations %v", v)
	}
	if n := sim.CountRequests("POST", "/v1/completions"); n != 2*runs {
		t.Errorf("%d completions requests, want %d (one per turn: no run driven twice)", n, 2*runs)
		for _, rq := range sim.Requests() {
			if rq.Path == "/v1/completions" {
				t.Logf("%s %.200s", rq.At.Format("15:04:05.000"), rq.Body)
			}
		}
	}
	t.Logf("%d executions for %d calls", total, 3*runs)
}
