package modelapi

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/projectdavid/toolsidecar/executor"
)

// responsesAnswer writes a Responses answer: a response, or its stream as
// the official clients accumulate it (§5.2): response.created and
// response.in_progress, then items with dense, append-only output
// indexes across every turn the application does not see (one message
// with the text of every turn; the application's own function calls),
// each added, given its parts and deltas, and done, every event with a
// sequence_number rising from 0, then one terminal event whose response
// holds every item and the usage summed over the turns.
type responsesAnswer struct {
	*answerBase
	seq   int               // the next event's sequence_number
	items []json.RawMessage // the items done
	open  bool              // the message item is open
	text  strings.Builder   // its text
}

// responseOut is the answer's response object (§2).
type responseOut struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	CreatedAt         int64              `json:"created_at"`
	Status            string             `json:"status"`
	Model             string             `json:"model"`
	Output            []json.RawMessage  `json:"output"`
	Error             any                `json:"error"`
	IncompleteDetails any                `json:"incomplete_details"`
	ParallelToolCalls bool               `json:"parallel_tool_calls"`
	ToolChoice        string             `json:"tool_choice"`
	Tools             []any              `json:"tools"`
	Usage             *responsesUsageOut `json:"usage"`
	// Toolsidecar tells the application what the sidecar did; clients
	// ignore the field.
	Toolsidecar *extension `json:"toolsidecar,omitempty"`
}

type responsesUsageOut struct {
	InputTokens         int64            `json:"input_tokens"`
	InputTokensDetails  map[string]int64 `json:"input_tokens_details"`
	OutputTokens        int64            `json:"output_tokens"`
	OutputTokensDetails map[string]int64 `json:"output_tokens_details"`
	TotalTokens         int64            `json:"total_tokens"`
}

// outputText is a message's text part.
type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

// messageItem is the answer's message.
type messageItem struct {
	Type    string       `json:"type"`
	ID      string       `json:"id"`
	Status  string       `json:"status"`
	Role    string       `json:"role"`
	Content []outputText `json:"content"`
}

// functionCallItem is an application's call.
type functionCallItem struct {
	Type      string `json:"type"`
	ID        string `json:"id"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Status    string `json:"status"`
}

// response is the answer's response, as it stands: in progress (no
// usage yet), or ended as res says.
func (a *responsesAnswer) response(res *Result, sum executor.Summary) responseOut {
	out := responseOut{ID: a.id, Object: "response", CreatedAt: a.created, Status: "in_progress", Model: a.model,
		Output: a.items, ParallelToolCalls: true, ToolChoice: "auto", Tools: []any{}}
	if out.Output == nil {
		out.Output = []json.RawMessage{}
	}
	if res == nil {
		return out
	}
	out.Status = "completed"
	if reason := res.FinishReason; len(res.AppCalls) == 0 && reason != "" && reason != "completed" && reason != "tool_calls" {
		out.Status, out.IncompleteDetails = "incomplete", map[string]string{"reason": reason}
	}
	out.Usage = &responsesUsageOut{InputTokens: res.Usage.PromptTokens, InputTokensDetails: map[string]int64{"cached_tokens": res.Usage.CacheReadTokens},
		OutputTokens: res.Usage.CompletionTokens, OutputTokensDetails: map[string]int64{"reasoning_tokens": res.Usage.ReasoningTokens}, TotalTokens: res.Usage.TotalTokens}
	out.Toolsidecar = extensionOf(a.id, sum)
	return out
}

func (a *responsesAnswer) begin() {
	a.mu.Lock()
	defer a.unlock()
	a.head()
}

func (a *responsesAnswer) head() {
	if !a.upgrade() {
		return
	}
	// One body for both events: encoded once.
	body, _ := json.Marshal(lifecycleEvent{a.response(nil, executor.Summary{})})
	a.sendRaw("response.created", body)
	a.sendRaw("response.in_progress", body)
}

// send sends an event: body's members after its type and sequence_number.
func (a *responsesAnswer) send(typ string, body any) {
	raw, _ := json.Marshal(body) // the events' structs: no error
	a.sendRaw(typ, raw)
}

// sendRaw sends an event whose body is encoded already.
func (a *responsesAnswer) sendRaw(typ string, body []byte) {
	a.event(typ, eventJSON(typ, a.seq, body), "")
	a.seq++
}

// The answer's events (§4), each without its type and sequence_number,
// which send puts first.
type (
	// lifecycleEvent: response.created, .in_progress, .completed,
	// .incomplete.
	lifecycleEvent struct {
		Response responseOut `json:"response"`
	}
	itemEvent struct {
		OutputIndex int `json:"output_index"`
		Item        any `json:"item"`
	}
	// contentAt is where a message's part is.
	contentAt struct {
		ItemID       string `json:"item_id"`
		OutputIndex  int    `json:"output_index"`
		ContentIndex int    `json:"content_index"`
	}
	partEvent struct {
		contentAt
		Part outputText `json:"part"`
	}
	textDeltaEvent struct {
		contentAt
		Delta    string `json:"delta"`
		Logprobs []any  `json:"logprobs"`
	}
	textDoneEvent struct {
		contentAt
		Text     string `json:"text"`
		Logprobs []any  `json:"logprobs"`
	}
	argumentsDeltaEvent struct {
		ItemID      string `json:"item_id"`
		OutputIndex int    `json:"output_index"`
		Delta       string `json:"delta"`
	}
	argumentsDoneEvent struct {
		ItemID      string `json:"item_id"`
		OutputIndex int    `json:"output_index"`
		Name        string `json:"name"`
		Arguments   string `json:"arguments"`
	}
)

// messageID is the answer's message item's id.
func (a *responsesAnswer) messageID() string { return "msg_" + strings.TrimPrefix(a.id, "resp_") }

// part is where the message's one text part is, the message at index at.
func (a *responsesAnswer) part(at int) contentAt {
	return contentAt{ItemID: a.messageID(), OutputIndex: at}
}

func (a *responsesAnswer) content(text string) {
	a.mu.Lock()
	defer a.unlock()
	a.head()
	a.written += len(text)
	at := len(a.items)
	if !a.open {
		a.open = true
		a.send("response.output_item.added", itemEvent{at,
			messageItem{Type: "message", ID: a.messageID(), Status: "in_progress", Role: "assistant", Content: []outputText{}}})
		a.send("response.content_part.added", partEvent{a.part(at), outputText{Type: "output_text", Annotations: []any{}}})
	}
	a.text.WriteString(text)
	a.send("response.output_text.delta", textDeltaEvent{a.part(at), text, []any{}})
}

// closeMessage ends the message item, if one is open.
func (a *responsesAnswer) closeMessage() {
	if !a.open {
		return
	}
	a.open = false
	at, text := len(a.items), a.text.String()
	part := outputText{Type: "output_text", Text: text, Annotations: []any{}}
	a.send("response.output_text.done", textDoneEvent{a.part(at), text, []any{}})
	a.send("response.content_part.done", partEvent{a.part(at), part})
	item := messageItem{Type: "message", ID: a.messageID(), Status: "completed", Role: "assistant", Content: []outputText{part}}
	a.send("response.output_item.done", itemEvent{at, item})
	raw, _ := json.Marshal(item)
	a.items = append(a.items, raw)
}

// callItem is an application's call as an item.
func callItem(c ToolCall, status string) functionCallItem {
	return functionCallItem{Type: "function_call", ID: "fc_" + strings.TrimPrefix(c.ID, "call_"), CallID: c.ID, Name: c.Function.Name,
		Arguments: c.Function.Arguments, Status: status}
}

// finish ends the stream: the application's calls, each added, its
// arguments in one delta, done; then the terminal event.
func (a *responsesAnswer) finish(res Result, sum executor.Summary) {
	a.mu.Lock()
	defer a.unlock()
	a.head()
	a.closeMessage()
	for _, c := range res.AppCalls {
		at, item := len(a.items), callItem(c, "completed")
		added := item
		added.Arguments, added.Status = "", "in_progress"
		a.send("response.output_item.added", itemEvent{at, added})
		a.send("response.function_call_arguments.delta", argumentsDeltaEvent{item.ID, at, item.Arguments})
		a.send("response.function_call_arguments.done", argumentsDoneEvent{item.ID, at, item.Name, item.Arguments})
		a.send("response.output_item.done", itemEvent{at, item})
		raw, _ := json.Marshal(item)
		a.items = append(a.items, raw)
	}
	r := a.response(&res, sum)
	terminal := "response.completed"
	if r.Status == "incomplete" {
		terminal = "response.incomplete"
	}
	a.send(terminal, lifecycleEvent{r})
}

func (a *responsesAnswer) whole(res Result, sum executor.Summary) {
	if res.Content != "" {
		raw, _ := json.Marshal(messageItem{Type: "message", ID: a.messageID(), Status: "completed", Role: "assistant",
			Content: []outputText{{Type: "output_text", Text: res.Content, Annotations: []any{}}}})
		a.items = append(a.items, raw)
	}
	for _, c := range res.AppCalls {
		raw, _ := json.Marshal(callItem(c, "completed"))
		a.items = append(a.items, raw)
	}
	writeJSON(a.w, http.StatusOK, a.response(&res, sum))
}

// failEvent: an error event nested under "error", which every official
// client stops on (§4.3). a.mu is held.
func (a *responsesAnswer) failEvent(msg, typ, code string) {
	var e APIError
	e.Error.Message, e.Error.Type, e.Error.Code = msg, typ, &code
	a.send("error", e)
}
