// Package approval keeps the calls that wait for a person's decision: a
// tool configured with approval: required is not dispatched until someone
// approves it, and a denial or a timeout is its outcome. A [Store] holds
// the pending approvals and their verdicts; [Memory] keeps them in the
// process, the ledger keeps them in JetStream so that they survive a
// restart and any sidecar of a cluster can take the decision.
package approval

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// The outcomes of an approval.
const (
	Approved = "approved"
	Denied   = "denied"
	TimedOut = "timed_out"
	// Withdrawn: the call was cancelled while it waited (its caller went
	// away); nobody needs to decide any more.
	Withdrawn = "withdrawn"
)

// The decisions a person takes, as POST /v1/approvals/{action_id} names
// them.
const (
	DecisionApprove = "approve"
	DecisionDeny    = "deny"
)

// MaxArgumentsBytes bounds the arguments an approval shows: enough to
// judge a call, never a whole document.
const MaxArgumentsBytes = 4 << 10

// Request is a call waiting for a decision.
type Request struct {
	ActionID   string `json:"action_id"`
	RunID      string `json:"run_id"`
	ToolCallID string `json:"tool_call_id"`
	Tool       string `json:"tool"`
	// Arguments are the call's arguments, cut to MaxArgumentsBytes
	// (then a JSON string holding the start of them).
	Arguments   json.RawMessage `json:"arguments"`
	RequestedAt time.Time       `json:"requested_at"`
	// Deadline is when the approval times out (on_timeout applies).
	Deadline time.Time `json:"deadline"`
	// Owner is the caller whose drive asked (executor.CallerOf, a digest
	// of its credentials; "" for a call of no caller, an MCP client's):
	// the approval is shown to, and decided by, that caller and the
	// operator alone, as the live view shows the run. It is kept in the
	// request because sidecars that share a store do not share a board.
	Owner string `json:"owner,omitempty"`
}

// Verdict is how an approval ended.
type Verdict struct {
	// Outcome is Approved, Denied, TimedOut or Withdrawn.
	Outcome string `json:"outcome"`
	Reason  string `json:"reason,omitempty"`
	// Approver is the name the person gave, if any; AuthenticatedAs is how
	// the request that decided was authenticated ("operator", "token", "key:<hash>",
	// or "none" on an open loopback listener). Both empty for a timeout.
	Approver        string    `json:"approver,omitempty"`
	AuthenticatedAs string    `json:"authenticated_as,omitempty"`
	DecidedAt       time.Time `json:"decided_at"`
}

// Entry is an approval: its request, and its verdict once there is one.
type Entry struct {
	Request
	Verdict *Verdict `json:"verdict,omitempty"`
}

// Errors of Decide.
var (
	ErrNotFound = errors.New("approval: no approval for that action")
	ErrDecided  = errors.New("approval: already decided")
)

// Store holds approvals. Every method is safe for concurrent use.
type Store interface {
	// Open records r as pending, or returns the approval already recorded
	// for its Action (a re-drive after a restart), decided or not.
	Open(ctx context.Context, r Request) (Entry, error)
	// Await blocks until the approval of actionID has a verdict, or ctx
	// ends.
	Await(ctx context.Context, actionID string) (Verdict, error)
	// Get returns the approval of actionID, decided or not, or
	// ErrNotFound.
	Get(ctx context.Context, actionID string) (Entry, error)
	// Decide records v as the approval's verdict, once: a second decision
	// gets ErrDecided and the entry as it stands.
	Decide(ctx context.Context, actionID string, v Verdict) (Entry, error)
	// Pending lists the approvals without a verdict, oldest first: an
	// empty list, never nil, when there are none.
	Pending(ctx context.Context) ([]Entry, error)
}

// Outlives reports whether s keeps its approvals beyond the process (it
// has a method Durable that says so): a call that waits on such a store
// may be left for the next drive when the sidecar stops, rather than
// withdrawn.
func Outlives(s Store) bool {
	d, ok := s.(interface{ Durable() bool })
	return ok && d.Durable()
}

// Arguments returns args as an approval shows them: the JSON itself, or
// a JSON string of its first MaxArgumentsBytes bytes when it is longer.
func Arguments(args []byte) json.RawMessage {
	if len(args) <= MaxArgumentsBytes && json.Valid(args) {
		return json.RawMessage(args)
	}
	cut := args
	if len(cut) > MaxArgumentsBytes {
		cut = cut[:MaxArgumentsBytes]
	}
	b, _ := json.Marshal(string(cut) + "…")
	return b
}
