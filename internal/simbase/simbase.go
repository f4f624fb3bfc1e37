// Package simbase is what the upstream simulators (openaisim,
// anthropicsim) share: the faults queued for the requests to come, the
// contract log, and the counts of requests and of turns delivered whole.
// It knows nothing of the sidecar, so that the simulators still share no
// code with the adapters they check.
package simbase

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
)

// Violation is a request the API would have refused, or a conversation
// that did not replay what the model said.
type Violation struct {
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

// Log is a simulator's record of its requests; F is its fault. The zero
// Log is ready, and safe for concurrent use.
type Log[F any] struct {
	mu         sync.Mutex
	faults     []F
	violations []Violation
	requests   int
	answered   map[string]int // turns delivered whole, by conversation
}

// Inject queues faults, one per request to come.
func (l *Log[F]) Inject(f ...F) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.faults = append(l.faults, f...)
}

// Begin counts a request, and returns its number (from 1) and the fault
// queued for it, if any.
func (l *Log[F]) Begin() (seq int, fault *F) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requests++
	if len(l.faults) > 0 {
		fault = &l.faults[0]
		l.faults = l.faults[1:]
	}
	return l.requests, fault
}

// Requests counts the requests received.
func (l *Log[F]) Requests() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.requests
}

// Violate records a violation and returns its detail.
func (l *Log[F]) Violate(code, format string, args ...any) string {
	v := Violation{Code: code, Detail: fmt.Sprintf(format, args...)}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.violations = append(l.violations, v)
	return v.Detail
}

// Violations returns the contract log.
func (l *Log[F]) Violations() []Violation {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Violation(nil), l.violations...)
}

// ServeViolations answers the contract log as JSON (GET /_sim/violations).
func (l *Log[F]) ServeViolations(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(l.Violations())
}

// Delivered counts a turn answered whole after the conversation named
// key: no fault can take it back.
func (l *Log[F]) Delivered(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.answered == nil {
		l.answered = map[string]int{}
	}
	l.answered[key]++
}

// Repeats counts the conversations whose turn was delivered whole more
// than once: turns asked again after they were delivered.
func (l *Log[F]) Repeats() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.answered {
		if c > 1 {
			n++
		}
	}
	return n
}

// Fault is what the next request to a simulator gets instead of its
// answer. A field one API has no use for is ignored by its simulator.
type Fault struct {
	// Status, when set, is answered with the API's error (Body, when set,
	// as the whole body; Type names the error type where the API has one)
	// and RetryAfter.
	Status     int
	RetryAfter string
	Body       string
	Type       string
	// CutAfter, when set, cuts the connection after that many events.
	CutAfter int
	// EndAfter, when set, ends the response cleanly after that many
	// events, without the stream's terminal event (anthropicsim).
	EndAfter int
	// ErrorAfter, when set, sends the API's error event (with
	// ErrorMessage, and ErrorType where the API has one) after that many
	// events, then ends the stream.
	ErrorAfter   int
	ErrorMessage string
	ErrorType    string
	// HoldAfter, when set, stops the stream after that many events, calls
	// Hit, and holds the connection open until the client goes away.
	HoldAfter int
	Hit       func() `json:"-"`
}

// Interrupt is called before a stream's event n (counting from 0) is
// written. It cuts the connection, or sends the error event (sendError)
// and ends the stream, or holds it, as f says for that event; otherwise
// it returns and the event is written. A nil f returns at once.
func (f *Fault) Interrupt(ctx context.Context, n int, flush, sendError func()) {
	switch {
	case f == nil:
	case f.CutAfter > 0 && n >= f.CutAfter:
		panic(http.ErrAbortHandler) // the connection is cut: no terminal event
	case f.ErrorAfter > 0 && n >= f.ErrorAfter:
		sendError()
		flush()
		panic(http.ErrAbortHandler) // the stream ends at its error event
	case f.HoldAfter > 0 && n >= f.HoldAfter:
		flush()
		if f.Hit != nil {
			f.Hit()
		}
		<-ctx.Done()
		panic(http.ErrAbortHandler)
	}
}

// Reply is what a simulator's model says in a turn: text, and calls.
type Reply struct {
	Content string
	Calls   []Call
}

// Call is a tool call the model makes. Args is sent as written (it need
// not be JSON); "" is a call without arguments.
type Call struct {
	Name, Args string
}
