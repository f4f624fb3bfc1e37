package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// describe renders a chunk or error as one line of a .want file.
func describe(c Chunk, err error) string {
	var fe *FrameError
	switch {
	case errors.As(err, &fe):
		return "frame_error " + fe.Reason
	case errors.Is(err, io.EOF):
		return "end done"
	case errors.Is(err, ErrTruncated):
		return "end truncated"
	case errors.Is(err, ErrStreamIdle):
		return "end idle"
	case err != nil:
		return "end error " + err.Error()
	}
	switch c.Kind {
	case KindStatus:
		return "status " + c.Status
	case KindToolCall:
		return "tool_call " + c.Call.Name + " " + c.Call.Arguments
	case KindManifest:
		m := c.Manifest
		return fmt.Sprintf("manifest %s %s %s %s", m.ActionID, m.ToolCallID, m.Tool, m.Args)
	case KindUnknown:
		return "unknown " + c.Type
	}
	return fmt.Sprintf("%s %q", c.Kind, c.Text)
}

// serveBody answers every request with the given SSE body.
func serveBody(t *testing.T, body []byte) *Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	c, err := New(Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func drain(s *Stream) []string {
	var got []string
	for {
		c, err := s.Next()
		got = append(got, describe(c, err))
		if err != nil && !errors.Is(err, ErrFrame) {
			return got
		}
	}
}

// TestGoldenFrames parses each recorded frame sequence in testdata/frames
// through a real HTTP response and compares the typed chunks with the
// hand-written expectation beside it.
func TestGoldenFrames(t *testing.T) {
	files, err := filepath.Glob("testdata/frames/*.sse")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden frames: %v", err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".sse")
		t.Run(name, func(t *testing.T) {
			body, _ := os.ReadFile(f)
			wantData, err := os.ReadFile(strings.TrimSuffix(f, ".sse") + ".want")
			if err != nil {
				t.Fatal(err)
			}
			want := strings.Split(strings.TrimSpace(string(wantData)), "\n")
			s, err := serveBody(t, body).Stream(context.Background(), CompletionRequest{RunID: "r"})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			got := drain(s)
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("chunks:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(want, "\n      "))
			}
			// The end is sticky.
			if _, err := s.Next(); err == nil || errors.Is(err, ErrFrame) {
				t.Errorf("Next after end = %v, want the terminal error again", err)
			}
		})
	}
}

// TestChunkedReads feeds the same frames through reads of many sizes: the
// result must not depend on where the bytes are cut.
func TestChunkedReads(t *testing.T) {
	body, _ := os.ReadFile("testdata/frames/all_types.sse")
	var ref []string
	for _, size := range []int{1, 2, 3, 17, 4096} {
		s := streamFrom(&slowReader{data: body, n: size}, 0)
		got := drain(s)
		s.Close()
		if ref == nil {
			ref = got
			continue
		}
		if strings.Join(got, "|") != strings.Join(ref, "|") {
			t.Errorf("read size %d: got %v, want %v", size, got, ref)
		}
	}
	if len(ref) != 10 {
		t.Fatalf("expected 10 results, got %d: %v", len(ref), ref)
	}
}

type slowReader struct {
	data []byte
	n    int
}

func (r *slowReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := min(r.n, len(p), len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

func streamFrom(r io.Reader, idle time.Duration) *Stream {
	ctx, cancel := context.WithCancelCause(context.Background())
	return newStream(ctx, cancel, io.NopCloser(r), idle, 1<<20)
}

func TestChunksIterator(t *testing.T) {
	body, _ := os.ReadFile("testdata/frames/not_json.sse")
	s := streamFrom(bytes.NewReader(body), 0)
	defer s.Close()
	var kinds []string
	for c, err := range s.Chunks() {
		kinds = append(kinds, describe(c, err))
	}
	want := "frame_error not JSON|content \"after\"|frame_error not JSON"
	if got := strings.Join(kinds, "|"); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	trunc := streamFrom(strings.NewReader("data: {\"type\": \"content\", \"content\": \"a\"}\n\n"), 0)
	defer trunc.Close()
	var last error
	for _, err := range trunc.Chunks() {
		last = err
	}
	if !errors.Is(last, ErrTruncated) {
		t.Errorf("last error %v, want ErrTruncated", last)
	}
}

func TestIdleTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("data: {\"type\": \"status\", \"status\": \"started\", \"run_id\": \"r\"}\n\n"))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	c, _ := New(Config{URL: srv.URL, StreamIdleTimeout: 100 * time.Millisecond})
	s, err := c.Stream(context.Background(), CompletionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := drain(s)
	if len(got) != 2 || got[0] != "status started" || got[1] != "end idle" {
		t.Fatalf("got %v, want [status started, end idle]", got)
	}
}

func TestStreamCallerCancel(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	c, _ := New(Config{URL: srv.URL})
	ctx, cancel := context.WithCancelCause(context.Background())
	s, err := c.Stream(ctx, CompletionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	stop := errors.New("application gave up")
	time.AfterFunc(20*time.Millisecond, func() { cancel(stop) })
	if _, err := s.Next(); !errors.Is(err, stop) {
		t.Fatalf("Next = %v, want the caller's cause", err)
	}
}

func TestStreamHTTPErrorBeforeStream(t *testing.T) {
	long := strings.Repeat("x", 10_000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"detail": "Thread ID does not match the run."}`+long, http.StatusForbidden)
	}))
	defer srv.Close()
	c, _ := New(Config{URL: srv.URL})
	_, err := c.Stream(context.Background(), CompletionRequest{})
	var he *HTTPError
	if !errors.As(err, &he) {
		t.Fatalf("err = %v, want *HTTPError", err)
	}
	if he.Status != 403 || !strings.HasPrefix(he.Body, `{"detail": "Thread ID does not match the run."}`) || len(he.Body) > errorExcerpt {
		t.Errorf("got status %d body len %d %.60q", he.Status, len(he.Body), he.Body)
	}
	if StatusCode(err) != 403 || StatusCode(io.EOF) != 0 {
		t.Errorf("StatusCode mismatch")
	}
}

func TestStreamConnectionRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c, _ := New(Config{URL: url})
	if _, err := c.Stream(context.Background(), CompletionRequest{}); err == nil || StatusCode(err) != 0 {
		t.Fatalf("err = %v, want a transport error", err)
	}
}

// TestFrameTooLarge: a frame over the bound is never read whole. A
// manifest among such frames is its call, with a Problem that says why it
// cannot run (its ids come before its arguments); any other is one
// undecodable frame; the stream goes on to its end either way.
func TestFrameTooLarge(t *testing.T) {
	big := "data: {\"type\": \"content\", \"content\": \"" + strings.Repeat("a", 2048) + "\"}\n\n" +
		"data: {\"type\": \"tool_call_manifest\", \"run_id\": \"run_1\", \"action_id\": \"act_1\", \"tool_call_id\": \"call_1\", \"tool\": \"t\", \"args\": {\"x\": \"" +
		strings.Repeat("b", 4096) + "\"}}\n\n" +
		"data: {\"type\": \"tool_call_manifest\", \"args\": {\"x\": \"" + strings.Repeat("c", 4096) + "\"}, \"action_id\": \"act_2\", \"tool_call_id\": \"call_2\"}\n\n" +
		"data: {\"type\": \"content\", \"content\": \"after\"}\n\ndata: [DONE]\n\n"
	ctx, cancel := context.WithCancelCause(context.Background())
	s := newStream(ctx, cancel, io.NopCloser(strings.NewReader(big)), 0, 1024)
	defer s.Close()
	var fe *FrameError
	if _, err := s.Next(); !errors.As(err, &fe) || fe.Manifest || !strings.Contains(err.Error(), "over the limit of 1024") {
		t.Fatalf("the long content frame: %v, want a frame error", err)
	}
	c, err := s.Next()
	if err != nil || c.Kind != KindManifest || c.Manifest.ActionID != "act_1" || c.Manifest.ToolCallID != "call_1" ||
		!strings.Contains(c.Manifest.Problem, "over the limit of 1024") {
		t.Fatalf("the long manifest: %+v %v", c.Manifest, err)
	}
	if _, err := s.Next(); !errors.As(err, &fe) || !fe.Manifest {
		t.Fatalf("a long manifest whose ids come after its arguments: %v, want a lost call", err)
	}
	if c, err := s.Next(); err != nil || c.Text != "after" {
		t.Fatalf("the frame after: %+v %v", c, err)
	}
	if _, err := s.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("end: %v", err)
	}
}

func TestCloseEarly(t *testing.T) {
	body, _ := os.ReadFile("testdata/frames/all_types.sse")
	s := streamFrom(bytes.NewReader(body), time.Minute)
	if _, err := s.Next(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Close()
	if _, err := s.Next(); err == nil {
		t.Fatal("Next after Close must fail")
	}
}

// TestMalformedManifests: a manifest that does not decode whole still
// yields its call (IDs and a Problem) when the IDs can be read, whatever
// else is broken; without them it is a FrameError marked Manifest.
func TestMalformedManifests(t *testing.T) {
	deep := strings.Repeat("[", 20000) + strings.Repeat("]", 20000)
	for name, tc := range map[string]struct {
		frame, problem string
	}{
		"tool not a string": {`{"type": "tool_call_manifest", "run_id": "r", "action_id": "a1", "tool_call_id": "c1", "tool": ["echo"], "args": {}}`, "field of the wrong type"},
		"args too deep":     {`{"type": "tool_call_manifest", "run_id": "r", "action_id": "a1", "tool_call_id": "c1", "tool": "echo", "args": {"x": ` + deep + `}}`, "nested 20002 levels deep, more than the limit of 64"},
		"args not JSON":     {`{"type": "tool_call_manifest", "run_id": "r", "action_id": "a1", "tool_call_id": "c1", "tool": "echo", "args": {"x": nope}}`, "not JSON"},
		"no tool":           {`{"type": "tool_call_manifest", "run_id": "r", "action_id": "a1", "tool_call_id": "c1", "args": {}}`, "names no tool"},
	} {
		c, err := DecodeChunk([]byte(tc.frame))
		if err != nil || c.Kind != KindManifest || c.Manifest.ActionID != "a1" || c.Manifest.ToolCallID != "c1" || !strings.Contains(c.Manifest.Problem, tc.problem) {
			t.Errorf("%s: chunk %+v err %v, want a manifest with a problem %q", name, c.Manifest, err, tc.problem)
		}
	}
	_, err := DecodeChunk([]byte(`{"type": "tool_call_manifest", "run_id": "r", "tool": ["echo"], "action_id": "a1"}`))
	var fe *FrameError
	if !errors.As(err, &fe) || !fe.Manifest {
		t.Errorf("manifest without tool_call_id: %v, want a FrameError marked Manifest", err)
	}
	if _, err := DecodeChunk([]byte(`{"type": "content", "content": ` + deep + `}`)); !errors.As(err, &fe) || fe.Manifest {
		t.Errorf("deep content frame: %v, want a plain FrameError", err)
	}
}

// TestStreamConnectionKept: a turn's stream whose body Core ends after
// [DONE] (in a write of its own, as uvicorn does) leaves its connection
// kept, and the next turns' streams go out on it; once Core has closed
// it, the next goes out on a new one. A stream whose body Core holds open
// after [DONE] has its connection closed, and each turn opens one.
func TestStreamConnectionKept(t *testing.T) {
	for _, holdOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("held open=%v", holdOpen), func(t *testing.T) {
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.Write([]byte("data: {\"type\": \"content\", \"content\": \"hi\", \"run_id\": \"r\"}\n\ndata: [DONE]\n\n"))
				w.(http.Flusher).Flush()
				if holdOpen {
					<-r.Context().Done()
				}
			}))
			conns := logConns(srv)
			srv.Start()
			defer srv.Close()
			c, _ := New(Config{URL: srv.URL})
			defer c.streamHC.CloseIdleConnections()
			for turn := range 3 {
				s, err := c.Stream(context.Background(), CompletionRequest{})
				if err != nil {
					t.Fatal(err)
				}
				if got := drain(s); len(got) != 2 || got[0] != `content "hi"` || got[1] != "end done" {
					t.Fatalf("turn %d: got %v, want [content \"hi\", end done]", turn, got)
				}
				s.Close()
				if holdOpen {
					conns.waitClosed(t)
				}
			}
			want := int32(1)
			if holdOpen {
				want = 3
			}
			if n := conns.opened.Load(); n != want {
				t.Errorf("3 streams used %d connections, want %d", n, want)
			}
			if holdOpen {
				return
			}
			// Core closes the kept connection: the next turn's stream goes
			// out on a new one, and is answered.
			srv.CloseClientConnections()
			conns.waitClosed(t)
			s, err := c.Stream(context.Background(), CompletionRequest{})
			if err != nil {
				t.Fatalf("a stream after Core closed the kept connection: %v", err)
			}
			if got := drain(s); len(got) != 2 {
				t.Fatalf("a stream after Core closed the kept connection: %v", got)
			}
			s.Close()
			if n := conns.opened.Load(); n != 2 {
				t.Errorf("%d connections, want 2", n)
			}
		})
	}
}
