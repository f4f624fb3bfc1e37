package core

import (
	"cmp"
	"encoding/json"
	"time"

	"github.com/projectdavid/toolsidecar/tool"
)

// Action statuses accepted by PUT /v1/actions/{id} (ActionStatus).
const (
	ActionPending    = "pending"
	ActionProcessing = "processing"
	ActionCompleted  = "completed"
	ActionFailed     = "failed"
	ActionExpired    = "expired"
	ActionCancelled  = "cancelled"
	ActionRetrying   = "retrying"
)

// Run statuses as they appear on the wire. "action_required" is the wire
// value of the enum member pending_action.
const (
	RunQueued         = "queued"
	RunInProgress     = "in_progress"
	RunActionRequired = "action_required"
	RunCompleted      = "completed"
	RunFailed         = "failed"
	RunCancelling     = "cancelling"
	RunCancelled      = "cancelled"
	RunExpired        = "expired"
)

// RunTerminal reports whether a run status is final: no further turn may be
// requested for it.
func RunTerminal(status string) bool {
	switch status {
	case RunCompleted, RunFailed, RunCancelled, RunExpired, "deleted":
		return true
	}
	return false
}

// RunStopped reports whether a run status says the run was cancelled (or
// is being cancelled) or expired: its calls in flight stop, and no further
// turn may be requested.
func RunStopped(status string) bool {
	switch status {
	case RunCancelled, RunCancelling, RunExpired:
		return true
	}
	return false
}

// CompletionRequest is the body of POST /v1/completions, in the SDK's key
// order. Every turn of a run re-sends the same body.
type CompletionRequest struct {
	Model       string         `json:"model"`
	APIKey      *string        `json:"api_key"`
	ThreadID    string         `json:"thread_id"`
	MessageID   string         `json:"message_id"`
	RunID       string         `json:"run_id"`
	AssistantID string         `json:"assistant_id"`
	Stream      bool           `json:"stream"`
	MetaData    map[string]any `json:"meta_data,omitempty"`
}

// ToolOutput is the body of POST /v1/messages/tools. ToolID carries the
// Action ID; ToolCallID the model's call id. They are never swapped.
type ToolOutput struct {
	Content     string         `json:"content"`
	ThreadID    string         `json:"thread_id"`
	SenderID    *string        `json:"sender_id"`
	AssistantID string         `json:"assistant_id"`
	Role        string         `json:"role"`
	ToolID      string         `json:"tool_id"`
	ToolCallID  string         `json:"tool_call_id"`
	MetaData    map[string]any `json:"meta_data"`
	IsLastChunk bool           `json:"is_last_chunk"`
	Attachments []any          `json:"attachments"`
}

// ActionUpdate is the body of PUT /v1/actions/{id}. Core overwrites the
// stored result with Result, to null when it is omitted.
type ActionUpdate struct {
	Status string `json:"status"`
	// Result is any JSON object: Core keeps it as the Action's result.
	Result any `json:"result,omitempty"`
}

// Action is an ActionRead row.
type Action struct {
	ID           string          `json:"id"`
	RunID        string          `json:"run_id"`
	ToolName     string          `json:"tool_name"`
	ToolCallID   string          `json:"tool_call_id"`
	TurnIndex    int             `json:"turn_index"`
	Status       string          `json:"status"`
	FunctionArgs json.RawMessage `json:"function_args"`
	Result       json.RawMessage `json:"result"`
	IsProcessed  bool            `json:"is_processed"`
	TriggeredAt  any             `json:"triggered_at,omitempty"`
	ProcessedAt  any             `json:"processed_at,omitempty"`
}

// CompareTriggered orders two Actions by the time Core created them
// (triggered_at, which Core stamps with datetime.now() as it reads each
// call from the model's stream), then by turn_index. A stamp that cannot
// be read compares equal, so a stable sort keeps Core's own order there.
func CompareTriggered(a, b Action) int {
	ta, oka := triggered(a.TriggeredAt)
	tb, okb := triggered(b.TriggeredAt)
	if oka && okb {
		if c := ta.Compare(tb); c != 0 {
			return c
		}
	}
	return cmp.Compare(a.TurnIndex, b.TurnIndex)
}

// triggered reads a triggered_at stamp: ISO 8601 with or without a zone
// and fractional seconds, as Pydantic writes a naive datetime.
func triggered(v any) (time.Time, bool) {
	s, ok := v.(string)
	if !ok {
		return time.Time{}, false
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05.999999999"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}

// PendingAction is one item of GET /v1/actions/pending/{run_id}.
type PendingAction struct {
	ActionID          string          `json:"action_id"`
	ToolCallID        string          `json:"tool_call_id"`
	ActionStatus      string          `json:"action_status"`
	FunctionArguments json.RawMessage `json:"function_arguments"`
	ToolName          string          `json:"tool_name"`
	RunID             string          `json:"run_id"`
	RunStatus         string          `json:"run_status"`
}

// Run is the subset of RunReadDetailed the sidecar reads.
type Run struct {
	ID          string         `json:"id"`
	AssistantID string         `json:"assistant_id"`
	ThreadID    string         `json:"thread_id"`
	Status      string         `json:"status"`
	Model       string         `json:"model,omitempty"`
	MetaData    map[string]any `json:"meta_data,omitempty"`
	CurrentTurn int            `json:"current_turn,omitempty"`
	// StartedAt is when the run's first turn began: Core stamps it as that
	// turn starts, before any Action of the run exists, and sends null
	// until then (core-protocol.md, A.2). Kept raw so that a null can be
	// told from an answer without the field.
	StartedAt json.RawMessage `json:"started_at"`
}

// NeverStarted says that Core reports no turn of the run begun, so the run
// has no Actions. An answer without started_at says nothing either way.
func (r Run) NeverStarted() bool { return string(r.StartedAt) == "null" }

// RunList is Core's answer to GET /v1/runs and GET /v1/threads/{id}/runs
// (projectdavid-core, routers/runs_router.py list_runs): a page of the
// caller's runs as Core's Run model, with no cursor to the next one.
type RunList struct {
	Object  string `json:"object"` // "list"
	Data    []Run  `json:"data"`
	FirstID string `json:"first_id"` // null when Data is empty
	LastID  string `json:"last_id"`
	HasMore bool   `json:"has_more"`
}

// MaxRunList is the largest limit Core accepts on a run listing; above it
// Core answers 422.
const MaxRunList = 100

// RunCreate is the body of POST /v1/runs. Core ignores a client id and
// status, so only what it reads is sent.
type RunCreate struct {
	AssistantID  string         `json:"assistant_id"`
	ThreadID     string         `json:"thread_id"`
	Instructions string         `json:"instructions"`
	Model        string         `json:"model,omitempty"`
	MetaData     map[string]any `json:"meta_data"`
}

// FunctionTool is one entry of an assistant's tools array: the shape Core
// and the OpenAI API share, which the registry's tools take.
type FunctionTool = tool.FunctionTool

// Function is the function part of a [FunctionTool].
type Function = tool.Function

// AssistantCreate is the body of POST /v1/assistants.
type AssistantCreate struct {
	Name         string         `json:"name"`
	Model        string         `json:"model"`
	Instructions string         `json:"instructions,omitempty"`
	Tools        []FunctionTool `json:"tools"`
}

// Assistant is the subset of AssistantRead the sidecar reads.
type Assistant struct {
	ID    string         `json:"id"`
	Name  string         `json:"name"`
	Model string         `json:"model"`
	Tools []FunctionTool `json:"tools"`
}

// Thread is a ThreadRead.
type Thread struct {
	ID       string         `json:"id"`
	MetaData map[string]any `json:"meta_data"`
}

// MessageCreate is the body of POST /v1/messages.
type MessageCreate struct {
	Content     string         `json:"content"`
	ThreadID    string         `json:"thread_id"`
	SenderID    *string        `json:"sender_id"`
	AssistantID string         `json:"assistant_id"`
	Role        string         `json:"role"`
	ToolID      *string        `json:"tool_id"`
	ToolCallID  *string        `json:"tool_call_id"`
	MetaData    map[string]any `json:"meta_data"`
	IsLastChunk bool           `json:"is_last_chunk"`
	Attachments []any          `json:"attachments"`
}

// Message is the subset of MessageRead the sidecar reads.
type Message struct {
	ID         string `json:"id"`
	ThreadID   string `json:"thread_id"`
	Role       string `json:"role"`
	Content    string `json:"content"`
	ToolID     string `json:"tool_id,omitempty"`
	ToolCallID string `json:"tool_call_id,omitempty"`
}
