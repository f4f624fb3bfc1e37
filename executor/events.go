package executor

import (
	"context"
	"encoding/json"
	"time"

	"github.com/projectdavid/toolsidecar/approval"
)

// EventType names an event of a drive.
type EventType string

// The events a drive emits, in the order they happen.
const (
	// EventAccepted goes to a caller's own sink, first, once the drive
	// took it (the run read, its owner checked, the caller leading or
	// attached); a drive refused before ends with EventDone alone. Never
	// published to followers nor to the live view.
	EventAccepted   EventType = "accepted"
	EventTurn       EventType = "turn"        // a turn starts
	EventContent    EventType = "content"     // model text
	EventReasoning  EventType = "reasoning"   // model reasoning
	EventChunk      EventType = "chunk"       // any other upstream chunk, raw
	EventToolCall   EventType = "tool_call"   // a call was dispatched
	EventProgress   EventType = "progress"    // a worker reported a call alive
	EventToolResult EventType = "tool_result" // a call's outcome was submitted
	// EventApprovalRequired: a call waits for a person's decision
	// (Approval is set); EventApprovalDecided: it has one.
	EventApprovalRequired EventType = "approval_required"
	EventApprovalDecided  EventType = "approval_decided"
	EventError            EventType = "error" // an upstream error chunk or a bad frame
	EventDone             EventType = "done"  // the drive ended; Summary is set
)

// Event is one thing that happened during a drive.
type Event struct {
	// ID names the event within its drive ("<drive>-<n>", n counting
	// from 1): a caller that lost its stream passes the last one it read
	// as Request.ResumeAfter to get the events that followed it. Empty on
	// the done event of a drive that never began.
	ID   string    `json:"-"`
	Type EventType `json:"type"`
	Turn int       `json:"turn"`
	Text string    `json:"text,omitempty"`
	// Raw is the upstream's chunk as it was sent, for content, reasoning,
	// chunk and error events that came from the stream.
	Raw  json.RawMessage `json:"-"`
	Call *CallResult     `json:"call,omitempty"`
	// Approval is the call's approval, for the approval events.
	Approval *approval.Entry `json:"approval,omitempty"`
	Summary  *Summary        `json:"summary,omitempty"`
}

// Sink receives events. Each caller's sink is called from that caller's
// own goroutine, one event at a time: a sink needs no lock of its own, and
// a slow one delays only its own caller, never the loop or the upstream.
type Sink func(Event)

// Observer receives measurements; metrics implement it.
type Observer interface {
	// CallDone: one call's outcome ("ok" or an error type) and duration.
	// ctx holds the call's span: a sampled trace's id is the
	// measurement's exemplar.
	CallDone(ctx context.Context, tool, outcome string, d time.Duration)
	// BatchDone: a batch's size and its join wait, first outcome to last.
	BatchDone(size int, joinWait time.Duration)
	// RunStarted and RunDone bracket a drive; ctx holds the drive's span.
	RunStarted()
	RunDone(ctx context.Context, status string, turns int, d time.Duration)
	// RunReplayed: a drive of a run that had already ended, answered with
	// its state and nothing run; counted apart from the drives that ran.
	RunReplayed(status string)
	// CallsInFlight changes by delta.
	CallsInFlight(delta int)
	// DriveAttached: a drive request joined the drive of its run in
	// progress.
	DriveAttached()
	// GuardTripped: the guard refused a turn (a bug; never in tests).
	GuardTripped()
	// CallRecovered: a reply kept by the durable ledger was submitted
	// instead of running the call again.
	CallRecovered()
	// BudgetExceeded: a call was refused by a budget (one of [Budgets]).
	BudgetExceeded(budget string)
	// CallDeduped: a call was answered from an earlier call of its run.
	CallDeduped(tool string)
	// Hedged: a straggling attempt was sent again; won says the copy
	// answered first.
	Hedged(tool string, won bool)
	// ApprovalWaiting changes by delta the calls that wait for approval.
	ApprovalWaiting(delta int)
	// ApprovalDecided: an approval ended (approved, denied, timed_out),
	// waited after it was requested.
	ApprovalDecided(outcome string, waited time.Duration)
}

type nopObserver struct{}

func (nopObserver) CallDone(context.Context, string, string, time.Duration) {}
func (nopObserver) BatchDone(int, time.Duration)                            {}
func (nopObserver) RunStarted()                                             {}
func (nopObserver) RunDone(context.Context, string, int, time.Duration)     {}
func (nopObserver) RunReplayed(string)                                      {}
func (nopObserver) CallsInFlight(int)                                       {}
func (nopObserver) DriveAttached()                                          {}
func (nopObserver) GuardTripped()                                           {}
func (nopObserver) CallRecovered()                                          {}
func (nopObserver) BudgetExceeded(string)                                   {}
func (nopObserver) CallDeduped(string)                                      {}
func (nopObserver) Hedged(string, bool)                                     {}
func (nopObserver) ApprovalWaiting(int)                                     {}
func (nopObserver) ApprovalDecided(string, time.Duration)                   {}
