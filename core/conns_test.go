package core

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/promtest"
)

// TestKeptConnectionFoundClosed: Core closes a kept connection while it
// is idle. The next POST, which the client never sends twice, goes out on
// a new connection, once, and is answered: the peek found the kept one
// closed before anything was written to it.
func TestKeptConnectionFoundClosed(t *testing.T) {
	var posts atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id": "msg_1", "role": "tool"}`)
	}))
	conns := logConns(srv)
	srv.Start()
	defer srv.Close()
	c, err := New(Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	out := ToolOutput{ThreadID: "t", ToolID: "act_1", ToolCallID: "call_1", Content: "ok"}
	if _, err := c.SubmitToolOutput(context.Background(), out); err != nil {
		t.Fatal(err)
	}
	srv.CloseClientConnections()
	conns.waitClosed(t)
	if _, err := c.SubmitToolOutput(context.Background(), out); err != nil {
		t.Fatalf("a POST after Core closed the kept connection: %v", err)
	}
	if n, p := conns.opened.Load(), posts.Load(); n != 2 || p != 2 {
		t.Errorf("Core accepted %d connections and %d POSTs, want 2 and 2", n, p)
	}
}

// TestLateStrayBytes: Core answers, then writes on the same connection,
// a moment later, bytes that answer nothing (a whole answer). The next
// request does not read them as its answer: the connection they came on
// is closed, and the request goes out on a new one.
func TestLateStrayBytes(t *testing.T) {
	addr, accepted := rawListener(t, func(n int32, conn net.Conn) {
		serveRuns(n, conn, func(n int32) {
			if n == 1 {
				time.Sleep(20 * time.Millisecond)
				answerJSON(conn, `{"id": "stray", "status": "cancelled"}`)
			}
		})
	})
	c, err := New(Config{URL: "http://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.GetRun(ctx, "run_1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the stray answer is in the socket
	run, err := c.GetRun(ctx, "run_1")
	if err != nil {
		t.Fatal(err)
	}
	if run.ID != "run_2" || run.Status != "in_progress" {
		t.Errorf("the second request read %+v, want run_2 from a new connection", run)
	}
	if n := accepted.Load(); n != 2 {
		t.Errorf("Core accepted %d connections, want 2", n)
	}
	c.hc.CloseIdleConnections()
}

// TestNoGoroutinePerConnection: the client's requests and streams are
// read on their callers' goroutines. With connections kept and a stream
// open, no goroutine reads or writes a connection to Core on its own
// (net/http's Transport has two per connection).
func TestNoGoroutinePerConnection(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"type\": \"content\", \"content\": \"hi\"}\n\n")
			w.(http.Flusher).Flush()
			<-release
			io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		runCore(w, r)
	}))
	defer srv.Close()
	defer close(release)
	c, err := New(Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 8 { // several connections kept at once
		wg.Go(func() {
			if _, err := c.GetRun(ctx, "run_1"); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	s, err := c.Stream(ctx, CompletionRequest{RunID: "run_1"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Next(); err != nil {
		t.Fatal(err)
	}
	var dump strings.Builder
	pprof.Lookup("goroutine").WriteTo(&dump, 1)
	for _, frame := range []string{"net/http.(*persistConn).readLoop", "net/http.(*persistConn).writeLoop"} {
		if n := strings.Count(dump.String(), frame); n > 0 {
			t.Errorf("%d goroutines in %s", n, frame)
		}
	}
}

// TestWithdrawableWriteShed: with the client's only connection held and
// one request already waiting for it, a write under WithWithdraw is not
// queued: it returns ErrWithdrawn at once, Core never receives it, and
// toolsidecar_core_writes_shed_total counts it. A write that may not be
// withdrawn waits for its turn and is sent.
func TestWithdrawableWriteShed(t *testing.T) {
	var puts atomic.Int32
	url, heldIn, releaseGet := heldCore(t, func() { puts.Add(1) })
	reg := prometheus.NewRegistry()
	c, err := New(Config{URL: url, MaxConns: 1}, WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	got := make(chan error, 2)
	go func() { _, err := c.GetRun(ctx, "run_1"); got <- err }()
	<-heldIn
	go func() { got <- c.WriteAction(ctx, "act_1", ActionUpdate{Status: ActionCompleted}) }() // waits: it counts
	for c.queued.Load() != 1 {
		time.Sleep(time.Millisecond)
	}
	err = c.WriteAction(WithWithdraw(ctx, make(chan struct{})), "act_2", ActionUpdate{Status: ActionProcessing})
	if !errors.Is(err, ErrWithdrawn) {
		t.Fatalf("a withdrawable write behind a full queue: %v, want ErrWithdrawn", err)
	}
	close(releaseGet)
	for range 2 {
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	}
	if n := puts.Load(); n != 1 {
		t.Errorf("Core received %d PUTs, want 1: the final status, not the shed mark", n)
	}
	if n := promtest.Value(t, reg, "toolsidecar_core_writes_shed_total"); n != 1 {
		t.Errorf("toolsidecar_core_writes_shed_total %v, want 1", n)
	}
}

// TestNewConnectionsBounded: Core accepts slowly (a small accept queue,
// a busy server): 16 requests at once, with one connection kept, open at
// most maxDials new ones while Core has answered on none of them, and
// the others wait for the kept connection instead: opening one each
// overflowed the listen backlog of Python's ThreadingHTTPServer (5), and
// each dropped attempt waited out the kernel's 1 s retransmission
// timeout (#76).
func TestNewConnectionsBounded(t *testing.T) {
	gate := make(chan struct{})
	var held atomic.Int32
	addr, _ := rawListener(t, func(n int32, conn net.Conn) {
		if n > 1 { // the first is the kept one; the others wait for the gate
			held.Add(1)
			<-gate
		}
		serveRuns(n, conn, func(int32) {})
	})
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release) // before the listener's cleanup waits for its connections
	c, err := New(Config{URL: "http://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.GetRun(ctx, "run_1"); err != nil { // the kept connection
		t.Fatal(err)
	}
	const requests = 16
	var done atomic.Int32
	var wg sync.WaitGroup
	for range requests {
		wg.Go(func() {
			if _, err := c.GetRun(ctx, "run_1"); err != nil {
				t.Error(err)
			}
			done.Add(1)
		})
	}
	// Every request is either answered or on a new connection Core holds,
	// unless more new connections than the bound were opened.
	poll.Until(t, "every request answered or held", func() bool {
		return done.Load()+held.Load() == requests || held.Load() > maxDials
	})
	if n := held.Load(); n > maxDials {
		t.Errorf("%d new connections opened at once, want at most %d", n, maxDials)
	}
	release()
	wg.Wait()
	c.hc.CloseIdleConnections() // the listener's cleanup waits for every connection to end
}
