package modelapi

// The wire shapes below follow the Chat Completions API reference
// (openai/openai-openapi). Only the fields the sidecar reads or writes
// are typed.

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

// ChatUsage is a Chat Completions usage on the wire, as a chunk carries
// it: the counts, the prompt's cached part and the completion's
// reasoning part.
type ChatUsage struct {
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

// Usage is c as the sidecar counts it; nil for nil.
func (c *ChatUsage) Usage() *Usage {
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
func chatUsageOf(u Usage) *ChatUsage {
	c := &ChatUsage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	if u.CacheReadTokens > 0 {
		c.PromptTokensDetails = &promptTokensDetails{CachedTokens: u.CacheReadTokens}
	}
	if u.ReasoningTokens > 0 {
		c.CompletionTokensDetails = &completionTokensDetails{ReasoningTokens: u.ReasoningTokens}
	}
	return c
}

// Add adds o's counts to u's; a nil o adds none.
func (u *Usage) Add(o *Usage) {
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

// ToolCall is a whole call, as a Chat Completions assistant message
// carries it.
type ToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// APIError is the error body of Chat Completions and Responses:
// {"error": {...}}.
type APIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}
