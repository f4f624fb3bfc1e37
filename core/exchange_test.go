package core

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// heldCore answers every request only once release is closed, and counts
// the requests it received.
func heldCore(t *testing.T) (srv *httptest.Server, received *atomic.Int32, release chan struct{}) {
	t.Helper()
	received, release = &atomic.Int32{}, make(chan struct{})
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received.Add(1)
		<-release
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id": "run_1", "status": "queued"}`))
	}))
	t.Cleanup(srv.Close)
	return srv, received, release
}

// waitFor waits, up to 10 s, until n requests have reached Core.
func waitFor(received *atomic.Int32, n int32) {
	for deadline := time.Now().Add(10 * time.Second); received.Load() < n && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
}

// inHTTPClient counts the goroutines running net/http's client.
func inHTTPClient() int {
	var b strings.Builder
	pprof.Lookup("goroutine").WriteTo(&b, 2)
	n := 0
	for g := range strings.SplitSeq(b.String(), "\n\n") {
		if strings.Contains(g, "net/http.(*Client).do") {
			n++
		}
	}
	return n
}

// queuedMetric reads toolsidecar_core_requests_queued from reg.
func queuedMetric(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "toolsidecar_core_requests_queued" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("toolsidecar_core_requests_queued is not registered")
	return 0
}

// TestCallersNeverRunTheHTTPClient: 200 calls at once against a Core that
// holds them. 64 requests reach Core, and only 64 goroutines run the HTTP
// client (the workers); the 200 callers wait on a channel, so their stacks
// stay small, and the other 136 show as queued. Then every caller gets its
// answer.
func TestCallersNeverRunTheHTTPClient(t *testing.T) {
	srv, received, release := heldCore(t)
	reg := prometheus.NewRegistry()
	c, _ := New(Config{URL: srv.URL}, WithMetrics(reg))
	var wg sync.WaitGroup
	var ok atomic.Int32
	for range 200 {
		wg.Go(func() {
			if _, err := c.GetRun(context.Background(), "run_1"); err == nil {
				ok.Add(1)
			}
		})
	}
	waitFor(received, maxConnsPerHost)
	if n := received.Load(); n != maxConnsPerHost {
		t.Errorf("%d requests reached Core at once, want %d", n, maxConnsPerHost)
	}
	if n := inHTTPClient(); n != maxConnsPerHost {
		t.Errorf("%d goroutines run the HTTP client, want the %d workers only", n, maxConnsPerHost)
	}
	for deadline := time.Now().Add(10 * time.Second); queuedMetric(t, reg) != 200-maxConnsPerHost && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if n := queuedMetric(t, reg); n != 200-maxConnsPerHost {
		t.Errorf("toolsidecar_core_requests_queued %v, want %d", n, 200-maxConnsPerHost)
	}
	close(release)
	wg.Wait()
	if ok.Load() != 200 {
		t.Errorf("%d of 200 calls answered", ok.Load())
	}
	if n := queuedMetric(t, reg); n != 0 {
		t.Errorf("toolsidecar_core_requests_queued %v after every answer, want 0", n)
	}
	c.exchanges.mu.Lock()
	defer c.exchanges.mu.Unlock()
	if len(c.exchanges.queue) != 0 {
		t.Errorf("%d exchanges left queued", len(c.exchanges.queue))
	}
}

// TestQueuedCallGivesUp: a call still queued behind busy workers returns
// its context's error at once, and never reaches Core.
func TestQueuedCallGivesUp(t *testing.T) {
	srv, received, release := heldCore(t)
	c, _ := New(Config{URL: srv.URL})
	var wg sync.WaitGroup
	for range maxConnsPerHost {
		wg.Go(func() { c.GetRun(context.Background(), "run_1") })
	}
	defer wg.Wait()
	defer close(release)
	waitFor(received, maxConnsPerHost)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := c.GetRun(ctx, "run_1"); errc <- err }()
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("queued call ended with %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled call waited for a worker")
	}
	if n := received.Load(); n != maxConnsPerHost {
		t.Errorf("%d requests reached Core, want %d: the cancelled one must not be sent", n, maxConnsPerHost)
	}
}
