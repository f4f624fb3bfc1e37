package core

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectdavid/toolsidecar/internal/promtest"
)

// heldCore answers every request only once release is closed, and counts
// the requests it received and the connections it accepted.
func heldCore(t *testing.T) (srv *httptest.Server, received, conns *atomic.Int32, release chan struct{}) {
	t.Helper()
	received, release = &atomic.Int32{}, make(chan struct{})
	srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received.Add(1)
		<-release
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id": "run_1", "status": "queued"}`))
	}))
	conns = countConns(srv)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, received, conns, release
}

// countConns makes an unstarted srv count the connections it accepts.
func countConns(srv *httptest.Server) *atomic.Int32 {
	return &logConns(srv).opened
}

// waitFor waits, up to 10 s, until n requests have reached Core.
func waitFor(received *atomic.Int32, n int32) {
	for deadline := time.Now().Add(10 * time.Second); received.Load() < n && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
}

// endsAtOnce checks that a queued exchange, whose only worker Core holds,
// ends with want without waiting for that worker: within 10 s, far less
// than the test's hold on Core.
func endsAtOnce(t *testing.T, ended <-chan error, want error, what string) {
	t.Helper()
	select {
	case err := <-ended:
		if !errors.Is(err, want) {
			t.Errorf("%s ended with %v, want %v", what, err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s waited for a worker instead of ending with %v", what, want)
	}
}

// inHTTPClient counts the goroutines running net/http's client.
func inHTTPClient() int {
	var b strings.Builder
	pprof.Lookup("goroutine").WriteTo(&b, 2)
	n := 0
	for g := range strings.SplitSeq(b.String(), "\n\n") {
		if strings.Contains(g, "net/http.(*Transport).roundTrip") || strings.Contains(g, "core.(*pool).RoundTrip") {
			n++
		}
	}
	return n
}

// queuedMetric reads toolsidecar_core_requests_queued from reg.
func queuedMetric(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	return promtest.Value(t, reg, "toolsidecar_core_requests_queued")
}

// TestCallersNeverRunTheHTTPClient: 200 calls at once against a Core that
// holds them. MaxConns requests (64 by default) reach Core, over as many
// connections, and only that many goroutines run the HTTP client (the
// workers); the callers wait on a channel, so their stacks stay small, and
// the others show as queued. Then every caller gets its answer, and a
// second round of 200 finds the connections still open.
func TestCallersNeverRunTheHTTPClient(t *testing.T) {
	for _, maxConns := range []int{0, 8} {
		want := int32(maxConns)
		if maxConns == 0 {
			want = DefaultMaxConns
		}
		t.Run(fmt.Sprintf("max_conns=%d", maxConns), func(t *testing.T) {
			srv, received, conns, release := heldCore(t)
			reg := prometheus.NewRegistry()
			c, _ := New(Config{URL: srv.URL, MaxConns: maxConns}, WithMetrics(reg))
			var wg sync.WaitGroup
			var ok atomic.Int32
			round := func() {
				for range 200 {
					wg.Go(func() {
						if _, err := c.GetRun(context.Background(), "run_1"); err == nil {
							ok.Add(1)
						}
					})
				}
			}
			round()
			waitFor(received, want)
			if n := received.Load(); n != want {
				t.Errorf("%d requests reached Core at once, want %d", n, want)
			}
			if n := inHTTPClient(); n != int(want) {
				t.Errorf("%d goroutines run the HTTP client, want the %d workers only", n, want)
			}
			for deadline := time.Now().Add(10 * time.Second); queuedMetric(t, reg) != float64(200-want) && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			if n := queuedMetric(t, reg); n != float64(200-want) {
				t.Errorf("toolsidecar_core_requests_queued %v, want %d", n, 200-want)
			}
			close(release)
			wg.Wait()
			round()
			wg.Wait()
			if ok.Load() != 400 {
				t.Errorf("%d of 400 calls answered", ok.Load())
			}
			if n := conns.Load(); n != want {
				t.Errorf("Core accepted %d connections for 400 calls, want %d, each kept between calls", n, want)
			}
			if n := promtest.Value(t, reg, "toolsidecar_core_connections_opened_total", "use=calls"); n != float64(conns.Load()) {
				t.Errorf("toolsidecar_core_connections_opened_total{use=calls} %v, Core accepted %d", n, conns.Load())
			}
			if n := queuedMetric(t, reg); n != 0 {
				t.Errorf("toolsidecar_core_requests_queued %v after every answer, want 0", n)
			}
			c.exchanges.mu.Lock()
			defer c.exchanges.mu.Unlock()
			if len(c.exchanges.queue) != 0 {
				t.Errorf("%d exchanges left queued", len(c.exchanges.queue))
			}
		})
	}
}

// TestQueuedCallGivesUp: a call still queued behind busy workers returns
// its context's error at once, and never reaches Core.
func TestQueuedCallGivesUp(t *testing.T) {
	srv, received, _, release := heldCore(t)
	c, _ := New(Config{URL: srv.URL})
	var wg sync.WaitGroup
	for range DefaultMaxConns {
		wg.Go(func() { c.GetRun(context.Background(), "run_1") })
	}
	defer wg.Wait()
	defer close(release)
	waitFor(received, DefaultMaxConns)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := c.GetRun(ctx, "run_1"); errc <- err }()
	cancel()
	endsAtOnce(t, errc, context.Canceled, "the cancelled queued call")
	if n := received.Load(); n != DefaultMaxConns {
		t.Errorf("%d requests reached Core, want %d: the cancelled one must not be sent", n, DefaultMaxConns)
	}
}

// TestTimeoutStartsWhenSent: core.timeout bounds a request from when it
// is sent, not its wait in the queue. With one connection, the second of
// two requests waits 700 ms for the first, then Core takes 700 ms to
// answer it: 1.4 s after it was made, but 0.7 s of a 1 s timeout after it
// was sent, so it succeeds.
func TestTimeoutStartsWhenSent(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(700 * time.Millisecond)
		w.Write([]byte(`{"id": "run_1", "status": "queued"}`))
	}))
	defer srv.Close()
	c, _ := New(Config{URL: srv.URL, MaxConns: 1, Timeout: time.Second, Retries: -1})
	errs := make(chan error, 2)
	for range 2 {
		go func() { _, err := c.GetRun(context.Background(), "run_1"); errs <- err }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("a request failed: %v; its wait in the queue counted against its timeout", err)
		}
	}
}

// TestQueuedRetryEndsAtItsDeadline: a retry is queued with the deadline
// its exchange took when first sent. Queued behind a request Core holds,
// it ends at that deadline, at once, not when the held request lets the
// worker go.
func TestQueuedRetryEndsAtItsDeadline(t *testing.T) {
	srv, received, _, release := heldCore(t)
	defer close(release)
	c, _ := New(Config{URL: srv.URL, MaxConns: 1})
	go c.GetRun(context.Background(), "run_1")
	waitFor(received, 1) // the one worker is busy
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	ended := make(chan error, 1)
	k := &calling{c: c, parent: context.Background(), ctx: ctx, cancel: cancel, method: http.MethodGet, path: "/v1/runs/run_2",
		endpoint: "runs_get", then: func(err error) { ended <- err }}
	c.retries(&k.r, http.MethodGet)
	k.attempt() // as after a first sending: k.ctx is the exchange's
	endsAtOnce(t, ended, context.DeadlineExceeded, "the queued retry")
	if n := received.Load(); n != 1 {
		t.Errorf("%d requests reached Core, want 1: the retry must not be sent", n)
	}
}

// TestUpdateActionThenHoldsNoGoroutine: writes made without waiting queue
// for the workers like any call, but no goroutine waits for them: with
// Core holding every request, only the workers' goroutines exist. Each
// write's callback then runs exactly once.
func TestUpdateActionThenHoldsNoGoroutine(t *testing.T) {
	srv, received, _, release := heldCore(t)
	c, _ := New(Config{URL: srv.URL, MaxConns: 4})
	const n = 100
	calls := make([]atomic.Int32, n)
	var wg sync.WaitGroup
	wg.Add(n)
	for i := range n {
		c.UpdateActionThen(context.Background(), fmt.Sprint("act_", i), ActionUpdate{Status: ActionProcessing}, func(err error) {
			if err != nil {
				t.Errorf("write %d: %v", i, err)
			}
			calls[i].Add(1)
			wg.Done()
		})
	}
	waitFor(received, 4)
	var b strings.Builder
	pprof.Lookup("goroutine").WriteTo(&b, 2)
	held := 0
	for g := range strings.SplitSeq(b.String(), "\n\n") {
		g, _, _ = strings.Cut(g, "created by") // where a goroutine started is not where it waits
		if strings.Contains(g, "toolsidecar/core.(*Client).") {
			held++
		}
	}
	if held != 4 {
		t.Errorf("%d goroutines in the client, want the 4 workers only:\n%s", held, b.String())
	}
	close(release)
	wg.Wait()
	for i := range n {
		if got := calls[i].Load(); got != 1 {
			t.Errorf("write %d: callback ran %d times", i, got)
		}
	}
}

// TestUpdateActionThenRetries: a write Core refuses with 503 is retried
// after a backoff, with no goroutine waiting meanwhile, and its callback
// hears the final answer once: success after two refusals, and the last
// error when Core refuses every attempt.
func TestUpdateActionThenRetries(t *testing.T) {
	for _, tc := range []struct {
		refuse int32
		ok     bool
	}{{2, true}, {100, false}} {
		t.Run(fmt.Sprint("refuse=", tc.refuse), func(t *testing.T) {
			var hits atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if hits.Add(1) <= tc.refuse {
					http.Error(w, "busy", http.StatusServiceUnavailable)
					return
				}
				w.Write([]byte(`{}`))
			}))
			defer srv.Close()
			c, _ := New(Config{URL: srv.URL, Retries: 3})
			errs := make(chan error, 2)
			c.UpdateActionThen(context.Background(), "act_1", ActionUpdate{Status: ActionProcessing}, func(err error) { errs <- err })
			err := <-errs
			switch {
			case tc.ok && (err != nil || hits.Load() != 3):
				t.Errorf("after %d attempts: %v, want success on the third", hits.Load(), err)
			case !tc.ok && (StatusCode(err) != http.StatusServiceUnavailable || hits.Load() != 4):
				t.Errorf("after %d attempts: %v, want the 503 after 4", hits.Load(), err)
			}
			select {
			case err := <-errs:
				t.Errorf("a second callback: %v", err)
			case <-time.After(300 * time.Millisecond):
			}
		})
	}
}

// TestUpdateActionThenDropped: a write withdrawn while it waits in the
// queue never reaches Core and its callback never runs; one a worker has
// taken cannot be withdrawn, and its callback runs once.
func TestUpdateActionThenDropped(t *testing.T) {
	srv, received, _, release := heldCore(t)
	c, _ := New(Config{URL: srv.URL, MaxConns: 1})
	var calls [2]atomic.Int32
	done := make(chan struct{})
	drop0 := c.UpdateActionThen(context.Background(), "act_0", ActionUpdate{Status: ActionProcessing}, func(error) { calls[0].Add(1); close(done) })
	waitFor(received, 1)
	drop1 := c.UpdateActionThen(context.Background(), "act_1", ActionUpdate{Status: ActionProcessing}, func(error) { calls[1].Add(1) })
	if !drop1() {
		t.Error("a queued write could not be withdrawn")
	}
	if drop0() {
		t.Error("a write already at Core was withdrawn")
	}
	close(release)
	<-done
	c.exchanges.mu.Lock()
	for len(c.exchanges.queue) > 0 || c.exchanges.workers > 0 { // the worker skips the withdrawn write and stops
		c.exchanges.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		c.exchanges.mu.Lock()
	}
	c.exchanges.mu.Unlock()
	if n := received.Load(); n != 1 {
		t.Errorf("Core received %d writes, want 1", n)
	}
	if a, b := calls[0].Load(), calls[1].Load(); a != 1 || b != 0 {
		t.Errorf("callbacks ran %d and %d times, want 1 and 0", a, b)
	}
}

// TestNeverEndingContextIsNotWatched: an attempt whose context cannot end
// (a processing mark's, thousands of which queue at once under load)
// allocates itself only, while one whose context can end registers a
// watch on it. TestUpdateActionThenHoldsNoGoroutine sends such attempts.
func TestNeverEndingContextIsNotWatched(t *testing.T) {
	c, _ := New(Config{URL: "http://127.0.0.1:1"})
	allocs := func(ctx context.Context) float64 {
		k := &calling{c: c, parent: ctx, method: http.MethodPut, path: "/v1/actions/act_1", endpoint: "actions_update", then: func(error) {}}
		return testing.AllocsPerRun(100, func() { newExchange(k).stop() })
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if n := allocs(context.WithoutCancel(ctx)); n != 1 {
		t.Errorf("an attempt on a context that never ends made %v allocations, want 1 (itself)", n)
	}
	if n := allocs(ctx); n <= 1 {
		t.Errorf("an attempt on a context that can end made %v allocations: the measure does not see the watch", n)
	}
}
