package executor_test

import (
	"context"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/testkit/coreservers"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// TestCoreServerMatrix drives a batch of 16 calls of a 200 ms tool, all
// at once, against every kind of Core server (coreservers.All), and checks
// Core's side of the run: one output per call, in call order, every
// Action final, and nothing the server saw out of contract.
//
// Behind Core's shipped nginx with its limit_req lines, a width-16 run
// makes more requests than the limit's burst (20) and needs the sidecar
// to pace its requests to Core (#76 items 4 and 5): until it does, that
// cell drives one call, which the burst admits.
func TestCoreServerMatrix(t *testing.T) {
	for _, kind := range coreservers.All {
		t.Run(string(kind), func(t *testing.T) {
			b := coreservers.Batch{Tool: "slow", Calls: 16}
			if kind == coreservers.NginxLimited {
				t.Log("width 16 under Core's limit_req awaits the pacing of a refusing Core (#76 items 4, 5): one call")
				b.Calls = 1
			}
			srv := coreservers.Start(t, kind, b)
			h := newHarnessWith(t, b.Scenario(), testenv.Options{ServeCore: srv.ServeCore(), Executor: config.Executor{MaxParallel: 16}},
				spec{config.Tool{Name: b.Tool}, sleep200})
			start := time.Now()
			sum, err := h.exec.Drive(context.Background(), h.req, nil)
			t.Logf("%s: %d calls at once in %v", kind, b.Calls, time.Since(start)) // a figure, not asserted: see BenchmarkBatch
			if err != nil || sum.Status != executor.StatusCompleted || len(sum.Calls) != b.Calls {
				t.Fatalf("drive against %s: %+v %v", kind, sum, err)
			}
			srv.Check(t, h.run, b.Calls)
		})
	}
}
