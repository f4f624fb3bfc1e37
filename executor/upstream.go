package executor

import (
	"context"
	"encoding/json"
	"errors"
	"iter"

	"github.com/projectdavid/toolsidecar/tool"
)

// ResultSummary is what the upstream keeps of a call's result beside its
// final status (Core: the Action's result): never the tool's output.
type ResultSummary struct {
	OK         bool   `json:"ok"`
	Attempts   int    `json:"attempts"`
	DurationMS int64  `json:"duration_ms"`
	Bytes      int    `json:"bytes"` // of the recorded output
	ErrorType  string `json:"error_type,omitempty"`
	Error      string `json:"error,omitempty"`
}

// Upstream is the side of the loop where the model is, in the executor's
// own terms: runs, turns streamed as events, and the records of each call
// (started, its output, its final status). Package coreup adapts Project
// David Core to it; another upstream (an OpenAI-compatible server) is
// another adapter. Each method waits for its answer.
type Upstream interface {
	// Kind names the upstream: "core", "openai", "responses", "anthropic".
	Kind() string
	// Run reads a run, with the caller's identity when ctx carries one
	// (AsCaller): a run the caller may not read is an error.
	Run(ctx context.Context, runID string) (Run, error)
	// RecentRuns reads the newest runs of ctx's caller, at most limit,
	// newest first: one read that tells the cancel watch about many runs.
	// An upstream without such a listing returns ErrNoListing.
	RecentRuns(ctx context.Context, limit int) ([]Run, error)
	// Turn asks the model for the run's next turn.
	Turn(ctx context.Context, req Request) (Turn, error)
	// MarkStarted records that a call was sent to its tool (Core: the
	// Action to processing). withdraw, when closed while the record still
	// waits to leave for the upstream (which is far behind), takes it
	// back: it is never sent, and MarkStarted returns an error wrapping
	// ErrWithdrawn. nil: the record is never withdrawn.
	MarkStarted(ctx context.Context, c *ToolCall, withdraw <-chan struct{}) error
	// RecordOutput records a call's output, exactly once whatever fails:
	// a write whose effect is uncertain is read back before it is tried
	// again. It retries until ctx ends, then wraps ErrSubmitBudget.
	RecordOutput(ctx context.Context, req Request, c *ToolCall, content string) error
	// Finalise records a call's final status (CallCompleted, CallFailed
	// or CallCancelled) with a summary of its result, retrying as
	// RecordOutput does.
	Finalise(ctx context.Context, c *ToolCall, status string, result ResultSummary) error
	// OpenCalls lists the run's calls that have no final status, in the
	// order the model made them, saying which were started and which have
	// their output recorded already.
	OpenCalls(ctx context.Context, req Request) ([]OpenCall, error)
	// LastAnswer is the final text of a run that has ended, if any.
	LastAnswer(ctx context.Context, req Request) (string, error)
	// AsCaller makes every request under ctx carry the caller's
	// credential instead of the sidecar's own; Caller names the caller
	// under ctx (a secret: group by it, never log it), "" for none.
	AsCaller(ctx context.Context, credential string) context.Context
	Caller(ctx context.Context) string
}

// Errors an Upstream reports.
var (
	// ErrSubmitBudget: a record's retries ran out of time; the record may
	// be tried again later (the outcome is kept for the next drive).
	ErrSubmitBudget = errors.New("executor: submit budget spent")
	// ErrLeftForNextDrive: the sidecar stopped while a call of the batch
	// waited for a person's approval, which a durable store keeps, or
	// before the call finished (Abandon); that call and the ones after it
	// are left for the next drive of the run, in call order.
	ErrLeftForNextDrive = errors.New("executor: left for the next drive")
	// ErrNoListing: the upstream has no listing of recent runs.
	ErrNoListing = errors.New("executor: the upstream lists no runs")
	// ErrWithdrawn: a record withdrawn before it was sent.
	ErrWithdrawn = errors.New("executor: withdrawn before it was sent")
	// ErrBadFrame: one event of a turn's stream could not be read; the
	// stream goes on.
	ErrBadFrame = errors.New("executor: an event of the turn could not be read")
)

// UpstreamError is the upstream's refusal of a request, with its HTTP
// status: the drive API answers 401, 403 and 404 as the upstream did.
type UpstreamError struct {
	Status int
	Err    error
}

func (e *UpstreamError) Error() string { return e.Err.Error() }
func (e *UpstreamError) Unwrap() error { return e.Err }

// UpstreamStatus is the HTTP status of the upstream's refusal under err,
// or 0.
func UpstreamStatus(err error) int {
	var ue *UpstreamError
	if errors.As(err, &ue) {
		return ue.Status
	}
	return 0
}

// LostCallError is a tool call of a turn whose identifiers could not be
// read: it cannot be answered, and the run fails quoting it.
type LostCallError struct{ Err error }

func (e *LostCallError) Error() string { return e.Err.Error() }
func (e *LostCallError) Unwrap() error { return e.Err }

// Run is a run as the upstream reports it.
type Run struct {
	ID string
	// Status is RunActive, RunStopping, RunCompleted, RunFailed or
	// RunCancelled; UpstreamStatus is the upstream's own word for it.
	Status, UpstreamStatus string
	ThreadID               string
	AssistantID            string
	// NeverStarted: no turn of the run ever began, so it has no call to
	// finish.
	NeverStarted bool
	// Owner is the caller that began the run (Request.Caller), where the
	// upstream does not check ownership itself (Core does, with the
	// caller's key): only that caller may drive it.
	Owner string
}

// Run statuses.
const (
	RunActive = "active"
	// RunStopping: being cancelled; no further turn may be asked for.
	RunStopping  = "stopping"
	RunCompleted = "completed"
	RunFailed    = "failed"
	// RunCancelled: cancelled or expired.
	RunCancelled = "cancelled"
)

// Ended reports a run in a final status.
func (r Run) Ended() bool {
	return r.Status == RunCompleted || r.Status == RunFailed || r.Status == RunCancelled
}

// Stopped reports a run cancelled, being cancelled or expired.
func (r Run) Stopped() bool { return r.Status == RunStopping || r.Status == RunCancelled }

// Turn is one turn's stream of events. Events yields each event as it
// comes; an error wrapping ErrBadFrame or a *LostCallError is yielded and
// the stream goes on; any other error ends it before its clean end (the
// stream dropped). Close releases it.
type Turn interface {
	Events() iter.Seq2[TurnEvent, error]
	Close()
}

// TurnEventKind says what a turn's event carries.
type TurnEventKind int

// The kinds of a turn's events.
const (
	TurnText      TurnEventKind = iota + 1 // text the model says
	TurnReasoning                          // the model's reasoning
	TurnToolCall                           // a tool call, complete
	TurnError                              // an error the upstream reports in the stream
	TurnOther                              // anything else, passed on as it came
)

// TurnEvent is one event of a turn. Raw is the event as the upstream sent
// it, for an application that follows the stream in the upstream's own
// framing.
type TurnEvent struct {
	Kind TurnEventKind
	Text string
	Raw  []byte
	Call *ToolCall // with TurnToolCall
}

// ToolCall is one call of a turn, as the upstream made it.
type ToolCall struct {
	RunID string
	// ActionID names the call for the executor: the idempotency key, the
	// ledger's key and the cancel subject's. An upstream with records of
	// its own (Core's Actions) gives their id; one without (OpenAI's)
	// gets an id the adapter makes.
	ActionID   string
	ToolCallID string
	Tool       string
	Args       json.RawMessage
	// Raw is the call as its upstream framed it for workers (Core's
	// tool_call_manifest, its extra fields kept). Nil when the upstream has
	// no such frame: the executor then encodes the worker protocol's
	// manifest from the fields above (body).
	Raw []byte
	// Problem says why the call could not be read whole, if it could not:
	// it gets an invalid_args outcome.
	Problem string
}

// OpenCall is a call of a run without a final status.
type OpenCall struct {
	Call *ToolCall
	// Started: it was marked started, so it may have run.
	Started bool
	// Recorded: its output is recorded already; only its final status is
	// missing.
	Recorded bool
}

// Final statuses of a call.
const (
	CallCompleted = "completed"
	CallFailed    = "failed"
	CallCancelled = "cancelled"
)

// body is the request body the call's worker receives: the upstream's own
// frame, or the worker protocol's manifest made from the call. This is the
// one place that makes it, so every upstream's workers read one shape.
func (m *ToolCall) body() []byte {
	if m.Raw != nil {
		return m.Raw
	}
	return tool.EncodeManifest(m.RunID, m.ActionID, m.ToolCallID, m.Tool, m.Args)
}

// CallerInContext gives an upstream adapter AsCaller and Caller for a
// caller's credential that travels in the context, as the model APIs'
// and the hosted agents' adapters carry it: embed it.
type CallerInContext struct{}

type callerCredential struct{}

// AsCaller makes the requests under ctx carry the caller's credential.
func (CallerInContext) AsCaller(ctx context.Context, credential string) context.Context {
	return context.WithValue(ctx, callerCredential{}, credential)
}

// Caller is the caller's credential under ctx, or "".
func (CallerInContext) Caller(ctx context.Context) string {
	k, _ := ctx.Value(callerCredential{}).(string)
	return k
}
