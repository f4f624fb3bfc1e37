package openaiup

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"

	sse "github.com/tmaxmax/go-sse"

	"github.com/projectdavid/toolsidecar/executor"
)

// answerBase is what every API's answer keeps: the response, its SSE
// session once the stream began, and what was written.
type answerBase struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	r       *http.Request
	api     api
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

func (a *answerBase) base() *answerBase { return a }

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

// chatAnswer writes a chat.completion, or a stream of
// chat.completion.chunk events that the official clients accumulate (one
// id, the role first, one finish chunk, usage when asked, one [DONE]).
type chatAnswer struct {
	*answerBase
	role bool // the role went out in a delta
}

type outChunk struct {
	ID      string      `json:"id"`
	Object  string      `json:"object"`
	Created int64       `json:"created"`
	Model   string      `json:"model"`
	Choices []outChoice `json:"choices"`
	Usage   *chatUsage  `json:"usage,omitempty"`
	// Toolsidecar tells the application what the sidecar did: the run's
	// id, its turns and each call's outcome. Clients ignore the field.
	Toolsidecar *extension `json:"toolsidecar,omitempty"`
}

type outChoice struct {
	Index        int              `json:"index"`
	Delta        *outDelta        `json:"delta,omitempty"`
	Message      *outMessage      `json:"message,omitempty"`
	FinishReason *string          `json:"finish_reason"`
	Logprobs     *json.RawMessage `json:"logprobs"`
}

type outDelta struct {
	Role      string          `json:"role,omitempty"`
	Content   *string         `json:"content,omitempty"`
	ToolCalls []toolCallChunk `json:"tool_calls,omitempty"`
}

type toolCallChunk struct {
	Index int `json:"index"`
	toolCall
}

type outMessage struct {
	Role      string     `json:"role"`
	Content   *string    `json:"content"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
	Refusal   *string    `json:"refusal"`
}

type extension struct {
	RunID string                `json:"run_id"`
	Turns int                   `json:"turns"`
	Calls []executor.CallResult `json:"calls"`
}

type outCompletion struct {
	ID          string      `json:"id"`
	Object      string      `json:"object"`
	Created     int64       `json:"created"`
	Model       string      `json:"model"`
	Choices     []outChoice `json:"choices"`
	Usage       *chatUsage  `json:"usage"`
	Toolsidecar *extension  `json:"toolsidecar"`
}

func (a *chatAnswer) begin() {
	a.mu.Lock()
	defer a.unlock()
	a.head()
}

func (a *chatAnswer) head() {
	if a.upgrade() {
		a.unflushed = true // the head alone, so that the client sees the 200 at once
	}
}

func (a *chatAnswer) content(text string) {
	a.mu.Lock()
	defer a.unlock()
	a.head()
	a.written += len(text)
	a.send(outChunk{Choices: []outChoice{{Delta: a.delta(&outDelta{Content: &text})}}})
}

// delta puts the role on the stream's first delta.
func (a *chatAnswer) delta(d *outDelta) *outDelta {
	if !a.role {
		d.Role, a.role = "assistant", true
	}
	return d
}

func (a *chatAnswer) send(c outChunk) {
	c.ID, c.Object, c.Created, c.Model = a.id, "chat.completion.chunk", a.created, a.model
	data, _ := json.Marshal(c)
	a.event("", string(data), "")
}

// finish ends the stream: the application's calls if the run ends on
// them, the finish chunk, the usage when asked, and [DONE].
func (a *chatAnswer) finish(res Result, sum executor.Summary) {
	a.mu.Lock()
	defer a.unlock()
	a.head()
	if len(res.AppCalls) > 0 {
		calls := make([]toolCallChunk, len(res.AppCalls))
		for i, c := range res.AppCalls {
			calls[i] = toolCallChunk{Index: i, toolCall: c}
		}
		a.send(outChunk{Choices: []outChoice{{Delta: a.delta(&outDelta{ToolCalls: calls})}}})
	}
	reason := finishReason(res)
	a.send(outChunk{Choices: []outChoice{{Delta: a.delta(&outDelta{}), FinishReason: &reason}},
		Toolsidecar: extensionOf(a.id, sum)})
	if a.usage {
		a.send(outChunk{Choices: []outChoice{}, Usage: chatUsageOf(res.Usage)})
	}
	a.event("", "[DONE]", "")
}

// extensionOf tells the application what the sidecar did.
func extensionOf(runID string, sum executor.Summary) *extension {
	return &extension{RunID: runID, Turns: sum.Turns, Calls: sum.Calls}
}

// finishReason is the answer's: tool_calls when the application has calls
// to run, else the last turn's, stop when it gave none the API knows.
func finishReason(res Result) string {
	if len(res.AppCalls) > 0 {
		return "tool_calls"
	}
	switch res.FinishReason {
	case "length", "content_filter":
		return res.FinishReason
	}
	return "stop"
}

// whole writes the answer as one chat.completion.
func (a *chatAnswer) whole(res Result, sum executor.Summary) {
	content := res.Content
	msg := &outMessage{Role: "assistant", Content: &content, ToolCalls: res.AppCalls}
	if content == "" && len(res.AppCalls) > 0 {
		msg.Content = nil
	}
	reason := finishReason(res)
	writeJSON(a.w, http.StatusOK, outCompletion{ID: a.id, Object: "chat.completion", Created: a.created, Model: a.model,
		Choices: []outChoice{{Message: msg, FinishReason: &reason}}, Usage: chatUsageOf(res.Usage), Toolsidecar: extensionOf(a.id, sum)})
}

// failEvent: an error event, which the official clients raise, and
// [DONE]. a.mu is held.
func (a *chatAnswer) failEvent(msg, typ, code string) {
	var e apiError
	e.Error.Message, e.Error.Type, e.Error.Code = msg, typ, &code
	data, _ := json.Marshal(e)
	a.event("", string(data), "")
	a.event("", "[DONE]", "")
}

// fail reports a run that did not end with the model's answer. Before the
// stream has begun it is an HTTP error: the upstream's refusal as the
// upstream sent it (a 400 stays a 400), a 502 for the upstream's other
// failures, a 422 for the turn limit (the same request would reach it
// again), a 503 for a sidecar that stopped (a retry resumes the run), and
// a 500 for the sidecar's own bug guard. Once the stream has begun it is
// the API's error event.
func fail(out answerWriter, sum executor.Summary, err error) {
	a := out.base()
	a.mu.Lock()
	defer a.unlock()
	status, typ := http.StatusInternalServerError, "toolsidecar_error"
	var re *RefusedError
	switch {
	case errors.As(err, &re):
		status, typ = re.Status, "upstream_error"
		if status >= 500 {
			status = http.StatusBadGateway
		}
	case sum.Status == executor.StatusMaxTurns:
		status, typ = http.StatusUnprocessableEntity, "max_turns_exceeded"
	case sum.Status == executor.StatusInterrupted:
		status, typ = http.StatusServiceUnavailable, "toolsidecar_interrupted"
		a.w.Header().Set("Retry-After", "1")
	case errors.Is(err, executor.ErrUpstream) || executor.UpstreamStatus(err) != 0 || sum.Status == executor.StatusFailed:
		status, typ = http.StatusBadGateway, "upstream_error"
	}
	msg := sum.Error
	if msg == "" && err != nil {
		msg = err.Error()
	}
	switch {
	case a.started:
		out.failEvent(msg, typ, sum.Status)
	case re != nil && json.Valid(re.Body) && re.Status < 500:
		a.w.Header().Set("Content-Type", "application/json")
		a.w.WriteHeader(re.Status)
		_, _ = a.w.Write(re.Body)
	default:
		a.api.writeError(a.w, status, msg, typ, "")
	}
}
