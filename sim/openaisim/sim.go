// Package openaisim is an OpenAI-compatible Chat Completions server for
// tests and the demo: a scripted model that streams tool calls the way
// OpenAI, vLLM, Ollama, llama.cpp and LiteLLM each do
// (../shared/reference/openai-upstream.md §1.4), faults on demand, and a
// contract log that checks every request as the API would (every call
// answered once, roles in order, the conversation replayed unchanged).
//
// It shares no code with the sidecar's adapter (package openaiup), so
// that each checks the other.
package openaisim

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/sim/internal/simbase"
)

// Profile is the way a server streams tool calls.
type Profile string

// The profiles.
const (
	// OpenAI: the first delta of a call has id, type, name and empty
	// arguments; the arguments follow in fragments, one call after the
	// other.
	OpenAI Profile = "openai"
	// VLLM: as OpenAI, but the first delta has no arguments key.
	VLLM Profile = "vllm"
	// Ollama: every call whole, in one chunk, each at index 0.
	Ollama Profile = "ollama"
	// LlamaCpp: the calls' fragments interleave.
	LlamaCpp Profile = "llamacpp"
	// LiteLLM: the call's id on every fragment, each call again whole in a
	// summary chunk after its fragments, and a new chunk id every chunk.
	LiteLLM Profile = "litellm"
)

// Profiles lists them all.
var Profiles = []Profile{OpenAI, VLLM, Ollama, LlamaCpp, LiteLLM}

// Config configures the simulator.
type Config struct {
	Profile Profile // default: OpenAI
	// NoIDs: calls carry no id.
	NoIDs bool
	// NegativeIndex: a turn's only call has index -1.
	NegativeIndex bool
	// Delay is the wait before each chunk.
	Delay time.Duration
	// Model plays the model. default: Scripted
	Model func(Request) Reply `json:"-"`
}

// Request is a chat completion request, as the model sees it.
type Request struct {
	Model    string            `json:"model"`
	Messages []json.RawMessage `json:"messages"`
	Tools    []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
	Stream        bool `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// Reply is what the model says: text, and calls (a call's Args as its
// arguments are sent).
type Reply = simbase.Reply

// Call is a tool call the model makes.
type Call = simbase.Call

// Fault is what the next request gets instead of its answer: Status with
// Body (an API error by default) and RetryAfter, a stream cut, an error
// event ({"error": ...} with ErrorMessage) or a held stream, after that
// many chunks.
type Fault = simbase.Fault

// Violation is a request the API would have refused, or a conversation
// that did not replay what the model said.
type Violation = simbase.Violation

// Sim is the simulator; it is an http.Handler. Its Base queues the faults
// (Inject) and keeps the contract log (Violations) and the counts
// (Requests, Repeats).
type Sim struct {
	simbase.Base[Fault]
	cfg Config

	mu       sync.Mutex
	said     map[string][]said // by the hash of the conversation it answered
	auth     []string
	finished []time.Time
}

// said is an assistant message the model produced.
type said struct {
	content string
	calls   []sentCall
}

type sentCall struct{ id, name, args string }

// New builds a simulator.
func New(cfg Config) *Sim {
	if cfg.Profile == "" {
		cfg.Profile = OpenAI
	}
	if cfg.Model == nil {
		cfg.Model = Scripted
	}
	s := &Sim{cfg: cfg, said: map[string][]said{}}
	s.Route("POST /v1/chat/completions", s.completions)
	return s
}

// Finished lists when each answered turn's finish chunk was written, in
// order.
func (s *Sim) Finished() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.finished...)
}

// Authorizations lists the Authorization headers received, in order.
func (s *Sim) Authorizations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.auth...)
}

// message is what the checks read of a message.
type message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"tool_call_id"`
	ToolCalls  []toolCall      `json:"tool_calls"`
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

func (m message) text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	return ""
}

// conversationKey identifies a conversation, whatever its JSON spacing
// and key order.
func conversationKey(msgs []json.RawMessage) string {
	h := sha256.New()
	for _, raw := range msgs {
		var v any
		if json.Unmarshal(raw, &v) != nil {
			h.Write(raw)
			continue
		}
		canon, _ := json.Marshal(v) // maps marshal with sorted keys
		h.Write(canon)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// check applies the API's checks and the replay check to a request's
// messages. It returns the first refusal, which the API answers 400.
func (s *Sim) check(msgs []json.RawMessage) string {
	return s.Check(func(refuse simbase.Refuse) {
		parsed := make([]message, len(msgs))
		for i, raw := range msgs {
			if err := json.Unmarshal(raw, &parsed[i]); err != nil {
				refuse("bad_message", "messages[%d]: %v", i, err)
				return
			}
		}
		for i := 0; i < len(parsed); i++ {
			m := parsed[i]
			switch m.Role {
			case "system", "developer", "user":
			case "tool":
				refuse("orphan_tool_message", "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'. (messages[%d])", i)
			case "assistant":
				s.checkReplay(msgs[:i], m, refuse)
				if len(m.ToolCalls) == 0 {
					continue
				}
				answered := map[string]int{}
				j := i + 1
				for ; j < len(parsed) && parsed[j].Role == "tool"; j++ {
					answered[parsed[j].ToolCallID]++
				}
				var missing []string
				for _, c := range m.ToolCalls {
					switch answered[c.ID] {
					case 0:
						missing = append(missing, c.ID)
					case 1:
					default:
						refuse("duplicate_tool_result", "Invalid parameter: Duplicate value for 'tool_call_id' of '%s'", c.ID)
					}
					delete(answered, c.ID)
				}
				if len(missing) > 0 {
					refuse("missing_tool_result", "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: %s", strings.Join(missing, ", "))
				}
				for id := range answered {
					refuse("orphan_tool_message", "Invalid parameter: 'tool_call_id' of '%s' not found in 'tool_calls' of previous message.", id)
				}
				i = j - 1
			default:
				refuse("bad_role", "messages[%d]: unknown role %q", i, m.Role)
			}
		}
	})
}

// checkReplay compares an assistant message with what the model said
// after the same conversation, if it said it here.
func (s *Sim) checkReplay(before []json.RawMessage, m message, refuse simbase.Refuse) {
	s.mu.Lock()
	answers := s.said[conversationKey(before)]
	s.mu.Unlock()
	if len(answers) == 0 {
		if len(m.ToolCalls) > 0 {
			refuse("unknown_turn", "an assistant message with tool calls that the model never made after this conversation (%d calls, first %s)", len(m.ToolCalls), m.ToolCalls[0].Function.Name)
		}
		return
	}
	// The same conversation may have been answered more than once (two
	// runs of one request): the replay must be one of the answers.
	var why string
	for _, want := range answers {
		if why = replayMismatch(want, m); why == "" {
			return
		}
	}
	refuse("replay_changed", "%s", why)
}

// replayMismatch says how m differs from what the model said, or "".
func replayMismatch(want said, m message) string {
	if m.text() != want.content {
		return fmt.Sprintf("the assistant's text was %q, replayed as %q", want.content, m.text())
	}
	if len(m.ToolCalls) != len(want.calls) {
		return fmt.Sprintf("the model made %d calls, replayed with %d", len(want.calls), len(m.ToolCalls))
	}
	for k, c := range m.ToolCalls {
		w := want.calls[k]
		if (w.id != "" && c.ID != w.id) || c.ID == "" || c.Type != "function" || c.Function.Name != w.name || c.Function.Arguments != w.args {
			return fmt.Sprintf("call %d was %s %s(%s), replayed as %s %s %s(%s)", k, w.id, w.name, w.args, c.ID, c.Type, c.Function.Name, c.Function.Arguments)
		}
	}
	return ""
}

// Scripted is the default model. A user message that is a JSON object
// {"rounds": [[{"name": ..., "arguments": {...}}, ...], ...], "answer":
// "..."} makes one turn of calls per round; after the last round it
// answers with the text "answer" and then "results: " and the tool
// messages of the last round, joined by " | ". Any other user message
// gets "echo: " and its text.
func Scripted(req Request) Reply { return Play(simbase.Script{})(req) }

// Play is [Scripted] with a script of its own: a conversation whose last
// user message is no script plays sc from that message on (with no
// rounds in sc, it gets the echo).
func Play(sc simbase.Script) func(Request) Reply {
	return func(req Request) Reply { return play(req, sc) }
}

func play(req Request, fallback simbase.Script) Reply {
	var msgs []message
	for _, raw := range req.Messages {
		var m message
		_ = json.Unmarshal(raw, &m)
		msgs = append(msgs, m)
	}
	last := -1
	for i, m := range msgs {
		if m.Role == "user" {
			last = i
		}
	}
	if last < 0 {
		return Reply{Content: "no user message"}
	}
	script, ok := simbase.ParseScript(msgs[last].text())
	if !ok && len(fallback.Rounds) == 0 {
		return Reply{Content: "echo: " + msgs[last].text()}
	} else if !ok {
		script = fallback
	}
	round := 0
	var results []string
	for _, m := range msgs[last+1:] {
		switch m.Role {
		case "assistant":
			round++
			results = results[:0]
		case "tool":
			results = append(results, m.text())
		}
	}
	r := script.Reply(round, results)
	for i := range r.Calls {
		if r.Calls[i].Args == "" {
			r.Calls[i].Args = "{}"
		}
	}
	return r
}
