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

import "encoding/json"

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
	Usage   *chatUsage      `json:"usage"`
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

// Usage is a completion's token counts.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
	// The prompt cache: tokens written to it (Messages, counted apart
	// from its input_tokens, §8) and read from it (Messages, counted
	// apart; Chat Completions and Responses, a part of the prompt's).
	CacheCreationTokens int64 `json:"cache_creation_input_tokens,omitempty"`
	CacheReadTokens     int64 `json:"cache_read_input_tokens,omitempty"`
	// ReasoningTokens are the completion's reasoning part (Chat
	// Completions, Responses).
	ReasoningTokens int64 `json:"reasoning_tokens,omitempty"`
}

// chatUsage is a Chat Completions usage on the wire: the counts, the
// prompt's cached part and the completion's reasoning part.
type chatUsage struct {
	PromptTokens            int64                    `json:"prompt_tokens"`
	CompletionTokens        int64                    `json:"completion_tokens"`
	TotalTokens             int64                    `json:"total_tokens"`
	PromptTokensDetails     *promptTokensDetails     `json:"prompt_tokens_details,omitempty"`
	CompletionTokensDetails *completionTokensDetails `json:"completion_tokens_details,omitempty"`
}

type promptTokensDetails struct {
	CachedTokens int64 `json:"cached_tokens"`
}

type completionTokensDetails struct {
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

// usage is c as the sidecar counts it.
func (c *chatUsage) usage() *Usage {
	if c == nil {
		return nil
	}
	u := &Usage{PromptTokens: c.PromptTokens, CompletionTokens: c.CompletionTokens, TotalTokens: c.TotalTokens}
	if d := c.PromptTokensDetails; d != nil {
		u.CacheReadTokens = d.CachedTokens
	}
	if d := c.CompletionTokensDetails; d != nil {
		u.ReasoningTokens = d.ReasoningTokens
	}
	return u
}

// chatUsageOf is u on the wire of Chat Completions.
func chatUsageOf(u Usage) *chatUsage {
	c := &chatUsage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	if u.CacheReadTokens > 0 {
		c.PromptTokensDetails = &promptTokensDetails{CachedTokens: u.CacheReadTokens}
	}
	if u.ReasoningTokens > 0 {
		c.CompletionTokensDetails = &completionTokensDetails{ReasoningTokens: u.ReasoningTokens}
	}
	return c
}

func (u *Usage) add(o *Usage) {
	if o == nil {
		return
	}
	u.PromptTokens += o.PromptTokens
	u.CompletionTokens += o.CompletionTokens
	u.TotalTokens += o.TotalTokens
	u.CacheCreationTokens += o.CacheCreationTokens
	u.CacheReadTokens += o.CacheReadTokens
	u.ReasoningTokens += o.ReasoningTokens
}

// message is a conversation message as the sidecar writes it.
type message struct {
	Role       string     `json:"role"`
	Content    *string    `json:"content"`
	ToolCalls  []toolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

// toolCall is a whole call, as an assistant message carries it.
type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// apiError is the error body of the API: {"error": {...}}.
type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}
