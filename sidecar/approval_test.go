package sidecar_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/promtest"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

const approvalToken = "approver-token-3e1a"

// approvalEnv is a sidecar whose pay tool needs approval (after timeout),
// beside look (ungated) and broken (always fails); pays counts the runs
// of pay.
type approvalEnv struct {
	*testenv.Env
	pays, others atomic.Int32
}

func newApprovalEnv(t *testing.T, sc coresim.Scenario, timeout time.Duration, edit ...func(*config.Config)) *approvalEnv {
	t.Helper()
	opts := testenv.Options{Token: approvalToken}
	if len(edit) > 0 {
		opts.Config = edit[0]
	}
	return startApprovalEnv(t, sc, timeout, opts)
}

// startApprovalEnv is newApprovalEnv with the environment's options.
func startApprovalEnv(t *testing.T, sc coresim.Scenario, timeout time.Duration, opts testenv.Options) *approvalEnv {
	t.Helper()
	a := &approvalEnv{}
	a.Env = testenv.Start(t, sc, opts,
		testenv.Tool{Config: config.Tool{Name: "pay", SideEffects: config.Unsafe, Approval: config.ApprovalRequired, ApprovalTimeout: timeout},
			Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) { a.pays.Add(1); return testenv.Echo(ctx, c) }},
		testenv.Tool{Config: config.Tool{Name: "look"}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
			a.others.Add(1)
			return testenv.Echo(ctx, c)
		}},
		testenv.Tool{Config: config.Tool{Name: "broken"}, Handler: func(context.Context, *tool.Call) ([]byte, error) {
			a.others.Add(1)
			return nil, tool.NewError(tool.ToolFailed, "disk full")
		}})
	return a
}

// api calls the sidecar's API with the token and decodes the answer.
func (a *approvalEnv) api(t *testing.T, method, path string, body any, out any) int {
	t.Helper()
	return a.apiAs(t, http.Header{"Authorization": {"Bearer " + approvalToken}}, method, path, body, out)
}

// apiAs is api with the credentials of header.
func (a *approvalEnv) apiAs(t *testing.T, header http.Header, method, path string, body any, out any) int {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, _ := http.NewRequest(method, a.URL+path, rd)
	req.Header = header.Clone()
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// pending waits until n approvals are pending and returns them.
func (a *approvalEnv) pending(t *testing.T, n int) []approval.Entry {
	t.Helper()
	var list struct{ Approvals []approval.Entry }
	poll.Until(t, "pending approvals", func() bool {
		a.api(t, "GET", "/v1/approvals", nil, &list)
		return len(list.Approvals) == n
	})
	return list.Approvals
}

func (a *approvalEnv) decide(t *testing.T, actionID, decision, reason string) int {
	t.Helper()
	return a.api(t, "POST", "/v1/approvals/"+actionID, map[string]string{"decision": decision, "reason": reason, "approver": "ana"}, nil)
}

// driveJSON drives the run and delivers its summary.
func (a *approvalEnv) driveJSON(t *testing.T, r testenv.Run) <-chan executor.Summary {
	done := make(chan executor.Summary, 1)
	go func() {
		_, s := testenv.Drive(t, a.URL, r, map[string]string{"Authorization": "Bearer " + approvalToken})
		done <- s
	}()
	return done
}

// sseDrive drives the run over SSE and delivers its events as they come,
// then the summary.
type sseDrive struct {
	mu     sync.Mutex
	events []string // "type data"
	done   chan executor.Summary
}

func (a *approvalEnv) driveSSE(t *testing.T, r testenv.Run) *sseDrive {
	t.Helper()
	d := &sseDrive{done: make(chan executor.Summary, 1)}
	body, _ := json.Marshal(r.DriveBody())
	req, _ := http.NewRequest("POST", a.URL+"/v1/runs/"+r.RunID+"/drive", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+approvalToken)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		typ := ""
		for sc.Scan() {
			line := sc.Text()
			if v, ok := strings.CutPrefix(line, "event: "); ok {
				typ = v
			} else if v, ok := strings.CutPrefix(line, "data: "); ok {
				d.mu.Lock()
				d.events = append(d.events, typ+" "+v)
				d.mu.Unlock()
				if typ == "done" {
					var s executor.Summary
					_ = json.Unmarshal([]byte(v), &s)
					d.done <- s
					return
				}
			}
		}
		close(d.done)
	}()
	return d
}

// of returns the data of the events of one type.
func (d *sseDrive) of(typ string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, e := range d.events {
		if data, ok := strings.CutPrefix(e, typ+" "); ok {
			out = append(out, data)
		}
	}
	return out
}

func (d *sseDrive) summary(t *testing.T) executor.Summary {
	t.Helper()
	select {
	case s, ok := <-d.done:
		if !ok {
			t.Fatal("the drive's stream ended without a done event")
		}
		return s
	case <-time.After(poll.Timeout):
		t.Fatal("the drive never ended")
	}
	return executor.Summary{}
}

func callOf(s executor.Summary, toolName string) executor.CallResult {
	for _, c := range s.Calls {
		if c.Tool == toolName {
			return c
		}
	}
	return executor.CallResult{}
}

// TestApprovalInAMixedBatch: a batch of a gated call, an ungated one and a
// failing one. The other two run while the gated call
// waits (their outputs follow the gated call's, in call order, as Core
// appends them); its Action stays pending and no second turn is asked
// until a person approves it. Then it runs once, the turn goes on, and Core has
// one output per call, every Action finalised. The decision (approver,
// how authenticated, reason) is in the summary and the metrics, the
// stream announced the approval with its arguments, and a second decision
// gets 409.
func TestApprovalInAMixedBatch(t *testing.T) {
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "pay", ArgsJSON: `{"amount": 40}`}, {Tool: "look", ArgsJSON: `{"q": 1}`}, {Tool: "broken", ArgsJSON: `{}`}}},
		{Content: "{{results}}"}}}
	a := newApprovalEnv(t, sc, time.Minute)
	r := a.NewRun()
	d := a.driveSSE(t, r)
	p := a.pending(t, 1)[0]
	if p.Tool != "pay" || string(p.Arguments) != `{"amount":40}` || p.RunID != r.RunID {
		t.Errorf("pending approval %+v (arguments %s)", p, p.Arguments)
	}
	poll.Until(t, "the siblings to run", func() bool { return a.others.Load() == 2 })
	if n := a.Sim.CountRequests("POST", "/v1/completions"); n != 1 {
		t.Errorf("%d completions requests while the approval was pending, want 1", n)
	}
	for _, act := range a.Sim.Actions(r.RunID) {
		if act.ToolName == "pay" && act.Status != core.ActionPending {
			t.Errorf("the gated call's Action is %s before its approval, want pending", act.Status)
		}
	}
	// The event and the pending list are written in one step but read
	// here apart: the stream's reader may still be on its way.
	poll.Until(t, "the approval_required event", func() bool { return len(d.of("approval_required")) > 0 })
	if ev := d.of("approval_required"); len(ev) != 1 || !strings.Contains(ev[0], `"arguments":{"amount":40}`) || !strings.Contains(ev[0], p.ActionID) {
		t.Errorf("approval_required events %v", ev)
	}
	if got := promtest.Value(t, a.Sidecar.Metrics(), "toolsidecar_approvals_pending"); got != 1 {
		t.Errorf("approvals_pending %v, want 1", got)
	}
	if code := a.decide(t, p.ActionID, "approve", "within budget"); code != http.StatusOK {
		t.Fatalf("approve answered %d", code)
	}
	sum := d.summary(t)
	if sum.Status != executor.StatusCompleted || sum.Turns != 2 {
		t.Fatalf("summary %+v", sum)
	}
	pay := callOf(sum, "pay")
	if !pay.OK || pay.Approval == nil || pay.Approval.Outcome != approval.Approved || pay.Approval.Approver != "ana" ||
		pay.Approval.AuthenticatedAs != "token" || pay.Approval.Reason != "within budget" {
		t.Errorf("pay's result %+v, approval %+v", pay, pay.Approval)
	}
	if b := callOf(sum, "broken"); b.OK || b.ErrorType != "tool_error" {
		t.Errorf("broken's result %+v", b)
	}
	if a.pays.Load() != 1 {
		t.Errorf("pay ran %d times, want 1", a.pays.Load())
	}
	a.AssertWholeBatches(r, 3)
	if ev := d.of("approval_decided"); len(ev) != 1 || !strings.Contains(ev[0], `"outcome":"approved"`) {
		t.Errorf("approval_decided events %v", ev)
	}
	var conflict struct{ Approval approval.Entry }
	if code := a.api(t, "POST", "/v1/approvals/"+p.ActionID, map[string]string{"decision": "deny"}, &conflict); code != http.StatusConflict ||
		conflict.Approval.Verdict == nil || conflict.Approval.Verdict.Outcome != approval.Approved {
		t.Errorf("a second decision answered %d %+v, want 409 with the first verdict", code, conflict.Approval)
	}
	if got := promtest.Value(t, a.Sidecar.Metrics(), "toolsidecar_approval_decisions_total", "outcome=approved"); got != 1 {
		t.Errorf("approval_decisions_total{outcome=approved} %v, want 1", got)
	}
	if got := promtest.Value(t, a.Sidecar.Metrics(), "toolsidecar_approvals_pending"); got != 0 {
		t.Errorf("approvals_pending %v after the decision, want 0", got)
	}
}

// TestApprovalOutlastsSubmitBudget: a person who decides after
// executor.submit_budget costs the gated call's siblings nothing: their
// outputs, which follow the gated call's in call order, are submitted once
// it has its own, with the whole budget then. Before, the budget ran from
// each sibling's reply, so the drive ended interrupted with Core healthy.
func TestApprovalOutlastsSubmitBudget(t *testing.T) {
	const budget = 300 * time.Millisecond
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "pay", ArgsJSON: `{"amount": 5}`}, {Tool: "look", ArgsJSON: `{}`}, {Tool: "broken", ArgsJSON: `{}`}}},
		{Content: "{{results}}"}}}
	a := newApprovalEnv(t, sc, time.Minute, func(c *config.Config) { c.Executor.SubmitBudget = budget })
	r := a.NewRun()
	done := a.driveJSON(t, r)
	p := a.pending(t, 1)[0]
	poll.Until(t, "the siblings to run", func() bool { return a.others.Load() == 2 })
	time.Sleep(3 * budget) // the person decides after the siblings' budget would have run out
	if code := a.decide(t, p.ActionID, "approve", ""); code != http.StatusOK {
		t.Fatalf("approve answered %d", code)
	}
	sum := <-done
	if sum.Status != executor.StatusCompleted || sum.Turns != 2 {
		t.Fatalf("summary %+v", sum)
	}
	for _, c := range sum.Calls {
		if !c.Submitted {
			t.Errorf("call %s (%s) not submitted", c.ToolCallID, c.Tool)
		}
	}
	a.AssertWholeBatches(r, 3)
}

// TestApprovalDenied: a denied call is not run; the model reads a denied
// outcome with the reason, and the Action is finalised failed. Bad
// decisions are refused without deciding anything, among them a body
// that gives "decision" twice ({"decision": "deny", "decision":
// "approve"}: 400 naming the key), which encoding/json read as its last
// key: the body a person or a log reads as a denial approved the call.
func TestApprovalDenied(t *testing.T) {
	sc := coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: "pay", ArgsJSON: `{"amount": 9000}`}}}, {Content: "{{results}}"}}}
	a := newApprovalEnv(t, sc, time.Minute)
	r := a.NewRun()
	done := a.driveJSON(t, r)
	p := a.pending(t, 1)[0]
	if code := a.decide(t, p.ActionID, "maybe", ""); code != http.StatusBadRequest {
		t.Errorf("decision maybe answered %d, want 400", code)
	}
	if code := a.decide(t, "act_nope", "approve", ""); code != http.StatusNotFound {
		t.Errorf("an unknown action answered %d, want 404", code)
	}
	var refused struct{ Error string }
	twice := json.RawMessage(`{"decision": "deny", "decision": "approve"}`)
	if code := a.api(t, "POST", "/v1/approvals/"+p.ActionID, twice, &refused); code != http.StatusBadRequest || !strings.Contains(refused.Error, `"decision"`) {
		t.Errorf("a decision given twice answered %d %q, want 400 naming decision", code, refused.Error)
	}
	if code := a.decide(t, p.ActionID, "deny", "over the limit"); code != http.StatusOK {
		t.Fatalf("deny answered %d", code)
	}
	sum := <-done
	pay := callOf(sum, "pay")
	if pay.OK || pay.ErrorType != string(tool.Denied) || !strings.Contains(pay.Error, "over the limit") || pay.Approval.Outcome != approval.Denied {
		t.Errorf("pay's result %+v", pay)
	}
	if a.pays.Load() != 0 {
		t.Errorf("a denied call ran %d times", a.pays.Load())
	}
	acts := a.AssertWholeBatches(r, 1)
	if acts[0].Status != core.ActionFailed {
		t.Errorf("the denied call's Action is %s, want failed", acts[0].Status)
	}
	if msgs := a.Sim.ToolMessages(r.ThreadID); !strings.Contains(msgs[0].Content, `"error_type":"denied"`) {
		t.Errorf("the model read %s", msgs[0].Content)
	}
}

// TestApprovalTimeout: an approval nobody decides is denied at its
// deadline; a decision after it gets 409.
func TestApprovalTimeout(t *testing.T) {
	sc := coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: "pay", ArgsJSON: `{}`}, {Tool: "look", ArgsJSON: `{}`}}}, {Content: "{{results}}"}}}
	a := newApprovalEnv(t, sc, 300*time.Millisecond)
	r := a.NewRun()
	resp, sum := testenv.Drive(t, a.URL, r, map[string]string{"Authorization": "Bearer " + approvalToken})
	pay := callOf(sum, "pay")
	if resp.StatusCode != 200 || sum.Status != executor.StatusCompleted || pay.ErrorType != string(tool.Denied) ||
		!strings.Contains(pay.Error, "nobody approved the call within 300ms") || pay.Approval.Outcome != approval.TimedOut {
		t.Fatalf("summary %+v, pay %+v", sum, pay)
	}
	if pay.Approval.WaitedMS < 300 {
		t.Errorf("the approval timed out after %d ms, want 300 or more", pay.Approval.WaitedMS)
	}
	if a.pays.Load() != 0 {
		t.Errorf("a call that timed out ran %d times", a.pays.Load())
	}
	a.AssertWholeBatches(r, 2)
	if code := a.decide(t, pay.ActionID, "approve", ""); code != http.StatusConflict {
		t.Errorf("a decision after the timeout answered %d, want 409", code)
	}
	if got := promtest.Value(t, a.Sidecar.Metrics(), "toolsidecar_approval_decisions_total", "outcome=timed_out"); got != 1 {
		t.Errorf("approval_decisions_total{outcome=timed_out} %v, want 1", got)
	}
}

// TestTwoApprovalsPending: two gated calls of one batch wait at once and
// are listed together; one decision does not release the turn, the second
// does; the approved call ran, the denied one did not.
func TestTwoApprovalsPending(t *testing.T) {
	sc := coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: "pay", ArgsJSON: `{"to": "a"}`}, {Tool: "pay", ArgsJSON: `{"to": "b"}`}}},
		{Content: "{{results}}"}}}
	a := newApprovalEnv(t, sc, time.Minute)
	r := a.NewRun()
	done := a.driveJSON(t, r)
	ps := a.pending(t, 2)
	byTo := map[string]string{}
	for _, p := range ps {
		var args struct{ To string }
		_ = json.Unmarshal(p.Arguments, &args)
		byTo[args.To] = p.ActionID
	}
	if code := a.decide(t, byTo["b"], "deny", "not b"); code != http.StatusOK {
		t.Fatalf("deny answered %d", code)
	}
	a.pending(t, 1)
	select {
	case s := <-done:
		t.Fatalf("the drive ended with one approval still pending: %+v", s)
	case <-time.After(200 * time.Millisecond):
	}
	if n := a.Sim.CountRequests("POST", "/v1/completions"); n != 1 {
		t.Errorf("%d completions requests with one approval pending, want 1", n)
	}
	if code := a.decide(t, byTo["a"], "approve", ""); code != http.StatusOK {
		t.Fatalf("approve answered %d", code)
	}
	sum := <-done
	if sum.Status != executor.StatusCompleted || len(sum.Calls) != 2 || !sum.Calls[0].OK || sum.Calls[1].ErrorType != string(tool.Denied) {
		t.Fatalf("summary %+v", sum)
	}
	if a.pays.Load() != 1 {
		t.Errorf("pay ran %d times, want 1", a.pays.Load())
	}
	a.AssertWholeBatches(r, 2)
}
