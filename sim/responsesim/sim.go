// Package responsesim is an OpenAI Responses API server for tests and the
// demo: a scripted model whose turns are output items (a reasoning item
// when the request asks for reasoning, a message, function_call items),
// streamed as the API streams them
// (../shared/reference/responses-and-messages.md §4), faults on demand,
// stored responses for previous_response_id, and a contract log that
// checks every request as the API would (§3.2): every function_call
// answered by one function_call_output, no output for an unknown call,
// no item the chained response already holds sent again, function_call
// item ids that are the API's, a reasoning item followed by its item, and
// the model's turns replayed as it said them.
//
// It is the Responses counterpart of package openaisim, and shares no code
// with the sidecar, so that each checks the other.
package responsesim

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/sim/internal/simbase"
)

// Config configures the simulator.
type Config struct {
	// Model plays the model: text, and calls (a call's Args as its
	// arguments are sent). default: Scripted
	Model func(Request) Reply `json:"-"`
	// Delay is the wait before each streamed event.
	Delay time.Duration
	// DroppedDeltas streams only the first argument delta of each call,
	// then its .done event with the whole arguments, as LiteLLM's bridge
	// did when it keyed deltas by call_id (litellm #20711, reference §6.1).
	DroppedDeltas bool
	// NoItemIDs sends function_call items without their item id, as
	// llama.cpp's server did before PR #24882 (§6.1).
	NoItemIDs bool
}

// Reply is what the model says in a turn: text, then calls.
type Reply = simbase.Reply

// Call is a call the model makes; Args is sent as written.
type Call = simbase.Call

// Violation is a request the API would refuse, as the contract log keeps it.
type Violation = simbase.Violation

// Request is a Responses request, as the model sees it: Items is the
// whole conversation (the chained responses' items, then the input).
type Request struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	PreviousResponseID string          `json:"previous_response_id"`
	Store              *bool           `json:"store"`
	Include            []string        `json:"include"`
	Stream             bool            `json:"stream"`
	Reasoning          json.RawMessage `json:"reasoning"`
	Tools              []struct {
		Type string `json:"type"`
		Name string `json:"name"`
	} `json:"tools"`

	Items []json.RawMessage `json:"-"`
}

// reasons says whether the request asks for reasoning.
func (r Request) reasons() bool { return len(r.Reasoning) > 0 && string(r.Reasoning) != "null" }

// stores says whether the response is stored (the API's default).
func (r Request) stores() bool { return r.Store == nil || *r.Store }

// Fault is what the next request gets instead of its answer: Status as
// an API error (Body, when set, as the whole body) with RetryAfter; or,
// after that many events, a connection cut, a clean end without a
// terminal event (EndAfter), an error event (nested under "error", with
// ErrorMessage), or a held stream.
type Fault = simbase.Fault

// Sim is the simulator; it is an http.Handler. Its Base queues the faults
// (Inject) and keeps the contract log (Violations) and the counts
// (Requests, Repeats).
type Sim struct {
	simbase.Base[Fault]
	cfg Config

	turns  simbase.Turns // the model's output, by the conversation it answered
	mu     sync.Mutex
	stored map[string][]json.RawMessage // a stored response's conversation: its items and its output, by id
}

// New builds a simulator.
func New(cfg Config) *Sim {
	if cfg.Model == nil {
		cfg.Model = Scripted
	}
	s := &Sim{cfg: cfg, stored: map[string][]json.RawMessage{}, turns: simbase.Turns{Noun: "items", Canonical: canonical}}
	s.Route("POST /v1/responses", s.responses)
	return s
}

// item is what the checks read of an input or output item.
type item struct {
	Type      string          `json:"type"`
	ID        string          `json:"id"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

func parse(raw json.RawMessage) item {
	var it item
	_ = json.Unmarshal(raw, &it)
	if it.Type == "" && it.Role != "" {
		it.Type = "message" // an easy input message
	}
	return it
}

// text is a message item's text: its string content, or its text parts.
func (it item) text() string {
	var s string
	if json.Unmarshal(it.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Type, Text string
	}
	_ = json.Unmarshal(it.Content, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// outputText is a function_call_output's output: a string, or its parts.
func (it item) outputText() string {
	return item{Content: it.Output}.text()
}

// said reports whether the item is one the model produces.
func (it item) said() bool {
	return it.Type == "reasoning" || it.Type == "function_call" || (it.Type == "message" && it.Role == "assistant")
}

// canonical is the item as the replay check compares it: the fields the
// API keeps, with sorted keys.
func canonical(raw json.RawMessage) string {
	var v map[string]any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	delete(v, "status") // a replayed item may drop its status
	if c, ok := v["content"].([]any); ok {
		for _, p := range c {
			if m, ok := p.(map[string]any); ok {
				delete(m, "annotations")
				delete(m, "logprobs")
			}
		}
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// key identifies a conversation (its items), whatever their spacing.
func key(items []json.RawMessage) string {
	var b strings.Builder
	for _, raw := range items {
		b.WriteString(canonical(raw))
		b.WriteByte(0)
	}
	return b.String()
}

// conversation is the request's items: the chained response's, then the
// input (a string is one user message). A refusal is answered 400.
func (s *Sim) conversation(req *Request) (refusal string) {
	var input []json.RawMessage
	var text string
	switch {
	case json.Unmarshal(req.Input, &text) == nil:
		raw, _ := json.Marshal(map[string]any{"type": "message", "role": "user", "content": text})
		input = []json.RawMessage{raw}
	case json.Unmarshal(req.Input, &input) != nil:
		return s.Violate("bad_input", "Invalid type for 'input': expected a string or an array of items.")
	}
	if req.PreviousResponseID == "" {
		req.Items = input
		return ""
	}
	s.mu.Lock()
	prev, ok := s.stored[req.PreviousResponseID]
	s.mu.Unlock()
	if !ok {
		return s.Violate("unknown_previous_response", "Previous response with id '%s' not found.", req.PreviousResponseID)
	}
	for _, raw := range input {
		if it := parse(raw); it.ID != "" && slices.ContainsFunc(prev, func(p json.RawMessage) bool { return parse(p).ID == it.ID }) {
			return s.Violate("duplicate_item", "Duplicate item found with id %s.", it.ID)
		}
	}
	req.Items = slices.Concat(prev, input)
	return ""
}

// check applies the API's checks and the replay check to the whole
// conversation. It returns the first refusal.
func (s *Sim) check(items []json.RawMessage) string {
	return s.Check(func(refuse simbase.Refuse) {
		parsed := make([]item, len(items))
		calls := map[string]int{} // call_id: its outputs
		for i, raw := range items {
			parsed[i] = parse(raw)
			it := parsed[i]
			switch it.Type {
			case "function_call":
				if it.ID != "" && !strings.HasPrefix(it.ID, "fc") {
					refuse("bad_item_id", "Invalid 'input[%d].id': '%s'. Expected an ID that begins with 'fc'.", i, it.ID)
				}
				calls[it.CallID] = 0
			case "function_call_output":
				n, ok := calls[it.CallID]
				switch {
				case !ok:
					refuse("unknown_call", "No tool call found for function call output with call_id %s.", it.CallID)
				case n > 0:
					refuse("duplicate_output", "Duplicate function_call_output for call_id %s.", it.CallID)
				}
				calls[it.CallID] = n + 1
			}
		}
		for i, it := range parsed {
			switch {
			case it.Type == "function_call" && calls[it.CallID] == 0:
				refuse("missing_output", "No tool output found for function call %s.", it.CallID)
			case it.Type == "reasoning" && (i+1 == len(parsed) || (parsed[i+1].Type != "message" && parsed[i+1].Type != "function_call")):
				refuse("reasoning_alone", "Item '%s' of type 'reasoning' was provided without its required following item.", it.ID)
			}
		}
		// Each run of the model's items is one turn, said after the items
		// before it.
		for i := 0; i < len(parsed); {
			if !parsed[i].said() {
				i++
				continue
			}
			j := i
			for j < len(parsed) && parsed[j].said() {
				j++
			}
			s.checkReplay(items[:i], items[i:j], refuse)
			i = j
		}
	})
}

// checkReplay compares a turn's items with what the model said after the
// same conversation, if it said it here.
func (s *Sim) checkReplay(before, turn []json.RawMessage, refuse simbase.Refuse) {
	known, why := s.turns.Replayed(key(before), turn)
	if !known {
		if slices.ContainsFunc(turn, func(raw json.RawMessage) bool { t := parse(raw).Type; return t == "function_call" || t == "reasoning" }) {
			refuse("unknown_turn", "a turn of %d items with calls or reasoning that the model never said after this conversation", len(turn))
		}
		return
	}
	if why != "" {
		refuse("replay_changed", "%s", why)
	}
}

// Scripted is the default model. A user message whose text is a JSON
// object {"rounds": [[{"name": ..., "arguments": {...}}, ...], ...],
// "answer": "..."} makes one turn of calls per round; after the last
// round it answers with the text "answer" and then "results: " and the
// outputs of the last round, joined by " | ". Any other user message
// gets "echo: " and its text.
func Scripted(req Request) simbase.Reply { return Play(simbase.Script{})(req) }

// Play is [Scripted] with a script of its own: a conversation with no
// script in its user messages plays sc from its last user message on
// (with no rounds in sc, it gets the echo).
func Play(sc simbase.Script) func(Request) simbase.Reply {
	return func(req Request) simbase.Reply { return play(req, sc) }
}

func play(req Request, fallback simbase.Script) simbase.Reply {
	var script simbase.Script
	items := make([]item, len(req.Items))
	start, lastUser := -1, -1
	for i, raw := range req.Items {
		items[i] = parse(raw)
		if items[i].Type == "message" && items[i].Role == "user" {
			lastUser = i
			if sc, ok := simbase.ParseScript(items[i].text()); ok {
				script, start = sc, i
			} else if start < 0 && i == len(req.Items)-1 && len(fallback.Rounds) == 0 {
				return simbase.Reply{Content: "echo: " + items[i].text()}
			}
		}
	}
	if start < 0 && lastUser >= 0 && len(fallback.Rounds) > 0 {
		script, start = fallback, lastUser
	}
	if start < 0 {
		return simbase.Reply{Content: "no script"}
	}
	round := 0
	var results []string
	for k := start + 1; k < len(items); k++ {
		it := items[k]
		switch {
		case it.said() && (k == start+1 || !items[k-1].said()):
			round++ // a turn of the model's begins
			results = results[:0]
		case it.Type == "function_call_output":
			results = append(results, it.outputText())
		}
	}
	return script.Reply(round, results)
}
