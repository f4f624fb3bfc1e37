package modelapi

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	sse "github.com/tmaxmax/go-sse"

	"github.com/projectdavid/toolsidecar/tool"
)

// messagesCodec is Anthropic's Messages API (POST /v1/messages), which
// Anthropic, LiteLLM, vLLM, Ollama and llama.cpp serve. The wire follows
// ../shared/reference/responses-and-messages.md, Part B; the section
// numbers below are that note's.
type messagesCodec struct{}

// anthropicVersion is the API version every turn asks for, the one the
// official SDKs send (§7.1).
const anthropicVersion = "2023-06-01"

func (messagesCodec) Kind() string      { return kindAnthropic }
func (messagesCodec) TurnPath() string  { return "/v1/messages" }
func (messagesCodec) RunPrefix() string { return "msg_" }

// The beta features the application asked for (§7.1): interleaved
// thinking, a longer context, and others, which change what the API
// takes and gives; every turn asks for the same.
func (messagesCodec) Forwarded() []string { return []string{"Anthropic-Beta"} }

// Messages events carry fragments of one content block.
func (messagesCodec) EventBound(frame int) int { return frame }

func (messagesCodec) Authorize(h http.Header, key string) {
	h.Set("Anthropic-Version", anthropicVersion)
	if key != "" {
		h.Set("X-Api-Key", key)
	}
}

func (messagesCodec) CallerKey(r *http.Request) string { return r.Header.Get("X-Api-Key") }
func (messagesCodec) API() API                         { return Messages }

// messagesTool is what the sidecar reads of a tool in a request: a client
// tool has no type (or "custom"); a server tool (web search, code
// execution) has its own, and Anthropic runs it.
type messagesTool struct {
	Type string `json:"type"`
	Name string `json:"name"`
}

// ownTool is a sidecar's tool as the Messages API declares one (§7.2).
type ownTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

func (messagesCodec) ReadRequest(body map[string]json.RawMessage, own []tool.FunctionTool) (*Request, error) {
	req, tools, err := readShared(body, "messages")
	if err != nil {
		return nil, err
	}
	req.Canonical, _ = json.Marshal(body)
	names := make([]string, len(tools))
	for i, raw := range tools {
		var t messagesTool
		if err := json.Unmarshal(raw, &t); err != nil || t.Name == "" {
			return nil, &BadRequest{Message: fmt.Sprintf("tools.%d: a tool needs a name", i), Param: fmt.Sprintf("tools.%d", i)}
		}
		names[i] = t.Name
		if t.Type == "" || t.Type == "custom" {
			req.AppTools[t.Name] = true
		}
	}
	ownRaw := make([]json.RawMessage, len(own))
	for i, t := range own {
		schema := t.Function.Parameters
		if len(schema) == 0 {
			schema = json.RawMessage(`{"type":"object"}`) // input_schema is required
		}
		ownRaw[i], _ = json.Marshal(ownTool{Name: t.Function.Name, Description: t.Function.Description, InputSchema: schema})
	}
	return req, req.addTools(tools, names, own, ownRaw, "tools.%d", ".name")
}

func (messagesCodec) TurnBody(body map[string]json.RawMessage, conv []json.RawMessage) ([]byte, error) {
	return streamedTurn(body, "messages", conv, nil)
}

func (messagesCodec) NewParser() Parser { return &messagesParser{} }

// messagesParser reads a Messages stream (§10): it keeps the content
// blocks as they are built, to replay them unchanged (§9.3), and gives
// the turn model their text, thinking and tool_use fragments.
type messagesParser struct {
	blocks []*contentBlock
	stop   string
	usage  Usage
}

// contentBlock is one block of the assistant's content, as it is built.
type contentBlock struct {
	start     json.RawMessage // the content_block it began with
	typ       string
	text      strings.Builder // a text's text, a thinking's thinking
	signature strings.Builder // a thinking's signature (signature_delta)
	input     strings.Builder // a server_tool_use's input fragments
	citations []json.RawMessage
	// call: a tool_use, whose fragments the pieces carry; fragment:
	// one came; startInput: the input its start carried.
	call       bool
	fragment   bool
	startInput json.RawMessage
}

// streamEvent is what the parser reads of an event's data.
type streamEvent struct {
	Type    string `json:"type"`
	Index   int    `json:"index"`
	Message *struct {
		Model string         `json:"model"`
		Usage *messagesUsage `json:"usage"`
	} `json:"message"`
	ContentBlock json.RawMessage `json:"content_block"`
	Delta        *struct {
		Type        string          `json:"type"`
		Text        string          `json:"text"`
		Thinking    string          `json:"thinking"`
		Signature   string          `json:"signature"`
		PartialJSON string          `json:"partial_json"`
		Citation    json.RawMessage `json:"citation"`
		StopReason  *string         `json:"stop_reason"`
	} `json:"delta"`
	Usage *messagesUsage `json:"usage"`
	Error *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// messagesUsage is a Messages usage: each count present overwrites the
// turn's (§10.5).
type messagesUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
}

// overwrite puts m's counts on u.
func (m *messagesUsage) overwrite(u *Usage) {
	if m == nil {
		return
	}
	if m.InputTokens != nil {
		u.PromptTokens = *m.InputTokens
	}
	if m.OutputTokens != nil {
		u.CompletionTokens = *m.OutputTokens
	}
	if m.CacheCreationInputTokens != nil {
		u.CacheCreationTokens = *m.CacheCreationInputTokens
	}
	if m.CacheReadInputTokens != nil {
		u.CacheReadTokens = *m.CacheReadInputTokens
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
}

// blockStart is what the parser reads of a content_block_start's block.
type blockStart struct {
	Type  string          `json:"type"`
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Text  string          `json:"text"`
	Input json.RawMessage `json:"input"`
}

var errBlockIndex = errors.New("a content block event names a block out of order")

func (p *messagesParser) Take(ev sse.Event) (Piece, error) {
	var e streamEvent
	if err := json.Unmarshal([]byte(ev.Data), &e); err != nil {
		return Piece{}, err
	}
	// The event's name and its data's type agree (§10.1); a server that
	// names none is read by the type.
	switch cmp.Or(ev.Type, e.Type) {
	case "message_start":
		if e.Message == nil {
			return Piece{}, errors.New("message_start without its message")
		}
		e.Message.Usage.overwrite(&p.usage)
		u := p.usage
		return Piece{Model: e.Message.Model, Usage: &u}, nil
	case "content_block_start":
		return p.start(e)
	case "content_block_delta":
		return p.delta(e)
	case "content_block_stop":
		if e.Index < 0 || e.Index >= len(p.blocks) {
			return Piece{}, fmt.Errorf("%w: stop of block %d", errBlockIndex, e.Index)
		}
		b := p.blocks[e.Index]
		if !b.call || b.fragment {
			return Piece{}, nil
		}
		// No fragment: the input its start carried (a server that sends
		// calls whole), or none, which is {} (§10.3).
		args := "{}"
		if in := strings.TrimSpace(string(b.startInput)); in != "" && in != "{}" && in != "null" {
			args = in
		}
		i := e.Index
		return Piece{Calls: []CallDelta{fragment(i, "", "", &args)}}, nil
	case "message_delta":
		if e.Delta != nil && e.Delta.StopReason != nil {
			p.stop = *e.Delta.StopReason
		}
		e.Usage.overwrite(&p.usage)
		u := p.usage
		return Piece{Usage: &u}, nil
	case "message_stop":
		// Only message_stop makes the turn whole: a stream that ends
		// without it was cut (§16), whatever came before.
		return Piece{Finish: cmp.Or(p.stop, "end_turn")}, nil
	case "error":
		msg := "an error event without a message"
		if e.Error != nil {
			msg = strings.TrimSpace(e.Error.Type + ": " + e.Error.Message)
		}
		return Piece{Failed: msg}, nil
	}
	return Piece{}, nil // ping, and the event types added later (§10.1)
}

func (p *messagesParser) start(e streamEvent) (Piece, error) {
	if e.Index != len(p.blocks) {
		return Piece{}, fmt.Errorf("%w: block %d starts after %d blocks", errBlockIndex, e.Index, len(p.blocks))
	}
	var s blockStart
	if err := json.Unmarshal(e.ContentBlock, &s); err != nil || s.Type == "" {
		return Piece{}, fmt.Errorf("content_block_start %d has no block", e.Index)
	}
	b := &contentBlock{start: e.ContentBlock, typ: s.Type}
	p.blocks = append(p.blocks, b)
	switch s.Type {
	case "tool_use":
		b.call, b.startInput = true, s.Input
		return Piece{Calls: []CallDelta{fragment(e.Index, s.ID, s.Name, nil)}}, nil
	case "text":
		b.text.WriteString(s.Text)
		return Piece{Text: s.Text}, nil
	}
	return Piece{}, nil
}

func (p *messagesParser) delta(e streamEvent) (Piece, error) {
	if e.Index < 0 || e.Index >= len(p.blocks) || e.Delta == nil {
		return Piece{}, fmt.Errorf("%w: delta of block %d", errBlockIndex, e.Index)
	}
	b, d := p.blocks[e.Index], e.Delta
	switch d.Type {
	case "text_delta":
		b.text.WriteString(d.Text)
		return Piece{Text: d.Text}, nil
	case "thinking_delta":
		b.text.WriteString(d.Thinking)
		return Piece{Reasoning: d.Thinking}, nil
	case "signature_delta":
		b.signature.WriteString(d.Signature) // appended, as anthropic-sdk-go does (§10.2)
	case "citations_delta":
		b.citations = append(b.citations, d.Citation)
	case "input_json_delta":
		switch {
		case !b.call:
			b.input.WriteString(d.PartialJSON)
		case d.PartialJSON != "": // empty fragments add nothing (§10.3)
			b.fragment = true
			args := d.PartialJSON
			return Piece{Calls: []CallDelta{fragment(e.Index, "", "", &args)}}, nil
		}
	}
	return Piece{}, nil
}

// The blocks the sidecar writes itself, in the API's field order.
type (
	thinkingBlock struct {
		Type      string `json:"type"`
		Thinking  string `json:"thinking"`
		Signature string `json:"signature"`
	}
	toolResultBlock struct {
		Type      string `json:"type"`
		ToolUseID string `json:"tool_use_id"`
		Content   string `json:"content,omitempty"`
		IsError   bool   `json:"is_error,omitempty"`
	}
	assistantMessage struct {
		Role    string            `json:"role"`
		Content []json.RawMessage `json:"content"`
	}
)

// Assistant is the content as it was streamed, block after block: a
// thinking block with its signature, a redacted one and the server tools'
// blocks as they came, each tool_use with its call made whole. An empty
// text block is left out: the API refuses one (§9.2).
func (p *messagesParser) Assistant(_ string, calls []Call) (json.RawMessage, error) {
	m := assistantMessage{Role: "assistant", Content: []json.RawMessage{}}
	next := 0
	for _, b := range p.blocks {
		var v any
		switch b.typ {
		case "text":
			if b.text.Len() == 0 {
				continue
			}
			v = TextBlock{Type: "text", Text: b.text.String(), Citations: b.citations}
		case "thinking":
			v = thinkingBlock{Type: "thinking", Thinking: b.text.String(), Signature: b.signature.String()}
		case "tool_use":
			if next >= len(calls) {
				return nil, errors.New("a tool_use block has no call")
			}
			c := calls[next]
			next++
			v = ToolUseBlock{Type: "tool_use", ID: c.ID, Name: c.Name, Input: inputOf(c)}
		default:
			v = b.whole()
		}
		raw, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		m.Content = append(m.Content, raw)
	}
	return json.Marshal(m)
}

// inputOf is a call's input: its arguments as the model wrote them, or
// {} when they cannot be used (the call's outcome says why).
func inputOf(c Call) json.RawMessage {
	if c.Problem != "" {
		return json.RawMessage("{}")
	}
	return json.RawMessage(c.Args)
}

// whole is a block the sidecar does not build: as it began, with the
// input its fragments gave (a server_tool_use's).
func (b *contentBlock) whole() json.RawMessage {
	if b.input.Len() == 0 || !json.Valid([]byte(b.input.String())) {
		return b.start
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(b.start, &fields) != nil {
		return b.start
	}
	fields["input"] = json.RawMessage(b.input.String())
	raw, _ := json.Marshal(fields)
	return raw
}

// messageOf is what the sidecar reads of a message: its role and its
// content as blocks (a string is one text block).
func messageOf(raw json.RawMessage) (role string, blocks []json.RawMessage) {
	var m struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &m) != nil {
		return "", nil
	}
	var text string
	if json.Unmarshal(m.Content, &text) == nil {
		b, _ := json.Marshal(TextBlock{Type: "text", Text: text})
		return m.Role, []json.RawMessage{b}
	}
	_ = json.Unmarshal(m.Content, &blocks)
	return m.Role, blocks
}

// blockRef is what the sidecar reads of a block to pair calls and results.
type blockRef struct {
	Type      string          `json:"type"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
}

func refOf(raw json.RawMessage) blockRef {
	var b blockRef
	_ = json.Unmarshal(raw, &b)
	return b
}

func (messagesCodec) CallsOf(assistant json.RawMessage) ([]ToolCall, error) {
	var m assistantMessage
	if err := json.Unmarshal(assistant, &m); err != nil {
		return nil, err
	}
	return toolUses(m.Content), nil
}

// toolUses are the tool_use blocks among blocks, as calls.
func toolUses(blocks []json.RawMessage) []ToolCall {
	var out []ToolCall
	for _, raw := range blocks {
		if b := refOf(raw); b.Type == "tool_use" {
			var tc ToolCall
			tc.ID, tc.Type, tc.Function.Name, tc.Function.Arguments = b.ID, "function", b.Name, string(b.Input)
			out = append(out, tc)
		}
	}
	return out
}

// FollowUp: the assistant message, then one user message that begins with
// a tool_result per call, in call order, flagged is_error for a failed
// call (§9.1, §15).
func (messagesCodec) FollowUp(assistant json.RawMessage, outputs []Output) ([]json.RawMessage, error) {
	out := []json.RawMessage{assistant}
	if len(outputs) == 0 {
		return out, nil
	}
	user := assistantMessage{Role: "user"}
	for _, r := range outputs {
		raw, err := json.Marshal(toolResultBlock{Type: "tool_result", ToolUseID: r.ID, Content: r.Content, IsError: r.failed()})
		if err != nil {
			return nil, err
		}
		user.Content = append(user.Content, raw)
	}
	raw, err := json.Marshal(user)
	return append(out, raw), err
}

func (messagesCodec) SplitParked(parked []json.RawMessage) (json.RawMessage, map[string]json.RawMessage) {
	out := map[string]json.RawMessage{}
	if len(parked) < 2 {
		return parked[0], out
	}
	_, blocks := messageOf(parked[1])
	for _, raw := range blocks {
		if b := refOf(raw); b.Type == "tool_result" {
			out[b.ToolUseID] = raw
		}
	}
	return parked[0], out
}

// Restore (§9.4): an assistant message whose tool_use blocks are the
// application's part of a parked turn becomes the turn as the model made
// it, and the user message after it begins with every call's tool_result
// in call order (the sidecar's and the application's), then whatever else
// the application wrote.
func (messagesCodec) Restore(msgs []json.RawMessage, find func([]ToolCall) *ParkedTurn) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(msgs))
	for i := 0; i < len(msgs); i++ {
		role, blocks := messageOf(msgs[i])
		var pt *ParkedTurn
		if role == "assistant" {
			pt = find(toolUses(blocks))
		}
		if pt == nil {
			out = append(out, msgs[i])
			continue
		}
		out = append(out, pt.Assistant)
		var answers, rest []json.RawMessage
		if i+1 < len(msgs) {
			if role, next := messageOf(msgs[i+1]); role == "user" {
				i++
				for _, raw := range next {
					if refOf(raw).Type == "tool_result" && len(rest) == 0 {
						answers = append(answers, raw)
					} else {
						rest = append(rest, raw)
					}
				}
			}
		}
		user := assistantMessage{Role: "user", Content: pt.merge(answers, func(raw json.RawMessage) string { return refOf(raw).ToolUseID })}
		user.Content = append(user.Content, rest...)
		raw, _ := json.Marshal(user)
		out = append(out, raw)
	}
	return out
}
