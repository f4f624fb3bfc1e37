// Package agentsapi is the wire of the hosted agent loops that park a
// session on client tools: the OpenAI Agents API (OpenAI-Beta: agents=v1)
// and Anthropic Managed Agents (anthropic-beta: managed-agents-2026-04-01).
// Both are read into one vocabulary: a session's status, the client calls
// it waits on, and the results posted back
// (../shared/reference/hosted-agents.md).
//
// It knows no run and no adapter: agentsup adapts a session to the
// executor's Upstream port, as openaiup does a model API.
package agentsapi

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"

	"github.com/projectdavid/toolsidecar/tool"
)

// Session statuses, in the package's own words.
const (
	// StatusRunning: the model works; no client call is pending.
	StatusRunning = "running"
	// StatusBlocked: the session waits on client calls (Pending).
	StatusBlocked = "blocked"
	// StatusIdle: the turn ended; the session waits for input.
	StatusIdle = "idle"
	// StatusFailed: the session failed (OpenAI's only terminal state).
	StatusFailed = "failed"
	// StatusEnded: terminated or deleted (Anthropic).
	StatusEnded = "ended"
)

// Call is a client tool call a session waits on.
type Call struct {
	// ID is the call's identity in the session: OpenAI's "turn_id/call_id",
	// Anthropic's agent.custom_tool_use event id.
	ID string
	// TurnID and CallID are OpenAI's; ThreadID Anthropic's
	// session_thread_id, echoed on the result.
	TurnID, CallID, ThreadID string
	Name                     string
	Args                     json.RawMessage
	// Problem says why the call could not be read whole, if it could not.
	Problem string
}

// Snapshot is a session as a read (or an event that carries it) tells.
type Snapshot struct {
	Status string
	// Pending are the client calls the session waits on, with StatusBlocked.
	Pending []Call
	// Confirmations are the server's calls it waits on a person's
	// permission for (Anthropic's ask-gated agent.tool_use and
	// agent.mcp_tool_use), with StatusBlocked.
	Confirmations []Call
	// Why says why the session failed or ended, when it did.
	Why string
}

// Update is what one event of a session's stream tells.
type Update struct {
	// EventID is the event's id: a redelivered event has the same.
	EventID string
	Type    string
	// Snapshot, when set, is the session's state after the event.
	Snapshot *Snapshot
	// CancelledTurn names a turn cancelled or interrupted: its calls must
	// not be answered any more ("*": every turn of the session).
	CancelledTurn string
	// Raw is the event as it came.
	Raw []byte
}

// Result is a call's answer.
type Result struct {
	Call   Call
	OK     bool
	Output string // the output, or the error's text when !OK
}

// API is one of the two hosted APIs. key is the credential a request is
// sent with: the application's own, or the sidecar's.
type API interface {
	// Kind is its upstream.kind.
	Kind() string
	// Read reads a session's state and the calls it waits on.
	Read(ctx context.Context, key, session string) (Snapshot, error)
	// Stream opens the session's event stream; Close it.
	Stream(ctx context.Context, key, session string) (*Stream, error)
	// Post posts the results of one batch in one request, retried (the
	// same request) through 429, 5xx and the API's own races.
	Post(ctx context.Context, key, session string, results []Result) error
}

// Confirmer is an API whose server-side calls may wait for the client's
// permission (Anthropic's user.tool_confirmation).
type Confirmer interface {
	Confirm(ctx context.Context, key, session, callID string, allow bool, message string) error
}

// Stream is a session's open event stream.
type Stream struct {
	// Updates yields the events; an error ends it (the stream was cut).
	Updates iter.Seq2[Update, error]
	close   func()
}

// Close releases the stream.
func (s *Stream) Close() { s.close() }

// HTTPError is the API's refusal of a request.
type HTTPError struct {
	Status  int
	Message string
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("the API answered %d: %s", e.Status, tool.Truncate(e.Message, tool.MaxErrorMessage))
}

// CheckSession reports whether id may name a session (in a path).
func CheckSession(id string) error { return tool.CheckID("session id", id) }
