package openaiup

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	sse "github.com/tmaxmax/go-sse"

	"github.com/projectdavid/toolsidecar/executor"
)

// answer writes the application's answer: a chat.completion, or a stream
// of chat.completion.chunk events that the official clients accumulate
// (one id, the role first, one finish chunk, usage when asked, one
// [DONE]). Its methods are called from the request's goroutine and from
// its keep-alive ticker.
type answer struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	r       *http.Request
	sess    *sse.Session // once started
	id      string
	model   string
	created int64
	usage   bool // stream_options.include_usage
	started bool // the stream's head is written
	role    bool // the role went out in a delta
	written int  // bytes of content streamed
}

type outChunk struct {
	ID      string      `json:"id"`
	Object  string      `json:"object"`
	Created int64       `json:"created"`
	Model   string      `json:"model"`
	Choices []outChoice `json:"choices"`
	Usage   *Usage      `json:"usage,omitempty"`
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
	Usage       Usage       `json:"usage"`
	Toolsidecar *extension  `json:"toolsidecar"`
}

// begin writes the stream's head, once.
func (a *answer) begin() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.head()
}

func (a *answer) head() {
	if a.started {
		return
	}
	a.started = true
	a.w.Header().Set("Cache-Control", "no-cache")
	a.w.Header().Set("X-Accel-Buffering", "no") // no buffering proxy between
	a.sess, _ = sse.Upgrade(a.w, a.r)           // net/http's writers can: no error
	_ = a.sess.Flush()
}

// event writes one SSE event of data, or a comment.
func (a *answer) event(data, comment string) {
	m := &sse.Message{}
	if comment != "" {
		m.AppendComment(comment)
	} else {
		m.AppendData(data)
	}
	if a.sess.Send(m) == nil {
		_ = a.sess.Flush()
	}
}

// content streams text the model said.
func (a *answer) content(text string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.head()
	a.written += len(text)
	a.send(outChunk{Choices: []outChoice{{Delta: a.delta(&outDelta{Content: &text})}}})
}

// delta puts the role on the stream's first delta.
func (a *answer) delta(d *outDelta) *outDelta {
	if !a.role {
		d.Role, a.role = "assistant", true
	}
	return d
}

func (a *answer) send(c outChunk) {
	c.ID, c.Object, c.Created, c.Model = a.id, "chat.completion.chunk", a.created, a.model
	data, _ := json.Marshal(c)
	a.event(string(data), "")
}

// keepAlive sends a comment on a stream that has begun, which clients
// ignore, so that no proxy between closes it while tools run.
func (a *answer) keepAlive() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.started {
		a.event("", "keep-alive")
	}
}

// finish ends the stream: the application's calls if the run ends on
// them, the finish chunk, the usage when asked, and [DONE].
func (a *answer) finish(res Result, sum executor.Summary) {
	a.mu.Lock()
	defer a.mu.Unlock()
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
		Toolsidecar: &extension{RunID: a.id, Turns: sum.Turns, Calls: sum.Calls}})
	if a.usage {
		u := res.Usage
		a.send(outChunk{Choices: []outChoice{}, Usage: &u})
	}
	a.event("[DONE]", "")
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
func (a *answer) whole(res Result, sum executor.Summary) {
	content := res.Content
	msg := &outMessage{Role: "assistant", Content: &content, ToolCalls: res.AppCalls}
	if content == "" && len(res.AppCalls) > 0 {
		msg.Content = nil
	}
	reason := finishReason(res)
	out := outCompletion{ID: a.id, Object: "chat.completion", Created: a.created, Model: a.model,
		Choices: []outChoice{{Message: msg, FinishReason: &reason}}, Usage: res.Usage,
		Toolsidecar: &extension{RunID: a.id, Turns: sum.Turns, Calls: sum.Calls}}
	body, err := json.Marshal(out)
	if err != nil {
		a.fail(sum, fmt.Errorf("encoding the answer: %w", err))
		return
	}
	body = append(body, '\n')
	// With its length the answer is whole to the client as soon as it
	// is sent, before the run's end is journaled (after the answer).
	a.w.Header().Set("Content-Type", "application/json")
	a.w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	a.w.WriteHeader(http.StatusOK)
	_, _ = a.w.Write(body)
}

// fail reports a run that did not end with the model's answer. Before the
// stream has begun it is an HTTP error: the upstream's refusal as the
// upstream sent it (a 400 stays a 400), a 502 for the upstream's other
// failures, a 422 for the turn limit (the same request would reach it
// again), a 503 for a sidecar that stopped (a retry resumes the run), and
// a 500 for the sidecar's own bug guard. Once the stream has begun it is
// an error event, which the official clients raise, and [DONE].
func (a *answer) fail(sum executor.Summary, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
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
	if !a.started {
		if re != nil && json.Valid(re.Body) && re.Status < 500 {
			a.w.Header().Set("Content-Type", "application/json")
			a.w.WriteHeader(re.Status)
			_, _ = a.w.Write(re.Body)
			return
		}
		writeAPIError(a.w, status, msg, typ, "")
		return
	}
	var e apiError
	e.Error.Message, e.Error.Type = msg, typ
	code := sum.Status
	e.Error.Code = &code
	data, _ := json.Marshal(e)
	a.event(string(data), "")
	a.event("[DONE]", "")
}
