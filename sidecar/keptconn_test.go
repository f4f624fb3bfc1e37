package sidecar_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// TestCoreDropsKeptConnections: Core's server drops kept connections.
// With keep-alive off (as behind some proxies) it closes every
// connection after each answer. With a keep-alive shorter than the
// tools' time it closes, without an answer, a connection that a request
// reaches after idling that long: the worst case of a close that races
// the send, which fails a POST (by net/http's rule too) unless the
// sidecar's core.idle_timeout, below Core's, closed the connection
// first. Core closing an idle connection before a request is core's
// TestKeptConnectionClosedByCore and TestCoreRestarted. Runs of an
// unsafe call beside read-only ones go through whole: one output per
// call, every Action final, the unsafe tool run once per call.
func TestCoreDropsKeptConnections(t *testing.T) {
	for name, tc := range map[string]struct {
		tweak     func(*httptest.Server)
		idle      time.Duration // core.idle_timeout; 0 for the default
		toolDelay time.Duration
	}{
		"keep-alive off": {tweak: func(s *httptest.Server) { s.Config.SetKeepAlivesEnabled(false) }},
		"keep-alive shorter than the tools": {tweak: keepAliveEndingOnArrival(300 * time.Millisecond),
			idle: 50 * time.Millisecond, toolDelay: 400 * time.Millisecond},
	} {
		t.Run(name, func(t *testing.T) {
			const runs, calls = 6, 3
			var mu sync.Mutex
			unsafeRuns := map[string]int{}
			env := testenv.Start(t, batchOf("look", "pay", "look"), testenv.Options{
				// The application's set-up calls (a POST of a thread, never
				// sent twice) do not meet the closes.
				ServeCore: testenv.CoreApart(t, tc.tweak),
				Config: func(c *config.Config) {
					if tc.idle > 0 {
						c.Core.IdleTimeout = tc.idle
					}
				},
			},
				testenv.Tool{Config: config.Tool{Name: "look", SideEffects: config.ReadOnly}, Handler: testenv.Delayed(tc.toolDelay, testenv.Echo)},
				testenv.Tool{Config: config.Tool{Name: "pay", SideEffects: config.Unsafe}, Handler: testenv.Delayed(tc.toolDelay, countingEcho(&mu, unsafeRuns))})
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
func countingEcho(mu *sync.Mutex, runs map[string]int) handler {
	return func(ctx context.Context, c *tool.Call) ([]byte, error) {
		mu.Lock()
		runs[c.ActionID]++
		mu.Unlock()
		return testenv.Echo(ctx, c)
	}
}

// handler is a Go worker's tool handler.
type handler = func(context.Context, *tool.Call) ([]byte, error)

// connKey is the context key of a request's connection.
type connKey struct{}

// keepAliveEndingOnArrival makes an unstarted server end a connection's
// keep-alive after k, as uvicorn does, with its close always arriving too
// late: a request that reaches a connection idle for k or longer is read
// and the connection closed, without an answer.
func keepAliveEndingOnArrival(k time.Duration) func(*httptest.Server) {
	return func(s *httptest.Server) {
		var mu sync.Mutex
		idleSince := map[net.Conn]time.Time{}
		s.Config.ConnState = func(c net.Conn, st http.ConnState) {
			mu.Lock()
			defer mu.Unlock()
			switch st {
			case http.StateIdle:
				idleSince[c] = time.Now()
			case http.StateClosed, http.StateHijacked:
				delete(idleSince, c)
			}
		}
		s.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		}
		next := s.Config.Handler
		s.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			since, kept := idleSince[r.Context().Value(connKey{}).(net.Conn)]
			mu.Unlock()
			if kept && time.Since(since) >= k {
				if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
					conn.Close()
					return
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}
