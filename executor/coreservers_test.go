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
// Behind Core's shipped nginx with its limit_req lines (30 requests a
// minute per client address, burst 20, nodelay), a width-16 run makes more
// requests than the burst: the sidecar paces its requests to Core, and the
// front refuses fewer than half as many as it lets through.
func TestCoreServerMatrix(t *testing.T) {
	for _, kind := range coreservers.All {
		t.Run(string(kind), func(t *testing.T) {
			if kind == coreservers.NginxLimited && testing.Short() {
				t.Skip("a paced run under Core's limit_req takes about a minute and a half")
			}
			b := coreservers.Batch{Tool: "slow", Calls: 16}
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
			if kind == coreservers.NginxLimited {
				st := srv.FrontStatuses(t)
				refused, accepted := st[503], 0
				for code, n := range st {
					if code != 503 {
						accepted += n
					}
				}
				t.Logf("the front let %d requests through and refused %d", accepted, refused)
				if accepted == 0 || 2*refused >= accepted {
					t.Errorf("the front refused %d requests and let %d through: want under half as many refused (statuses %v)", refused, accepted, st)
				}
			}
		})
	}
}
