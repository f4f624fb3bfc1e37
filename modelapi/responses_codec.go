package modelapi

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	sse "github.com/tmaxmax/go-sse"

	"github.com/projectdavid/toolsidecar/tool"
)

// responsesCodec is OpenAI's Responses API (POST /responses), which OpenAI,
// vLLM, Ollama, llama.cpp and LiteLLM serve. Turns are stateless replays
// (store: false, the reasoning's encrypted content included): the
// conversation is the input items, and each turn's output items are
// appended to it, unchanged, with one function_call_output per call. The
// wire follows ../shared/reference/responses-and-messages.md, Part A; the
// section numbers below are that note's.
type responsesCodec struct{}

func (responsesCodec) Kind() string        { return kindResponses }
func (responsesCodec) TurnPath() string    { return "/responses" }
func (responsesCodec) RunPrefix() string   { return "resp_" }
func (responsesCodec) Forwarded() []string { return nil }
func (responsesCodec) API() API            { return Responses }

// A Responses stream's lifecycle events carry the whole response (§4.3):
// the terminal one repeats every item of the turn, and each one echoes
// the request's instructions and tools. Their bound is a turn's.
func (responsesCodec) EventBound(frame int) int { return turnCalls * frame }

// The key and the errors are OpenAI's, as in Chat Completions.
func (responsesCodec) Authorize(h http.Header, key string) { chatCodec{}.Authorize(h, key) }
func (responsesCodec) CallerKey(r *http.Request) string    { return chatCodec{}.CallerKey(r) }

// responsesTool is what the sidecar reads of a tool in a request: a
// function tool (the application's) or a built-in one (web search, file
// search, remote MCP), which the upstream runs.
type responsesTool struct {
	Type string `json:"type"`
	Name string `json:"name"`
}

// ownFunction is a sidecar's tool as the Responses API declares one
// (§1.1: type, name, parameters and strict are required).
type ownFunction struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      bool            `json:"strict"`
}

func (responsesCodec) ReadRequest(body map[string]json.RawMessage, own []tool.FunctionTool) (*Request, error) {
	var text string
	if json.Unmarshal(body["input"], &text) == nil {
		// A string is one user message (§1.1); the turns append items.
		body["input"], _ = json.Marshal([]map[string]string{{"role": "user", "content": text}})
	}
	if raw := body["previous_response_id"]; len(raw) > 0 && string(raw) != "null" && string(raw) != `""` {
		return nil, &BadRequest{Message: "previous_response_id is not supported: the sidecar replays each run statelessly, so send the whole conversation as input",
			Param: "previous_response_id"}
	}
	if string(body["background"]) == "true" {
		return nil, &BadRequest{Message: "background mode is not supported: the sidecar runs the tools while the response is asked for", Param: "background"}
	}
	req, tools, err := readShared(body, "input")
	if err != nil {
		return nil, err
	}
	delete(body, "stream_options") // only with stream, which every turn sets
	req.Canonical, _ = json.Marshal(body)
	names := make([]string, len(tools))
	for i, raw := range tools {
		var t responsesTool
		if err := json.Unmarshal(raw, &t); err != nil || t.Type == "" {
			return nil, &BadRequest{Message: fmt.Sprintf("tools[%d] has no type", i), Param: fmt.Sprintf("tools[%d]", i)}
		}
		names[i] = t.Name
		if t.Type == "function" {
			req.AppTools[t.Name] = true
		}
	}
	ownRaw := make([]json.RawMessage, len(own))
	for i, t := range own {
		params := t.Function.Parameters
		if len(params) == 0 {
			params = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		ownRaw[i], _ = json.Marshal(ownFunction{Type: "function", Name: t.Function.Name, Description: t.Function.Description, Parameters: params})
	}
	return req, req.addTools(tools, names, own, ownRaw, "tools[%d]", ".name")
}

// TurnBody: the conversation as input, streamed, not stored, with the
// reasoning's encrypted content, which the next turn replays (§1.2, §3.1).
func (responsesCodec) TurnBody(body map[string]json.RawMessage, conv []json.RawMessage) ([]byte, error) {
	var include []string
	_ = json.Unmarshal(body["include"], &include)
	if !slices.Contains(include, "reasoning.encrypted_content") {
		include = append(include, "reasoning.encrypted_content")
	}
	inc, _ := json.Marshal(include)
	return streamedTurn(body, "input", conv, map[string]json.RawMessage{"store": json.RawMessage("false"), "include": inc})
}

func (responsesCodec) NewParser() Parser { return &responsesParser{items: map[int]*outputItem{}} }

// responsesParser reads a Responses stream (§4): it keeps each output
// item as it is added and done, to replay the turn's items unchanged,
// and gives the turn model their text, reasoning and calls.
type responsesParser struct {
	items map[int]*outputItem // by output_index
	final []json.RawMessage   // the terminal response's output
	usage Usage
}

// outputItem is one output item of a turn.
type outputItem struct {
	typ   string
	added json.RawMessage // as it was added
	done  json.RawMessage // as it was done, when it was
}

// responseEvent is what the parser reads of an event.
type responseEvent struct {
	Type        string          `json:"type"`
	OutputIndex int             `json:"output_index"`
	Delta       string          `json:"delta"`
	Arguments   *string         `json:"arguments"`
	Item        json.RawMessage `json:"item"`
	Response    *struct {
		Model             string            `json:"model"`
		Output            []json.RawMessage `json:"output"`
		Usage             *responsesUsage   `json:"usage"`
		IncompleteDetails *struct {
			Reason string `json:"reason"`
		} `json:"incomplete_details"`
		Error *apiErrorBody `json:"error"`
	} `json:"response"`
	// An error event's, nested (first-party) or flat (the spec, §4.3).
	Error   *apiErrorBody `json:"error"`
	Message string        `json:"message"`
}

type apiErrorBody struct {
	Message string `json:"message"`
	Code    any    `json:"code"`
}

type responsesUsage struct {
	InputTokens        int64 `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int64 `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int64 `json:"total_tokens"`
}

// itemHead is what the parser reads of an output item.
type itemHead struct {
	Type      string  `json:"type"`
	ID        string  `json:"id"`
	CallID    string  `json:"call_id"`
	Name      string  `json:"name"`
	Arguments *string `json:"arguments"`
}

func (p *responsesParser) Take(ev sse.Event) (Piece, error) {
	if strings.HasPrefix(ev.Data, "[DONE]") {
		return Piece{Done: true}, nil // some servers end with it; the terminal event came
	}
	var e responseEvent
	if err := json.Unmarshal([]byte(ev.Data), &e); err != nil {
		return Piece{}, err
	}
	switch e.Type {
	case "response.created", "response.in_progress", "response.queued":
		if e.Response != nil {
			return Piece{Model: e.Response.Model}, nil
		}
	case "response.output_item.added":
		return p.added(e)
	case "response.output_text.delta":
		return Piece{Text: e.Delta}, nil
	case "response.reasoning_summary_text.delta", "response.reasoning_text.delta":
		return Piece{Reasoning: e.Delta}, nil
	case "response.function_call_arguments.delta", "response.function_call_arguments.done":
		return p.arguments(e)
	case "response.output_item.done":
		return p.itemDone(e)
	case "response.completed", "response.incomplete":
		return p.completed(e)
	case "response.failed", "error":
		return Piece{Failed: failure(e)}, nil
	}
	return Piece{}, nil // the other events: their items come whole in output_item.done
}

// added keeps an output item as it is added; a function call's head is
// its call's first fragment.
func (p *responsesParser) added(e responseEvent) (Piece, error) {
	var h itemHead
	if err := json.Unmarshal(e.Item, &h); err != nil || h.Type == "" {
		return Piece{}, fmt.Errorf("output item %d is added without its type", e.OutputIndex)
	}
	if p.items[e.OutputIndex] != nil {
		return Piece{}, fmt.Errorf("output item %d is added twice", e.OutputIndex)
	}
	p.items[e.OutputIndex] = &outputItem{typ: h.Type, added: e.Item}
	if h.Type != "function_call" {
		return Piece{}, nil
	}
	d := fragment(e.OutputIndex, h.CallID, h.Name, nil)
	if h.Arguments != nil && *h.Arguments != "" {
		d.Function.Arguments, d.Whole = h.Arguments, true
	}
	return Piece{Calls: []CallDelta{d}}, nil
}

// arguments reads a function call's arguments: a fragment, or the whole
// arguments when they are done.
func (p *responsesParser) arguments(e responseEvent) (Piece, error) {
	it := p.items[e.OutputIndex]
	if it == nil || it.typ != "function_call" {
		return Piece{}, fmt.Errorf("%s for output item %d, which is no function call", e.Type, e.OutputIndex)
	}
	d := fragment(e.OutputIndex, "", "", &e.Delta)
	if e.Type == "response.function_call_arguments.done" {
		if e.Arguments == nil {
			return Piece{}, nil
		}
		// The whole arguments: a server that dropped fragments
		// (LiteLLM #20711) is right here.
		d.Function.Arguments, d.Whole = e.Arguments, true
	}
	return Piece{Calls: []CallDelta{d}}, nil
}

// itemDone keeps an output item as it is done; a function call's
// arguments there are whole.
func (p *responsesParser) itemDone(e responseEvent) (Piece, error) {
	it := p.items[e.OutputIndex]
	if it == nil {
		return Piece{}, fmt.Errorf("output item %d is done before it was added", e.OutputIndex)
	}
	it.done = e.Item
	var h itemHead
	if json.Unmarshal(e.Item, &h) == nil && h.Type == "function_call" && h.Arguments != nil {
		d := fragment(e.OutputIndex, "", "", h.Arguments)
		d.Whole = true
		return Piece{Calls: []CallDelta{d}}, nil
	}
	return Piece{}, nil
}

// completed ends the turn. A tool turn is a completed response with
// function_call items (§2.3); an incomplete one ends with its reason, and
// its calls cut short are not whole.
func (p *responsesParser) completed(e responseEvent) (Piece, error) {
	finish := "completed"
	if e.Response == nil {
		return Piece{}, fmt.Errorf("%s without its response", e.Type)
	}
	if e.Type == "response.incomplete" {
		finish = "incomplete"
		if d := e.Response.IncompleteDetails; d != nil && d.Reason != "" {
			finish = d.Reason
		}
	}
	p.final = e.Response.Output
	if u := e.Response.Usage; u != nil {
		p.usage = Usage{PromptTokens: u.InputTokens, CompletionTokens: u.OutputTokens, TotalTokens: u.TotalTokens,
			CacheReadTokens: u.InputTokensDetails.CachedTokens, ReasoningTokens: u.OutputTokensDetails.ReasoningTokens}
	}
	usage := p.usage
	return Piece{Finish: finish, Usage: &usage, Model: e.Response.Model}, nil
}

// failure is the message of a failed response, or of an error event.
func failure(e responseEvent) string {
	if e.Type == "response.failed" {
		if e.Response != nil && e.Response.Error != nil && e.Response.Error.Message != "" {
			return e.Response.Error.Message
		}
		return "the response failed"
	}
	msg := e.Message
	if e.Error != nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	return cmp.Or(msg, "an error event without a message")
}

// Assistant is the turn's output items in order, as the upstream gave
// them: the terminal response's output, else each item as it was done
// (or added); each function_call with its call's id and the arguments
// as the model wrote them, and an item id only when it is the API's
// (§2.1: "fc…").
func (p *responsesParser) Assistant(_ string, calls []Call) (json.RawMessage, error) {
	items := p.final
	if len(items) == 0 {
		idx := make([]int, 0, len(p.items))
		for i := range p.items {
			idx = append(idx, i)
		}
		slices.Sort(idx)
		for _, i := range idx {
			it := p.items[i]
			items = append(items, it.latest())
		}
	}
	out := make([]json.RawMessage, 0, len(items))
	next := 0
	for _, raw := range items {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(raw, &fields); err != nil {
			return nil, fmt.Errorf("an output item is not an object: %w", err)
		}
		var typ, id string
		_ = json.Unmarshal(fields["type"], &typ)
		if typ != "function_call" {
			out = append(out, raw)
			continue
		}
		if next >= len(calls) {
			return nil, errors.New("a function_call item has no call")
		}
		c := calls[next]
		next++
		fields["call_id"], _ = json.Marshal(c.ID)
		fields["arguments"], _ = json.Marshal(c.Args)
		if _ = json.Unmarshal(fields["id"], &id); !strings.HasPrefix(id, "fc") {
			delete(fields, "id")
		}
		b, _ := json.Marshal(fields)
		out = append(out, b)
	}
	return json.Marshal(out)
}

// latest is the item as it was done, or as it was added.
func (it *outputItem) latest() json.RawMessage {
	if len(it.done) > 0 {
		return it.done
	}
	return it.added
}

// turnItems are an assistant turn's items (assistant is their array).
func turnItems(assistant json.RawMessage) ([]json.RawMessage, error) {
	var items []json.RawMessage
	err := json.Unmarshal(assistant, &items)
	return items, err
}

func (responsesCodec) CallsOf(assistant json.RawMessage) ([]ToolCall, error) {
	items, err := turnItems(assistant)
	if err != nil {
		return nil, err
	}
	return functionCalls(items), nil
}

// functionCalls are the function_call items among items, as calls.
func functionCalls(items []json.RawMessage) []ToolCall {
	var out []ToolCall
	for _, raw := range items {
		var h itemHead
		if json.Unmarshal(raw, &h) == nil && h.Type == "function_call" {
			var tc ToolCall
			tc.ID, tc.Type, tc.Function.Name = h.CallID, "function", h.Name
			if h.Arguments != nil {
				tc.Function.Arguments = *h.Arguments
			}
			out = append(out, tc)
		}
	}
	return out
}

// functionCallOutput answers a call (§3.1).
type functionCallOutput struct {
	Type   string `json:"type"`
	CallID string `json:"call_id"`
	Output string `json:"output"`
}

// FollowUp: the turn's items, then a function_call_output per call in
// call order.
func (responsesCodec) FollowUp(assistant json.RawMessage, outputs []Output) ([]json.RawMessage, error) {
	out, err := turnItems(assistant)
	if err != nil {
		return nil, err
	}
	for _, r := range outputs {
		raw, err := json.Marshal(functionCallOutput{Type: "function_call_output", CallID: r.ID, Output: r.Content})
		if err != nil {
			return nil, err
		}
		out = append(out, raw)
	}
	return out, nil
}

// SplitParked: the items up to the first output are the turn's.
func (responsesCodec) SplitParked(parked []json.RawMessage) (json.RawMessage, map[string]json.RawMessage) {
	results := map[string]json.RawMessage{}
	n := len(parked)
	for i, raw := range parked {
		var o functionCallOutput
		if json.Unmarshal(raw, &o) == nil && o.Type == "function_call_output" {
			n = min(n, i)
			results[o.CallID] = raw
		}
	}
	assistant, _ := json.Marshal(parked[:n])
	return assistant, results
}

// said reports an item the model produces (its turn's, replayed).
func said(raw json.RawMessage) bool {
	var it struct{ Type, Role string }
	_ = json.Unmarshal(raw, &it)
	return it.Type == "reasoning" || it.Type == "function_call" || ((it.Type == "message" || it.Type == "") && it.Role == "assistant")
}

// Restore (§3.3): a run of the model's items whose function calls are the
// application's part of a parked turn becomes the turn as the model made
// it, and the outputs after it are every call's, in call order.
func (responsesCodec) Restore(items []json.RawMessage, find func([]ToolCall) *ParkedTurn) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(items))
	for i := 0; i < len(items); {
		if !said(items[i]) {
			out = append(out, items[i])
			i++
			continue
		}
		j := i
		for j < len(items) && said(items[j]) {
			j++
		}
		pt := find(functionCalls(items[i:j]))
		if pt == nil {
			out = append(out, items[i:j]...)
			i = j
			continue
		}
		parked, _ := turnItems(pt.Assistant)
		out = append(out, parked...)
		var answers []json.RawMessage
		for ; j < len(items); j++ {
			var o functionCallOutput
			if json.Unmarshal(items[j], &o) != nil || o.Type != "function_call_output" {
				break
			}
			answers = append(answers, items[j])
		}
		out = append(out, pt.merge(answers, func(raw json.RawMessage) string {
			var o functionCallOutput
			_ = json.Unmarshal(raw, &o)
			return o.CallID
		})...)
		i = j
	}
	return out
}
