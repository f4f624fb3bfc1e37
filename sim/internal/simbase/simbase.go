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
	"strings"
	"sync"
	"time"
)

// Violation is a request the API would have refused, or a conversation
// that did not replay what the model said.
type Violation struct {
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

// Base is what a simulator embeds: its routes (with GET
// /_sim/violations), the faults queued for its requests, its contract
// log and its counts; F is its fault. The zero Base is ready, and safe for
// concurrent use once its routes are set.
type Base[F any] struct {
	mux        *http.ServeMux
	mu         sync.Mutex
	faults     []F
	violations []Violation
	requests   int
	answered   map[string]int // turns delivered whole, by conversation
}

// Route serves pattern with h; the first route also serves the contract
// log on GET /_sim/violations.
func (l *Base[F]) Route(pattern string, h http.HandlerFunc) {
	if l.mux == nil {
		l.mux = http.NewServeMux()
		l.mux.HandleFunc("GET /_sim/violations", l.ServeViolations)
	}
	l.mux.HandleFunc(pattern, h)
}

// ServeHTTP serves the routes.
func (l *Base[F]) ServeHTTP(w http.ResponseWriter, r *http.Request) { l.mux.ServeHTTP(w, r) }

// Inject queues faults, one per request to come.
func (l *Base[F]) Inject(f ...F) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.faults = append(l.faults, f...)
}

// Begin counts a request, and returns its number (from 1) and the fault
// queued for it, if any.
func (l *Base[F]) Begin() (seq int, fault *F) {
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
func (l *Base[F]) Requests() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.requests
}

// Violate records a violation and returns its detail.
func (l *Base[F]) Violate(code, format string, args ...any) string {
	v := Violation{Code: code, Detail: fmt.Sprintf(format, args...)}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.violations = append(l.violations, v)
	return v.Detail
}

// Violations returns the contract log.
func (l *Base[F]) Violations() []Violation {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Violation(nil), l.violations...)
}

// ServeViolations answers the contract log as JSON (GET /_sim/violations).
func (l *Base[F]) ServeViolations(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(l.Violations())
}

// Delivered counts a turn answered whole after the conversation named
// key: no fault can take it back.
func (l *Base[F]) Delivered(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.answered == nil {
		l.answered = map[string]int{}
	}
	l.answered[key]++
}

// Repeats counts the conversations whose turn was delivered whole more
// than once: turns asked again after they were delivered.
func (l *Base[F]) Repeats() int {
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

// Answer writes f's HTTP error, when it has one, and says whether it did:
// Retry-After, then Body as the whole body or the API's own error
// (apiError) for the status.
func (f *Fault) Answer(w http.ResponseWriter, apiError func(w http.ResponseWriter, status int)) bool {
	if f == nil || f.Status == 0 {
		return false
	}
	if f.RetryAfter != "" {
		w.Header().Set("Retry-After", f.RetryAfter)
	}
	if f.Body != "" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.Status)
		_, _ = w.Write([]byte(f.Body))
		return true
	}
	apiError(w, f.Status)
	return true
}

// Stream writes one response's server-sent events, interrupted as its
// Fault says. N counts the events written.
type Stream struct {
	W     http.ResponseWriter
	Ctx   context.Context
	Fault *Fault
	N     int
	Ended bool          // EndAfter ended the response: nothing more is written
	Delay time.Duration // the wait before each event, as a model's pace
}

// Next says whether the next event may be written: false once EndAfter
// has ended the response. It first cuts, errs (sendError writes the API's
// error event) or holds the stream, as the Fault says for that event.
func (s *Stream) Next(sendError func()) bool {
	if f := s.Fault; s.Ended || (f != nil && f.EndAfter > 0 && s.N >= f.EndAfter) {
		s.Ended = true
		return false
	}
	s.Fault.Interrupt(s.Ctx, s.N, s.Flush, sendError)
	if s.Delay > 0 {
		time.Sleep(s.Delay)
	}
	return true
}

// Send writes one event with its name (an event: line) and flushes.
func (s *Stream) Send(typ string, data any) {
	raw, _ := json.Marshal(data)
	_, _ = fmt.Fprintf(s.W, "event: %s\ndata: %s\n\n", typ, raw)
	s.Flush()
}

// Flush sends what was written.
func (s *Stream) Flush() { _ = http.NewResponseController(s.W).Flush() }

// Turns keeps what a model said after each conversation, for the check
// that a later request replays it unchanged. The zero Turns is ready, and
// safe for concurrent use.
type Turns struct {
	// Noun names a turn's parts in the check's messages ("items",
	// "blocks"); Canonical is a part as the check compares it.
	Noun      string
	Canonical func(json.RawMessage) string

	mu   sync.Mutex
	said map[string][][]json.RawMessage
}

// Said records a turn the model said after the conversation named conv.
func (t *Turns) Said(conv string, turn []json.RawMessage) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.said == nil {
		t.said = map[string][][]json.RawMessage{}
	}
	t.said[conv] = append(t.said[conv], turn)
}

// Replayed checks a turn replayed after the conversation named conv:
// known is false when the model said nothing after it here; why says how
// the turn differs from each of the turns said (the conversation may have
// been answered more than once), "" when it is one of them.
func (t *Turns) Replayed(conv string, turn []json.RawMessage) (known bool, why string) {
	t.mu.Lock()
	answers := t.said[conv]
	t.mu.Unlock()
	for _, want := range answers {
		if why = t.mismatch(want, turn); why == "" {
			return true, ""
		}
	}
	return len(answers) > 0, why
}

func (t *Turns) mismatch(want, got []json.RawMessage) string {
	if len(got) != len(want) {
		return fmt.Sprintf("the model said %d %s, replayed as %d", len(want), t.Noun, len(got))
	}
	for k := range want {
		if w, g := t.Canonical(want[k]), t.Canonical(got[k]); w != g {
			return fmt.Sprintf("%s %d was %s, replayed as %s", strings.TrimSuffix(t.Noun, "s"), k, w, g)
		}
	}
	return ""
}

// Refuse records a violation of a request being checked.
type Refuse func(code, format string, args ...any)

// Check runs a request's checks, recording each violation they find, and
// returns the first, which the API answers 400 ("" when none).
func (l *Base[F]) Check(checks func(refuse Refuse)) string {
	var first string
	checks(func(code, format string, args ...any) {
		if d := l.Violate(code, format, args...); first == "" {
			first = d
		}
	})
	return first
}

// Script is what the simulators' scripted model follows, sent as a user
// message's text: {"rounds": [[{"name": ..., "arguments": {...}}, ...],
// ...], "answer": "..."} makes one turn of calls per round ("arguments"
// as JSON, or "raw_arguments" as a string sent as it is); after the last
// round the model answers with the text "answer", then "results: " and
// the last round's results joined by " | ".
type Script struct {
	Rounds [][]struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
		Raw       *string         `json:"raw_arguments"`
	} `json:"rounds"`
	Answer string `json:"answer"`
}

// ResultsMark, in a script's answer, stands for the last round's results.
const ResultsMark = "{{results}}"

// ParseScript reads a script from a message's text; ok is false for any
// other text.
func ParseScript(text string) (s Script, ok bool) {
	return s, json.Unmarshal([]byte(text), &s) == nil && len(s.Rounds) > 0
}

// Reply is the model's turn after it made round turns of calls, the last
// one's results being results. A call without arguments has Args "". An
// answer that holds "{{results}}" has the results there instead of at
// its end.
func (s Script) Reply(round int, results []string) Reply {
	if round >= len(s.Rounds) {
		joined := strings.Join(results, " | ")
		if strings.Contains(s.Answer, ResultsMark) {
			return Reply{Content: strings.ReplaceAll(s.Answer, ResultsMark, joined)}
		}
		return Reply{Content: s.Answer + "results: " + joined}
	}
	var r Reply
	for _, c := range s.Rounds[round] {
		args := string(c.Arguments)
		if c.Raw != nil {
			args = *c.Raw
		}
		r.Calls = append(r.Calls, Call{Name: c.Name, Args: args})
	}
	return r
}
