package modelapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	sse "github.com/tmaxmax/go-sse"

	"github.com/projectdavid/toolsidecar/tool"
)

// chatCodec is the Chat Completions API (POST /chat/completions), which
// OpenAI, vLLM, Ollama, llama.cpp and LiteLLM serve.
type chatCodec struct{}

func (chatCodec) Kind() string        { return kindOpenAI }
func (chatCodec) TurnPath() string    { return "/chat/completions" }
func (chatCodec) RunPrefix() string   { return "chatcmpl-" }
func (chatCodec) Forwarded() []string { return nil }
func (chatCodec) API() API            { return Chat }

// A Chat Completions chunk carries fragments, or whole calls: Ollama
// sends every call of a turn in one chunk. Its bound is a turn's.
func (chatCodec) EventBound(frame int) int { return turnCalls * frame }

func (chatCodec) Authorize(h http.Header, key string) {
	if key != "" {
		h.Set("Authorization", "Bearer "+key)
	}
}

func (chatCodec) CallerKey(r *http.Request) string {
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return key
}

func (chatCodec) ReadRequest(body map[string]json.RawMessage, own []tool.FunctionTool) (*Request, error) {
	req, tools, err := readShared(body, "messages")
	if err != nil {
		return nil, err
	}
	if raw, ok := body["n"]; ok {
		var n int
		if json.Unmarshal(raw, &n) != nil || n > 1 {
			return nil, &BadRequest{Message: "n > 1 is not supported: each choice would need its own tool calls", Param: "n"}
		}
	}
	if raw, ok := body["stream_options"]; ok && string(raw) != "null" {
		if !req.Stream {
			return nil, &BadRequest{Message: "The 'stream_options' parameter is only allowed when 'stream' is enabled.", Param: "stream_options"}
		}
		var so struct {
			IncludeUsage bool `json:"include_usage"`
		}
		_ = json.Unmarshal(raw, &so)
		req.IncludeUsage = so.IncludeUsage
	}
	delete(body, "stream_options")
	req.Canonical, _ = json.Marshal(body) // keys sorted
	names := make([]string, len(tools))
	for i, raw := range tools {
		var t tool.FunctionTool
		if err := json.Unmarshal(raw, &t); err != nil || t.Function.Name == "" {
			return nil, &BadRequest{Message: fmt.Sprintf("tools[%d] is not a function tool", i), Param: fmt.Sprintf("tools[%d]", i)}
		}
		names[i] = t.Function.Name
		req.AppTools[t.Function.Name] = true
	}
	ownRaw := make([]json.RawMessage, len(own))
	for i, t := range own {
		ownRaw[i], _ = json.Marshal(t)
	}
	return req, req.addTools(tools, names, own, ownRaw, "tools[%d]", ".function.name")
}

func (chatCodec) TurnBody(body map[string]json.RawMessage, conv []json.RawMessage) ([]byte, error) {
	return streamedTurn(body, "messages", conv, map[string]json.RawMessage{"stream_options": json.RawMessage(`{"include_usage":true}`)})
}

func (chatCodec) NewParser() Parser { return chatParser{} }

// chatParser reads chat.completion.chunk events; it keeps no state (the
// caller keeps what the chunks add up to, and makes the calls whole).
type chatParser struct{}

func (chatParser) Take(ev sse.Event) (Piece, error) {
	if strings.HasPrefix(ev.Data, "[DONE]") {
		return Piece{Done: true}, nil
	}
	var c chunk
	if err := json.Unmarshal([]byte(ev.Data), &c); err != nil {
		return Piece{}, err
	}
	p := Piece{Model: c.Model, Created: c.Created, Usage: c.Usage.Usage()}
	if len(c.Error) > 0 && string(c.Error) != "null" {
		p.Failed = errorMessage(c.Error)
		return p, nil
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue // n is 1: the endpoint refuses more
		}
		if s := ch.Delta.ReasoningContent; s != nil {
			p.Reasoning += *s
		}
		if s := ch.Delta.Content; s != nil {
			p.Text += *s
		}
		p.Calls = append(p.Calls, ch.Delta.ToolCalls...)
		if ch.FinishReason != nil && *ch.FinishReason != "" && p.Finish == "" {
			p.Finish = *ch.FinishReason
		}
	}
	return p, nil
}

func (chatParser) Assistant(text string, calls []Call) (json.RawMessage, error) {
	m := message{Role: "assistant"}
	if text != "" {
		m.Content = &text
	}
	for _, c := range calls {
		m.ToolCalls = append(m.ToolCalls, c.ToolCall())
	}
	return json.Marshal(m)
}

func (chatCodec) CallsOf(assistant json.RawMessage) ([]ToolCall, error) {
	var m message
	if err := json.Unmarshal(assistant, &m); err != nil {
		return nil, err
	}
	return m.ToolCalls, nil
}

func (chatCodec) FollowUp(assistant json.RawMessage, outputs []Output) ([]json.RawMessage, error) {
	out := []json.RawMessage{assistant}
	for _, r := range outputs {
		m, err := json.Marshal(message{Role: "tool", Content: &r.Content, ToolCallID: r.ID})
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

func (chatCodec) SplitParked(parked []json.RawMessage) (json.RawMessage, map[string]json.RawMessage) {
	out := map[string]json.RawMessage{}
	for _, raw := range parked[1:] {
		var m message
		if json.Unmarshal(raw, &m) == nil {
			out[m.ToolCallID] = raw
		}
	}
	return parked[0], out
}

// Restore: an assistant message whose calls are the application's part
// of a parked turn becomes the whole turn, and its tool messages are
// joined by the sidecar's, in the turn's call order.
func (chatCodec) Restore(msgs []json.RawMessage, find func([]ToolCall) *ParkedTurn) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(msgs))
	for i := 0; i < len(msgs); i++ {
		var m message
		_ = json.Unmarshal(msgs[i], &m)
		var pt *ParkedTurn
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

// The wire shapes below follow the Chat Completions API reference
// (openai/openai-openapi, CreateChatCompletionStreamResponse and
// ChatCompletionMessageToolCallChunk). Only the fields the sidecar reads
// are typed; everything else is passed through as the server sent it.

// chunk is one streamed event of a chat completion.
type chunk struct {
	ID      string          `json:"id"`
	Model   string          `json:"model"`
	Created int64           `json:"created"`
	Choices []choiceDelta   `json:"choices"`
	Usage   *ChatUsage      `json:"usage"`
	Error   json.RawMessage `json:"error"`
}

type choiceDelta struct {
	Index        int     `json:"index"`
	Delta        delta   `json:"delta"`
	FinishReason *string `json:"finish_reason"`
}

type delta struct {
	Role    string  `json:"role"`
	Content *string `json:"content"`
	// ReasoningContent is the reasoning of the servers that stream it
	// (vLLM, DeepSeek, llama.cpp).
	ReasoningContent *string     `json:"reasoning_content"`
	ToolCalls        []CallDelta `json:"tool_calls"`
}

// message is a conversation message as the sidecar writes it.
type message struct {
	Role       string     `json:"role"`
	Content    *string    `json:"content"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}
