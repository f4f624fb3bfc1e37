package coresim

import (
	"context"
	"strings"
	"testing"

	"github.com/projectdavid/toolsidecar/core"
)

func (f *fixture) post(t *testing.T, toolID, callID, content string) {
	t.Helper()
	if _, err := f.c.SubmitToolOutput(context.Background(), core.ToolOutput{Content: content, ThreadID: f.req.ThreadID, AssistantID: f.req.AssistantID, ToolID: toolID, ToolCallID: callID}); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) finalise(t *testing.T, ms []*core.Manifest) {
	t.Helper()
	for _, m := range ms {
		if _, err := f.c.UpdateAction(context.Background(), m.ActionID, core.ActionUpdate{Status: core.ActionCompleted}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestContractViolations: each wrong move of a client is recorded as
// exactly one violation of the right kind.
func TestContractViolations(t *testing.T) {
	cases := []struct {
		name     string
		act      func(t *testing.T, f *fixture, ms []*core.Manifest)
		wantKind string
		wantCall int // index of the call named in the violation, -1 for none
	}{
		{"no tool_call_id", func(t *testing.T, f *fixture, ms []*core.Manifest) {
			f.post(t, ms[0].ActionID, "", "x")
			f.post(t, ms[1].ActionID, ms[1].ToolCallID, "x")
			f.post(t, ms[2].ActionID, ms[2].ToolCallID, "x")
			f.post(t, ms[0].ActionID, ms[0].ToolCallID, "x")
		}, ViolationNoToolCallID, -1},
		{"unknown tool_call_id", func(t *testing.T, f *fixture, ms []*core.Manifest) {
			for _, m := range ms {
				f.post(t, m.ActionID, m.ToolCallID, "x")
			}
			f.post(t, ms[0].ActionID, "call_deadbeef", "x")
		}, ViolationUnknownToolCallID, -1},
		{"duplicate output", func(t *testing.T, f *fixture, ms []*core.Manifest) {
			for _, m := range ms {
				f.post(t, m.ActionID, m.ToolCallID, "x")
			}
			f.post(t, ms[2].ActionID, ms[2].ToolCallID, "again")
		}, ViolationDuplicateOutput, 2},
		{"out of order", func(t *testing.T, f *fixture, ms []*core.Manifest) {
			f.post(t, ms[0].ActionID, ms[0].ToolCallID, "x")
			f.post(t, ms[2].ActionID, ms[2].ToolCallID, "x")
			f.post(t, ms[1].ActionID, ms[1].ToolCallID, "x")
		}, ViolationOutOfOrder, 1},
		{"tool_id swapped", func(t *testing.T, f *fixture, ms []*core.Manifest) {
			f.post(t, ms[1].ActionID, ms[0].ToolCallID, "x")
			f.post(t, ms[0].ActionID, ms[1].ToolCallID, "x")
			f.post(t, ms[2].ActionID, ms[2].ToolCallID, "x")
		}, ViolationToolIDMismatch, 0},
		{"processing after output", func(t *testing.T, f *fixture, ms []*core.Manifest) {
			for _, m := range ms {
				f.post(t, m.ActionID, m.ToolCallID, "x")
			}
			f.c.UpdateAction(context.Background(), ms[1].ActionID, core.ActionUpdate{Status: core.ActionProcessing})
		}, ViolationProcessingAfterOutput, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t, threeCalls())
			ms, _, err := f.turn(t)
			if err != nil {
				t.Fatal(err)
			}
			tc.act(t, f, ms)
			f.finalise(t, ms)
			if _, _, err := f.turn(t); err != nil {
				t.Fatal(err)
			}
			var kinds []Violation
			for _, v := range f.sim.Violations() {
				if v.Kind == tc.wantKind {
					kinds = append(kinds, v)
				}
			}
			if len(kinds) == 0 {
				t.Fatalf("no %s violation in %v", tc.wantKind, f.sim.Violations())
			}
			if tc.wantCall >= 0 && kinds[0].ToolCallID != ms[tc.wantCall].ToolCallID {
				t.Errorf("violation names %s, want %s", kinds[0].ToolCallID, ms[tc.wantCall].ToolCallID)
			}
			if kinds[0].String() == "" {
				t.Error("empty violation text")
			}
		})
	}
}

func TestActionNotFinalised(t *testing.T) {
	f := setup(t, threeCalls())
	ms, _, _ := f.turn(t)
	f.c.UpdateAction(context.Background(), ms[2].ActionID, core.ActionUpdate{Status: core.ActionProcessing})
	for _, m := range ms {
		f.post(t, m.ActionID, m.ToolCallID, "x")
	}
	f.finalise(t, ms[:2])
	f.turn(t)
	v := f.sim.Violations()
	if len(v) != 1 || v[0].Kind != ViolationActionNotFinalised || v[0].ToolCallID != ms[2].ToolCallID {
		t.Fatalf("violations %v, want action_not_finalised for the third call", v)
	}
	f.sim.EndRun(f.req.RunID) // a second end records nothing new
	if len(f.sim.Violations()) != 1 {
		t.Fatal("EndRun recorded twice")
	}
}

func TestActionsEndpoints(t *testing.T) {
	f := setup(t, threeCalls())
	ms, _, _ := f.turn(t)
	ctx := context.Background()
	pending, err := f.c.PendingActions(ctx, f.req.RunID)
	if err != nil || len(pending) != 3 || pending[0].ToolCallID != "call_1a2b3c4d" || pending[0].RunStatus != core.RunActionRequired {
		t.Fatalf("pending %+v %v", pending, err)
	}
	f.c.UpdateAction(ctx, ms[0].ActionID, core.ActionUpdate{Status: core.ActionProcessing, Result: map[string]any{"step": 1}})
	pending, _ = f.c.PendingActions(ctx, f.req.RunID)
	if len(pending) != 2 {
		t.Errorf("processing actions must leave the pending list: %d left", len(pending))
	}
	byStatus, err := f.c.ActionsByStatus(ctx, f.req.RunID, core.ActionProcessing)
	if err != nil || len(byStatus) != 1 || byStatus[0].ID != ms[0].ActionID {
		t.Fatalf("by status %+v %v", byStatus, err)
	}
	// PUT without result overwrites the stored result with null.
	a, err := f.c.UpdateAction(ctx, ms[0].ActionID, core.ActionUpdate{Status: core.ActionCompleted})
	if err != nil || string(a.Result) != "null" || !a.IsProcessed {
		t.Fatalf("update %+v %v", a, err)
	}
	got, err := f.c.GetAction(ctx, ms[0].ActionID)
	if err != nil || got.Status != core.ActionCompleted || got.ToolCallID != ms[0].ToolCallID || got.ToolName != "get_weather" {
		t.Fatalf("get %+v %v", got, err)
	}
	if _, err := f.c.UpdateAction(ctx, ms[0].ActionID, core.ActionUpdate{Status: "done"}); core.StatusCode(err) != 422 {
		t.Errorf("bad status: %v, want 422", err)
	}
	if _, err := f.c.GetAction(ctx, "act_nope"); core.StatusCode(err) != 404 {
		t.Errorf("missing action: %v, want 404", err)
	}
	if _, err := f.c.UpdateAction(ctx, "act_nope", core.ActionUpdate{Status: core.ActionFailed}); core.StatusCode(err) != 404 {
		t.Errorf("missing action update: %v, want 404", err)
	}
	if acts := f.sim.Actions(f.req.RunID); len(acts) != 3 || acts[2].ToolCallID != "call_9c0d1e2f" {
		t.Errorf("Actions() = %+v", acts)
	}
}

// TestMergedContext: consecutive tool messages reach the model as one,
// joined by newlines, with only the first tool_call_id.
func TestMergedContext(t *testing.T) {
	f := setup(t, threeCalls())
	ms, _, _ := f.turn(t)
	for i, m := range ms {
		f.post(t, m.ActionID, m.ToolCallID, []string{"sunny", "14:00", "rain"}[i])
	}
	ctx := f.sim.Context(f.req.ThreadID)
	if len(ctx) != 3 || ctx[0].Role != "user" || ctx[1].Role != "assistant" || ctx[2].Role != "tool" {
		t.Fatalf("context roles %+v", ctx)
	}
	if !strings.Contains(ctx[1].Content, `"id": "call_1a2b3c4d", "type": "function"`) {
		t.Errorf("assistant tool-calls message %s", ctx[1].Content)
	}
	if ctx[2].Content != "sunny\n14:00\nrain" || ctx[2].ToolCallID != ms[0].ToolCallID {
		t.Errorf("merged tool message %+v", ctx[2])
	}
	if tm := f.sim.ToolMessages(f.req.ThreadID); len(tm) != 3 || tm[1].ToolID != ms[1].ActionID {
		t.Errorf("tool messages %+v", tm)
	}
}
