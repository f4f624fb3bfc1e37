package coreup

import (
	"context"
	"slices"
	"testing"

	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sim/coresim"
)

// TestOpenCallsInCallOrder: after a sidecar died mid-batch, Core lists the
// run's pending Actions and its processing ones apart. The open calls come
// back in the order the model made them (Core's triggered_at), not
// pending first, each saying whether it was started and whether its
// output is recorded.
func TestOpenCallsInCallOrder(t *testing.T) {
	sc := coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: "a"}, {Tool: "b"}, {Tool: "c"}, {Tool: "d"}}}}}
	_, srv := coresim.NewServer(coresim.Config{APIKey: "k", Scenario: sc})
	t.Cleanup(srv.Close)
	c, err := core.New(core.Config{URL: srv.URL, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r, err := coresim.SetUpRun(ctx, c, nil)
	if err != nil {
		t.Fatal(err)
	}
	u := New(c)
	req := executor.Request{RunID: r.RunID, ThreadID: r.ThreadID, AssistantID: r.AssistantID, MessageID: r.MessageID, Model: r.Model}
	turn, err := u.Turn(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var calls []*executor.ToolCall
	for ev, err := range turn.Events() {
		if err != nil {
			t.Fatal(err)
		}
		if ev.Kind == executor.TurnToolCall {
			calls = append(calls, ev.Call)
		}
	}
	turn.Close()
	if len(calls) != 4 {
		t.Fatalf("%d calls in the turn, want 4", len(calls))
	}
	// Calls a and c were started (c's output recorded); b and d were not.
	for _, i := range []int{0, 2} {
		if err := u.MarkStarted(ctx, calls[i], nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := u.RecordOutput(ctx, req, calls[2], "done"); err != nil {
		t.Fatal(err)
	}
	open, err := u.OpenCalls(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var started, recorded []bool
	for _, oc := range open {
		got = append(got, oc.Call.Tool)
		started, recorded = append(started, oc.Started), append(recorded, oc.Recorded)
	}
	if !slices.Equal(got, []string{"a", "b", "c", "d"}) || !slices.Equal(started, []bool{true, false, true, false}) ||
		!slices.Equal(recorded, []bool{false, false, true, false}) {
		t.Errorf("open calls %v, started %v, recorded %v; want [a b c d], [true false true false], [false false true false]", got, started, recorded)
	}
	if oc := open[1].Call; oc.ActionID != calls[1].ActionID || oc.ToolCallID != calls[1].ToolCallID || oc.RunID != r.RunID {
		t.Errorf("open call b %+v, want the turn's %+v", oc, calls[1])
	}
}

// TestRunStatuses: Core's run statuses in the executor's terms.
func TestRunStatuses(t *testing.T) {
	for status, want := range map[string]string{
		core.RunQueued: executor.RunActive, core.RunInProgress: executor.RunActive, core.RunActionRequired: executor.RunActive,
		core.RunCompleted: executor.RunCompleted, core.RunFailed: executor.RunFailed,
		core.RunCancelled: executor.RunCancelled, core.RunExpired: executor.RunCancelled, core.RunCancelling: executor.RunStopping,
	} {
		if got := runOf(core.Run{Status: status}); got.Status != want || got.UpstreamStatus != status {
			t.Errorf("Core's %q became %q (%q), want %q", status, got.Status, got.UpstreamStatus, want)
		}
	}
}

// TestProxyRejectsBadURL: proxy mode needs Core's URL.
func TestProxyRejectsBadURL(t *testing.T) {
	if _, err := NewProxy(ProxyConfig{CoreURL: "::bad"}); err == nil {
		t.Error("a bad Core URL was accepted")
	}
}
