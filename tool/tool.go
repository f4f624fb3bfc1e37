// Package tool is the transport-neutral vocabulary of a tool call: the
// [Call] a handler receives, the [Handler] that serves it, the [Request] for
// one attempt and the [Outcome] it produces, and the error taxonomy that
// every worker language shares. The NATS transport (packages bridge and
// worker), the in-process routes (package plugins) and the executor all
// speak in these terms; this package knows no transport.
package tool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"
)

// DefaultTimeout bounds one attempt of a tool that sets no timeout.
const DefaultTimeout = 30 * time.Second

// DefaultMaxDuration bounds one attempt whatever progress it reports.
const DefaultMaxDuration = 10 * time.Minute

// Header names of the worker protocol. Transports that carry headers (NATS,
// HTTP) use these names, so that a worker reads the same ones everywhere.
const (
	HeaderDeadline       = "Tool-Deadline"        // unix milliseconds
	HeaderAttempt        = "Tool-Attempt"         // 1-based
	HeaderIdempotencyKey = "Tool-Idempotency-Key" // the Action ID
	HeaderTraceparent    = "traceparent"          // W3C trace context
	HeaderProgress       = "Tool-Progress"        // "1" on progress messages
	HeaderErrorType      = "Tool-Error-Type"      // the taxonomy of [ErrorType]
	HeaderServiceError   = "Nats-Service-Error"   // micro's convention: description
	HeaderServiceCode    = "Nats-Service-Error-Code"
	// HeaderDescribe marks the sidecar's request for a tool's declaration,
	// sent on the tool's own subject with an empty body; the reply is the
	// declaration, and HeaderWorker names the worker that gives it.
	HeaderDescribe = "Tool-Describe"
	HeaderWorker   = "Tool-Worker"
)

// Request is one attempt of one call, as the executor hands it to a
// transport.
type Request struct {
	// Tool names the tool; a transport derives its address from it.
	Tool string
	// Body is the manifest exactly as Core sent it.
	Body []byte
	// ActionID is the idempotency key and names the call for cancellation.
	ActionID string
	// RunID is the run the call belongs to, for records.
	RunID   string
	Attempt int
	// Timeout bounds the wait for the outcome; each progress message
	// restarts it. Zero means [DefaultTimeout].
	Timeout time.Duration
	// MaxDuration bounds the attempt whatever progress it reports. Zero
	// means [DefaultMaxDuration].
	MaxDuration time.Duration
	// Traceparent is forwarded to the worker; a transport makes one when
	// it is empty.
	Traceparent string
	// Unsafe: the tool must not run twice. A durable transport records
	// the attempt before it sends it and waits until the record is
	// stored; for other tools it may overlap the two.
	Unsafe bool
	// OnProgress, when set, is called for each progress message the
	// worker sends. It must not block.
	OnProgress func()
	// OnSent, when set, is called once the attempt has left, on the
	// dispatching goroutine and before the wait for its outcome, so that
	// work about the call (telling Core it started) overlaps the tool's
	// run. Its time counts against the attempt's timeout, as the worker's
	// deadline was set at the send. A transport that runs the tool in
	// process calls it just before the tool, whose time starts after it.
	OnSent func()
}

// Sent calls r.OnSent when it is set.
func (r Request) Sent() {
	if r.OnSent != nil {
		r.OnSent()
	}
}

// TimeoutOrDefault is the request's timeout, or [DefaultTimeout].
func (r Request) TimeoutOrDefault() time.Duration {
	if r.Timeout <= 0 {
		return DefaultTimeout
	}
	return r.Timeout
}

// MaxDurationOrDefault is the request's hard bound, never below its
// timeout.
func (r Request) MaxDurationOrDefault() time.Duration {
	d := r.MaxDuration
	if d <= 0 {
		d = DefaultMaxDuration
	}
	return max(d, r.TimeoutOrDefault())
}

// Outcome is the result of one attempt: Data on success, Err otherwise.
type Outcome struct {
	Data []byte
	Err  *Error
	// Progress counts the progress messages seen.
	Progress int
	// Sent is false when the request never reached a worker (no
	// responders), so that even an unsafe tool may be tried again.
	Sent bool
}

// Call is what a handler receives: the manifest's fields, the raw manifest,
// and the protocol's metadata.
type Call struct {
	Tool       string          `json:"tool"`
	RunID      string          `json:"run_id"`
	ActionID   string          `json:"action_id"`
	ToolCallID string          `json:"tool_call_id"`
	Args       json.RawMessage `json:"args"`
	// Manifest is the request body as received.
	Manifest       []byte    `json:"-"`
	Attempt        int       `json:"-"`
	Deadline       time.Time `json:"-"`
	IdempotencyKey string    `json:"-"`
	Traceparent    string    `json:"-"`

	progress func() error
}

// Progress tells the caller that the call is alive, which restarts its
// deadline. Where the transport has no progress channel it does nothing.
func (c *Call) Progress() error {
	if c.progress == nil {
		return nil
	}
	return c.progress()
}

// SetProgress installs the transport's progress function; transports call
// it before they hand the call to a handler.
func (c *Call) SetProgress(f func() error) { c.progress = f }

// ParseCall reads a request body (the manifest) into a Call for the named
// tool. A body that is not a manifest is an invalid_args error.
func ParseCall(name string, body []byte) (*Call, error) {
	m, err := parseManifest(body)
	if err != nil {
		return nil, NewError(InvalidArgs, "request body is not a manifest: %v", err)
	}
	return &Call{Tool: name, RunID: m.runID, ActionID: m.actionID, ToolCallID: m.toolCallID, Args: m.args, Manifest: body}, nil
}

// Handler serves one tool. A returned error is sent as an error outcome: an
// *Error keeps its type, any other error is a tool_error. A panic is
// recovered by [Invoke] and becomes worker_crash.
type Handler func(ctx context.Context, call *Call) ([]byte, error)

// Invoke runs a handler at the tool-call boundary: a panic becomes a
// worker_crash error (logged with its stack), and an untyped error after
// ctx ended becomes timeout or cancelled. Every transport calls handlers
// through it.
func Invoke(ctx context.Context, h Handler, call *Call, log *slog.Logger) (data []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			if log != nil {
				log.Error("tool handler panicked", "tool", call.Tool, "action_id", call.ActionID, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			}
			data, err = nil, NewError(WorkerCrash, "worker panicked: %v", p)
		}
	}()
	data, err = h(ctx, call)
	if err != nil && ctx.Err() != nil && !errors.As(err, new(*Error)) {
		if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			return nil, NewError(Timeout, "deadline passed: %v", err)
		}
		return nil, NewError(Cancelled, "%v: %v", context.Cause(ctx), err)
	}
	return data, err
}

// OutcomeOf turns a handler's return values into an outcome that reached
// its worker.
func OutcomeOf(data []byte, err error) Outcome {
	if err != nil {
		return Outcome{Sent: true, Err: AsError(err)}
	}
	return Outcome{Sent: true, Data: data}
}

// FunctionTool is one entry of a tools array, as Project David Core's
// assistants and OpenAI's Chat Completions both take it:
// {"type": "function", "function": {name, description, parameters}}.
type FunctionTool struct {
	Type     string   `json:"type"`
	Function Function `json:"function"`
}

// Function is the function part of a [FunctionTool].
type Function struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// SourcedTool is a function tool and where it is defined, as GET
// /v1/tools?source=1 and `toolsidecar tools --source` list it.
type SourcedTool struct {
	FunctionTool
	// Source is config, worker, config+worker or builtin.
	Source string `json:"source"`
	// DeclaredBy names the workers that declare the tool in their code.
	DeclaredBy []string `json:"declared_by,omitempty"`
	// The policies in force, whichever source set them: what an operator
	// checks before the model may call a tool a worker declared.
	SideEffects string `json:"side_effects,omitempty"`
	Timeout     string `json:"timeout,omitempty"`
	Retries     int    `json:"retries"`
}
