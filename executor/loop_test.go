package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/promtest"
	"github.com/projectdavid/toolsidecar/testkit/syncbuf"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// TestLegacyBugGone: in a batch of N calls whose last call fails, times
// out, or has nobody to run it, all N outcomes are submitted and every
// Action finalised before turn 2 is requested; the contract log is empty.
func TestLegacyBugGone(t *testing.T) {
	cases := []struct {
		name     string
		last     spec
		wantType string
	}{
		{"last call fails", spec{config.Tool{Name: "last"}, func(context.Context, *tool.Call) ([]byte, error) {
			return nil, errors.New("upstream API down")
		}}, "tool_error"},
		{"last call times out", spec{config.Tool{Name: "last", Timeout: 150 * time.Millisecond}, hang}, "timeout"},
		{"last call has no worker", spec{config.Tool{Name: "last"}, nil}, "not_found"},
		{"last call is an unknown tool", spec{config.Tool{Name: "other"}, echo}, "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, twoTurns(calls("echo", "echo", "echo", "last")...), config.Executor{},
				spec{config.Tool{Name: "echo"}, echo}, tc.last)
			sum, err := h.drive(context.Background())
			if err != nil || sum.Status != executor.StatusCompleted || sum.Turns != 2 {
				t.Fatalf("summary %+v err %v", sum, err)
			}
			acts := h.assertWholeBatches(4)
			// Every submission of turn 1 precedes the second completions request.
			var completions, submissionsBefore int
			for _, r := range h.sim.Requests() {
				switch {
				case r.Path == "/v1/completions":
					completions++
				case completions == 1 && (r.Path == "/v1/messages/tools" || (r.Method == "PUT" && strings.Contains(string(r.Body), `"result"`))):
					submissionsBefore++
				}
			}
			if submissionsBefore != 8 {
				t.Errorf("%d submissions (tool message + final PUT) before turn 2, want 8", submissionsBefore)
			}
			if acts[3].Status != core.ActionFailed {
				t.Errorf("last action %s, want failed", acts[3].Status)
			}
			msgs := h.sim.ToolMessages(h.req.ThreadID)
			if typ, _ := errorOf(t, msgs[3].Content); typ != tc.wantType {
				t.Errorf("last outcome %q, want error type %s", msgs[3].Content, tc.wantType)
			}
			if got := sum.Calls[3]; got.OK || got.ErrorType != tc.wantType || !got.Submitted || got.ToolCallID != acts[3].ToolCallID {
				t.Errorf("summary of last call %+v", got)
			}
			if !strings.HasPrefix(sum.Content, "final: {\"echo\": {\"q\": \"x\"}}") {
				t.Errorf("final content %q", sum.Content)
			}
		})
	}
}

// TestMixedBatch: duplicate tool names, invalid arguments in the middle,
// an unknown tool, a panicking worker, a worker that never replies (timeout,
// retry, then an error outcome) and a tool with no worker each give exactly
// one outcome per tool_call_id, in call order, with every Action finalised.
func TestMixedBatch(t *testing.T) {
	var hangAttempts atomic.Int32
	h := newHarness(t, twoTurns(calls(
		`flights {"from": "LAX", "to": "JFK"}`,
		`flights {"from": "SFO"}`, // invalid: "to" is required
		`flights {"from": "SEA", "to": "BOS"}`,
		`teleport {"to": "Mars"}`, // unknown
		`crash`,
		`hang`,
		`absent`,
	)...), config.Executor{},
		spec{config.Tool{Name: "flights", Parameters: schema("from", "to")}, echo},
		spec{config.Tool{Name: "crash"}, func(context.Context, *tool.Call) ([]byte, error) { panic("nil map") }},
		spec{config.Tool{Name: "hang", Timeout: 100 * time.Millisecond, Retries: 1, SideEffects: config.Idempotent},
			func(ctx context.Context, c *tool.Call) ([]byte, error) { hangAttempts.Add(1); return hang(ctx, c) }},
		spec{config.Tool{Name: "absent"}, nil},
	)
	sum, err := h.drive(context.Background())
	if err != nil || sum.Status != executor.StatusCompleted {
		t.Fatalf("summary %+v err %v", sum, err)
	}
	acts := h.assertWholeBatches(7)
	msgs := h.sim.ToolMessages(h.req.ThreadID)
	want := []struct{ typ, contains string }{
		{"", `{"echo": {"from": "LAX", "to": "JFK"}}`},
		{"invalid_args", "missing property 'to'"},
		{"", `{"echo": {"from": "SEA", "to": "BOS"}}`},
		{"not_found", `unknown tool "teleport"; the registered tools are: flights, crash, hang, absent`},
		{"worker_crash", "worker panicked: nil map"},
		{"timeout", ""}, // the sidecar or the worker may notice the deadline first
		{"not_found", "no worker is serving tool \"absent\""},
	}
	for i, w := range want {
		typ, msg := errorOf(t, msgs[i].Content)
		if typ != w.typ || (w.typ == "" && msgs[i].Content != w.contains) || (w.typ != "" && !strings.Contains(msg, w.contains)) {
			t.Errorf("call %d (%s): type %q content %q; want %q containing %q", i, acts[i].ToolName, typ, msgs[i].Content, w.typ, w.contains)
		}
	}
	if hangAttempts.Load() != 2 || sum.Calls[5].Attempts != 2 {
		t.Errorf("hang attempts: worker saw %d, summary %d; want 2 (timeout, retry)", hangAttempts.Load(), sum.Calls[5].Attempts)
	}
	if sum.Calls[6].Attempts != 1 {
		t.Errorf("absent tool without retries made %d attempts", sum.Calls[6].Attempts)
	}
	if acts[0].Status != core.ActionCompleted || acts[1].Status != core.ActionFailed {
		t.Errorf("statuses %s %s", acts[0].Status, acts[1].Status)
	}
}

// TestUnsafeNeverResent: an unsafe tool that timed out after being sent is
// not retried, even with retries configured; one with no responders is.
func TestUnsafeNeverResent(t *testing.T) {
	var sent atomic.Int32
	h := newHarness(t, twoTurns(calls("pay")...), config.Executor{},
		spec{config.Tool{Name: "pay", Timeout: 100 * time.Millisecond, Retries: 3, SideEffects: config.Unsafe},
			func(ctx context.Context, c *tool.Call) ([]byte, error) { sent.Add(1); return hang(ctx, c) }})
	sum, _ := h.drive(context.Background())
	if sent.Load() != 1 || sum.Calls[0].Attempts != 1 || sum.Calls[0].ErrorType != "timeout" {
		t.Fatalf("unsafe tool sent %d times, summary %+v", sent.Load(), sum.Calls[0])
	}
	h2 := newHarness(t, twoTurns(calls("pay")...), config.Executor{},
		spec{config.Tool{Name: "pay", Retries: 2, SideEffects: config.Unsafe}, nil})
	sum2, _ := h2.drive(context.Background())
	if sum2.Calls[0].Attempts != 3 {
		t.Errorf("no-responders attempts %d, want 3 (never sent, so safe to retry)", sum2.Calls[0].Attempts)
	}
}

// barrier counts calls in flight at the worker and records the peak.
type barrier struct {
	cur, peak atomic.Int32
	want      int32
	wait      time.Duration // how long a call waits for the others
	reached   chan struct{}
}

func (b *barrier) handler(ctx context.Context, c *tool.Call) ([]byte, error) {
	n := b.cur.Add(1)
	defer b.cur.Add(-1)
	for p := b.peak.Load(); n > p && !b.peak.CompareAndSwap(p, n); p = b.peak.Load() {
	}
	if n == b.want {
		close(b.reached)
	}
	select {
	case <-b.reached:
	case <-time.After(b.wait):
	case <-ctx.Done():
	}
	time.Sleep(5 * time.Millisecond)
	return []byte(`"ok"`), nil
}

// TestParallelism: the worker sees all 8 calls of a batch in flight at
// once; with max_parallel 1 it never sees two.
func TestParallelism(t *testing.T) {
	specs := make([]string, 8)
	for i := range specs {
		specs[i] = "par"
	}
	for _, tc := range []struct {
		maxParallel int
		want        int32
		wait        time.Duration
	}{{16, 8, 5 * time.Second}, {1, 1, 30 * time.Millisecond}} {
		t.Run(fmt.Sprint("max_parallel ", tc.maxParallel), func(t *testing.T) {
			b := &barrier{want: 8, wait: tc.wait, reached: make(chan struct{})}
			h := newHarness(t, twoTurns(calls(specs...)...), config.Executor{MaxParallel: tc.maxParallel},
				spec{config.Tool{Name: "par"}, b.handler})
			if _, err := h.drive(context.Background()); err != nil {
				t.Fatal(err)
			}
			h.assertWholeBatches(8)
			if b.peak.Load() != tc.want {
				t.Errorf("peak in flight %d, want %d", b.peak.Load(), tc.want)
			}
		})
	}
}

// TestCallRunsWhileCoreHearsItStarted: a call of a tool that is not unsafe
// leaves for its worker while Core is still being told that it started, so
// a slow Core write does not hold the tool back; its final status is
// written only after that write and is never overwritten by it. An unsafe
// call still starts only once Core has taken the write.
func TestCallRunsWhileCoreHearsItStarted(t *testing.T) {
	for _, side := range []string{config.ReadOnly, config.Idempotent, config.Unsafe} {
		t.Run(side, func(t *testing.T) {
			var held, overtaken atomic.Bool
			markHit, started, hitDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
			h := newHarness(t, twoTurns(calls("look")...), config.Executor{}, spec{config.Tool{Name: "look", SideEffects: side},
				func(ctx context.Context, c *tool.Call) ([]byte, error) {
					select { // the processing write reaches Core, or has come and gone
					case <-markHit:
					case <-time.After(2 * time.Second):
					}
					if held.Load() {
						close(started) // the tool runs while Core holds the write
					}
					return []byte(`"seen"`), nil
				}})
			// Core holds the first Action write, the processing mark, until
			// the tool has started (or 2 s have passed), and then for as long
			// as a final status could overtake it (up to 300 ms): a sidecar
			// that did not wait for the mark would have its final status
			// applied first and then reopened.
			h.sim.AddFault(coresim.Fault{Method: "PUT", Path: "/v1/actions/", Hit: func() {
				held.Store(true)
				close(markHit)
				select {
				case <-started:
				case <-time.After(2 * time.Second):
				}
				for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
					if acts := h.sim.Actions(h.req.RunID); len(acts) == 1 && acts[0].Status != core.ActionPending {
						overtaken.Store(true)
						break
					}
				}
				held.Store(false)
				close(hitDone)
			}})
			sum, err := h.drive(context.Background())
			if err != nil || sum.Status != executor.StatusCompleted {
				t.Fatalf("summary %+v err %v", sum, err)
			}
			overlapped := false
			select {
			case <-started:
				overlapped = true
			default:
			}
			if want := side != config.Unsafe; overlapped != want {
				t.Errorf("the tool ran while Core held the processing write: %v, want %v", overlapped, want)
			}
			<-hitDone
			if overtaken.Load() {
				t.Error("the Action was finalised while Core still held its processing write")
			}
			acts := h.assertWholeBatches(1) // the contract log has no "reopened"
			if acts[0].Status != core.ActionCompleted {
				t.Errorf("action %s, want completed", acts[0].Status)
			}
			var statuses []string
			for _, r := range h.sim.Requests() {
				if r.Method == "PUT" && strings.HasPrefix(r.Path, "/v1/actions/") {
					var body struct{ Status string }
					_ = json.Unmarshal(r.Body, &body)
					statuses = append(statuses, body.Status)
				}
			}
			if !slices.Equal(statuses, []string{core.ActionProcessing, core.ActionCompleted}) {
				t.Errorf("Action writes %v, want [processing completed]", statuses)
			}
		})
	}
}

// heldMark is Core holding the first processing mark that reaches it,
// until release (which the test's cleanup also calls).
type heldMark struct {
	action  atomic.Value  // the Action whose mark Core holds
	arrived chan struct{} // closed when that mark reaches Core
	free    chan struct{}
	once    sync.Once
}

func newHeldMark(t *testing.T) *heldMark {
	hm := &heldMark{arrived: make(chan struct{}), free: make(chan struct{})}
	hm.action.Store("")
	t.Cleanup(hm.release)
	return hm
}

func (hm *heldMark) release() { hm.once.Do(func() { close(hm.free) }) }

// arm makes h's Core hold the first PUT of an Action.
func (hm *heldMark) arm(h *harness) {
	h.sim.AddFault(coresim.Fault{Method: "PUT", Path: "/v1/actions/", Hit: func() {
		reqs := h.sim.Requests()
		hm.action.Store(strings.TrimPrefix(reqs[len(reqs)-1].Path, "/v1/actions/"))
		close(hm.arrived)
		<-hm.free
	}})
}

// TestOutputWaitsForProcessingMark: Core is slow to answer one call's
// processing mark while its tool answers at once. The call's output is
// posted only after Core has answered the mark, so Core never sees the
// call start after its output (the simulator records that as a
// violation), and the final status is the Action's last write.
func TestOutputWaitsForProcessingMark(t *testing.T) {
	hm := newHeldMark(t)
	h := newHarness(t, twoTurns(calls("a", "b")...), config.Executor{},
		spec{config.Tool{Name: "a"}, echo}, spec{config.Tool{Name: "b"}, echo})
	hm.arm(h)
	done := make(chan error, 1)
	go func() { _, err := h.drive(context.Background()); done <- err }()
	<-hm.arrived
	poll.Until(t, "both calls to have their outcome", func() bool {
		n, _ := promtest.Sum(t, h.env.Sidecar.Metrics(), "toolsidecar_calls_total")
		return n == 2
	})
	hm.release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	h.assertWholeBatches(2) // no processing_after_output violation
	a := hm.action.Load().(string)
	var writes []string
	for _, r := range h.sim.Requests() {
		switch {
		case r.Method == "PUT" && r.Path == "/v1/actions/"+a:
			var body struct{ Status string }
			_ = json.Unmarshal(r.Body, &body)
			writes = append(writes, body.Status)
		case r.Method == "POST" && r.Path == "/v1/messages/tools" && strings.Contains(string(r.Body), a):
			writes = append(writes, "output")
		}
	}
	if !slices.Equal(writes, []string{core.ActionProcessing, "output", core.ActionCompleted}) {
		t.Errorf("writes of the held Action %s reached Core as %v, want [processing output completed]", a, writes)
	}
}

// TestProcessingMarkWithdrawn: when Core is so far behind that a call ends
// while its processing write still waits in the Core client's queue, the
// write is withdrawn: Core goes from pending to the final status, one write
// fewer. A write Core already has is waited for, as before. One connection
// to Core is held by the first mark to arrive; the other call's mark
// queues behind it while that call ends.
func TestProcessingMarkWithdrawn(t *testing.T) {
	hm := newHeldMark(t)
	handler := func(ctx context.Context, c *tool.Call) ([]byte, error) {
		<-hm.arrived
		if c.ActionID == hm.action.Load() {
			<-hm.free
		}
		return []byte(`"done"`), nil
	}
	h := newHarnessWith(t, twoTurns(calls("a", "b")...), testenv.Options{Config: func(c *config.Config) { c.Core.MaxConnections = 1 }},
		spec{config.Tool{Name: "a"}, handler}, spec{config.Tool{Name: "b"}, handler})
	hm.arm(h)
	done := make(chan error, 1)
	go func() { _, err := h.drive(context.Background()); done <- err }()
	poll.Until(t, "the call whose mark is queued to end", func() bool {
		n, _ := promtest.Sum(t, h.env.Sidecar.Metrics(), "toolsidecar_calls_total")
		return n == 1
	})
	hm.release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	acts := h.assertWholeBatches(2)
	marks := map[string]int{}
	for _, r := range h.sim.Requests() {
		if r.Method == "PUT" && strings.HasPrefix(r.Path, "/v1/actions/") && strings.Contains(string(r.Body), `"processing"`) {
			marks[strings.TrimPrefix(r.Path, "/v1/actions/")]++
		}
	}
	for _, a := range acts {
		want := 0
		if a.ID == hm.action.Load() {
			want = 1
		}
		if marks[a.ID] != want || a.Status != core.ActionCompleted {
			t.Errorf("%s (%s): %d processing writes, status %s; want %d, completed", a.ID, a.ToolName, marks[a.ID], a.Status, want)
		}
	}
}

// TestHedgeAtPercentileLearnsFromReplies: a tool that hedges at a
// percentile learns its latencies from the replies of its earlier calls,
// which come through the bridge's callback. After a batch of 20 quick
// calls, the next call's stalled first attempt is hedged, and the hedge's
// reply is its outcome.
func TestHedgeAtPercentileLearnsFromReplies(t *testing.T) {
	quick := make([]string, 20)
	for i := range quick {
		quick[i] = "look"
	}
	sc := coresim.Scenario{Turns: []coresim.Turn{{Calls: calls(quick...)}, {Calls: calls(`look {"q": "stall"}`)}, {Content: "done"}}}
	h := newHarness(t, sc, config.Executor{}, spec{config.Tool{Name: "look", HedgeAfter: "p50", Retries: 1, Timeout: 5 * time.Second},
		func(ctx context.Context, c *tool.Call) ([]byte, error) {
			if strings.Contains(string(c.Args), "stall") && c.Attempt == 1 {
				<-ctx.Done() // the straggler, until the hedge wins
				return nil, ctx.Err()
			}
			return []byte(`"seen"`), nil
		}})
	sum, err := h.drive(context.Background())
	if err != nil || sum.Status != executor.StatusCompleted || len(sum.Calls) != 21 {
		t.Fatalf("summary %+v err %v", sum, err)
	}
	h.assertWholeBatches(21)
	if c := sum.Calls[20]; !c.OK || !c.Hedged || c.Attempts != 2 {
		t.Errorf("the stalled call %+v: want ok, hedged, 2 attempts", c)
	}
}

// TestFailedDriveLeavesATrace: a drive that fails, before its loop began
// (Core refuses to read the run) or in a turn (Core answers the
// completions request 500), logs one WARN record with the run id and the
// cause, and counts a failed run.
func TestFailedDriveLeavesATrace(t *testing.T) {
	var logs syncbuf.Buffer
	h := newHarnessWith(t, twoTurns(calls(`echo`)...),
		testenv.Options{Sidecar: []sidecar.Option{sidecar.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil)))}},
		spec{config.Tool{Name: "echo"}, echo})
	h.sim.AddFault(coresim.Fault{Method: "GET", Path: "/v1/runs/" + h.req.RunID, Status: http.StatusServiceUnavailable, Times: 100})
	if sum, err := h.drive(context.Background()); err == nil || sum.Status != executor.StatusFailed {
		t.Fatalf("Core refusing the run: %+v %v, want failed", sum, err)
	}
	h.sim.ClearFaults()
	h.sim.AddFault(coresim.Fault{Method: "POST", Path: "/v1/completions", Status: http.StatusInternalServerError, Times: 100})
	if sum, err := h.drive(context.Background()); err == nil || sum.Status != executor.StatusFailed {
		t.Fatalf("Core failing the turn: %+v %v, want failed", sum, err)
	}
	var warned []string
	for line := range strings.Lines(logs.String()) {
		var r struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			RunID string `json:"run_id"`
			Err   string `json:"err"`
		}
		_ = json.Unmarshal([]byte(line), &r)
		if r.Level == "WARN" && r.RunID == h.req.RunID && (strings.Contains(r.Err, "503") || strings.Contains(r.Err, "500")) {
			warned = append(warned, r.Msg)
		}
	}
	if len(warned) != 2 {
		t.Errorf("WARN records with the run id and Core's status: %q, want one per failed drive", warned)
	}
	if n := promtest.Value(t, h.env.Sidecar.Metrics(), "toolsidecar_runs_total", "status=failed"); n != 2 {
		t.Errorf("toolsidecar_runs_total{status=failed} = %v, want 2", n)
	}
}

// TestFailedCallLogsItsIDs: each failed call logs one "call failed" record
// carrying the run's and the call's identifiers, which the executor adds
// only where a call logs; a call that succeeds logs nothing.
func TestFailedCallLogsItsIDs(t *testing.T) {
	var logs syncbuf.Buffer
	h := newHarnessWith(t, twoTurns(calls(`echo`, `fail`, `teleport`)...),
		testenv.Options{Sidecar: []sidecar.Option{sidecar.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil)))}},
		spec{config.Tool{Name: "echo"}, echo},
		spec{config.Tool{Name: "fail"}, func(context.Context, *tool.Call) ([]byte, error) { return nil, errors.New("no such flight") }},
	)
	sum, err := h.drive(context.Background())
	if err != nil || len(sum.Calls) != 3 {
		t.Fatalf("summary %+v err %v", sum, err)
	}
	type record struct {
		Msg, RunID, ActionID, ToolCallID, Tool, ErrorType string
	}
	failed := map[string]record{}
	for line := range strings.Lines(logs.String()) {
		var r struct {
			Msg        string `json:"msg"`
			RunID      string `json:"run_id"`
			ActionID   string `json:"action_id"`
			ToolCallID string `json:"tool_call_id"`
			Tool       string `json:"tool"`
			ErrorType  string `json:"error_type"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if r.Msg == "call failed" {
			failed[r.ToolCallID] = record(r)
		}
	}
	want := map[string]string{"echo": "", "fail": string(tool.ToolFailed), "teleport": string(tool.NotFound)}
	for _, c := range sum.Calls {
		r, logged := failed[c.ToolCallID]
		if want[c.Tool] == "" {
			if logged {
				t.Errorf("call %s (%s) succeeded and logged %+v", c.ToolCallID, c.Tool, r)
			}
			continue
		}
		if w := (record{"call failed", h.req.RunID, c.ActionID, c.ToolCallID, c.Tool, want[c.Tool]}); r != w {
			t.Errorf("call %s (%s) logged %+v, want %+v", c.ToolCallID, c.Tool, r, w)
		}
	}
}
