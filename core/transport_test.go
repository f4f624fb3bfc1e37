package core

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectdavid/toolsidecar/testkit/promtest"
)

// connLog makes an unstarted srv count the connections it accepts, and
// tell of each it has closed.
type connLog struct {
	opened atomic.Int32
	closed chan struct{}
}

func logConns(srv *httptest.Server) *connLog {
	l := &connLog{closed: make(chan struct{}, 64)}
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			l.opened.Add(1)
		case http.StateClosed:
			select { // a test waits for one close at a time; the others are not news
			case l.closed <- struct{}{}:
			default:
			}
		}
	}
	return l
}

// waitClosed waits for Core to have closed a connection.
func (l *connLog) waitClosed(t *testing.T) {
	t.Helper()
	select {
	case <-l.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Core did not close the connection")
	}
}

// runCore answers an Action write with the Action written, and every
// other request with a run.
func runCore(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if id, ok := strings.CutPrefix(r.URL.Path, "/v1/actions/"); ok && r.Method == http.MethodPut {
		var upd ActionUpdate
		json.NewDecoder(r.Body).Decode(&upd)
		json.NewEncoder(w).Encode(Action{ID: id, Status: upd.Status})
		return
	}
	io.WriteString(w, `{"id": "run_1", "status": "in_progress"}`)
}

// TestKeptConnectionClosedByCore: Core closes a kept connection while it
// is idle (uvicorn does after 5 s). The next request goes out on a new
// connection and is answered, over plain HTTP and over TLS, where Core's
// close comes with an alert. (A POST that meets the close as it leaves is
// not sent again by net/http; the exactly-once writes read back and
// retry, TestClosedAfterTheRequest, and core.idle_timeout keeps the
// client's closes ahead of Core's.)
func TestKeptConnectionClosedByCore(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", tlsOn), func(t *testing.T) {
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodPost {
					w.Header().Set("Content-Type", "application/json")
					io.WriteString(w, `{"id": "msg_1", "role": "tool"}`)
					return
				}
				runCore(w, r)
			}))
			conns := logConns(srv)
			var opts []Option
			if tlsOn {
				srv.StartTLS()
				opts = append(opts, WithTLS(srv.Client().Transport.(*http.Transport).TLSClientConfig))
			} else {
				srv.Start()
			}
			defer srv.Close()
			reg := prometheus.NewRegistry()
			c, err := New(Config{URL: srv.URL}, append(opts, WithMetrics(reg))...)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.GetRun(context.Background(), "run_1"); err != nil {
				t.Fatal(err)
			}
			srv.CloseClientConnections()
			conns.waitClosed(t)
			if _, err := c.GetRun(context.Background(), "run_1"); err != nil {
				t.Fatalf("a request after Core closed the idle connection: %v", err)
			}
			if n := conns.opened.Load(); n != 2 {
				t.Errorf("Core accepted %d connections, want 2: the closed one is not used", n)
			}
			if n := promtest.Value(t, reg, "toolsidecar_core_connections_opened_total", "use=calls"); n != 2 {
				t.Errorf("toolsidecar_core_connections_opened_total{use=calls} %v, want 2", n)
			}
		})
	}
}

// oneAnswerCore is a Core whose keep-alive ends as a connection's second
// request arrives: it answers the first request on each connection, and
// closes the connection on the second without answering (the close raced
// the send). A completions request is answered with a stream of [DONE]
// alone, any other with an Action. It counts the connections it accepts
// and the requests it reads.
func oneAnswerCore(t *testing.T) (url string, accepted, requests *atomic.Int32) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted, requests = new(atomic.Int32), new(atomic.Int32)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				for served := 0; ; served++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					requests.Add(1)
					if served == 1 { // the second request on a connection
						return
					}
					typ, body := "application/json", `{"id": "act_1", "status": "completed"}`
					if req.URL.Path == "/v1/completions" {
						typ, body = "text/event-stream", "data: [DONE]\n\n"
					}
					fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s", typ, len(body), body)
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String(), accepted, requests
}

// TestClosedAfterTheRequest: Core closes a kept connection as the
// request arrives on it, without an answer (the close raced the send).
// A PUT, safe to repeat, is sent again on a new connection; a POST is not,
// and its error says why.
func TestClosedAfterTheRequest(t *testing.T) {
	url, accepted, requests := oneAnswerCore(t)
	c, err := New(Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	upd := ActionUpdate{Status: "completed"}
	for i := range 2 { // the second is answered on a new connection
		if _, err := c.UpdateAction(ctx, "act_1", upd); err != nil {
			t.Fatalf("PUT %d: %v", i, err)
		}
	}
	if n, r := accepted.Load(), requests.Load(); n != 2 || r != 3 {
		t.Errorf("%d connections and %d requests for two PUTs, want 2 and 3 (the PUT on the closed one sent again)", n, r)
	}
	if _, err = c.SubmitToolOutput(ctx, ToolOutput{ThreadID: "t", ToolID: "call_1", Content: "ok"}); err == nil {
		t.Fatal("a POST on a connection closed under it was answered")
	}
	if r := requests.Load(); r != 4 {
		t.Errorf("Core received %d requests, want 4: the POST is sent once", r)
	}
}

// TestIdleTimeoutUnderCores: with Core's keep-alive ending as a request
// arrives (oneAnswerCore), a connection idle for longer than the client's
// IdleTimeout is closed by the client, not sent on: each POST, a tool
// output and a turn's completions request, goes out once on a new
// connection and is answered. TestClosedAfterTheRequest is the same Core
// with the connection reused: the POST is lost.
func TestIdleTimeoutUnderCores(t *testing.T) {
	url, accepted, requests := oneAnswerCore(t)
	c, err := New(Config{URL: url, IdleTimeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 2 {
		time.Sleep(5 * time.Millisecond) // idle for longer than IdleTimeout
		if _, err := c.SubmitToolOutput(ctx, ToolOutput{ThreadID: "t", ToolID: "call_1", Content: "ok"}); err != nil {
			t.Fatalf("tool output %d: %v", i, err)
		}
	}
	for i := range 2 {
		time.Sleep(5 * time.Millisecond)
		s, err := c.Stream(ctx, CompletionRequest{RunID: "run_1"})
		if err != nil {
			t.Fatalf("completions %d: %v", i, err)
		}
		for _, err := range s.Chunks() {
			if err != nil {
				t.Fatalf("completions %d: %v", i, err)
			}
		}
		s.Close()
	}
	if n, r := accepted.Load(), requests.Load(); n != 4 || r != 4 {
		t.Errorf("%d connections and %d requests for four POSTs, want 4 and 4: each POST on a new connection, once", n, r)
	}
}

// TestConnectionKeptOrClosed: a connection is kept across answers with a
// length or chunked, and closed when the answer asks for it, when its
// body is not read to the end (an error's excerpt from a long body: not
// drained, however long), when the request's context ends while Core
// answers, or when bytes that answer nothing follow the answer.
func TestConnectionKeptOrClosed(t *testing.T) {
	release := make(chan struct{})
	trailingClosed := make(chan struct{}) // the client closed the connection the stray bytes came on
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/runs/chunked":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id": "chunked",`)
			w.(http.Flusher).Flush()
			io.WriteString(w, ` "status": "in_progress"}`)
		case "/v1/runs/closing":
			w.Header().Set("Connection", "close")
			runCore(w, r)
		case "/v1/runs/long-error":
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(strings.Repeat("x", 4<<20)))
		case "/v1/runs/held":
			<-release
			runCore(w, r)
		case "/v1/runs/trailing":
			// An answer followed by bytes that answer nothing.
			conn, bw, _ := w.(http.Hijacker).Hijack()
			defer conn.Close()
			body := `{"id": "trailing", "status": "in_progress"}`
			fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%sHTTP/1.1 200 OK\r\n\r\n", len(body), body)
			bw.Flush()
			io.Copy(io.Discard, conn) // until the client closes it
			close(trailingClosed)
		default:
			runCore(w, r)
		}
	}))
	conns := logConns(srv)
	srv.Start()
	defer srv.Close()
	defer close(release)
	c, _ := New(Config{URL: srv.URL, Retries: -1})
	ctx := context.Background()
	steps := []struct {
		run     string
		wantErr bool
		conns   int32 // accepted by Core after the step
	}{
		{"run_1", false, 1},
		{"chunked", false, 1},
		{"chunked", false, 1},
		{"run_1", false, 1},
		{"closing", false, 1},
		{"run_1", false, 2},
		{"long-error", true, 2},
		{"run_1", false, 3},
		{"held", true, 3},
		{"run_1", false, 4},
		{"run_1", false, 4},
		{"trailing", false, 4},
		{"run_1", false, 5},
		{"run_1", false, 5},
	}
	for i, s := range steps {
		callCtx, cancel := ctx, context.CancelFunc(func() {})
		if s.run == "held" {
			callCtx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
		}
		run, err := c.GetRun(callCtx, s.run)
		cancel()
		if (err != nil) != s.wantErr {
			t.Fatalf("step %d (%s): %+v, %v", i, s.run, run, err)
		}
		if err == nil && run.Status != "in_progress" {
			t.Errorf("step %d (%s): run %+v", i, s.run, run)
		}
		if n := conns.opened.Load(); n != s.conns {
			t.Fatalf("after step %d (%s) Core accepted %d connections, want %d", i, s.run, n, s.conns)
		}
		if s.run == "trailing" {
			// net/http sees the stray bytes once the connection is idle,
			// and closes it; a request sent on it before then would read
			// them as its answer, so wait for the close.
			select {
			case <-trailingClosed:
			case <-time.After(5 * time.Second):
				t.Fatal("the client kept the connection that stray bytes came on")
			}
		}
	}
}

// TestIdleConnectionsClosed: a connection idle for longer than the
// client's idle timeout is closed by the sidecar, with no request to
// notice it.
func TestIdleConnectionsClosed(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(runCore))
	conns := logConns(srv)
	srv.Start()
	defer srv.Close()
	c, _ := New(Config{URL: srv.URL, IdleTimeout: 20 * time.Millisecond})
	if _, err := c.GetRun(context.Background(), "run_1"); err != nil {
		t.Fatal(err)
	}
	conns.waitClosed(t)
}

// TestShortCallsThroughAProxy: with HTTP_PROXY set for Core's host, the
// short calls go through the proxy.
func TestShortCallsThroughAProxy(t *testing.T) {
	var proxied atomic.Value
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied.Store(r.URL.String())
		runCore(w, r)
	}))
	defer proxy.Close()
	t.Setenv("HTTP_PROXY", proxy.URL)
	t.Setenv("NO_PROXY", "")
	c, err := New(Config{URL: "http://core.invalid:9000"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetRun(context.Background(), "run_1"); err != nil {
		t.Fatal(err)
	}
	if got, want := proxied.Load(), "http://core.invalid:9000/v1/runs/run_1"; got != want {
		t.Errorf("the proxy saw %v, want %s", got, want)
	}
}

// TestCoreRestarted: Core stops, closing its connections, and starts
// again on the same address. The client's next requests reach the new
// Core: a tool output, whose first POST meets the dead kept connection,
// is looked up and posted once; a GET; and a completions stream, which
// never reuses a connection.
func TestCoreRestarted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	first := httptest.NewUnstartedServer(http.HandlerFunc(runCore))
	first.Listener.Close()
	first.Listener = ln
	first.Start()
	c, _ := New(Config{URL: first.URL})
	ctx := context.Background()
	for range 3 {
		if _, err := c.GetRun(ctx, "run_1"); err != nil {
			t.Fatal(err)
		}
	}
	first.Close()

	var posts atomic.Int32
	second := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v1/completions":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: [DONE]\n\n")
		case r.Method == http.MethodPost:
			posts.Add(1)
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id": "msg_1", "role": "tool", "tool_call_id": "call_1"}`)
		case strings.HasSuffix(r.URL.Path, "/messages"):
			io.WriteString(w, "[]")
		default:
			runCore(w, r)
		}
	}))
	second.Listener.Close()
	if second.Listener, err = net.Listen("tcp", addr); err != nil {
		t.Fatalf("listening again on %s: %v", addr, err)
	}
	second.Start()
	defer second.Close()
	if _, err := c.RecordToolOutput(ctx, ToolOutput{ThreadID: "t", ToolID: "act_1", ToolCallID: "call_1", Content: "ok"}); err != nil {
		t.Fatalf("a tool output after Core restarted: %v", err)
	}
	if _, err := c.GetRun(ctx, "run_1"); err != nil {
		t.Fatalf("a GET after Core restarted: %v", err)
	}
	s, err := c.Stream(ctx, CompletionRequest{RunID: "run_1"})
	if err != nil {
		t.Fatalf("a completions stream after Core restarted: %v", err)
	}
	for _, err := range s.Chunks() {
		if err != nil {
			t.Fatalf("completions: %v", err)
		}
	}
	s.Close()
	if p := posts.Load(); p != 1 {
		t.Errorf("the restarted Core received %d tool outputs, want 1", p)
	}
}

// countConns makes an unstarted srv count the connections it accepts.
func countConns(srv *httptest.Server) *atomic.Int32 { return &logConns(srv).opened }

// heldCore is a Core that holds the first GET it receives until
// releaseGet is closed (heldIn is closed as it arrives), and calls onPut
// for each PUT before it answers.
func heldCore(t *testing.T, onPut func()) (url string, heldIn, releaseGet chan struct{}) {
	heldIn, releaseGet = make(chan struct{}), make(chan struct{})
	var held sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
			held.Do(func() { close(heldIn); <-releaseGet })
		case http.MethodPut:
			onPut()
		}
		runCore(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, heldIn, releaseGet
}

// TestWithdrawnWhileQueued: with the client's only connection held by a
// request that Core holds, a write under WithWithdraw waits; withdrawn, it
// returns ErrWithdrawn at once and Core never receives it. A write
// withdrawn after it has left goes on to its answer.
func TestWithdrawnWhileQueued(t *testing.T) {
	putIn, releasePut := make(chan struct{}, 1), make(chan struct{})
	var puts atomic.Int32
	url, heldIn, releaseGet := heldCore(t, func() {
		puts.Add(1)
		putIn <- struct{}{}
		<-releasePut
	})
	c, _ := New(Config{URL: url, MaxConns: 1})
	ctx := context.Background()
	got := make(chan error, 1)
	go func() { _, err := c.GetRun(ctx, "run_1"); got <- err }()
	<-heldIn
	withdraw := make(chan struct{})
	wrote := make(chan error, 1)
	go func() {
		wrote <- c.WriteAction(WithWithdraw(ctx, withdraw), "act_1", ActionUpdate{Status: ActionProcessing})
	}()
	for c.queued.Load() != 1 {
		time.Sleep(time.Millisecond)
	}
	close(withdraw)
	if err := <-wrote; !errors.Is(err, ErrWithdrawn) {
		t.Fatalf("a write withdrawn while queued: %v, want ErrWithdrawn", err)
	}
	close(releaseGet)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if n := puts.Load(); n != 0 {
		t.Fatalf("Core received %d withdrawn writes", n)
	}

	withdraw = make(chan struct{})
	go func() {
		wrote <- c.WriteAction(WithWithdraw(ctx, withdraw), "act_1", ActionUpdate{Status: ActionProcessing})
	}()
	<-putIn
	close(withdraw) // too late: it has left
	close(releasePut)
	if err := <-wrote; err != nil || puts.Load() != 1 {
		t.Fatalf("a write withdrawn after it left: %v after %d PUTs, want its answer", err, puts.Load())
	}
}
