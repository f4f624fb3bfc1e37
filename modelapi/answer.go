package modelapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"

	sse "github.com/tmaxmax/go-sse"

	"github.com/projectdavid/toolsidecar/executor"
)

// API is one of the model APIs whose answers the sidecar writes.
type API int

// The APIs.
const (
	// Chat is OpenAI's Chat Completions, and the servers compatible with
	// it.
	Chat API = iota
	// Messages is Anthropic's Messages API.
	Messages
	// Responses is OpenAI's Responses API.
	Responses
)

// Head is what an answer carries from its beginning: the run's id, which
// the answer gives as its own, the model asked for, when the run began
// (unix seconds), and whether a Chat Completions stream ends with the
// usage (stream_options.include_usage).
type Head struct {
	ID           string
	Model        string
	Created      int64
	IncludeUsage bool
}

// NewAnswer begins the answer to r, in a's shape. Nothing is written
// until [Answer.Begin], [Answer.Content] or the end.
func (a API) NewAnswer(w http.ResponseWriter, r *http.Request, h Head) *Answer {
	b := &answerBase{w: w, r: r, api: a, id: h.ID, model: h.Model, created: h.Created, usage: h.IncludeUsage}
	var enc encoder
	switch a {
	case Messages:
		enc = &messagesAnswer{answerBase: b}
	case Responses:
		enc = &responsesAnswer{answerBase: b}
	default:
		enc = &chatAnswer{answerBase: b}
	}
	return &Answer{base: b, enc: enc}
}

// WriteError writes an error body in a's shape: the message (truncated
// to tool.MaxErrorMessage), the error's type and, where the API has one,
// the parameter at fault.
func (a API) WriteError(w http.ResponseWriter, status int, msg, typ, param string) {
	switch a {
	case Messages:
		writeJSON(w, status, newMessagesError(msg, typ))
	default: // Chat Completions; Responses shares its error body
		writeChatError(w, status, msg, typ, param)
	}
}

// Result is how a run ended, for the application's answer.
type Result struct {
	// Content is what the model said, every turn's text in order.
	Content string
	// FinishReason is the last turn's (stop, length, content_filter), or
	// tool_calls when AppCalls is set.
	FinishReason string
	// AppCalls are the last turn's calls of tools the application
	// declared: it runs them and asks again (see Parked).
	AppCalls []ToolCall
	// Parked is the last turn as the model made it, when it holds
	// AppCalls: its assistant message with every call, and the tool
	// messages of the sidecar's calls. The application's next request
	// gets it back (Restore).
	Parked  []json.RawMessage
	Usage   Usage
	Model   string
	Created int64
}

// Answer writes the application's answer: whole, or as a stream its
// official client accumulates. Its methods are called from the request's
// goroutine and from its keep-alive ticker.
//
// A streamed answer is, in order: [Answer.Begin] or [Answer.Content]
// (the head, once, with the first), text as the model says it,
// [Answer.KeepAlive] while tools run, then [Answer.Finish] or
// [Answer.Fail]. A whole answer is [Answer.Whole] or [Answer.Fail].
type Answer struct {
	base *answerBase
	enc  encoder
}

// encoder is what differs between the APIs' answers. Each method takes
// the answer's lock itself, but failEvent, which is called with it held.
type encoder interface {
	begin()
	content(text string)
	finish(res Result, sum executor.Summary)
	whole(res Result, sum executor.Summary)
	failEvent(msg, typ, code string)
}

// Begin writes the stream's head, once: the upstream took the turn.
func (a *Answer) Begin() { a.enc.begin() }

// Content streams text the model said.
func (a *Answer) Content(text string) { a.enc.content(text) }

// Finish ends the stream with how the run ended, and sum, which the
// answer's toolsidecar member reports.
func (a *Answer) Finish(res Result, sum executor.Summary) { a.enc.finish(res, sum) }

// Whole writes the answer in one body.
func (a *Answer) Whole(res Result, sum executor.Summary) { a.enc.whole(res, sum) }

// KeepAlive sends a comment on a stream that has begun, which clients
// ignore, so that no proxy between closes it while tools run.
func (a *Answer) KeepAlive() { a.base.keepAlive() }

// Written is how many bytes of content the answer has streamed. It is
// read from the goroutine that calls [Answer.Content].
func (a *Answer) Written() int { return a.base.written }

// SetModel names the model the answer reports from here, once the run
// knows which answered. It is called when no other method runs.
func (a *Answer) SetModel(model string) { a.base.model = model }

// Failure is a run that did not end with the model's answer, as its
// answer reports it.
type Failure struct {
	// Status is the HTTP status of an answer whose stream has not begun.
	Status int
	// Message and Type are the error's, Code the stream's error event's
	// code (the run's status).
	Message, Type, Code string
	// Refusal, when set, is the upstream's refusal as it came, already
	// in the API's shape: an answer whose stream has not begun is that
	// body, with Status.
	Refusal []byte
}

// Fail reports f: before the stream has begun, as an HTTP error (f's
// refusal, or an error body in the API's shape); once it has begun, as
// the API's error event.
func (a *Answer) Fail(f Failure) {
	b := a.base
	b.mu.Lock()
	defer b.unlock()
	switch {
	case b.started:
		a.enc.failEvent(f.Message, f.Type, f.Code)
	case f.Refusal != nil:
		b.w.Header().Set("Content-Type", "application/json")
		b.w.WriteHeader(f.Status)
		_, _ = b.w.Write(f.Refusal)
	default:
		b.api.WriteError(b.w, f.Status, f.Message, f.Type, "")
	}
}

// answerBase is what every API's answer keeps: the response, its SSE
// session once the stream began, and what was written.
type answerBase struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	r       *http.Request
	api     API
	sess    *sse.Session // once started
	id      string
	model   string
	created int64
	usage   bool // stream_options.include_usage
	started bool // the stream's head is written
	// unflushed: written since the last flush (at the end of the call
	// that holds mu)
	unflushed bool
	written   int // bytes of content streamed
}

// upgrade begins the stream, reporting whether this call did. a.mu is
// held.
func (a *answerBase) upgrade() bool {
	if a.started {
		return false
	}
	a.started = true
	a.w.Header().Set("Cache-Control", "no-cache")
	a.w.Header().Set("X-Accel-Buffering", "no") // no buffering proxy between
	a.sess, _ = sse.Upgrade(a.w, a.r)           // net/http's writers can: no error
	return true
}

// event writes one SSE event of data, named when name is set (Messages
// names each event; Chat Completions none), or a comment; a.unlock
// flushes it. a.mu is held.
func (a *answerBase) event(name, data, comment string) {
	m := &sse.Message{}
	if comment != "" {
		m.AppendComment(comment)
	} else {
		if name != "" {
			m.Type = sse.Type(name)
		}
		m.AppendData(data)
	}
	if a.sess.Send(m) == nil {
		a.unflushed = true
	}
}

// unlock sends what the call wrote in one flush and releases a.mu: the
// events of one moment (the stream's head, an item's opening with its
// first delta, the end) reach the application together, not one write
// and one wake-up each.
func (a *answerBase) unlock() {
	if a.unflushed {
		a.unflushed = false
		_ = a.sess.Flush()
	}
	a.mu.Unlock()
}

// keepAlive sends a comment on a stream that has begun, which clients
// ignore, so that no proxy between closes it while tools run.
func (a *answerBase) keepAlive() {
	a.mu.Lock()
	defer a.unlock()
	if a.started {
		a.event("", "", "keep-alive")
	}
}

// eventJSON is an event's JSON: its type (and, when seq is not negative,
// its sequence_number) first, then the members of body, a struct encoded
// as an object. Each event is a struct of its own, so that no event pays
// for a map's boxing and sorted keys: the Responses and Messages streams
// send several per turn. typ is one of the APIs' event names, plain
// ASCII, which strconv quotes as JSON does.
func eventJSON(typ string, seq int, body []byte) string {
	b := make([]byte, 0, len(body)+len(typ)+40)
	b = strconv.AppendQuote(append(b, `{"type":`...), typ)
	if seq >= 0 {
		b = strconv.AppendInt(append(b, `,"sequence_number":`...), int64(seq), 10)
	}
	if len(body) > 2 { // not {}
		b = append(append(b, ','), body[1:]...)
	} else {
		b = append(b, '}')
	}
	return string(b)
}

// writeJSON writes a whole JSON body, with its length: the answer is
// whole to the client as soon as it is sent, before the run's end is
// journaled (after the answer).
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding the answer failed","type":"toolsidecar_error"}}`)
	}
	body = append(body, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
