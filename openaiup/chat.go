package openaiup

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	sse "github.com/tmaxmax/go-sse"

	"github.com/projectdavid/toolsidecar/modelapi"
	"github.com/projectdavid/toolsidecar/tool"
)

// chatAPI is the Chat Completions API (POST /chat/completions), which
// OpenAI, vLLM, Ollama, llama.cpp and LiteLLM serve.
type chatAPI struct{}

func (chatAPI) kind() string        { return kindOpenAI }
func (chatAPI) turnPath() string    { return "/chat/completions" }
func (chatAPI) runPrefix() string   { return "chatcmpl-" }
func (chatAPI) forwarded() []string { return nil }
func (chatAPI) wire() modelapi.API  { return modelapi.Chat }

// A Chat Completions chunk carries fragments, or whole calls: Ollama
// sends every call of a turn in one chunk. Its bound is a turn's.
func (chatAPI) eventBound(frame int) int { return turnCalls * frame }

func (chatAPI) authorize(h http.Header, key string) {
	if key != "" {
		h.Set("Authorization", "Bearer "+key)
	}
}

func (chatAPI) callerKey(r *http.Request) string {
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return key
}

func (chatAPI) readRequest(body map[string]json.RawMessage, own []tool.FunctionTool) (*request, error) {
	req, tools, err := readShared(body, "messages")
	if err != nil {
		return nil, err
	}
	if raw, ok := body["n"]; ok {
		var n int
		if json.Unmarshal(raw, &n) != nil || n > 1 {
			return nil, &badRequest{msg: "n > 1 is not supported: each choice would need its own tool calls", param: "n"}
		}
	}
	if raw, ok := body["stream_options"]; ok && string(raw) != "null" {
		if !req.stream {
			return nil, &badRequest{msg: "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param: "stream_options"}
		}
		var so struct {
			IncludeUsage bool `json:"include_usage"`
		}
		_ = json.Unmarshal(raw, &so)
		req.usage = so.IncludeUsage
	}
	delete(body, "stream_options")
	req.canonical, _ = json.Marshal(body) // keys sorted
	names := make([]string, len(tools))
	for i, raw := range tools {
		var t tool.FunctionTool
		if err := json.Unmarshal(raw, &t); err != nil || t.Function.Name == "" {
			return nil, &badRequest{msg: fmt.Sprintf("tools[%d] is not a function tool", i), param: fmt.Sprintf("tools[%d]", i)}
		}
		names[i] = t.Function.Name
		req.appTools[t.Function.Name] = true
	}
	ownRaw := make([]json.RawMessage, len(own))
	for i, t := range own {
		ownRaw[i], _ = json.Marshal(t)
	}
	return req, req.addTools(tools, names, own, ownRaw, "tools[%d]", ".function.name")
}

// readShared reads what a request has in every API: the conversation
// (under field), the model, whether it is streamed (which is then left
// out of the body: every turn is) and the application's tools.
func readShared(body map[string]json.RawMessage, field string) (*request, []json.RawMessage, error) {
	req := &request{body: body, appTools: map[string]bool{}, field: field}
	if err := json.Unmarshal(body[field], &req.messages); err != nil || len(req.messages) == 0 {
		return nil, nil, &badRequest{msg: field + " must be a non-empty array", param: field}
	}
	_ = json.Unmarshal(body["model"], &req.model)
	if raw, ok := body["stream"]; ok {
		_ = json.Unmarshal(raw, &req.stream)
	}
	delete(body, "stream")
	var tools []json.RawMessage
	if raw, ok := body["tools"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &tools); err != nil {
			return nil, nil, &badRequest{msg: "tools must be an array", param: "tools"}
		}
	}
	return req, tools, nil
}

// addTools adds the sidecar's tools (own, and ownRaw in the API's shape)
// to the application's (tools, named names) in the body sent upstream,
// refusing an application's tool named as one of the sidecar's: at is the
// place of tools[i] in the API's error messages, and name the place of
// its name under it. The conversation leaves the body: each turn sets it.
func (req *request) addTools(tools []json.RawMessage, names []string, own []tool.FunctionTool, ownRaw []json.RawMessage, at, name string) error {
	for i, n := range names {
		if slices.ContainsFunc(own, func(t tool.FunctionTool) bool { return t.Function.Name == n }) {
			place := fmt.Sprintf(at, i)
			return &badRequest{msg: fmt.Sprintf("%s: %s is a tool of the sidecar; rename the application's tool", place, tool.Excerpt(n)),
				param: place + name}
		}
	}
	if tools = append(tools, ownRaw...); len(tools) > 0 {
		req.body["tools"], _ = json.Marshal(tools)
	}
	delete(req.body, req.field)
	return nil
}

func (chatAPI) turnBody(body map[string]json.RawMessage, conv []json.RawMessage) ([]byte, error) {
	return streamedTurn(body, "messages", conv, map[string]json.RawMessage{"stream_options": json.RawMessage(`{"include_usage":true}`)})
}

// streamedTurn is a turn's body in every API: the application's fields,
// the conversation under field, stream on, and the API's extra fields.
func streamedTurn(body map[string]json.RawMessage, field string, conv []json.RawMessage, extra map[string]json.RawMessage) ([]byte, error) {
	out := make(map[string]json.RawMessage, len(body)+2+len(extra))
	maps.Copy(out, body)
	maps.Copy(out, extra)
	msgs, err := json.Marshal(conv)
	if err != nil {
		return nil, err
	}
	out[field] = msgs
	out["stream"] = json.RawMessage("true")
	return json.Marshal(out)
}

func (chatAPI) newParser() parser { return chatParser{} }

// chatParser reads chat.completion.chunk events; it keeps no state (the
// assembler and the turn's reading keep what the chunks add up to).
type chatParser struct{}

func (chatParser) take(ev sse.Event) (piece, error) {
	if strings.HasPrefix(ev.Data, "[DONE]") {
		return piece{done: true}, nil
	}
	var c chunk
	if err := json.Unmarshal([]byte(ev.Data), &c); err != nil {
		return piece{}, err
	}
	p := piece{model: c.Model, created: c.Created, usage: c.Usage.Usage()}
	if len(c.Error) > 0 && string(c.Error) != "null" {
		p.failed = errorMessage(c.Error)
		return p, nil
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue // n is 1: the endpoint refuses more
		}
		if s := ch.Delta.ReasoningContent; s != nil {
			p.reasoning += *s
		}
		if s := ch.Delta.Content; s != nil {
			p.text += *s
		}
		p.calls = append(p.calls, ch.Delta.ToolCalls...)
		if ch.FinishReason != nil && *ch.FinishReason != "" && p.finish == "" {
			p.finish = *ch.FinishReason
		}
	}
	return p, nil
}

func (chatParser) assistant(text string, calls []assembled) (json.RawMessage, error) {
	m := message{Role: "assistant"}
	if text != "" {
		m.Content = &text
	}
	for _, c := range calls {
		m.ToolCalls = append(m.ToolCalls, c.toolCall())
	}
	return json.Marshal(m)
}

// modelapi.ToolCall is c as an assistant message carries it.
func (c assembled) toolCall() modelapi.ToolCall {
	var tc modelapi.ToolCall
	tc.ID, tc.Type, tc.Function.Name, tc.Function.Arguments = c.ID, "function", c.Name, c.Args
	return tc
}

func (chatAPI) callsOf(assistant json.RawMessage) ([]modelapi.ToolCall, error) {
	var m message
	if err := json.Unmarshal(assistant, &m); err != nil {
		return nil, err
	}
	return m.ToolCalls, nil
}

func (chatAPI) followUp(assistant json.RawMessage, results []result) ([]json.RawMessage, error) {
	out := []json.RawMessage{assistant}
	for _, r := range results {
		m, err := json.Marshal(message{Role: "tool", Content: &r.Content, ToolCallID: r.ID})
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

func (chatAPI) splitParked(parked []json.RawMessage) (json.RawMessage, map[string]json.RawMessage) {
	out := map[string]json.RawMessage{}
	for _, raw := range parked[1:] {
		var m message
		if json.Unmarshal(raw, &m) == nil {
			out[m.ToolCallID] = raw
		}
	}
	return parked[0], out
}

// restore: an assistant message whose calls are the application's part
// of a parked turn becomes the whole turn, and its tool messages are
// joined by the sidecar's, in the turn's call order.
func (chatAPI) restore(msgs []json.RawMessage, find func([]modelapi.ToolCall) *parkedTurn) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(msgs))
	for i := 0; i < len(msgs); i++ {
		var m message
		_ = json.Unmarshal(msgs[i], &m)
		var pt *parkedTurn
		if m.Role == "assistant" {
			pt = find(m.ToolCalls)
		}
		if pt == nil {
			out = append(out, msgs[i])
			continue
		}
		var answers []json.RawMessage // the application's tool messages
		for i+1 < len(msgs) {
			var t message
			if json.Unmarshal(msgs[i+1], &t) != nil || t.Role != "tool" {
				break
			}
			i++
			answers = append(answers, msgs[i])
		}
		out = append(out, pt.Assistant)
		out = append(out, pt.merge(answers, func(raw json.RawMessage) string {
			var t message
			_ = json.Unmarshal(raw, &t)
			return t.ToolCallID
		})...)
	}
	return out
}
