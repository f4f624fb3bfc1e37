package modelapi

import (
	"encoding/json"
	"net/http"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/tool"
)

// messagesAnswer writes a Messages answer: a message, or its stream as
// the official clients accumulate it (§12.4): one message_start, content
// blocks with dense indexes across every turn the application does not
// see, each started, given its deltas and stopped, one message_delta with
// the stop reason and the usage summed over the turns, then
// message_stop. Every event is named: anthropic-sdk-go reads no other.
type messagesAnswer struct {
	*answerBase
	blocks int  // blocks begun
	open   bool // the text block is open
}

// messagesOut is the answer's message (§8).
type messagesOut struct {
	ID           string            `json:"id"`
	Type         string            `json:"type"`
	Role         string            `json:"role"`
	Model        string            `json:"model"`
	Content      []json.RawMessage `json:"content"`
	StopReason   *string           `json:"stop_reason"`
	StopSequence *string           `json:"stop_sequence"`
	Usage        messagesOutUsage  `json:"usage"`
	// Toolsidecar tells the application what the sidecar did; clients
	// ignore the field.
	Toolsidecar *extension `json:"toolsidecar,omitempty"`
}

// messagesOutUsage is the answer's usage, summed over the turns: the
// cache's counts beside input_tokens, as the API gives them (§8).
type messagesOutUsage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

func usageOut(u Usage) messagesOutUsage {
	return messagesOutUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens,
		CacheCreationInputTokens: u.CacheCreationTokens, CacheReadInputTokens: u.CacheReadTokens}
}

func (a *messagesAnswer) begin() {
	a.mu.Lock()
	defer a.unlock()
	a.head()
}

// head begins the stream with message_start: no content, no stop reason
// yet, and the usage that message_delta overwrites.
func (a *messagesAnswer) head() {
	if !a.upgrade() {
		return
	}
	a.send("message_start", messageStartEvent{messagesOut{ID: a.id, Type: "message", Role: "assistant", Model: a.model, Content: []json.RawMessage{}}})
}

// send sends an event: body's members after its type.
func (a *messagesAnswer) send(typ string, body any) {
	raw, _ := json.Marshal(body) // the events' structs: no error
	a.event(typ, eventJSON(typ, -1, raw), "")
}

// The answer's events (§12.1), each without its type, which send puts
// first.
type (
	messageStartEvent struct {
		Message messagesOut `json:"message"`
	}
	blockStartEvent struct {
		Index        int `json:"index"`
		ContentBlock any `json:"content_block"`
	}
	blockDeltaEvent struct {
		Index int `json:"index"`
		Delta any `json:"delta"`
	}
	textDelta struct {
		Type string `json:"type"` // text_delta
		Text string `json:"text"`
	}
	inputJSONDelta struct {
		Type        string `json:"type"` // input_json_delta
		PartialJSON string `json:"partial_json"`
	}
	blockStopEvent struct {
		Index int `json:"index"`
	}
	messageDeltaEvent struct {
		Delta struct {
			StopReason   string  `json:"stop_reason"`
			StopSequence *string `json:"stop_sequence"`
		} `json:"delta"`
		Usage       messagesOutUsage `json:"usage"`
		Toolsidecar *extension       `json:"toolsidecar,omitempty"`
	}
)

func (a *messagesAnswer) content(text string) {
	a.mu.Lock()
	defer a.unlock()
	a.head()
	a.written += len(text)
	if !a.open {
		a.open = true
		a.send("content_block_start", blockStartEvent{a.blocks, TextBlock{Type: "text", Text: ""}})
	}
	a.send("content_block_delta", blockDeltaEvent{a.blocks, textDelta{"text_delta", text}})
}

// closeText stops the text block, if one is open.
func (a *messagesAnswer) closeText() {
	if a.open {
		a.open = false
		a.send("content_block_stop", blockStopEvent{a.blocks})
		a.blocks++
	}
}

// finish ends the stream: the application's calls as tool_use blocks,
// their input in one fragment, then the stop reason and the usage.
func (a *messagesAnswer) finish(res Result, sum executor.Summary) {
	a.mu.Lock()
	defer a.unlock()
	a.head()
	a.closeText()
	for _, c := range res.AppCalls {
		a.send("content_block_start", blockStartEvent{a.blocks, ToolUseBlock{Type: "tool_use", ID: c.ID, Name: c.Function.Name, Input: json.RawMessage("{}")}})
		a.send("content_block_delta", blockDeltaEvent{a.blocks, inputJSONDelta{"input_json_delta", c.Function.Arguments}})
		a.send("content_block_stop", blockStopEvent{a.blocks})
		a.blocks++
	}
	end := messageDeltaEvent{Usage: usageOut(res.Usage), Toolsidecar: extensionOf(a.id, sum)}
	end.Delta.StopReason = stopReason(res)
	a.send("message_delta", end)
	a.send("message_stop", struct{}{})
}

// stopReason is the answer's (§8.2): tool_use when the application has
// calls to run, else the last turn's.
func stopReason(res Result) string {
	switch {
	case len(res.AppCalls) > 0:
		return "tool_use"
	case res.FinishReason == "" || res.FinishReason == "tool_use":
		return "end_turn"
	}
	return res.FinishReason
}

func (a *messagesAnswer) whole(res Result, sum executor.Summary) {
	out := messagesOut{ID: a.id, Type: "message", Role: "assistant", Model: a.model, Content: []json.RawMessage{},
		Usage: usageOut(res.Usage), Toolsidecar: extensionOf(a.id, sum)}
	if res.Content != "" {
		raw, _ := json.Marshal(TextBlock{Type: "text", Text: res.Content})
		out.Content = append(out.Content, raw)
	}
	for _, c := range res.AppCalls {
		raw, _ := json.Marshal(ToolUseBlock{Type: "tool_use", ID: c.ID, Name: c.Function.Name, Input: json.RawMessage(c.Function.Arguments)})
		out.Content = append(out.Content, raw)
	}
	reason := stopReason(res)
	out.StopReason = &reason
	writeJSON(a.w, http.StatusOK, out)
}

// failEvent: an error event, which the official clients raise (§12.2).
// a.mu is held.
func (a *messagesAnswer) failEvent(msg, typ, _ string) {
	data, _ := json.Marshal(newMessagesError(msg, typ))
	a.event("error", string(data), "")
}

// TextBlock is a Messages text block, as the sidecar writes it.
type TextBlock struct {
	Type      string            `json:"type"` // text
	Text      string            `json:"text"`
	Citations []json.RawMessage `json:"citations,omitempty"`
}

// ToolUseBlock is a Messages call, as the sidecar writes it.
type ToolUseBlock struct {
	Type  string          `json:"type"` // tool_use
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

// messagesError is the API's error body (§11.1).
type messagesError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func newMessagesError(msg, typ string) messagesError {
	e := messagesError{Type: "error"}
	e.Error.Type, e.Error.Message = typ, tool.Truncate(msg, tool.MaxErrorMessage)
	return e
}
