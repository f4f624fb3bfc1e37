package executor_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/coreup"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/promtest"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// counted is a handler that counts its executions per tool_call_id, so
// that a test can assert that no tool ran twice.
type counted struct {
	mu  sync.Mutex
	ran map[string]int
}

func (c *counted) handler(ctx context.Context, call *tool.Call) ([]byte, error) {
	c.mu.Lock()
	if c.ran == nil {
		c.ran = map[string]int{}
	}
	c.ran[call.ToolCallID]++
	c.mu.Unlock()
	return []byte(`"ran ` + call.ToolCallID + `"`), nil
}

func (c *counted) total() (calls, runs int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.ran {
		calls++
		runs += n
	}
	return calls, runs
}

// assertCompletedOnce is the invariant on Core's side: the run completed,
// exactly one output per tool_call_id, every Action finalised, an empty
// contract log, and each tool run once.
func assertCompletedOnce(t *testing.T, h *harness, sum executor.Summary, calls int, c *counted) {
	t.Helper()
	if sum.Status != executor.StatusCompleted {
		t.Fatalf("status %s (%s), want completed", sum.Status, sum.Error)
	}
	if run, _ := h.core.GetRun(context.Background(), h.req.RunID); run.Status != core.RunCompleted {
		t.Errorf("Core's run is %s", run.Status)
	}
	h.assertWholeBatches(calls)
	if c != nil {
		if n, runs := c.total(); n != calls || runs != calls {
			t.Errorf("%d calls ran %d times, want %d once each", n, runs, calls)
		}
	}
}

func threeEcho() coresim.Scenario { return twoTurns(calls("echo", "echo", "echo")...) }

// TestCoreWriteFaults: Core refuses the first tool outputs with 503; Core
// stores an output but answers after core.timeout, or drops the connection
// after storing it; the final PUT of an Action fails four times in a row;
// Core holds the processing marks, or an output, past core.timeout before
// it applies them. Each run still completes with one output per call, each
// Action's writes in order (the contract log is empty) and each tool run
// once.
func TestCoreWriteFaults(t *testing.T) {
	cases := []struct {
		name   string
		faults []coresim.Fault
	}{
		{"output refused", []coresim.Fault{{Method: "POST", Path: "/v1/messages/tools", Status: 503, Times: 2}}},
		{"output stored, answer late", []coresim.Fault{{Method: "POST", Path: "/v1/messages/tools", Store: true, Delay: 2 * time.Second}}},
		{"output stored, connection dropped", []coresim.Fault{{Method: "POST", Path: "/v1/messages/tools", Store: true, Drop: true, Times: 3}}},
		// The processing marks take the first three PUTs; then four fail.
		{"final status fails four times", []coresim.Fault{{Method: "PUT", Path: "/v1/actions/", Status: 503, Times: 3, Store: true},
			{Method: "PUT", Path: "/v1/actions/", Status: 502, Times: 4}}},
		// Core holds a write past core.timeout before it applies it: a
		// write given up on would be applied after the call's next one
		// (a processing mark after the final status, an output twice).
		{"processing marks held past core.timeout", []coresim.Fault{{Method: "PUT", Path: "/v1/actions/", Hold: time.Second, Times: 3}}},
		{"output held past core.timeout", []coresim.Fault{{Method: "POST", Path: "/v1/messages/tools", Hold: time.Second}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &counted{}
			h := newHarnessWith(t, threeEcho(), testenv.Options{CoreTimeout: 400 * time.Millisecond}, spec{config.Tool{Name: "echo"}, c.handler})
			for _, f := range tc.faults {
				h.sim.AddFault(f)
			}
			sum, err := h.drive(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			assertCompletedOnce(t, h, sum, 3, c)
			for _, call := range sum.Calls {
				if !call.OK {
					t.Errorf("call %+v: its output landed, so it succeeded", call)
				}
			}
		})
	}
}

// Cases 4: concurrent drives of one run attach to one driver: one
// completions request per turn and identical summaries.
func TestConcurrentDrivesAttach(t *testing.T) {
	c := &counted{}
	release := make(chan struct{})
	slow := func(ctx context.Context, call *tool.Call) ([]byte, error) {
		<-release
		return c.handler(ctx, call)
	}
	h := newHarness(t, threeEcho(), config.Executor{}, spec{config.Tool{Name: "echo"}, slow})
	const n = 50
	sums := make([]executor.Summary, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { sums[i], _ = h.exec.Drive(context.Background(), h.req, nil) })
	}
	// The calls are held until every other drive has attached: one that
	// came after the run ended would rightly report it ended.
	poll.Until(t, "49 drives attached to the first", func() bool {
		attached, _ := promtest.Sum(t, h.exec.Metrics(), "toolsidecar_drives_attached_total")
		return attached == n-1
	})
	close(release)
	wg.Wait()
	assertCompletedOnce(t, h, sums[0], 3, c)
	if got := h.sim.CountRequests("POST", "/v1/completions"); got != 2 {
		t.Errorf("%d completions requests for 2 turns, want 2", got)
	}
	for i, s := range sums {
		if s.Status != sums[0].Status || s.Content != sums[0].Content || len(s.Calls) != len(sums[0].Calls) {
			t.Errorf("summary %d differs: %+v vs %+v", i, s, sums[0])
		}
	}
}

// Case 5: driving a completed run asks the model nothing.
func TestDriveFinishedRun(t *testing.T) {
	h := newHarness(t, twoTurns(calls("echo")...), config.Executor{}, spec{config.Tool{Name: "echo"}, echo})
	first, err := h.drive(context.Background())
	if err != nil || first.Status != executor.StatusCompleted {
		t.Fatalf("first drive %+v %v", first, err)
	}
	again, err := h.drive(context.Background())
	if err != nil || again.Status != executor.StatusCompleted || again.Content != first.Content || len(again.Calls) != 0 {
		t.Fatalf("second drive %+v %v, want the completed run's state", again, err)
	}
	if n := h.sim.CountRequests("POST", "/v1/completions"); n != 2 {
		t.Errorf("%d completions requests, want the first drive's 2 only", n)
	}
	// The second drive ran nothing: it is a replay, not a second run.
	m := h.env.Sidecar.Metrics()
	if runs, replays := promtest.Value(t, m, "toolsidecar_runs_total", "status=completed"), promtest.Value(t, m, "toolsidecar_drives_replayed_total", "status=completed"); runs != 1 || replays != 1 {
		t.Errorf("runs_total{completed} %v, drives_replayed_total{completed} %v: want 1 and 1", runs, replays)
	}
}

// Case 6: manifests that do not decode still get an outcome.
func TestMalformedManifestsAnswered(t *testing.T) {
	deep := strings.Repeat("[", 20000) + strings.Repeat("]", 20000)
	sc := twoTurns(coresim.Call{Tool: "echo", RawTool: `["echo"]`}, coresim.Call{Tool: "echo", RawArgs: `{"x": ` + deep + `}`},
		coresim.Call{Tool: "echo", ArgsJSON: `{"q": "fine"}`})
	c := &counted{}
	h := newHarness(t, sc, config.Executor{}, spec{config.Tool{Name: "echo"}, c.handler})
	sum, err := h.drive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Status != executor.StatusCompleted || len(sum.Calls) != 3 {
		t.Fatalf("summary %+v", sum)
	}
	h.assertWholeBatches(3)
	for i, want := range []string{"field of the wrong type", "nested 20002 levels deep"} {
		if call := sum.Calls[i]; call.ErrorType != "invalid_args" || !strings.Contains(call.Error, want) {
			t.Errorf("call %d: %+v, want invalid_args saying %q", i, call, want)
		}
	}
	if n, _ := c.total(); n != 1 {
		t.Errorf("%d calls reached the worker, want only the well-formed one", n)
	}
}

// A drive whose Core stays down past the submit budget ends interrupted,
// keeping the outcomes; after Core is back, the next drive completes the
// run without running any tool again.
func TestCoreDownPastBudget(t *testing.T) {
	c := &counted{}
	h := newHarness(t, threeEcho(), config.Executor{SubmitBudget: 500 * time.Millisecond}, spec{config.Tool{Name: "echo"}, c.handler})
	h.sim.AddFault(coresim.Fault{Method: "POST", Path: "/v1/messages/tools", Status: 503, Times: 1000})
	sum, err := h.drive(context.Background())
	if err != nil || sum.Status != executor.StatusInterrupted || !strings.Contains(sum.Error, "kept") {
		t.Fatalf("summary %+v err %v, want interrupted keeping the outcomes", sum, err)
	}
	if msgs := h.sim.ToolMessages(h.req.ThreadID); len(msgs) != 0 {
		t.Fatalf("tool messages %+v while Core refused them", msgs)
	}
	for _, a := range h.sim.Actions(h.req.RunID) {
		// pending: the call ended before its processing mark left the queue.
		if a.Status != core.ActionProcessing && a.Status != core.ActionPending {
			t.Errorf("action %s %s: an Action is never finalised before its output", a.ID, a.Status)
		}
	}
	h.sim.ClearFaults()
	sum, err = h.drive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	assertCompletedOnce(t, h, sum, 3, c)
	// The kept outcomes are what reached Core: the tools' own results.
	for _, call := range sum.Calls {
		if !call.OK {
			t.Errorf("kept call %s submitted as %s: %s", call.ToolCallID, call.ErrorType, call.Error)
		}
	}
	for _, m := range h.sim.ToolMessages(h.req.ThreadID) {
		if strings.Contains(m.Content, "error_type") {
			t.Errorf("tool message %q, want the kept result", m.Content)
		}
	}
}

// TestReconcileAfterLostSidecar: a sidecar died mid-batch. Core has one
// call with its output (Action still processing), one pending call of a
// read-only tool, and one processing call of an unsafe tool. A new drive
// finalises the first without posting again, runs the second, and gives
// the third an "interrupted" outcome without running it.
func TestReconcileAfterLostSidecar(t *testing.T) {
	c := &counted{}
	sc := twoTurns(calls("echo", "echo", "pay")...)
	h := newHarness(t, sc, config.Executor{},
		spec{config.Tool{Name: "echo"}, c.handler},
		spec{config.Tool{Name: "pay", SideEffects: config.Unsafe}, c.handler})
	// What the lost sidecar did: read the turn, mark calls 1 and 3
	// processing, record call 1's output.
	ctx := context.Background()
	st, err := h.core.Stream(ctx, core.CompletionRequest{Model: h.req.Model, ThreadID: h.req.ThreadID, MessageID: h.req.MessageID, RunID: h.req.RunID, AssistantID: h.req.AssistantID})
	if err != nil {
		t.Fatal(err)
	}
	var ms []*core.Manifest
	for ch, err := range st.Chunks() {
		if err == nil && ch.Kind == core.KindManifest {
			ms = append(ms, ch.Manifest)
		}
	}
	st.Close()
	for _, i := range []int{0, 2} {
		h.core.UpdateAction(ctx, ms[i].ActionID, core.ActionUpdate{Status: core.ActionProcessing})
	}
	h.core.SubmitToolOutput(ctx, core.ToolOutput{Content: `"from the lost sidecar"`, ThreadID: h.req.ThreadID, AssistantID: h.req.AssistantID, ToolID: ms[0].ActionID, ToolCallID: ms[0].ToolCallID})

	sum, err := h.drive(ctx)
	if err != nil || sum.Status != executor.StatusCompleted || sum.Turns != 1 {
		t.Fatalf("summary %+v err %v, want completed after 1 more turn", sum, err)
	}
	h.assertWholeBatches(3)
	if n, runs := c.total(); n != 1 || runs != 1 || c.ran[ms[1].ToolCallID] != 1 {
		t.Errorf("ran %v, want only the pending read-only call, once", c.ran)
	}
	msgs := h.sim.ToolMessages(h.req.ThreadID)
	if msgs[0].Content != `"from the lost sidecar"` {
		t.Errorf("first output %q was replaced", msgs[0].Content)
	}
	if typ, _ := errorOf(t, msgs[2].Content); typ != "interrupted" {
		t.Errorf("unsafe call's output %s, want an interrupted error", msgs[2].Content)
	}
}

// TestFreshRunAsksNoOpenActions: a run whose first turn never began has no
// Actions, so its drive skips the reconciliation's two reads, but only
// when Core says so (started_at present and null). A Core answer without
// the field leaves the reads in place, and a run that began is reconciled
// (TestReconcileAfterLostSidecar).
func TestFreshRunAsksNoOpenActions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		strip     bool // Core's run read has no started_at
		wantReads int
	}{{"started_at null", false, 0}, {"no started_at", true, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			c := &counted{}
			opts := testenv.Options{}
			if tc.strip {
				opts.ServeCore = withoutStartedAt
			}
			h := newHarnessWith(t, threeEcho(), opts, spec{config.Tool{Name: "echo"}, c.handler})
			sum, err := h.drive(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			assertCompletedOnce(t, h, sum, 3, c)
			reads := h.sim.CountRequests(http.MethodGet, "/v1/actions/pending/") + h.sim.CountRequests(http.MethodGet, "/v1/runs/"+h.req.RunID+"/actions/")
			if reads != tc.wantReads {
				t.Errorf("%d reads of the run's open Actions, want %d", reads, tc.wantReads)
			}
		})
	}
}

// withoutStartedAt serves the simulator as a Core whose run reads have no
// started_at field.
func withoutStartedAt(sim *coresim.Sim) (string, *core.Client, func()) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.HasPrefix(r.URL.Path, "/v1/runs/") || strings.Count(r.URL.Path, "/") != 3 {
			sim.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		sim.ServeHTTP(rec, r)
		var run map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &run); err != nil {
			panic(err)
		}
		delete(run, "started_at")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.Code)
		_ = json.NewEncoder(w).Encode(run)
	}))
	cc, err := core.New(core.Config{URL: srv.URL, APIKey: testenv.APIKey, Timeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	return srv.URL, cc, srv.Close
}

// panicky is a transport that panics: a bug in the sidecar's own code,
// outside any worker's handler.
type panicky struct{}

func (panicky) Dispatch(context.Context, tool.Request) tool.Outcome { panic("transport bug") }

// TestPanicOutsideWorker: a panic in the sidecar's code path of one call
// becomes that call's error outcome, submitted like any other; the run
// goes on to its next turn.
func TestPanicOutsideWorker(t *testing.T) {
	sim, srv := coresim.NewServer(coresim.Config{Scenario: twoTurns(calls("boom", "echo")...)})
	defer srv.Close()
	cc, err := core.New(core.Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Tools = []config.Tool{{Name: "boom"}, {Name: "echo"}}
	reg, err := registry.New(context.Background(), cfg, registry.Base(panicky{}))
	if err != nil {
		t.Fatal(err)
	}
	ex := executor.New(sidecar.ExecutorConfig(cfg.Executor), coreup.New(cc), registry.NewLive(reg))
	ctx := context.Background()
	a, _ := cc.CreateAssistant(ctx, core.AssistantCreate{Name: "a", Model: "vllm/x"})
	th, _ := cc.CreateThread(ctx)
	msg, _ := cc.CreateMessage(ctx, th.ID, a.ID, "hi")
	run, _ := cc.CreateRun(ctx, core.RunCreate{AssistantID: a.ID, ThreadID: th.ID})
	sum, err := ex.Drive(ctx, executor.Request{RunID: run.ID, ThreadID: th.ID, AssistantID: a.ID, MessageID: msg.ID, Model: "vllm/x"}, nil)
	if err != nil || sum.Status != executor.StatusCompleted || len(sum.Calls) != 2 {
		t.Fatalf("summary %+v err %v", sum, err)
	}
	for _, c := range sum.Calls {
		if c.ErrorType != "worker_crash" || !strings.Contains(c.Error, "transport bug") || !c.Submitted {
			t.Errorf("call %+v, want a submitted worker_crash outcome", c)
		}
	}
	if v := sim.Violations(); len(v) != 0 {
		t.Errorf("violations %v", v)
	}
}

// TestMarkHeldPastSubmitBudget: Core holds a call's processing mark past
// the submit budget and applies it after the sidecar gave up on it. The
// drive must not record the call's output and final status while the
// mark may still land (Core would reopen the finalised Action), nor say
// completed: it ends interrupted, keeping the outcome, and the next drive,
// once the mark has landed, completes the run with every Action final and
// the contract log empty.
func TestMarkHeldPastSubmitBudget(t *testing.T) {
	for _, side := range []string{config.ReadOnly, config.Unsafe} {
		t.Run(side, func(t *testing.T) {
			c := &counted{}
			h := newHarness(t, twoTurns(calls("look", "look")...), config.Executor{SubmitBudget: 300 * time.Millisecond},
				spec{config.Tool{Name: "look", SideEffects: side}, c.handler})
			h.sim.AddFault(coresim.Fault{Method: "PUT", Path: "/v1/actions/", Hold: time.Second})
			sum, err := h.drive(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			poll.Until(t, "Core to apply the held mark", func() bool { return h.sim.Holding() == 0 })
			if v := h.sim.Violations(); len(v) != 0 {
				t.Fatalf("contract log %v after the held mark landed (drive %s)", v, sum.Status)
			}
			if sum.Status != executor.StatusInterrupted || !strings.Contains(sum.Error, "kept") {
				t.Fatalf("drive %s (%s), want interrupted keeping the outcome: the mark could still land", sum.Status, sum.Error)
			}
			// What the drive reports submitted is what Core has final.
			final := map[string]bool{}
			for _, a := range h.sim.Actions(h.req.RunID) {
				final[a.ID] = a.Status != core.ActionPending && a.Status != core.ActionProcessing
			}
			kept := 0
			for _, call := range sum.Calls {
				if call.Submitted != final[call.ActionID] {
					t.Errorf("call %s reported submitted %v, its Action final in Core %v", call.ToolCallID, call.Submitted, final[call.ActionID])
				}
				if !call.Submitted {
					kept++
				}
			}
			if kept == 0 {
				t.Error("every call reported submitted, the one whose mark Core held included")
			}
			sum, err = h.drive(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if side != config.Unsafe {
				assertCompletedOnce(t, h, sum, 2, c)
				return
			}
			// The unsafe call whose mark was held never ran (it runs only
			// once Core knows it started); the other ran once.
			assertCompletedOnce(t, h, sum, 2, nil)
			if n, runs := c.total(); n != 1 || runs != 1 {
				t.Errorf("%d calls ran %d times, want 1 once", n, runs)
			}
		})
	}
}

// TestStrayAnswers: between the sidecar and Core, a proxy sends a second
// whole answer, "200 {}", 3 ms after each answer: the next request on
// the kept connection would read it as its own, and take a write as
// recorded before Core had it. Each drive must still record every output
// once, in order, before its Action's final status and the next turn (the
// contract log is empty), and report submitted only what Core has final.
func TestStrayAnswers(t *testing.T) {
	c := &counted{}
	h := newHarnessWith(t, threeEcho(), testenv.Options{ServeCore: strayCore(t)}, spec{config.Tool{Name: "echo"}, c.handler})
	for i := range 4 {
		if i > 0 {
			h.req = h.setupRun()
		}
		sum, err := h.drive(context.Background())
		if err != nil || sum.Status != executor.StatusCompleted {
			t.Fatalf("drive %d: summary %+v err %v", i, sum, err)
		}
		acts := h.assertWholeBatches(3)
		final := map[string]string{}
		for _, a := range acts {
			final[a.ID] = a.Status
		}
		for _, call := range sum.Calls {
			if !call.Submitted || final[call.ActionID] != core.ActionCompleted {
				t.Errorf("drive %d: call %s submitted %v, its Action %q in Core", i, call.ToolCallID, call.Submitted, final[call.ActionID])
			}
		}
	}
	if n, runs := c.total(); n != 12 || runs != 12 {
		t.Errorf("%d calls ran %d times, want 12 once each", n, runs)
	}
}

// strayCore serves the simulator behind a proxy on a raw listener that,
// 3 ms after each answer, sends a second complete answer that answers
// nothing. It is an [testenv.Options.ServeCore].
func strayCore(t *testing.T) func(*coresim.Sim) (string, *core.Client, func()) {
	return func(sim *coresim.Sim) (string, *core.Client, func()) {
		simURL, app, stopSim := testenv.CoreApart(t, nil)(sim)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		toSim := &http.Transport{}
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			conns = map[net.Conn]bool{}
		)
		wg.Go(func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns[conn] = true
				mu.Unlock()
				wg.Go(func() {
					defer conn.Close()
					relayWithStrays(conn, strings.TrimPrefix(simURL, "http://"), toSim)
				})
			}
		})
		return "http://" + ln.Addr().String(), app, func() {
			ln.Close()
			mu.Lock()
			for conn := range conns {
				conn.Close()
			}
			mu.Unlock()
			wg.Wait()
			toSim.CloseIdleConnections()
			stopSim()
		}
	}
}

// relayWithStrays relays each request read from conn to Core at host and
// writes its answer back, then, 3 ms later, a stray answer.
func relayWithStrays(conn net.Conn, host string, toSim http.RoundTripper) {
	br := bufio.NewReader(conn)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		req.URL.Scheme, req.URL.Host, req.RequestURI = "http", host, ""
		resp, err := toSim.RoundTrip(req)
		if err != nil {
			return
		}
		err = resp.Write(conn)
		resp.Body.Close()
		if err != nil {
			return
		}
		time.Sleep(3 * time.Millisecond)
		if _, err := io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
			return
		}
	}
}
