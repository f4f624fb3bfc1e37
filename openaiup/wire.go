// Package openaiup adapts an OpenAI-compatible Chat Completions server
// (OpenAI, vLLM, Ollama, llama.cpp, LiteLLM) to the executor's Upstream
// port, and serves POST /v1/chat/completions to applications: an
// unmodified OpenAI client that changes only its base URL gets answers
// whose tool calls the sidecar ran.
//
// The upstream is stateless, so the sidecar holds each run's conversation:
// a run is one application request, and lives in memory while it is
// driven.
package openaiup

import (
	"encoding/json"

	"github.com/projectdavid/toolsidecar/modelapi"
)

// The wire shapes below follow the Chat Completions API reference
// (openai/openai-openapi, CreateChatCompletionStreamResponse and
// ChatCompletionMessageToolCallChunk). Only the fields the sidecar reads
// are typed; everything else is passed through as the server sent it.

// chunk is one streamed event of a chat completion.
type chunk struct {
	ID      string              `json:"id"`
	Model   string              `json:"model"`
	Created int64               `json:"created"`
	Choices []choiceDelta       `json:"choices"`
	Usage   *modelapi.ChatUsage `json:"usage"`
	Error   json.RawMessage     `json:"error"`
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
	ReasoningContent *string         `json:"reasoning_content"`
	ToolCalls        []toolCallDelta `json:"tool_calls"`
}

// toolCallDelta is one fragment of a tool call: only index is required,
// and servers omit even that (Ollama before v0.4.7).
type toolCallDelta struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name string `json:"name"`
		// Arguments is absent on vLLM's first delta and null on some
		// of its streams (vllm #9693): nothing to add.
		Arguments *string `json:"arguments"`
	} `json:"function"`
	// whole: Arguments are the call's whole arguments, which replace the
	// fragments read (the Responses API's *.done events, authoritative
	// where a server dropped fragments: LiteLLM #20711).
	whole bool
}

// message is a conversation message as the sidecar writes it.
type message struct {
	Role       string              `json:"role"`
	Content    *string             `json:"content"`
	ToolCalls  []modelapi.ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string              `json:"tool_call_id,omitempty"`
}
