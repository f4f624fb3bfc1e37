package plugins

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/tool"
)

// envMCPDrip makes the test binary an MCP server whose drip tool answers a
// byte at a time, over dripFor in all; its value is a file where the server
// writes "dripping" once the answer has begun. With envMCPHTTP the server
// speaks streamable HTTP, else stdio.
const envMCPDrip = "TSC_TEST_MCP_DRIP"

// dripFor is how long a dripping answer takes: past every timeout of the
// test, so that only a replaced session answers the calls after it.
const dripFor = 20 * time.Second

// dripMark is in the drip tool's answer, and in no other message.
const dripMark = "drip-drip-drip"

// serveDripping serves testMCPServer and a drip tool, its answer dripped
// (see envMCPDrip), and exits.
func serveDripping(file string) {
	srv := testMCPServer("")
	srv.AddTool(&mcp.Tool{Name: "drip", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: dripMark}}}, nil
	})
	d := dripper{file}
	if urlFile, ok := os.LookupEnv(envMCPHTTP); ok {
		h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
		serveHTTP(urlFile, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(dripResponse{w, d}, r)
		}))
	}
	t := &mcp.IOTransport{Reader: os.Stdin, Writer: dripStdout{d}}
	_ = srv.Run(context.Background(), t)
	os.Exit(0)
}

// dripper writes a message holding dripMark a byte at a time, any other at
// once.
type dripper struct{ file string }

func (d dripper) write(w io.Writer, p []byte, flush func()) (int, error) {
	if !bytes.Contains(p, []byte(dripMark)) {
		return w.Write(p)
	}
	_ = os.WriteFile(d.file, []byte("dripping"), 0o600)
	for i := range p {
		if _, err := w.Write(p[i : i+1]); err != nil {
			return i, err // the client went away
		}
		flush()
		time.Sleep(dripFor / time.Duration(len(p)))
	}
	return len(p), nil
}

// dripStdout is the stdio server's output. The SDK writes each message
// whole, under its write lock: every message after a dripping one waits.
type dripStdout struct{ d dripper }

func (s dripStdout) Write(p []byte) (int, error) { return s.d.write(os.Stdout, p, func() {}) }
func (s dripStdout) Close() error                { return nil }

// dripResponse is a streamable HTTP server's response to one POST: each
// call's answer has its own.
type dripResponse struct {
	http.ResponseWriter
	d dripper
}

func (r dripResponse) Write(p []byte) (int, error) {
	return r.d.write(r.ResponseWriter, p, func() { _ = http.NewResponseController(r.ResponseWriter).Flush() })
}

// Unwrap lets the SDK flush the response (http.ResponseController).
func (r dripResponse) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// TestMCPDrippingAnswer: a server writes one answer a byte at a time, far
// past its call's timeout (issue #61). The dripping call is a timeout; calls
// beside it on the same session end by their own timeouts; and the next
// call is answered, within its own timeout.
//
// Over stdio every message of the session follows the dripping one on the
// server's stdout: the session is wedged, and is replaced (its server
// killed and started again); the calls beside it are timeouts. Over
// streamable HTTP the same wedge cannot happen: each call's answer comes on
// a response of its own, which the client abandons at the call's end, and
// the server writes to each response under that response's own lock. The
// calls beside the dripping one are answered, and the session is kept.
// Before the fix the next stdio call was a timeout too, its answer behind
// the 20 s drip.
func TestMCPDrippingAnswer(t *testing.T) {
	dir := t.TempDir()
	stdioFile, httpFile := filepath.Join(dir, "stdio"), filepath.Join(dir, "http")
	stdio := map[string]any{"command": []any{os.Args[0], "-test.run=^$"}, "env": map[string]any{envMCPDrip: stdioFile}}
	httpServer := httpServerProcess(t, envMCPDrip+"="+httpFile)
	t.Cleanup(StopMCP)
	for _, server := range []struct {
		name     string
		settings map[string]any
		dripping string // the file the server writes "dripping" into
		wedged   bool   // the session is wedged by the drip
	}{{"stdio", stdio, stdioFile, true}, {"http", httpServer, httpFile, false}} {
		t.Run(server.name, func(t *testing.T) {
			echo := func(timeout time.Duration) *Local { return local(t, mcpTool(server.settings, "echo", timeout)) }
			if o := dispatch(echo(5*time.Second), 5*time.Second); o.Err != nil {
				t.Fatalf("the session does not start: %v", o.Err)
			}
			dripping := local(t, mcpTool(server.settings, "drip", time.Second))
			var wg sync.WaitGroup
			drip := make(chan tool.Outcome, 1)
			wg.Go(func() { drip <- dispatch(dripping, time.Second) })
			poll.Until(t, "the answer to drip", func() bool {
				b, _ := os.ReadFile(server.dripping)
				return string(b) == "dripping"
			})
			// One bystander's timeout passes while the session is checked,
			// the other's after the session was replaced under it.
			timeouts := []time.Duration{1500 * time.Millisecond, 4 * time.Second}
			outs, took := make([]tool.Outcome, len(timeouts)), make([]time.Duration, len(timeouts))
			for i, timeout := range timeouts {
				bystander := echo(timeout)
				wg.Go(func() {
					start := time.Now()
					outs[i], took[i] = dispatch(bystander, timeout), time.Since(start)
				})
			}
			if o := <-drip; o.Err == nil || o.Err.Type != tool.Timeout {
				t.Errorf("the dripping call: %q %v, want a timeout", o.Data, o.Err)
			}
			start := time.Now()
			if o := dispatch(echo(5*time.Second), 5*time.Second); o.Err != nil || !strings.Contains(string(o.Data), "LAX") {
				t.Errorf("the next call, after %v: %q %v", time.Since(start).Round(time.Millisecond), o.Data, o.Err)
			}
			wg.Wait()
			for i, o := range outs {
				switch {
				case took[i] > timeouts[i]+time.Second:
					t.Errorf("a call beside the dripping one took %v, past its timeout of %v", took[i], timeouts[i])
				case server.wedged && (o.Err == nil || o.Err.Type != tool.Timeout):
					t.Errorf("a call beside the dripping one: %q %v, want a timeout", o.Data, o.Err)
				case !server.wedged && o.Err != nil:
					t.Errorf("a call beside the dripping one: %v", o.Err)
				}
			}
		})
	}
}
