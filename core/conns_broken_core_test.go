package core

import (
	"bufio"
	"context"
	"crypto/tls"
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
)

// rawCore is a Core on a raw listener: serve is given each connection
// it accepts, its requests read with br.
func rawCore(t *testing.T, serve func(conn net.Conn, br *bufio.Reader)) string {
	t.Helper()
	addr, _ := rawListener(t, func(_ int32, conn net.Conn) { serve(conn, bufio.NewReader(conn)) })
	return "http://" + addr
}

// rawListener serves each connection it accepts with serve, numbered
// from 1, and closes it after; it returns its address and the count of
// connections accepted. Its goroutines end with the test.
func rawListener(t *testing.T, serve func(n int32, conn net.Conn)) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	accepted := new(atomic.Int32)
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			n := accepted.Add(1)
			wg.Go(func() {
				defer conn.Close()
				serve(n, conn)
			})
		}
	})
	return ln.Addr().String(), accepted
}

// answerJSON writes a whole 200 answer with a JSON body.
func answerJSON(w io.Writer, body string) {
	fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// serveRuns answers each request read from conn with run_<n>, the
// connection's number, then calls after.
func serveRuns(n int32, conn net.Conn, after func(n int32)) {
	br := bufio.NewReader(conn)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		answerJSON(conn, fmt.Sprintf(`{"id": "run_%d", "status": "in_progress"}`, n))
		after(n)
	}
}

// TestResponseHeadersBounded: a Core whose answer's headers never end,
// or which sends informational answers without end, fails the request
// once 10 MiB of headers have come (net/http's Transport's bound), not
// when the call's Timeout runs out with all of them held in memory.
func TestResponseHeadersBounded(t *testing.T) {
	for name, head := range map[string]func(w io.Writer) error{
		"endless headers": func(w io.Writer) error {
			if _, err := io.WriteString(w, "HTTP/1.1 200 OK\r\n"); err != nil {
				return err
			}
			line := "X-Pad: " + strings.Repeat("a", 1000) + "\r\n"
			for {
				if _, err := io.WriteString(w, line); err != nil {
					return err
				}
			}
		},
		"1xx flood": func(w io.Writer) error {
			for {
				if _, err := io.WriteString(w, "HTTP/1.1 102 Processing\r\nX-Pad: "+strings.Repeat("a", 1000)+"\r\n\r\n"); err != nil {
					return err
				}
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			url := rawCore(t, func(conn net.Conn, br *bufio.Reader) {
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				conn.SetWriteDeadline(time.Now().Add(20 * time.Second))
				head(bufio.NewWriter(conn))
			})
			c, err := New(Config{URL: url, Timeout: 10 * time.Second, Retries: -1})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err = c.GetRun(context.Background(), "run_1")
			if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "exceeded") {
				t.Fatalf("after %v: %v, want the header bound exceeded", time.Since(start), err)
			}
		})
	}
}

// heldConn holds what is written to it while hold is set, and writes it
// all at once on flush: two TLS records in one segment.
type heldConn struct {
	net.Conn
	hold bool
	buf  []byte
}

func (h *heldConn) Write(p []byte) (int, error) {
	if h.hold {
		h.buf = append(h.buf, p...)
		return len(p), nil
	}
	return h.Conn.Write(p)
}

func (h *heldConn) flush() error {
	h.hold = false
	_, err := h.Conn.Write(h.buf)
	return err
}

// TestStrayRecordOverTLS: over TLS, Core's answer and bytes that answer
// nothing (a whole answer) come in two records of one segment. The TLS
// connection reads both from the socket, so a peek at the socket finds
// it silent; the next request still does not read the stray answer as
// its own: it goes out on a new connection. A silent TLS connection is
// still kept.
func TestStrayRecordOverTLS(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.StartTLS()
	serverTLS, clientTLS := srv.TLS.Clone(), srv.Client().Transport.(*http.Transport).TLSClientConfig
	srv.Close()
	addr, accepted := rawListener(t, func(n int32, raw net.Conn) {
		hc := &heldConn{Conn: raw}
		conn := tls.Server(hc, serverTLS)
		defer conn.Close()
		if conn.Handshake() != nil {
			return
		}
		hc.hold = n == 1 // the first connection's answer and the stray one go out in one segment
		serveRuns(n, conn, func(n int32) {
			if n == 1 {
				answerJSON(conn, `{"id": "stray", "status": "cancelled"}`)
				hc.flush()
			}
		})
	})
	c, err := New(Config{URL: "https://" + addr}, WithTLS(clientTLS))
	if err != nil {
		t.Fatal(err)
	}
	defer c.hc.CloseIdleConnections()
	ctx := context.Background()
	if _, err := c.GetRun(ctx, "run_1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	run, err := c.GetRun(ctx, "run_1")
	if err != nil {
		t.Fatal(err)
	}
	if run.ID != "run_2" {
		t.Errorf("the second request read %+v, want run_2 from a new connection", run)
	}
	if _, err := c.GetRun(ctx, "run_1"); err != nil { // on the second connection, kept
		t.Fatal(err)
	}
	if n := accepted.Load(); n != 2 {
		t.Errorf("Core accepted %d connections, want 2", n)
	}
}

// TestSwitchingProtocolsNotKept: Core answers a request with 101
// Switching Protocols, after which the connection speaks another
// protocol. The connection is not kept: the next request goes out on a
// new one.
func TestSwitchingProtocolsNotKept(t *testing.T) {
	var accepted atomic.Int32
	url := rawCore(t, func(conn net.Conn, br *bufio.Reader) {
		n := accepted.Add(1)
		for served := 0; ; served++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			if n == 1 && served == 0 {
				io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: other\r\nConnection: Upgrade\r\n\r\n")
				continue
			}
			body := fmt.Sprintf(`{"id": "run_%d", "status": "in_progress"}`, n)
			answerJSON(conn, body)
		}
	})
	c, err := New(Config{URL: url, Retries: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.hc.CloseIdleConnections()
	ctx := context.Background()
	if _, err := c.GetRun(ctx, "run_1"); StatusCode(err) != http.StatusSwitchingProtocols {
		t.Fatalf("the first request: %v, want HTTP 101", err)
	}
	if _, err := c.GetRun(ctx, "run_1"); err != nil {
		t.Fatal(err)
	}
	if n := accepted.Load(); n != 2 {
		t.Errorf("Core accepted %d connections, want 2: the switched one is not used again", n)
	}
}

// countingCore is a client of a Core that answers every request with a
// run and counts the requests it receives.
func countingCore(t *testing.T) (*Client, *atomic.Int32) {
	t.Helper()
	requests := new(atomic.Int32)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		runCore(w, r)
	}))
	t.Cleanup(srv.Close)
	c, err := New(Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.hc.CloseIdleConnections)
	return c, requests
}

// TestEndedContextNotSent: a request whose context has already ended is
// not written, though a kept connection is there for it (net/http's
// Transport checked the context first too): a write given up on must not
// reach Core after the writes that follow it.
func TestEndedContextNotSent(t *testing.T) {
	c, requests := countingCore(t)
	if _, err := c.GetRun(context.Background(), "run_1"); err != nil { // a connection is kept
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 20 {
		req, err := c.newRequest(ctx, http.MethodPut, "/v1/actions/act_1", []byte(`{"status": "processing"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := send(c.hc, req)
		if err == nil {
			resp.Body.Close()
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("a request whose context had ended: %v, want context.Canceled", err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if n := requests.Load(); n != 1 {
		t.Errorf("Core received %d requests, want 1: none whose context had ended", n)
	}
}

// TestWithdrawnNotSentWithSlotFree: a write whose withdrawal has come
// before it is sent is never sent, even when a connection is free for
// it at once (a select with both ready chose either).
func TestWithdrawnNotSentWithSlotFree(t *testing.T) {
	c, puts := countingCore(t)
	withdrawn := make(chan struct{})
	close(withdrawn)
	ctx := WithWithdraw(context.Background(), withdrawn)
	for range 20 {
		if err := c.WriteAction(ctx, "act_1", ActionUpdate{Status: ActionProcessing}); !errors.Is(err, ErrWithdrawn) {
			t.Fatalf("a withdrawn write: %v, want ErrWithdrawn", err)
		}
	}
	if n := puts.Load(); n != 0 {
		t.Errorf("Core received %d withdrawn writes, want 0", n)
	}
}

// TestAnswerBeforeTheBody: Core answers a request before it has read its
// body (a 413 here; a proxy's 401 alike) and closes the connection, so
// the rest of the body cannot be written. The call fails with Core's
// answer, as it did through net/http's Transport, not with the write's
// broken pipe, which would be a failure to retry.
func TestAnswerBeforeTheBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		http.Error(w, "too large", http.StatusRequestEntityTooLarge)
	}))
	defer srv.Close()
	c, err := New(Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer c.hc.CloseIdleConnections()
	_, err = c.SubmitToolOutput(context.Background(), ToolOutput{ThreadID: "t", ToolID: "act_1", Content: strings.Repeat("x", 32<<20)})
	if StatusCode(err) != http.StatusRequestEntityTooLarge {
		t.Fatalf("a request answered before its body was written: %v, want HTTP 413", err)
	}
}
