package sidecar_test

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/coresim"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/internal/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// TestCoreDropsKeptConnections: a Core that closes every connection after
// each answer (keep-alive off, as behind some proxies). Core closing an
// idle connection is core's TestKeptConnectionClosedByCore and
// TestCoreRestarted; a close that races a request's send fails a POST (by
// net/http's rule too), and a 2 ms idle timeout made that happen under
// make test's load, so it is not tested here. Runs of an
// unsafe call beside read-only ones go through whole: one output per
// call, every Action final, the unsafe tool run once per call.
func TestCoreDropsKeptConnections(t *testing.T) {
	for name, tweak := range map[string]func(*httptest.Server){
		"keep-alive off": func(s *httptest.Server) { s.Config.SetKeepAlivesEnabled(false) },
	} {
		t.Run(name, func(t *testing.T) {
			const runs, calls = 6, 3
			var mu sync.Mutex
			unsafeRuns := map[string]int{}
			env := testenv.Start(t, batchOf("look", "pay", "look"), testenv.Options{
				ServeCore: func(sim *coresim.Sim) (string, *core.Client, func()) {
					srv := httptest.NewUnstartedServer(sim)
					tweak(srv)
					srv.Start()
					// The application's set-up calls (a POST of a thread,
					// never sent twice) reach the same Core on a server
					// of its own: only the sidecar meets the closes.
					setup := httptest.NewServer(sim)
					app, err := core.New(core.Config{URL: setup.URL, APIKey: testenv.APIKey})
					if err != nil {
						t.Fatal(err)
					}
					return srv.URL, app, func() { srv.Close(); setup.Close() }
				},
			},
				testenv.Tool{Config: config.Tool{Name: "look", SideEffects: config.ReadOnly}, Handler: testenv.Echo},
				testenv.Tool{Config: config.Tool{Name: "pay", SideEffects: config.Unsafe}, Handler: countingEcho(&mu, unsafeRuns)})
			rs := make([]testenv.Run, runs)
			sums := make([]executor.Summary, runs)
			var wg sync.WaitGroup
			for i := range rs {
				rs[i] = env.NewRun()
				wg.Go(func() { _, sums[i] = testenv.Drive(t, env.URL, rs[i], nil) })
			}
			wg.Wait()
			for i, r := range rs {
				if sums[i].Status != executor.StatusCompleted {
					t.Fatalf("run %d: %s (%s)", i, sums[i].Status, sums[i].Error)
				}
				env.AssertWholeBatches(r, calls)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(unsafeRuns) != runs {
				t.Errorf("the unsafe tool ran for %d calls, want %d", len(unsafeRuns), runs)
			}
			for id, n := range unsafeRuns {
				if n != 1 {
					t.Errorf("unsafe call %s ran %d times", id, n)
				}
			}
		})
	}
}

// countingEcho is testenv.Echo that counts its runs by Action.
func countingEcho(mu *sync.Mutex, runs map[string]int) func(context.Context, *tool.Call) ([]byte, error) {
	return func(ctx context.Context, c *tool.Call) ([]byte, error) {
		mu.Lock()
		runs[c.ActionID]++
		mu.Unlock()
		return testenv.Echo(ctx, c)
	}
}
