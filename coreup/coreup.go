// Package coreup adapts Project David Core to the executor's Upstream
// port: a run is Core's run, a turn is POST /v1/completions read as SSE, a
// call is an Action, started is the Action set processing, an output is a
// tool message, and the final status is the Action's. It is the one
// package beside core/ that speaks Core's wire types to the loop.
package coreup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"slices"

	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/tool"
)

// Upstream is Core as the executor's upstream.
type Upstream struct{ c *core.Client }

var _ executor.Upstream = (*Upstream)(nil)

// New adapts c.
func New(c *core.Client) *Upstream { return &Upstream{c: c} }

// Kind is "core".
func (u *Upstream) Kind() string { return "core" }

// Run reads a run (GET /v1/runs/{id}).
func (u *Upstream) Run(ctx context.Context, runID string) (executor.Run, error) {
	r, err := u.c.GetRun(ctx, runID)
	if err != nil {
		return executor.Run{}, refused(err)
	}
	return runOf(r), nil
}

// refused gives a non-2xx answer of Core its status in the executor's
// terms, keeping Core's error in the chain.
func refused(err error) error {
	if code := core.StatusCode(err); code != 0 {
		return &executor.UpstreamError{Status: code, Err: err}
	}
	return err
}

// runOf is Core's run in the executor's terms.
func runOf(r core.Run) executor.Run {
	out := executor.Run{ID: r.ID, UpstreamStatus: r.Status, ThreadID: r.ThreadID, AssistantID: r.AssistantID, NeverStarted: r.NeverStarted()}
	switch {
	case r.Status == core.RunCompleted:
		out.Status = executor.RunCompleted
	case r.Status == core.RunFailed:
		out.Status = executor.RunFailed
	case core.RunTerminal(r.Status): // cancelled, expired, deleted
		out.Status = executor.RunCancelled
	case core.RunStopped(r.Status): // cancelling
		out.Status = executor.RunStopping
	default:
		out.Status = executor.RunActive
	}
	return out
}

// RecentRuns reads the caller's newest runs (GET /v1/runs, newest
// first); Core shows at most [core.MaxRunList]. A Core without the
// listing, or one that refuses its query, reports ErrNoListing.
func (u *Upstream) RecentRuns(ctx context.Context, limit int) ([]executor.Run, error) {
	l, err := u.c.ListRuns(ctx, min(core.MaxRunList, limit), true)
	if err != nil {
		switch core.StatusCode(err) {
		case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusUnprocessableEntity:
			return nil, fmt.Errorf("%w: %w", executor.ErrNoListing, err)
		}
		return nil, err
	}
	out := make([]executor.Run, len(l.Data))
	for i, r := range l.Data {
		out[i] = runOf(r)
	}
	return out, nil
}

// Turn opens the run's next completions stream.
func (u *Upstream) Turn(ctx context.Context, req executor.Request) (executor.Turn, error) {
	s, err := u.c.Stream(ctx, core.CompletionRequest{
		Model: req.Model, APIKey: req.ProviderKey, ThreadID: req.ThreadID, MessageID: req.MessageID,
		RunID: req.RunID, AssistantID: req.AssistantID, MetaData: req.MetaData,
	})
	if err != nil {
		return nil, refused(err)
	}
	return turn{s}, nil
}

// turn is a completions stream read as the executor's events.
type turn struct{ s *core.Stream }

func (t turn) Close() { t.s.Close() }

func (t turn) Events() iter.Seq2[executor.TurnEvent, error] {
	return func(yield func(executor.TurnEvent, error) bool) {
		for c, err := range t.s.Chunks() {
			var fe *core.FrameError
			switch {
			case err == nil:
			case errors.As(err, &fe) && fe.Manifest:
				err = &executor.LostCallError{Err: err}
			case errors.Is(err, core.ErrFrame):
				err = fmt.Errorf("%w: %w", executor.ErrBadFrame, err)
			}
			if err != nil {
				if !yield(executor.TurnEvent{}, err) {
					return
				}
				continue
			}
			ev := executor.TurnEvent{Text: c.Text, Raw: c.Raw}
			switch c.Kind {
			case core.KindManifest:
				ev.Kind, ev.Call = executor.TurnToolCall, callOf(c.Manifest)
			case core.KindContent:
				ev.Kind = executor.TurnText
			case core.KindReasoning:
				ev.Kind = executor.TurnReasoning
			case core.KindError:
				ev.Kind = executor.TurnError
			default:
				ev.Kind = executor.TurnOther
			}
			if !yield(ev, nil) {
				return
			}
		}
	}
}

// callOf is a manifest as the executor's call; the worker receives the
// manifest exactly as Core sent it.
func callOf(m *core.Manifest) *executor.ToolCall {
	return &executor.ToolCall{RunID: m.RunID, ActionID: m.ActionID, ToolCallID: m.ToolCallID, Tool: m.Tool, Args: m.Args, Raw: m.Raw, Problem: m.Problem}
}

// MarkStarted sets the call's Action processing, unless it is withdrawn
// while it waits for a connection to Core.
func (u *Upstream) MarkStarted(ctx context.Context, c *executor.ToolCall, withdraw <-chan struct{}) error {
	if withdraw != nil {
		ctx = core.WithWithdraw(ctx, withdraw)
	}
	err := u.c.WriteAction(ctx, c.ActionID, core.ActionUpdate{Status: core.ActionProcessing})
	if errors.Is(err, core.ErrWithdrawn) {
		return fmt.Errorf("%w: %w", executor.ErrWithdrawn, err)
	}
	return budget(err)
}

// RecordOutput posts the call's tool message, exactly once. An action_id
// that is not an id is not echoed to Core: the message goes without its
// tool_id (optional in Core), so that the model still reads the call's
// error beside its tool_call_id.
func (u *Upstream) RecordOutput(ctx context.Context, req executor.Request, c *executor.ToolCall, content string) error {
	toolID := c.ActionID
	if tool.CheckID("action_id", toolID) != nil {
		toolID = ""
	}
	_, err := u.c.RecordToolOutput(ctx, core.ToolOutput{
		Content: content, ThreadID: req.ThreadID, AssistantID: req.AssistantID, ToolID: toolID, ToolCallID: c.ToolCallID,
	})
	return budget(err)
}

// Finalise sets the call's Action to its final status, with the result
// summary. The executor's final statuses are Core's Action statuses.
func (u *Upstream) Finalise(ctx context.Context, c *executor.ToolCall, status string, result executor.ResultSummary) error {
	return budget(u.c.WriteAction(ctx, c.ActionID, core.ActionUpdate{Status: status, Result: result}))
}

// budget says in the executor's terms that a write ran out of its budget.
func budget(err error) error {
	if errors.Is(err, core.ErrBudget) {
		return fmt.Errorf("%w: %w", executor.ErrSubmitBudget, err)
	}
	return err
}

// OpenCalls lists the run's Actions that are pending or processing, in
// the order Core created them: by triggered_at, which Core stamps as it
// reads each call from the model's stream (Actions whose stamps are equal
// or unreadable keep the order of Core's listings). A call whose tool
// message is in the thread is Recorded.
func (u *Upstream) OpenCalls(ctx context.Context, req executor.Request) ([]executor.OpenCall, error) {
	var open []core.Action
	for _, status := range []string{core.ActionPending, core.ActionProcessing} {
		as, err := u.c.ActionsByStatus(ctx, req.RunID, status)
		if err != nil {
			return nil, err
		}
		for _, a := range as {
			a.Status = status
			open = append(open, a)
		}
	}
	if len(open) == 0 {
		return nil, nil
	}
	slices.SortStableFunc(open, core.CompareTriggered)
	recorded, err := u.recordedOutputs(ctx, req.ThreadID)
	if err != nil {
		// The output's write reads the thread again before it posts, so
		// nothing is posted twice: say that none is recorded.
		recorded = map[string]bool{}
	}
	out := make([]executor.OpenCall, len(open))
	for i, a := range open {
		args := a.FunctionArgs
		if len(args) == 0 || string(args) == "null" {
			args = json.RawMessage("{}")
		}
		m := &core.Manifest{Type: string(core.KindManifest), RunID: req.RunID, ActionID: a.ID, ToolCallID: a.ToolCallID, Tool: a.ToolName, Args: args}
		out[i] = executor.OpenCall{Call: callOf(m), Started: a.Status == core.ActionProcessing, Recorded: recorded[a.ToolCallID]}
	}
	return out, nil
}

// recordedOutputs lists the tool_call_ids whose tool message is among the
// thread's newest 100 messages.
func (u *Upstream) recordedOutputs(ctx context.Context, threadID string) (map[string]bool, error) {
	msgs, err := u.c.ListMessages(ctx, threadID, 100)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, m := range msgs {
		if m.Role == "tool" && m.ToolCallID != "" {
			out[m.ToolCallID] = true
		}
	}
	return out, nil
}

// LastAnswer is the newest assistant message of the run's thread.
func (u *Upstream) LastAnswer(ctx context.Context, req executor.Request) (string, error) {
	msgs, err := u.c.ListMessages(ctx, req.ThreadID, 20)
	if err != nil {
		return "", err
	}
	for _, m := range msgs {
		if m.Role == "assistant" {
			return m.Content, nil
		}
	}
	return "", nil
}

// AsCaller makes Core requests under ctx carry the caller's X-API-Key.
func (u *Upstream) AsCaller(ctx context.Context, key string) context.Context {
	return core.AsCaller(ctx, key)
}

// Caller is the caller's key under ctx, or "".
func (u *Upstream) Caller(ctx context.Context) string { return core.CallerOf(ctx) }
