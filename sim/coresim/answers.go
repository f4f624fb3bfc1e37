package coresim

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/projectdavid/toolsidecar/core"
)

// Core's read models carry much more than the sidecar reads, and the
// Project David SDK validates each answer against its pydantic model
// (projectdavid_common): a field it requires that is missing makes it
// raise before any tool runs. The simulator therefore answers every model
// whole, with Core's defaults where it keeps no value of its own. Each
// type embeds the core type first, so that "id" stays the first key.

// assistantRead is Core's AssistantRead.
type assistantRead struct {
	core.Assistant
	Object            string           `json:"object"`
	CreatedAt         int64            `json:"created_at"`
	Description       *string          `json:"description"`
	Instructions      string           `json:"instructions"`
	ToolResources     map[string]any   `json:"tool_resources"`
	MetaData          map[string]any   `json:"meta_data"`
	TopP              float64          `json:"top_p"`
	Temperature       float64          `json:"temperature"`
	ResponseFormat    string           `json:"response_format"`
	MaxTurns          int              `json:"max_turns"`
	AgentMode         bool             `json:"agent_mode"`
	WebAccess         bool             `json:"web_access"`
	DeepResearch      bool             `json:"deep_research"`
	Engineer          bool             `json:"engineer"`
	DecisionTelemetry bool             `json:"decision_telemetry"`
	VectorStores      []map[string]any `json:"vector_stores"`
	WebhookURL        *string          `json:"webhook_url"`
}

// assistant is an assistant as the simulator keeps it.
type assistant struct {
	core.Assistant
	instructions string
	createdAt    int64
}

func (a *assistant) read() assistantRead {
	return assistantRead{Assistant: a.Assistant, Object: "assistant", CreatedAt: a.createdAt, Instructions: a.instructions,
		ToolResources: map[string]any{}, MetaData: map[string]any{}, TopP: 1, Temperature: 1, ResponseFormat: "auto", MaxTurns: 1,
		VectorStores: []map[string]any{}}
}

// threadRead is Core's ThreadRead.
type threadRead struct {
	ID            string         `json:"id"`
	CreatedAt     int64          `json:"created_at"`
	MetaData      map[string]any `json:"meta_data"`
	Object        string         `json:"object"`
	ToolResources map[string]any `json:"tool_resources"`
}

func (t *thread) read() threadRead {
	return threadRead{ID: t.id, CreatedAt: t.createdAt, MetaData: map[string]any{}, Object: "thread", ToolResources: map[string]any{}}
}

// messageRead is Core's MessageRead.
type messageRead struct {
	core.Message
	AssistantID       *string        `json:"assistant_id"`
	Attachments       []any          `json:"attachments"`
	CompletedAt       *int64         `json:"completed_at"`
	CreatedAt         int64          `json:"created_at"`
	IncompleteAt      *int64         `json:"incomplete_at"`
	IncompleteDetails map[string]any `json:"incomplete_details"`
	MetaData          map[string]any `json:"meta_data"`
	Object            string         `json:"object"`
	RunID             *string        `json:"run_id"`
	Status            string         `json:"status"`
	SenderID          *string        `json:"sender_id"`
}

func (m message) read(threadID string) messageRead {
	return messageRead{Message: core.Message{ID: m.id, ThreadID: threadID, Role: m.role, Content: m.content, ToolID: m.toolID, ToolCallID: m.toolCallID},
		AssistantID: nullable(m.assistantID), Attachments: []any{}, CreatedAt: m.createdAt, MetaData: map[string]any{},
		Object: "message", Status: "completed"}
}

// runRead is Core's Run, which is also a RunReadDetailed once the
// detailed read adds its actions.
type runRead struct {
	core.Run
	// Model and MetaData override the embedded omitempty fields: both
	// models require them.
	Model               string         `json:"model"`
	MetaData            map[string]any `json:"meta_data"`
	UserID              string         `json:"user_id"`
	Object              string         `json:"object"`
	CreatedAt           int64          `json:"created_at"`
	ExpiresAt           int64          `json:"expires_at"`
	CancelledAt         *int64         `json:"cancelled_at"`
	CompletedAt         *int64         `json:"completed_at"`
	FailedAt            *int64         `json:"failed_at"`
	IncompleteDetails   *string        `json:"incomplete_details"`
	Instructions        string         `json:"instructions"`
	LastError           *string        `json:"last_error"`
	MaxCompletionTokens int            `json:"max_completion_tokens"`
	MaxPromptTokens     int            `json:"max_prompt_tokens"`
	ParallelToolCalls   bool           `json:"parallel_tool_calls"`
	RequiredAction      *string        `json:"required_action"`
	ResponseFormat      string         `json:"response_format"`
	ToolChoice          string         `json:"tool_choice"`
	TruncationStrategy  *string        `json:"truncation_strategy"`
	Usage               any            `json:"usage"`
	Temperature         float64        `json:"temperature"`
	TopP                float64        `json:"top_p"`
	ToolResources       map[string]any `json:"tool_resources"`
}

// Core keeps a run for an hour (runs_service.py: expires_at = now + 3600).
const runLifetime = 3600

func (rn *run) read() runRead {
	out := runRead{Run: rn.Run, Model: rn.Model, MetaData: rn.MetaData, UserID: userID(rn.owner), Object: "run",
		CreatedAt: rn.createdAt, ExpiresAt: rn.createdAt + runLifetime, Instructions: rn.instructions,
		MaxCompletionTokens: 1000, MaxPromptTokens: 500, ResponseFormat: "text", ToolChoice: "none",
		Temperature: 1, TopP: 1, ToolResources: map[string]any{}}
	if out.MetaData == nil {
		out.MetaData = map[string]any{}
	}
	if rn.finishedAt != 0 {
		switch rn.Status {
		case core.RunCompleted:
			out.CompletedAt = &rn.finishedAt
		case core.RunCancelled:
			out.CancelledAt = &rn.finishedAt
		case core.RunFailed:
			out.FailedAt = &rn.finishedAt
		}
	}
	return out
}

// userID is the Core user of a run's owner: a stable id derived from the
// key with PerKeyUsers (never the key itself), one user without.
func userID(owner string) string {
	if owner == "" {
		return "user_sim"
	}
	sum := sha256.Sum256([]byte(owner))
	return "user_" + hex.EncodeToString(sum[:8])
}

// nullable is s, or null when it is empty.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
