package sidecar_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/testkit/workerproc"
)

// TestClusterNodeLoss: a 3-node NATS cluster holds the ledger, the reply
// stream and the run leases at 3 replicas; 2 sidecars drive 6 runs (and
// each run is driven again through the other sidecar, as an application
// retrying against another replica does) with 2 worker processes. The
// node that leads the reply stream is shut down while the first batch
// runs. Every run completes with exactly one output per call and every
// Action finalised, and no unsafe call runs twice.
func TestClusterNodeLoss(t *testing.T) {
	for i := range testenv.SoakReps() {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			resume, execs := clusterNodeLoss(t)
			t.Logf("FAULT nats_node_loss rep=%d resume_ms=%d executions=%d/18", i, resume.Milliseconds(), execs)
		})
	}
}

// clusterNodeLoss runs it once and returns the time from the node loss to
// the last run's completion, and how many executions the workers saw.
func clusterNodeLoss(t *testing.T) (time.Duration, int) {
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
	for range 2 {
		workerproc.Start(t, workerproc.Config{URLs: cl.URL(), Prefix: testenv.Prefix, Delay: 400 * time.Millisecond, ExecLog: execLog})
	}
	cc, _ := core.New(core.Config{URL: srv.URL, APIKey: testenv.APIKey})
	testenv.WaitLive(t, "http://"+sidecars[0].Addr(), "look", "pay")

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
			go func() { sum, _ := s.Drive(context.Background(), testenv.Request(r), nil); results <- result{r, sum} }()
		}
	}
	poll.Until(t, "calls to be running", func() bool { _, n := workerproc.Executions(t, execLog); return n >= runs })
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
	resume := time.Since(lost)
	byAction, total := workerproc.Executions(t, execLog)
	for key, n := range byAction {
		if strings.HasPrefix(key, "pay ") && n != 1 {
			t.Errorf("unsafe call %s ran %d times", key, n)
		}
	}
	for _, r := range all {
		testenv.AssertWholeBatches(t, sim, r, 3)
	}
	if n := sim.CountRequests("POST", "/v1/completions"); n != 2*runs {
		t.Errorf("%d completions requests, want %d (one per turn: no run driven twice)", n, 2*runs)
		for _, rq := range sim.Requests() {
			if rq.Path == "/v1/completions" {
				t.Logf("%s %.200s", rq.At.Format("15:04:05.000"), rq.Body)
			}
		}
	}
	return resume, total
}
