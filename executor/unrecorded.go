package executor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
)

// recorder is where a call's records go (started, its output, its final
// status): the upstream, or nowhere for a call that no upstream knows.
type recorder interface {
	MarkStarted(ctx context.Context, c *ToolCall, withdraw <-chan struct{}) error
	RecordOutput(ctx context.Context, req Request, c *ToolCall, content string) error
	Finalise(ctx context.Context, c *ToolCall, status string, result ResultSummary) error
}

// unrecorded records nothing: the calls of an MCP client have no Action
// and no conversation.
type unrecorded struct{}

func (unrecorded) MarkStarted(context.Context, *ToolCall, <-chan struct{}) error  { return nil }
func (unrecorded) RecordOutput(context.Context, Request, *ToolCall, string) error { return nil }
func (unrecorded) Finalise(context.Context, *ToolCall, string, ResultSummary) error {
	return nil
}

// Call runs one call that no upstream records (an MCP client's, through
// /mcp): checked against the tool's schema, through the policies
// (budgets, dedupe, claim-check, hedging), dispatched and observed as a
// model's call is, as a run of its own. Its result carries the output
// the model would read (Output), an error outcome's included.
func (e *Executor) Call(ctx context.Context, name string, args json.RawMessage) CallResult {
	var b [12]byte
	_, _ = rand.Read(b[:])
	id := "mcp_" + hex.EncodeToString(b[:])
	m := &ToolCall{RunID: id, ActionID: id, ToolCallID: id, Tool: name, Args: args}
	if !json.Valid(args) {
		m.Problem, m.Args = "the arguments are not valid JSON", json.RawMessage("{}")
	}
	req := Request{RunID: id, scope: &scope{}}
	// The call's tool_result event carries its output, which the call
	// drops once the event is out.
	var res CallResult
	emit := e.tapped(id, "", func(ev Event) {
		if ev.Type == EventToolResult {
			res = *ev.Call
		}
	})
	br := e.newBatch(ctx, req, 1, emit, e.log.With("run_id", id))
	br.rec, br.noNextDrive = unrecorded{}, true
	br.add(m)
	_ = br.b.Wait()
	// Its run ends with it: the live view moves it to the recent runs. As
	// a drive's, the summary keeps no tool output.
	kept := res
	kept.Output = ""
	emit(Event{Type: EventDone, Turn: 1, Summary: &Summary{RunID: id, Upstream: "mcp", Status: StatusCompleted, Turns: 1, Calls: []CallResult{kept}}})
	return res
}
