package modelapi

import (
	"encoding/json"
	"net/http"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/tool"
)

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
	Usage   *ChatUsage  `json:"usage,omitempty"`
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
	ToolCall
}

type outMessage struct {
	Role      string     `json:"role"`
	Content   *string    `json:"content"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
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
	Usage       *ChatUsage  `json:"usage"`
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
			calls[i] = toolCallChunk{Index: i, ToolCall: c}
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
	var e APIError
	e.Error.Message, e.Error.Type, e.Error.Code = msg, typ, &code
	data, _ := json.Marshal(e)
	a.event("", string(data), "")
	a.event("", "[DONE]", "")
}

// writeChatError writes an error body of Chat Completions.
func writeChatError(w http.ResponseWriter, status int, msg, typ, param string) {
	var e APIError
	e.Error.Message, e.Error.Type = tool.Truncate(msg, tool.MaxErrorMessage), typ
	if param != "" {
		e.Error.Param = &param
	}
	writeJSON(w, status, e)
}
