package live

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/executor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestBoardFoldsARun: a run's events become its turns and calls with their
// steps, outcome and marks; output and errors are cut; the watcher hears
// which run changed and that the approvals did.
func TestBoardFoldsARun(t *testing.T) {
	b := NewBoard(10)
	w, stop := b.watch()
	defer stop()
	ref := func(id, toolName string) *executor.CallResult {
		return &executor.CallResult{Turn: 1, ActionID: id, ToolCallID: "call_" + id, Tool: toolName}
	}
	b.Observe("run_1", "", executor.Event{Type: executor.EventTurn, Turn: 1})
	b.Observe("run_1", "", executor.Event{Type: executor.EventContent, Turn: 1, Text: "thinking"})
	b.Observe("run_1", "", executor.Event{Type: executor.EventToolCall, Turn: 1, Call: ref("a", "pay")})
	b.Observe("run_1", "", executor.Event{Type: executor.EventToolCall, Turn: 1, Call: ref("b", "look")})
	b.Observe("run_1", "", executor.Event{Type: executor.EventApprovalRequired, Turn: 1, Call: ref("a", "pay"), Approval: &approval.Entry{}})
	if runs, approvals := b.changes(w); len(runs) != 1 || !approvals || runs[0].Turns[0].Calls[0].Approval != "waiting" {
		t.Fatalf("changes %+v %v", runs, approvals)
	}
	b.Observe("run_1", "", executor.Event{Type: executor.EventApprovalDecided, Turn: 1, Call: ref("a", "pay"),
		Approval: &approval.Entry{Verdict: &approval.Verdict{Outcome: approval.Denied, Approver: "ana"}}})
	now := time.Now()
	long := strings.Repeat("é", 300)
	b.Observe("run_1", "", executor.Event{Type: executor.EventToolResult, Turn: 1, Call: &executor.CallResult{Turn: 1, ActionID: "a", Tool: "pay",
		ErrorType: "denied", Error: long, Attempts: 0, Timeline: executor.Timeline{Replied: now, Recorded: now, Finalised: now}}})
	b.Observe("run_1", "", executor.Event{Type: executor.EventToolResult, Turn: 1, Call: &executor.CallResult{Turn: 1, ActionID: "b", Tool: "look",
		OK: true, Output: long, Attempts: 2, Hedged: true, Timeline: executor.Timeline{Replied: now}}})
	b.Observe("run_1", "", executor.Event{Type: executor.EventDone, Summary: &executor.Summary{Status: executor.StatusCompleted}})
	runs, approvals := b.changes(w)
	if len(runs) != 1 || !approvals { // decided since
		t.Fatalf("changes %d runs, approvals %v", len(runs), approvals)
	}
	r := runs[0]
	if r.Status != executor.StatusCompleted || r.Ended == 0 || r.Calls != 2 || r.Errors != 1 || len(r.Turns) != 1 {
		t.Fatalf("run %+v", r)
	}
	pay, look := r.Turns[0].Calls[0], r.Turns[0].Calls[1]
	if pay.Outcome != "denied" || pay.Approval != approval.Denied || pay.Approver != "ana" || pay.Decided < pay.ApprovalAsked ||
		pay.Finalised != now.UnixMilli() {
		t.Errorf("pay %+v", pay)
	}
	if look.Outcome != "ok" || look.Attempts != 2 || !look.Hedged || look.Recorded != 0 {
		t.Errorf("look %+v", look)
	}
	for _, s := range []string{pay.Error, look.Preview} {
		if len(s) > maxTextBytes+len("…") || !strings.HasSuffix(s, "é…") {
			t.Errorf("text of %d bytes not cut on a rune: %q", len(s), s[len(s)-8:])
		}
	}
}

// TestBoardHistory: the board keeps the runs in flight and the last
// history finished ones; a run driven again goes on in its row, and a
// drive that only replays an ended run's state leaves the row as it was.
func TestBoardHistory(t *testing.T) {
	b := NewBoard(2)
	b.Observe("running", "", executor.Event{Type: executor.EventTurn, Turn: 1})
	for _, id := range []string{"r1", "r2", "r3"} {
		b.Observe(id, "", executor.Event{Type: executor.EventTurn, Turn: 1})
		b.Observe(id, "", executor.Event{Type: executor.EventDone, Summary: &executor.Summary{Status: executor.StatusCompleted}})
	}
	ids := map[string]bool{}
	for _, r := range b.snapshot() {
		ids[r.ID] = true
	}
	if len(ids) != 3 || !ids["running"] || !ids["r2"] || !ids["r3"] {
		t.Errorf("the board keeps %v, want running, r2 and r3", ids)
	}
	r3, _ := b.run("r3")
	time.Sleep(5 * time.Millisecond)
	b.Observe("r3", "", executor.Event{Type: executor.EventDone, Summary: &executor.Summary{Status: executor.StatusCompleted}})
	if again, _ := b.run("r3"); again.Ended != r3.Ended || again.Started != r3.Started || len(b.finished) != 2 {
		t.Errorf("a replay of r3 changed its row: %+v, was %+v (finished %v)", again, r3, b.finished)
	}
	b.Observe("r2", "", executor.Event{Type: executor.EventTurn, Turn: 2})
	if r, _ := b.run("r2"); r.Status != "running" || r.Ended != 0 || len(r.Turns) != 2 {
		t.Errorf("r2 driven again is %+v, want running with turns 1 and 2", r)
	}
	b.Observe("r4", "", executor.Event{Type: executor.EventDone, Summary: &executor.Summary{Status: executor.StatusFailed}})
	if n := len(b.snapshot()); n != 4 { // running, r2 (in flight again), r3, r4
		t.Errorf("%d runs kept, want 4", n)
	}
}
