package executor_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

// cancelHarness: a batch of a fast call and two calls that block until the
// sidecar cancels them; ready is closed when both slow calls run and the
// fast call's outcome is submitted.
func cancelHarness(t *testing.T) (*harness, chan error, chan struct{}) {
	return cancelHarnessWith(t, config.Executor{})
}

func cancelHarnessWith(t *testing.T, ecfg config.Executor) (*harness, chan error, chan struct{}) {
	causes := make(chan error, 2)
	started := make(chan struct{})
	var n atomic.Int32
	slow := func(ctx context.Context, c *tool.Call) ([]byte, error) {
		if n.Add(1) == 2 {
			close(started)
		}
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, ctx.Err()
	}
	h := newHarness(t, twoTurns(calls("fast", "slow", "slow")...), ecfg,
		spec{config.Tool{Name: "fast"}, echo},
		spec{config.Tool{Name: "slow", Timeout: 30 * time.Second}, slow})
	fastDone := make(chan struct{})
	h.onEvent = func(e executor.Event) {
		if e.Type == executor.EventToolResult && e.Call.Tool == "fast" {
			close(fastDone)
		}
	}
	ready := make(chan struct{})
	go func() {
		<-started
		<-fastDone
		close(ready)
	}()
	return h, causes, ready
}

func (h *harness) assertCancelled(t *testing.T, sum executor.Summary, causes chan error) {
	t.Helper()
	if sum.Status != executor.StatusCancelled {
		t.Fatalf("status %q (%s), want cancelled", sum.Status, sum.Error)
	}
	for range 2 {
		select {
		case err := <-causes:
			if !errors.Is(err, worker.ErrCancelledBySidecar) {
				t.Errorf("worker stopped by %v, want the cancel subject", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("in-flight call was not cancelled at the worker")
		}
	}
	if n := h.sim.CountRequests("POST", "/v1/completions"); n != 1 {
		t.Errorf("%d completions requests, want 1: no turn after a cancellation", n)
	}
	acts := h.sim.Actions(h.req.RunID)
	if len(acts) != 3 || acts[0].Status != core.ActionCompleted || acts[1].Status != core.ActionCancelled || acts[2].Status != core.ActionCancelled {
		t.Fatalf("actions %+v, want completed, cancelled, cancelled", acts)
	}
	if msgs := h.sim.ToolMessages(h.req.ThreadID); len(msgs) != 3 {
		t.Errorf("%d tool messages, want 3 (cancelled calls still get an outcome)", len(msgs))
	}
	if v := h.sim.Violations(); len(v) != 0 {
		t.Errorf("violations %v", v)
	}
}

func TestCancelThroughCore(t *testing.T) {
	h, causes, started := cancelHarness(t)
	go func() {
		<-started
		h.core.CancelRun(context.Background(), h.req.RunID)
	}()
	sum, err := h.drive(context.Background())
	if err != nil {
		t.Fatalf("a cancellation is not a failure: %v", err)
	}
	h.assertCancelled(t, sum, causes)
	if !strings.Contains(sum.Error, "cancelled upstream") {
		t.Errorf("error %q", sum.Error)
	}
}

// TestCancelThroughProxy: an application (an unmodified SDK in proxy mode)
// cancels the run through the sidecar. Core cancels it, and the sidecar
// stops the calls in flight at once, with no poll of Core: cancel_poll is
// an hour here, so only the proxy's notice can end the batch.
func TestCancelThroughProxy(t *testing.T) {
	h, causes, started := cancelHarnessWith(t, config.Executor{CancelPoll: time.Hour})
	go func() {
		<-started
		req, _ := http.NewRequest(http.MethodPost, h.env.URL+"/v1/runs/"+h.req.RunID+"/cancel", nil)
		req.Header.Set("X-API-Key", testenv.APIKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("cancel through the proxy: %d", resp.StatusCode)
		}
	}()
	// Bounded, so that a missed notice fails here rather than in an hour.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sum, err := h.drive(ctx)
	if err != nil {
		t.Fatalf("a cancellation is not a failure: %v", err)
	}
	h.assertCancelled(t, sum, causes)
	if !strings.Contains(sum.Error, "cancelled upstream") {
		t.Errorf("error %q: want the run's cancellation, not the test's deadline", sum.Error)
	}
}

func TestCancelThroughContext(t *testing.T) {
	h, causes, started := cancelHarness(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		<-started
		cancel(errors.New("application disconnected"))
	}()
	sum, err := h.drive(ctx)
	if err != nil {
		t.Fatalf("a cancellation is not a failure: %v", err)
	}
	h.assertCancelled(t, sum, causes)
	if sum.Error != "application disconnected" {
		t.Errorf("error %q, want the caller's cause", sum.Error)
	}
}

// TestCancelledBeforeTurn: a run already cancelled in Core gets no
// completions request at all.
func TestCancelledBeforeTurn(t *testing.T) {
	h := newHarness(t, twoTurns(calls("echo")...), config.Executor{}, spec{config.Tool{Name: "echo"}, echo})
	h.core.CancelRun(context.Background(), h.req.RunID)
	sum, _ := h.drive(context.Background())
	if sum.Status != executor.StatusCancelled || h.sim.CountRequests("POST", "/v1/completions") != 0 {
		t.Fatalf("status %s, completions %d", sum.Status, h.sim.CountRequests("POST", "/v1/completions"))
	}
}

// TestDroppedStreamRecovered: the connection drops after the first
// manifest, while Core has already created the second call's Action. The
// loop recovers it from the pending Actions instead of asking again.
func TestDroppedStreamRecovered(t *testing.T) {
	sc := twoTurns(calls("echo", "echo", "echo")...)
	sc.Turns[0].DropAfter = 1 + 3 + 1 + 1 // started, 3 tool_call, processing, first manifest
	h := newHarness(t, sc, config.Executor{}, spec{config.Tool{Name: "echo"}, echo})
	sum, err := h.drive(context.Background())
	if err != nil || sum.Status != executor.StatusCompleted || sum.Turns != 2 {
		t.Fatalf("summary %+v err %v", sum, err)
	}
	h.assertWholeBatches(2)
	if len(sum.Calls) != 2 || !sum.Calls[1].OK {
		t.Errorf("calls %+v", sum.Calls)
	}
}

// TestTruncatedTextTurn: a text turn that drops has nothing to recover;
// the run fails instead of asking the model to answer twice.
func TestTruncatedTextTurn(t *testing.T) {
	sc := coresim.Scenario{Turns: []coresim.Turn{{Content: "The answer is", DropAfter: 2}}}
	h := newHarness(t, sc, config.Executor{})
	sum, err := h.drive(context.Background())
	if !errors.Is(err, executor.ErrTruncatedTurn) || !errors.Is(err, core.ErrTruncated) || sum.Status != executor.StatusFailed {
		t.Fatalf("err %v summary %+v", err, sum)
	}
	if sum.Content != "The answer is" || h.sim.CountRequests("POST", "/v1/completions") != 1 {
		t.Errorf("content %q, completions %d", sum.Content, h.sim.CountRequests("POST", "/v1/completions"))
	}
}

func TestUpstreamFailures(t *testing.T) {
	cases := []struct {
		name string
		turn coresim.Turn
		want func(error) bool
	}{
		{"HTTP 500 before the stream", coresim.Turn{HTTPStatus: 500}, func(err error) bool { return core.StatusCode(err) == 500 }},
		{"in-band error", coresim.Turn{Error: "Maximum conversation turns exceeded"}, func(err error) bool {
			return errors.Is(err, executor.ErrUpstream) && strings.Contains(err.Error(), "Maximum conversation turns exceeded")
		}},
		{"router exception", coresim.Turn{RouterError: "boom"}, func(err error) bool { return errors.Is(err, executor.ErrTruncatedTurn) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, coresim.Scenario{Turns: []coresim.Turn{tc.turn}}, config.Executor{})
			sum, err := h.drive(context.Background())
			if sum.Status != executor.StatusFailed || !tc.want(err) {
				t.Fatalf("status %s err %v", sum.Status, err)
			}
		})
	}
}

// TestFailRun: under missing_tool: fail_run an unknown tool fails the run,
// after every call of the batch, itself included, got its outcome.
func TestFailRun(t *testing.T) {
	h := newHarness(t, twoTurns(calls("echo", "ghost", "echo")...), config.Executor{MissingTool: config.MissingToolFailRun},
		spec{config.Tool{Name: "echo"}, echo})
	sum, err := h.drive(context.Background())
	if !errors.Is(err, executor.ErrUnknownToolFailRun) || sum.Status != executor.StatusFailed {
		t.Fatalf("status %s err %v", sum.Status, err)
	}
	h.assertWholeBatches(3)
	if h.sim.CountRequests("POST", "/v1/completions") != 1 {
		t.Error("a failed run requested another turn")
	}
}

func TestMaxTurns(t *testing.T) {
	loop := coresim.Turn{Calls: calls("echo")}
	h := newHarness(t, coresim.Scenario{Turns: []coresim.Turn{loop, loop, loop, loop}}, config.Executor{MaxTurns: 3},
		spec{config.Tool{Name: "echo"}, echo})
	sum, err := h.drive(context.Background())
	if err != nil || sum.Status != executor.StatusMaxTurns || sum.Turns != 3 || len(sum.Calls) != 3 {
		t.Fatalf("summary %+v err %v", sum, err)
	}
	h.req.MaxTurns = 1
	h2 := h.setupRun()
	h.req = h2
	h.req.MaxTurns = 1
	sum, _ = h.drive(context.Background())
	if sum.Turns != 1 || sum.Status != executor.StatusMaxTurns {
		t.Errorf("per-request max_turns: %+v", sum)
	}
	// A caller may tighten the operator's limit, never loosen it.
	h.req = h.setupRun()
	h.req.MaxTurns = 40
	sum, _ = h.drive(context.Background())
	if sum.Turns != 3 || sum.Status != executor.StatusMaxTurns {
		t.Errorf("max_turns 40 against an operator limit of 3: %+v", sum)
	}
}

// TestEvents: the sink sees the turn, the text, each call dispatched and
// each result in call order, then done.
func TestEvents(t *testing.T) {
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Reasoning: "think", Content: "checking", Calls: calls("echo", "echo")},
		{Content: "done"},
	}}
	h := newHarness(t, sc, config.Executor{}, spec{config.Tool{Name: "echo"}, echo})
	if _, err := h.drive(context.Background()); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range h.events {
		switch e.Type {
		case executor.EventToolCall, executor.EventToolResult:
			got = append(got, string(e.Type)+":"+e.Call.ToolCallID[len(e.Call.ToolCallID)-2:])
		case executor.EventChunk:
		default:
			got = append(got, string(e.Type))
		}
	}
	acts := h.sim.Actions(h.req.RunID)
	a, b := acts[0].ToolCallID[len(acts[0].ToolCallID)-2:], acts[1].ToolCallID[len(acts[1].ToolCallID)-2:]
	// Results may interleave with later dispatches (they are pipelined),
	// but calls and results each keep call order, a result follows its
	// call, and turn 2 starts only after the last result.
	pos := map[string]int{}
	for i, g := range got {
		if _, seen := pos[g]; !seen {
			pos[g] = i // first occurrence
		}
	}
	order := []string{"turn", "reasoning", "content", "tool_call:" + a, "tool_result:" + a}
	for i := 1; i < len(order); i++ {
		if pos[order[i-1]] > pos[order[i]] {
			t.Errorf("%s after %s in %v", order[i-1], order[i], got)
		}
	}
	if !(pos["tool_call:"+a] < pos["tool_call:"+b] && pos["tool_call:"+b] < pos["tool_result:"+b] && pos["tool_result:"+a] < pos["tool_result:"+b]) {
		t.Errorf("call order lost: %v", got)
	}
	if tail := strings.Join(got[len(got)-4:], " "); tail != "tool_result:"+b+" turn content done" {
		t.Errorf("events end %q", tail)
	}
	if last := h.events[len(h.events)-1]; last.Summary == nil || last.Summary.Content != "done" {
		t.Errorf("done event %+v", last)
	}
}

// waitingRuns drives n runs whose one call holds until release is closed
// or the call is cancelled; it returns once every call runs. done[i] is
// closed when drive i has ended, with its summary in sums[i].
type waitingRuns struct {
	reqs    []executor.Request
	sums    []executor.Summary
	done    []chan struct{}
	release chan struct{}
	wg      sync.WaitGroup
}

func startWaitingRuns(t *testing.T, n int, ecfg config.Executor) (*harness, *waitingRuns) {
	t.Helper()
	w := &waitingRuns{release: make(chan struct{}), sums: make([]executor.Summary, n), done: make([]chan struct{}, n)}
	hold := func(ctx context.Context, c *tool.Call) ([]byte, error) {
		select {
		case <-w.release:
			return []byte(`{"ok": true}`), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	h := newHarness(t, twoTurns(calls("hold")...), ecfg, spec{config.Tool{Name: "hold", Timeout: time.Minute}, hold})
	var calling atomic.Int32
	for range n {
		w.reqs = append(w.reqs, h.setupRun())
	}
	for i := range n {
		w.done[i] = make(chan struct{})
		w.wg.Go(func() {
			defer close(w.done[i])
			// Bounded, so that a cancel never seen fails the test rather
			// than hanging it.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			w.sums[i], _ = h.exec.Drive(ctx, w.reqs[i], func(e executor.Event) {
				if e.Type == executor.EventToolCall {
					calling.Add(1)
				}
			})
		})
	}
	t.Cleanup(func() {
		select {
		case <-w.release:
		default:
			close(w.release)
		}
		w.wg.Wait()
	})
	poll.Until(t, "every call to run", func() bool { return calling.Load() == int32(n) })
	return h, w
}

// cancelledInCore waits for drive i and checks that it ended because the
// run was cancelled in Core (not at the test's deadline), and Core's side:
// its one call has one tool message and its Action is finalised
// cancelled, with no contract violation.
func (w *waitingRuns) cancelledInCore(t *testing.T, h *harness, i int) {
	t.Helper()
	<-w.done[i]
	if s := w.sums[i]; s.Status != executor.StatusCancelled || !strings.Contains(s.Error, "cancelled upstream") {
		t.Fatalf("run %d: %q (%s), want cancelled upstream", i, s.Status, s.Error)
	}
	if acts := h.sim.Actions(w.reqs[i].RunID); len(acts) != 1 || acts[0].Status != core.ActionCancelled {
		t.Errorf("run %d: actions %+v, want one, cancelled", i, acts)
	}
	if msgs := h.sim.ToolMessages(w.reqs[i].ThreadID); len(msgs) != 1 {
		t.Errorf("run %d: %d tool messages, want 1", i, len(msgs))
	}
	if v := h.sim.Violations(); len(v) != 0 {
		t.Errorf("violations %v", v)
	}
}

// listings counts the simulator's GET /v1/runs (not reads of one run).
func listings(sim *coresim.Sim) int {
	n := 0
	for _, r := range sim.Requests() {
		if r.Method == http.MethodGet && r.Path == "/v1/runs" {
			n++
		}
	}
	return n
}

// TestCancelSeenInListing: with many runs waiting, one listing of the
// caller's runs per cancel_poll reads them all, and a run cancelled in Core
// is seen there with no read of the run itself. The budget (5 requests/s,
// one per cancel_poll) would take 6 s to read 30 runs one by one.
func TestCancelSeenInListing(t *testing.T) {
	h, w := startWaitingRuns(t, 30, config.Executor{CancelPoll: 200 * time.Millisecond, CancelPollRPS: 5})
	from := listings(h.sim)
	poll.Until(t, "two listings with every run waiting", func() bool { return listings(h.sim) >= from+2 })
	reads := h.sim.CountRequests(http.MethodGet, "/v1/runs/")
	h.sim.Cancel(w.reqs[17].RunID)
	w.cancelledInCore(t, h, 17)
	if n := h.sim.CountRequests(http.MethodGet, "/v1/runs/") - reads; n != 0 {
		t.Errorf("%d reads of single runs after the cancel, want 0: the listing shows every waiting run", n)
	}
	close(w.release)
	w.wg.Wait()
	for i, s := range w.sums {
		if i != 17 && s.Status != executor.StatusCompleted {
			t.Errorf("run %d: %q (%s), want completed: only run 17 was cancelled", i, s.Status, s.Error)
		}
	}
	if v := h.sim.Violations(); len(v) != 0 {
		t.Errorf("violations %v", v)
	}
}

// TestCancelWithoutRunListing: a Core that answers the listing 404 (no
// such route), 405 or 422 (a query it refuses) is asked once; its runs are
// read one by one, and a cancel is still seen. More runs wait than the
// budget reads in an interval, so that several are always due and a
// listing would be worth asking for again.
func TestCancelWithoutRunListing(t *testing.T) {
	for _, status := range []int{http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusUnprocessableEntity} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			h, w := startWaitingRuns(t, 8, config.Executor{CancelPoll: 100 * time.Millisecond, CancelPollRPS: 25})
			h.sim.AddFault(coresim.Fault{Method: http.MethodGet, Path: "/v1/runs$", Status: status, Times: 1000})
			from, reads := listings(h.sim), h.sim.CountRequests(http.MethodGet, "/v1/runs/")
			h.sim.Cancel(w.reqs[1].RunID)
			w.cancelledInCore(t, h, 1)
			// Several intervals of per-run reads of the runs still waiting.
			poll.Until(t, "reads of the runs still waiting", func() bool { return h.sim.CountRequests(http.MethodGet, "/v1/runs/")-reads >= 10 })
			if n := listings(h.sim) - from; n > 1 {
				t.Errorf("%d listings after a %d, want at most 1", n, status)
			}
		})
	}
}

// TestCancelOfRunTheListingMisses: newer runs of the same user push the
// waiting runs out of the listing's page; they are read one by one, and a
// cancel among them is still seen.
func TestCancelOfRunTheListingMisses(t *testing.T) {
	h, w := startWaitingRuns(t, 3, config.Executor{CancelPoll: 100 * time.Millisecond})
	for range 10 {
		h.setupRun()
	}
	from := listings(h.sim)
	poll.Until(t, "a listing after the newer runs", func() bool { return listings(h.sim) > from })
	h.sim.Cancel(w.reqs[0].RunID)
	w.cancelledInCore(t, h, 0)
}
