// Package anthropicsim is an Anthropic Messages API server for tests and
// the demo: a scripted model that answers with text, thinking and
// tool_use blocks, streamed as the API streams them
// (../shared/reference/responses-and-messages.md §10), faults on demand,
// and a contract log that checks every request as the API would (§9.2):
// each tool_use answered by a tool_result at the start of the very next
// user message, no tool_result for a call the message before did not
// make, thinking blocks replayed unchanged, no empty text block, and the
// conversation replayed as the model said it.
//
// It is the Messages counterpart of package openaisim, and shares no code
// with the sidecar, so that each checks the other.
package anthropicsim

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"time"

	"github.com/projectdavid/toolsidecar/sim/internal/simbase"
)

// Version is the anthropic-version the API is asked with (the official
// SDKs send it).
const Version = "2023-06-01"

// Config configures the simulator.
type Config struct {
	// APIKey, when set, is the x-api-key every request must carry.
	APIKey string
	// Delay is the wait before each streamed event.
	Delay time.Duration
	// Model plays the model: text, and calls (a call's Args as its
	// arguments are sent). default: Scripted
	Model func(Request) Reply `json:"-"`
	// WholeCalls streams each tool_use whole in its content_block_start,
	// with no input_json_delta, as servers that translate from another
	// API's whole calls do (Ollama's calls, reference §13).
	WholeCalls bool
	// ServerTool begins every turn that calls tools with a server tool's
	// blocks, which Anthropic runs itself: a server_tool_use (its input
	// streamed) and its web_search_tool_result (whole in its start). A
	// follow-up must replay them unchanged, and answer no call of theirs.
	ServerTool bool
}

// Request is a Messages request, as the model sees it.
type Request struct {
	// Betas is the request's anthropic-beta header (§7.1).
	Betas     string            `json:"-"`
	Model     string            `json:"model"`
	MaxTokens *int              `json:"max_tokens"`
	Messages  []json.RawMessage `json:"messages"`
	Tools     []struct {
		Name string `json:"name"`
	} `json:"tools"`
	Stream   bool `json:"stream"`
	Thinking *struct {
		Type string `json:"type"`
	} `json:"thinking"`
}

// thinking says whether the request turns extended thinking on.
func (r Request) thinking() bool {
	return r.Thinking != nil && (r.Thinking.Type == "enabled" || r.Thinking.Type == "adaptive")
}

// Fault is what the next request gets instead of its answer: Status as
// an API error of Type (rate_limit_error for 429, overloaded_error for
// 529, api_error otherwise by default) with RetryAfter; or, after that
// many events, a connection cut, a clean end without message_stop
// (EndAfter: the official clients take it for a whole message), an error
// event of ErrorType (default overloaded_error), or a held stream.
type Fault = simbase.Fault

// Reply is what the model says in a turn: text, then calls.
type Reply = simbase.Reply

// Call is a call the model makes; Args is sent as written.
type Call = simbase.Call

// Violation is a request the API would refuse, as the contract log keeps it.
type Violation = simbase.Violation

// Sim is the simulator; it is an http.Handler. Its Base queues the faults
// (Inject) and keeps the contract log (Violations) and the counts
// (Requests, Repeats).
type Sim struct {
	simbase.Base[Fault]
	cfg Config

	turns simbase.Turns // the assistant contents, by the conversation they answered
}

// New builds a simulator.
func New(cfg Config) *Sim {
	if cfg.Model == nil {
		cfg.Model = Scripted
	}
	s := &Sim{cfg: cfg, turns: simbase.Turns{Noun: "blocks", Canonical: canonical}}
	s.Route("POST /v1/messages", s.messages)
	return s
}

// message is what the checks read of a message.
type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// block is what the checks read of a content block.
type block struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	ID        string          `json:"id"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

// blocks are a message's content as blocks; a string is one text block.
func (m message) blocks() ([]block, []json.RawMessage) {
	var text string
	if json.Unmarshal(m.Content, &text) == nil {
		raw, _ := json.Marshal(map[string]string{"type": "text", "text": text})
		return []block{{Type: "text", Text: &text}}, []json.RawMessage{raw}
	}
	var raws []json.RawMessage
	_ = json.Unmarshal(m.Content, &raws)
	out := make([]block, len(raws))
	for i, r := range raws {
		_ = json.Unmarshal(r, &out[i])
	}
	return out, raws
}

// text is the message's text: its string, or its text blocks joined.
func (m message) text() string {
	bs, _ := m.blocks()
	var b strings.Builder
	for _, bl := range bs {
		if bl.Type == "text" && bl.Text != nil {
			b.WriteString(*bl.Text)
		}
	}
	return b.String()
}

// resultText is a tool_result's content: a string, or its text blocks.
func (b block) resultText() string {
	var s string
	if json.Unmarshal(b.Content, &s) == nil {
		return s
	}
	return message{Content: b.Content}.text()
}

// canonical is v's JSON with sorted keys and no spacing: two encodings of
// one value compare equal.
func canonical(raw json.RawMessage) string {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// conversationKey identifies a conversation, whatever its JSON spacing
// and key order; a message's string content counts as its text block.
func conversationKey(msgs []json.RawMessage) string {
	h := sha256.New()
	for _, raw := range msgs {
		var m message
		if json.Unmarshal(raw, &m) != nil {
			h.Write(raw)
			continue
		}
		_, blocks := m.blocks()
		h.Write([]byte(m.Role))
		for _, b := range blocks {
			h.Write([]byte(canonical(b)))
			h.Write([]byte{1})
		}
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// check applies the API's checks and the replay check to a request. It
// returns the first refusal, which the API answers 400.
func (s *Sim) check(req Request) string {
	return s.Check(func(refuse simbase.Refuse) {
		msgs := req.Messages
		parsed := make([]message, len(msgs))
		for i, raw := range msgs {
			if err := json.Unmarshal(raw, &parsed[i]); err != nil {
				refuse("bad_message", "messages.%d: %v", i, err)
				return
			}
			if r := parsed[i].Role; r != "user" && r != "assistant" {
				refuse("bad_role", "messages.%d.role: Input should be 'user' or 'assistant'", i)
			}
			bs, _ := parsed[i].blocks()
			for _, b := range bs {
				if b.Type == "text" && (b.Text == nil || *b.Text == "") {
					refuse("empty_text", "messages: text content blocks must be non-empty")
				}
			}
		}
		lastAssistant := -1
		for i, m := range parsed {
			if m.Role == "assistant" {
				lastAssistant = i
			}
		}
		// The thinking rules first: the API refuses on them before it
		// reads the calls and their results.
		if lastAssistant >= 0 {
			bs, _ := parsed[lastAssistant].blocks()
			thought := len(bs) > 0 && (bs[0].Type == "thinking" || bs[0].Type == "redacted_thinking")
			calls := false
			for _, b := range bs {
				calls = calls || b.Type == "tool_use"
			}
			switch {
			case req.thinking() && calls && !thought:
				refuse("thinking_missing", "messages.%d.content.0.type: Expected `thinking` or `redacted_thinking`, but found `%s`. When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks).", lastAssistant, bs[0].Type)
			case !req.thinking() && thought && lastAssistant == len(parsed)-1:
				refuse("thinking_disabled", "When thinking is disabled, an `assistant` message in the final position cannot contain `thinking`.")
			}
		}
		for i, m := range parsed {
			if m.Role != "assistant" {
				s.checkResults(parsed, i, refuse)
				continue
			}
			s.checkReplay(msgs[:i], i, m, refuse)
		}
	})
}

// checkResults checks user message i against the assistant message before
// it: every tool_use there answered by a tool_result at the start of i,
// each once, and no tool_result for a call that message did not make.
func (s *Sim) checkResults(msgs []message, i int, refuse simbase.Refuse) {
	bs, _ := msgs[i].blocks()
	var calls []string
	if i > 0 && msgs[i-1].Role == "assistant" {
		prev, _ := msgs[i-1].blocks()
		for _, b := range prev {
			if b.Type == "tool_use" {
				calls = append(calls, b.ID)
			}
		}
	}
	leading := 0
	for leading < len(bs) && bs[leading].Type == "tool_result" {
		leading++
	}
	seen := map[string]int{}
	for m, b := range bs {
		if b.Type != "tool_result" {
			continue
		}
		seen[b.ToolUseID]++
		if !contains(calls, b.ToolUseID) {
			refuse("unexpected_tool_result", "messages.%d.content.%d: unexpected `tool_use_id` found in `tool_result` blocks: %s. Each `tool_result` block must have a corresponding `tool_use` block in the previous message.", i, m, b.ToolUseID)
		} else if seen[b.ToolUseID] == 2 {
			refuse("duplicate_tool_result", "messages.%d: more than one `tool_result` block for `tool_use` id %s", i, b.ToolUseID)
		}
	}
	if len(calls) == 0 {
		return
	}
	var missing []string
	for _, id := range calls {
		found := false
		for _, b := range bs[:leading] {
			found = found || b.ToolUseID == id
		}
		if !found {
			missing = append(missing, id)
		}
	}
	switch {
	case len(missing) == 0:
	case leading == 0:
		refuse("missing_tool_result", "messages.%d: `tool_use` ids were found without `tool_result` blocks immediately after: %s. Each `tool_use` block must have a corresponding `tool_result` block in the next message.", i-1, strings.Join(missing, ", "))
	default:
		refuse("missing_tool_result", "messages.%d: Did not find %d tool_result block(s) at the beginning of this message. Messages following tool_use blocks must begin with a matching number of tool_result blocks.", i, len(missing))
	}
}

// checkReplay compares assistant message i with what the model said after
// the same conversation, if it said it here: block by block, thinking
// and its signature included.
func (s *Sim) checkReplay(before []json.RawMessage, i int, m message, refuse simbase.Refuse) {
	bs, raws := m.blocks()
	known, why := s.turns.Replayed(conversationKey(before), raws)
	if !known {
		for _, b := range bs {
			if b.Type == "tool_use" || b.Type == "thinking" {
				refuse("unknown_turn", "messages.%d: an assistant message with %s blocks that the model never said after this conversation", i, b.Type)
				return
			}
		}
		return
	}
	if why == "" {
		return
	}
	if strings.Contains(why, "thinking") {
		refuse("thinking_modified", "messages.%d: `thinking` or `redacted_thinking` blocks in the latest assistant message cannot be modified. These blocks must remain as they were in the original response. (%s)", i, why)
		return
	}
	refuse("replay_changed", "messages.%d: %s", i, why)
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// Scripted is the default model. A user message whose text is a JSON
// object {"rounds": [[{"name": ..., "arguments": {...}}, ...], ...],
// "answer": "..."} makes one turn of calls per round; after the last
// round it answers with the text "answer" and then "results: " and the
// tool_result contents of the last round, joined by " | " (an error
// result as "error: " and its content). Any other user message gets
// "echo: " and its text.
func Scripted(req Request) simbase.Reply { return Play(simbase.Script{})(req) }

// Play is [Scripted] with a script of its own: a conversation with no
// script in its user messages plays sc from its last user message with
// text on (with no rounds in sc, it gets the echo).
func Play(sc simbase.Script) func(Request) simbase.Reply {
	return func(req Request) simbase.Reply { return play(req, sc) }
}

func play(req Request, fallback simbase.Script) simbase.Reply {
	var msgs []message
	for _, raw := range req.Messages {
		var m message
		_ = json.Unmarshal(raw, &m)
		msgs = append(msgs, m)
	}
	var script simbase.Script
	start, asked := -1, -1
	for i, m := range msgs {
		if m.Role == "user" && m.text() != "" {
			asked = i
		}
		if sc, ok := simbase.ParseScript(m.text()); ok && m.Role == "user" {
			script, start = sc, i
		}
	}
	if start < 0 && asked >= 0 && len(fallback.Rounds) > 0 {
		script, start = fallback, asked
	}
	if start < 0 {
		if len(msgs) == 0 {
			return simbase.Reply{Content: "no user message"}
		}
		return simbase.Reply{Content: "echo: " + msgs[len(msgs)-1].text()}
	}
	round := 0
	var results []string
	for _, m := range msgs[start+1:] {
		if m.Role == "assistant" {
			round++
			results = results[:0]
			continue
		}
		bs, _ := m.blocks()
		for _, b := range bs {
			if b.Type != "tool_result" {
				continue
			}
			text := b.resultText()
			if b.IsError {
				text = "error: " + text
			}
			results = append(results, text)
		}
	}
	return script.Reply(round, results)
}
