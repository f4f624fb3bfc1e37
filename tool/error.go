package tool

import (
	"errors"
	"fmt"
)

// ErrorType is the error taxonomy shared by every worker language.
type ErrorType string

// The taxonomy. The model sees the type; the retry policy is driven by it.
const (
	InvalidArgs ErrorType = "invalid_args"
	NotFound    ErrorType = "not_found"
	Timeout     ErrorType = "timeout"
	WorkerCrash ErrorType = "worker_crash"
	RateLimited ErrorType = "rate_limited"
	Cancelled   ErrorType = "cancelled"
	ToolFailed  ErrorType = "tool_error"
	// Interrupted is produced by the sidecar, never by a worker: an unsafe
	// call whose effect is unknown after a fault, and which is therefore
	// not run again.
	Interrupted ErrorType = "interrupted"
	// Skipped is produced by the sidecar: a call of an ordered lane with
	// on_error skip_rest that did not run because an earlier call of its
	// lane failed.
	Skipped ErrorType = "skipped"
	// BudgetExceeded is produced by the sidecar: a call past one of the
	// run's or the tool's budgets, not dispatched.
	BudgetExceeded ErrorType = "budget_exceeded"
	// Denied is produced by the sidecar: a call of a tool that needs a
	// person's approval was denied, or its approval timed out; it was not
	// dispatched.
	Denied ErrorType = "denied"
)

// ErrLeft is the cause of a call's context when the sidecar stops before
// the call has finished: a transport then stops waiting without telling
// the worker (no cancellation is published), exactly as a crash would
// leave the call, so that the worker finishes it and a durable sidecar
// finds its reply on the next drive of the run.
var ErrLeft = errors.New("the sidecar stopped before the call finished; it is left for the next drive of its run")

// ErrNeverSent: a durable transport knows that no attempt of the call
// ever left the sidecar (it records each attempt before sending it), so
// that even an unsafe tool can run it now.
var ErrNeverSent = errors.New("the call was never sent to a worker")

// ErrIntentOfOldFormat comes with ErrNeverSent when the intent was
// recorded by a sidecar of an earlier release, which recorded the calls it
// sent to workers but not those it ran in its own process: for a tool run
// in process, "never sent" is then not known, and an unsafe call's effect
// is unknown (a rolling update from that release).
var ErrIntentOfOldFormat = errors.New("the intent was recorded by a sidecar that did not record calls run in its process")

// codes maps types to NATS micro's numeric codes (HTTP-like), and back.
var codes = map[ErrorType]int{
	InvalidArgs: 400, NotFound: 404, Timeout: 504, WorkerCrash: 500,
	RateLimited: 429, Cancelled: 499, ToolFailed: 422, Interrupted: 409,
	Skipped: 424, BudgetExceeded: 402, Denied: 403,
}

// Known reports whether t is one of the taxonomy's types.
func (t ErrorType) Known() bool {
	_, ok := codes[t]
	return ok
}

// Code is the numeric code of t; 0 for an unknown type.
func (t ErrorType) Code() int { return codes[t] }

// TypeOfCode maps a numeric error code that came without a type.
func TypeOfCode(code int) ErrorType {
	for t, c := range codes {
		if c == code {
			return t
		}
	}
	switch {
	case code == 408:
		return Timeout
	case code >= 500:
		return WorkerCrash
	}
	return ToolFailed
}

// Error is a failed call: a value carried in the outcome, never a panic.
type Error struct {
	Type    ErrorType
	Code    int
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s", e.Type, e.Message)
}

// Is matches another *Error of the same type (and code, when the target
// sets one), so errors.Is(err, &tool.Error{Type: tool.Timeout}) works.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Type == e.Type && (t.Code == 0 || t.Code == e.Code)
}

// Retryable reports whether another attempt may succeed. Whether it may be
// sent also depends on the tool's side effects; the caller decides that.
func (e *Error) Retryable() bool {
	switch e.Type {
	case Timeout, RateLimited, NotFound, WorkerCrash:
		return true
	}
	return false
}

// NewError builds an error of the given type, for a handler to return.
func NewError(t ErrorType, format string, args ...any) *Error {
	return &Error{Type: t, Code: codes[t], Message: fmt.Sprintf(format, args...)}
}

// AsError turns any error into an *Error; an untyped one is a tool_error.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		if e.Code == 0 {
			e.Code = codes[e.Type]
		}
		return e
	}
	return NewError(ToolFailed, "%s", err.Error())
}
