package core_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/sim/coresim"
)

// writeFixture is a run on the simulator whose first turn made one call:
// the manifest whose outcome the tests write.
type writeFixture struct {
	sim    *coresim.Sim
	c      *core.Client
	url    string
	thread string
	run    string
	m      *core.Manifest
}

func newWriteFixture(t *testing.T) writeFixture {
	t.Helper()
	sim, srv := coresim.NewServer(coresim.Config{Scenario: coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "echo", ArgsJSON: `{}`}}}, {Content: "done"}}}})
	t.Cleanup(srv.Close)
	c, err := core.New(core.Config{URL: srv.URL, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, _ := c.CreateAssistant(ctx, core.AssistantCreate{Name: "a", Model: "vllm/x"})
	th, _ := c.CreateThread(ctx)
	msg, _ := c.CreateMessage(ctx, th.ID, a.ID, "hi")
	run, _ := c.CreateRun(ctx, core.RunCreate{AssistantID: a.ID, ThreadID: th.ID})
	st, err := c.Stream(ctx, core.CompletionRequest{Model: "vllm/x", ThreadID: th.ID, MessageID: msg.ID, RunID: run.ID, AssistantID: a.ID})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	f := writeFixture{sim: sim, c: c, url: srv.URL, thread: th.ID, run: run.ID}
	for ch, err := range st.Chunks() {
		if err == nil && ch.Kind == core.KindManifest {
			f.m = ch.Manifest
		}
	}
	if f.m == nil {
		t.Fatal("no manifest")
	}
	return f
}

func (f writeFixture) output() core.ToolOutput {
	return core.ToolOutput{Content: "result", ThreadID: f.thread, ToolID: f.m.ActionID, ToolCallID: f.m.ToolCallID}
}

// assertOneOutput: exactly one tool message for the call, and a clean
// contract log (no duplicate_output).
func (f writeFixture) assertOneOutput(t *testing.T) {
	t.Helper()
	if msgs := f.sim.ToolMessages(f.thread); len(msgs) != 1 || msgs[0].ToolCallID != f.m.ToolCallID {
		t.Errorf("tool messages %+v, want exactly one for %s", msgs, f.m.ToolCallID)
	}
	if v := f.sim.Violations(); len(v) != 0 {
		t.Errorf("violations %v", v)
	}
}

func TestRecordToolOutputRetriesRefusals(t *testing.T) {
	f := newWriteFixture(t)
	f.sim.AddFault(coresim.Fault{Method: "POST", Path: "/v1/messages/tools", Status: 503, Times: 2, RetryAfter: "0"})
	f.sim.AddFault(coresim.Fault{Method: "POST", Path: "/v1/messages/tools", Status: 429, Times: 1})
	if _, err := f.c.RecordToolOutput(context.Background(), f.output()); err != nil {
		t.Fatal(err)
	}
	f.assertOneOutput(t)
	if n := f.sim.CountRequests("POST", "/v1/messages/tools"); n != 4 {
		t.Errorf("%d posts, want 4 (2 × 503, 1 × 429, then the one that landed)", n)
	}
}

// TestRecordToolOutputReadsBeforeRetrying: Core stores the output but the
// answer is lost (late past the timeout, or the connection dropped): the
// client finds the stored output instead of posting a second one.
func TestRecordToolOutputReadsBeforeRetrying(t *testing.T) {
	for name, fault := range map[string]coresim.Fault{
		"late":    {Method: "POST", Path: "/v1/messages/tools", Store: true, Delay: time.Second},
		"dropped": {Method: "POST", Path: "/v1/messages/tools", Store: true, Drop: true},
		"5xx":     {Method: "POST", Path: "/v1/messages/tools", Store: true, Status: 502},
	} {
		t.Run(name, func(t *testing.T) {
			f := newWriteFixture(t)
			f.sim.AddFault(fault)
			m, err := f.c.RecordToolOutput(context.Background(), f.output())
			if err != nil || m.ToolCallID != f.m.ToolCallID {
				t.Fatalf("message %+v err %v", m, err)
			}
			f.assertOneOutput(t)
			if n := f.sim.CountRequests("POST", "/v1/messages/tools"); n != 1 {
				t.Errorf("%d posts, want 1: the stored output is found, not posted again", n)
			}
		})
	}
}

func TestFinaliseActionOutlastsFailures(t *testing.T) {
	f := newWriteFixture(t)
	if _, err := f.c.RecordToolOutput(context.Background(), f.output()); err != nil {
		t.Fatal(err)
	}
	f.sim.AddFault(coresim.Fault{Method: "PUT", Path: "/v1/actions/", Status: 503, Times: 5})
	if err := f.c.WriteAction(context.Background(), f.m.ActionID, core.ActionUpdate{Status: core.ActionCompleted}); err != nil {
		t.Fatal(err)
	}
	if acts := f.sim.Actions(f.run); len(acts) != 1 || acts[0].Status != core.ActionCompleted {
		t.Fatalf("actions %+v, want the one completed", acts)
	}
}

func TestWriteBudgetSpent(t *testing.T) {
	f := newWriteFixture(t)
	f.sim.AddFault(coresim.Fault{Method: "POST", Path: "/v1/messages/tools", Status: 503, Times: 1000})
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	if _, err := f.c.RecordToolOutput(ctx, f.output()); !errors.Is(err, core.ErrBudget) || core.StatusCode(err) != 503 {
		t.Fatalf("err %v, want ErrBudget wrapping the 503", err)
	}
	if msgs := f.sim.ToolMessages(f.thread); len(msgs) != 0 {
		t.Errorf("tool messages %+v", msgs)
	}
}

// TestWritesRetryARefusal: a write that Core answers with 503 and
// Retry-After is tried again (after a look at whether the output landed)
// and succeeds: one output, the Action final.
func TestWritesRetryARefusal(t *testing.T) {
	f := newWriteFixture(t)
	// Without the client's own quick retries of a 503'd PUT, the write is
	// retried by the submit loop, which honours Retry-After.
	f.c, _ = core.New(core.Config{URL: f.url, Timeout: 300 * time.Millisecond, Retries: -1})
	for _, tc := range []struct {
		name, method, path string
		write              func() error
	}{
		{"RecordToolOutput", "POST", "/v1/messages/tools", func() error {
			m, err := f.c.RecordToolOutput(context.Background(), f.output())
			if err == nil && m.ToolCallID != f.m.ToolCallID {
				err = fmt.Errorf("message %+v", m)
			}
			return err
		}},
		{"WriteAction", "PUT", "/v1/actions/", func() error {
			return f.c.WriteAction(context.Background(), f.m.ActionID, core.ActionUpdate{Status: core.ActionCompleted})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.sim.AddFault(coresim.Fault{Method: tc.method, Path: tc.path, Status: 503, RetryAfter: "1"})
			if err := tc.write(); err != nil {
				t.Fatal(err)
			}
			if n := f.sim.CountRequests(tc.method, tc.path); n < 2 {
				t.Errorf("%d requests to %s %s, want the refused one and its retry", n, tc.method, tc.path)
			}
		})
	}
	f.assertOneOutput(t)
	if acts := f.sim.Actions(f.run); len(acts) != 1 || acts[0].Status != core.ActionCompleted {
		t.Errorf("actions %+v, want the one completed", acts)
	}
}

// TestRecordedOutputNotDecodedAgain: the message a post returns carries
// Core's identifiers and the content the client sent; the content Core
// echoes is not decoded (here it differs, which the real Core's never
// does, so that the test can tell).
func TestRecordedOutputNotDecodedAgain(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/messages/tools" {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, `{"id": "msg_7", "thread_id": "thread_1", "role": "tool", "content": "echoed", "tool_call_id": "call_1"}`)
	}))
	defer srv.Close()
	c, _ := core.New(core.Config{URL: srv.URL, Retries: -1})
	m, err := c.RecordToolOutput(context.Background(), core.ToolOutput{Content: "sent", ThreadID: "thread_1", ToolCallID: "call_1"})
	if want := (core.Message{ID: "msg_7", ThreadID: "thread_1", Role: "tool", Content: "sent", ToolCallID: "call_1"}); err != nil || m != want {
		t.Fatalf("message %+v err %v, want %+v", m, err, want)
	}
}

// TestBudgetEndsWhileARetryWaits: a write refused with 503 waits to be
// tried again, and its retry still waits for the only connection, which
// Core holds, when the budget ends. The error reports the 503 that made
// it a retry, not only the budget's end.
func TestBudgetEndsWhileARetryWaits(t *testing.T) {
	refused, held, release := make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			w.WriteHeader(http.StatusServiceUnavailable)
			refused <- struct{}{}
			return
		}
		close(held)
		<-release
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id": "run_1", "status": "queued"}`)
	}))
	defer srv.Close()
	defer close(release)
	c, _ := core.New(core.Config{URL: srv.URL, MaxConns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.WriteAction(ctx, "act_1", core.ActionUpdate{Status: core.ActionCompleted}) }()
	<-refused // the first attempt; its retry waits 100 to 300 ms
	go c.GetRun(context.Background(), "run_1")
	<-held // the only connection is Core's until the test ends
	err := <-errc
	if !errors.Is(err, core.ErrBudget) || core.StatusCode(err) != http.StatusServiceUnavailable {
		t.Fatalf("err %v, want ErrBudget wrapping the 503", err)
	}
}
