package plugins

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os/exec"
	"regexp"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/projectdavid/toolsidecar/internal/frames"
)

// An MCP server's messages are bounded while they are read. The SDK reads a
// message whole (a stdio line, an HTTP body, an SSE event) and, past its
// own bound, ends the session: every call in flight on it fails, and one
// 50 MB result held the sidecar's memory until then. Read through
// internal/frames, a message past mcpFrameBytes is never held: it becomes
// a JSON-RPC error answering the same request id, so that only its own
// call fails (tool_error), and the session goes on.

// codeTooLarge is the JSON-RPC error code of a result that was not read: in
// the range JSON-RPC leaves to implementations.
const codeTooLarge = -32090

// mcpFrameBytes bounds one message of a server whose results are bounded by
// maxResult: a result's text may come escaped in JSON (doubling it), beside
// the envelope. A result between maxResult and this is read, and refused
// with its size.
func mcpFrameBytes(maxResult int) int { return 2*maxResult + 64<<10 }

// tooLarge is the error message that replaces an oversized response, as a
// JSON-RPC message, or nil when the message is not a response whose id can
// be read (a request or a notification of the server's is dropped; a
// response whose id is unreadable leaves its call to its timeout).
func tooLarge(o frames.Oversized, limit int) []byte {
	head := jsonStart(o.Head)
	if frames.TopLevel(head)["method"] != nil {
		return nil
	}
	id := frames.TopLevel(head)["id"]
	if id == nil {
		id = tailID(o.Tail)
	}
	if id == nil {
		return nil
	}
	msg, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": codeTooLarge,
		"message": fmt.Sprintf("the server's answer is %d bytes long, over the limit of %d; it was not read", o.Size, limit)}})
	return msg
}

// jsonStart is where the JSON of a frame starts: after an SSE event's
// field names ("event: message\ndata: {...").
func jsonStart(b []byte) []byte {
	if i := bytes.IndexByte(b, '{'); i >= 0 {
		return b[i:]
	}
	return nil
}

// idAtEnd is a JSON-RPC id written last, as some serializers do (the
// TypeScript SDK writes result, jsonrpc, id).
var idAtEnd = regexp.MustCompile(`"id"\s*:\s*("(?:[^"\\]|\\.){0,256}"|-?\d{1,20})\s*}\s*$`)

// tailID reads an id written at the end of a message.
func tailID(tail []byte) json.RawMessage {
	m := idAtEnd.FindSubmatch(bytes.TrimSpace(tail))
	if m == nil {
		return nil
	}
	return json.RawMessage(bytes.Clone(m[1]))
}

// boundedBody bounds an MCP server's HTTP answer by its kind: each event of
// a stream, or the whole of a JSON body.
func boundedBody(resp *http.Response, limit int) {
	kind := frames.Whole
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" {
		kind = frames.Events
	}
	replace := func(o frames.Oversized) []byte {
		msg := tooLarge(o, limit)
		if msg == nil || kind == frames.Whole {
			return msg
		}
		return fmt.Appendf(nil, "event: message\ndata: %s\n\n", msg)
	}
	resp.Body = readCloser{frames.NewReader(resp.Body, kind, limit, replace), resp.Body}
	resp.ContentLength = -1
}

type readCloser struct {
	io.Reader
	io.Closer
}

// stdioTransport is the SDK's CommandTransport with its server's output
// read through a frames.Reader: one line (one message) past the bound is
// that request's error, not the session's end.
type stdioTransport struct {
	cmd       *exec.Cmd
	terminate time.Duration
	limit     int
}

func (t *stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	stdout, err := t.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := t.cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := t.cmd.Start(); err != nil {
		return nil, err
	}
	out := frames.NewReader(stdout, frames.Lines, t.limit, func(o frames.Oversized) []byte {
		if msg := tooLarge(o, t.limit); msg != nil {
			return append(msg, '\n')
		}
		return nil
	})
	// A line that is not JSON (a server that logs to its stdout) is
	// dropped, not taken for the end of the session.
	out.Keep = func(line []byte) bool {
		line = bytes.TrimSpace(line)
		return len(line) == 0 || json.Valid(line)
	}
	tr := &mcp.IOTransport{Reader: io.NopCloser(out), Writer: &serverInput{stdin, t.cmd, t.terminate}, MaxLineLength: t.limit + 1<<10}
	return tr.Connect(ctx)
}

// serverInput is the stdin of a stdio server; closing it ends the server
// as the MCP specification says: close its input, wait, SIGTERM, wait,
// SIGKILL.
type serverInput struct {
	io.WriteCloser
	cmd       *exec.Cmd
	terminate time.Duration
}

func (s *serverInput) Close() error {
	if err := s.WriteCloser.Close(); err != nil {
		return fmt.Errorf("closing stdin: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait() }()
	wait := func() (error, bool) {
		select {
		case err := <-exited:
			return err, true
		case <-time.After(s.terminate):
			return nil, false
		}
	}
	if err, ok := wait(); ok {
		return err
	}
	if s.cmd.Process.Signal(syscall.SIGTERM) == nil {
		if err, ok := wait(); ok {
			return err
		}
	}
	if err := s.cmd.Process.Kill(); err != nil {
		return err
	}
	if err, ok := wait(); ok {
		return err
	}
	return errors.New("the MCP server did not exit after SIGKILL")
}
