// Package bridge is the NATS wire between the sidecar and tool workers.
//
// The sidecar side ([Client]) publishes one call to <prefix>.<tool> with a
// reply subject of its own, waits for the outcome, lets progress messages
// extend the deadline, and publishes <prefix>.cancel.<action_id> when it
// gives up. The worker side ([Worker]) serves handlers in the queue group
// "toolsidecar", turns errors and panics into micro-style error replies, and
// cancels a handler's context on the cancel subject. An embedded
// nats-server ([StartEmbedded]) makes the default setup self-contained.
//
// The protocol is language-neutral; docs/worker-protocol.md describes it
// byte by byte.
package bridge

import (
	"errors"
	"fmt"
	"strconv"
)

// Header names of the worker protocol.
const (
	HeaderDeadline       = "Tool-Deadline"        // unix milliseconds
	HeaderAttempt        = "Tool-Attempt"         // 1-based
	HeaderIdempotencyKey = "Tool-Idempotency-Key" // the Action ID
	HeaderTraceparent    = "traceparent"          // W3C trace context
	HeaderProgress       = "Tool-Progress"        // "1" on progress messages
	HeaderErrorType      = "Tool-Error-Type"      // the taxonomy below
	HeaderServiceError   = "Nats-Service-Error"   // micro: description
	HeaderServiceCode    = "Nats-Service-Error-Code"
)

// QueueGroup is the queue group every worker joins.
const QueueGroup = "toolsidecar"

// ErrorType is the error taxonomy shared by every worker language.
type ErrorType string

// The taxonomy. The model sees the type; retry policy is driven by it.
const (
	InvalidArgs ErrorType = "invalid_args"
	NotFound    ErrorType = "not_found"
	Timeout     ErrorType = "timeout"
	WorkerCrash ErrorType = "worker_crash"
	RateLimited ErrorType = "rate_limited"
	Cancelled   ErrorType = "cancelled"
	ToolFailed  ErrorType = "tool_error"
)

// codes maps types to micro's numeric codes, and back.
var codes = map[ErrorType]int{
	InvalidArgs: 400, NotFound: 404, Timeout: 504, WorkerCrash: 500,
	RateLimited: 429, Cancelled: 499, ToolFailed: 422,
}

// typeOfCode maps a micro error code with no Tool-Error-Type header.
func typeOfCode(code int) ErrorType {
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

// Error is a failed call: a value, carried in the outcome, never a panic.
type Error struct {
	Type    ErrorType
	Code    int
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s", e.Type, e.Message)
}

// Is matches another *Error of the same type, so errors.Is(err,
// &bridge.Error{Type: bridge.Timeout}) works on wire errors.
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

// NewError builds an error of the given type for a worker handler to
// return.
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

func itoa(n int) string { return strconv.Itoa(n) }
