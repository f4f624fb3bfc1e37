// Package simbase is what the upstream simulators (openaisim, agentssim,
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
	"slices"
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

// ViolationCodes is the contract log's codes, in order.
func (l *Base[F]) ViolationCodes() []string {
	var codes []string
	for _, v := range l.Violations() {
		codes = append(codes, v.Code)
	}
	return codes
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

// Feed is a session's event stream for the hosted-loop simulators: events
// go to every open stream from the moment it opens (no replay). The zero
// Feed is ready; its simulator's lock guards it (passed to Serve, and
// held around Send and End).
type Feed struct {
	subs   map[*feedSub]struct{}
	opened int
}

// Opened counts the streams opened.
func (f *Feed) Opened() int { return f.opened }

type feedSub struct {
	queue [][]byte
	wake  chan struct{}
	done  bool
}

// Send queues an event (named typ, or unnamed with "") for every open
// stream.
func (f *Feed) Send(typ string, data []byte) {
	frame := fmt.Appendf(nil, "data: %s\n\n", data)
	if typ != "" {
		frame = fmt.Appendf(nil, "event: %s\ndata: %s\n\n", typ, data)
	}
	for s := range f.subs {
		s.queue = append(s.queue, frame)
		s.poke()
	}
}

// End ends every open stream after what it has queued.
func (f *Feed) End() {
	for s := range f.subs {
		s.done = true
		s.poke()
	}
}

func (s *feedSub) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// StreamOptions are how one stream is served.
type StreamOptions struct {
	// Cut, when 0 or more, cuts the connection after that many events.
	Cut int
	// Duplicate writes every event twice.
	Duplicate bool
	// Delay is the wait before each event.
	Delay time.Duration
	// Until, when set, ends the stream after the event it is true of.
	Until func(frame []byte) bool
}

// Serve writes the feed's events from now on to w until the client goes,
// the feed ends, or the cut; mu is the simulator's lock, which guards f.
func (f *Feed) Serve(w http.ResponseWriter, r *http.Request, mu *sync.Mutex, o StreamOptions) {
	mu.Lock()
	s := f.Open()
	mu.Unlock()
	f.Stream(w, r, mu, s, o, http.StatusOK)
}

// FeedSub is one stream's subscription to a feed.
type FeedSub = *feedSub

// Open subscribes a stream to the feed from now on (the simulator's lock
// held): a response that streams events it causes itself (a create with
// stream) opens before causing them.
func (f *Feed) Open() FeedSub {
	s := &feedSub{wake: make(chan struct{}, 1)}
	if f.subs == nil {
		f.subs = map[*feedSub]struct{}{}
	}
	f.subs[s] = struct{}{}
	f.opened++
	return s
}

// Stream writes the events of s to w, with status, until the client
// goes, the feed ends, the cut, or an event o.Until says is the last.
func (f *Feed) Stream(w http.ResponseWriter, r *http.Request, mu *sync.Mutex, s FeedSub, o StreamOptions, status int) {
	defer func() {
		mu.Lock()
		delete(f.subs, s)
		mu.Unlock()
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(status)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	n := 0
	for {
		mu.Lock()
		batch, done := s.queue, s.done
		s.queue = nil
		mu.Unlock()
		for _, frame := range batch {
			if o.Cut >= 0 && n >= o.Cut {
				panic(http.ErrAbortHandler)
			}
			if o.Delay > 0 {
				time.Sleep(o.Delay)
			}
			_, _ = w.Write(frame)
			if o.Duplicate {
				_, _ = w.Write(frame)
			}
			_ = rc.Flush()
			n++
			if o.Until != nil && o.Until(frame) {
				return
			}
		}
		if done {
			return
		}
		select {
		case <-s.wake:
		case <-r.Context().Done():
			return
		}
	}
}

// Answers is what a hosted-loop simulator keeps of a session's results:
// the answer each call got, how many times, the calls of cancelled turns,
// and how many results each post carried. The zero Answers is ready; its
// simulator's lock guards it.
type Answers struct {
	given   map[string]string
	count   map[string]int
	void    map[string]bool
	posts   []int
	blocked []time.Time // when each block was first announced
	posted  []time.Time // when each post was taken
}

// Check checks a result for call id (answer is its content, as compared)
// against the results taken: a second answer, the same one again, or one
// for a call of a cancelled turn is a violation; it returns the refusal's
// text, "" when the result may be taken.
func (a *Answers) Check(log interface {
	Violate(code, format string, args ...any) string
}, id, answer string) string {
	if prev, done := a.given[id]; done {
		if prev != answer {
			log.Violate("second_answer", "call %s answered again with another result", id)
		} else {
			log.Violate("duplicate_result", "call %s answered twice", id)
		}
		return "the tool call " + id + " already has a result"
	}
	if a.void[id] {
		log.Violate("late_result", "a result for call %s of a cancelled turn", id)
		return "the turn of " + id + " was cancelled"
	}
	return ""
}

// Take records a result taken.
func (a *Answers) Take(id, answer string) {
	if a.given == nil {
		a.given, a.count = map[string]string{}, map[string]int{}
	}
	a.given[id] = answer
	a.count[id]++
}

// Posted records a post that carried n results.
func (a *Answers) Posted(n int) {
	a.posts = append(a.posts, n)
	a.posted = append(a.posted, time.Now())
}

// Blocked records that a block was announced (not its re-announcements).
func (a *Answers) Blocked() { a.blocked = append(a.blocked, time.Now()) }

// Void marks calls of a cancelled turn.
func (a *Answers) Void(ids ...string) {
	if a.void == nil {
		a.void = map[string]bool{}
	}
	for _, id := range ids {
		a.void[id] = true
	}
}

// Session is what a test reads of a hosted session.
type Session struct {
	Status string
	// Answers counts the results taken per call.
	Answers map[string]int
	// Posts is the number of results of each post that carried some.
	Posts []int
	// Pending lists the calls waiting for a result, sorted.
	Pending []string
	// Final is the last turn's answer.
	Final string
	Turns int
	// BlockedAt is when each block was announced; PostedAt when each post
	// of results was taken.
	BlockedAt, PostedAt []time.Time
	// Streams counts the event streams opened on the session.
	Streams int
}

// View is the session as a test reads it.
func (a *Answers) View(status string, pending []string, final string, turns int) Session {
	out := Session{Status: status, Answers: map[string]int{}, Posts: append([]int(nil), a.posts...), Final: final, Turns: turns,
		Pending: slices.Sorted(slices.Values(pending)), BlockedAt: slices.Clone(a.blocked), PostedAt: slices.Clone(a.posted)}
	for k, v := range a.count {
		out.Answers[k] = v
	}
	return out
}

// Cuts are the stream opens to cut, each after its number of events. The
// zero Cuts is ready, and safe for concurrent use.
type Cuts struct {
	mu   sync.Mutex
	next []int
}

// Add makes the next stream opened end, cut, after n events.
func (c *Cuts) Add(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next = append(c.next, n)
}

// Take is the cut of a stream being opened: -1 for none.
func (c *Cuts) Take() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.next) == 0 {
		return -1
	}
	n := c.next[0]
	c.next = c.next[1:]
	return n
}

// ServeSession answers a session as a test reads it (GET
// /_sim/sessions/{id}), for a simulator in a process of its own.
func ServeSession(w http.ResponseWriter, s Session, ok bool) {
	if !ok {
		http.NotFound(w, nil)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s)
}
