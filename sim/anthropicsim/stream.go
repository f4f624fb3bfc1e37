package anthropicsim

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/projectdavid/toolsidecar/sim/internal/chunk"
	"github.com/projectdavid/toolsidecar/sim/internal/simbase"
)

func (s *Sim) messages(w http.ResponseWriter, r *http.Request) {
	seq, f := s.Begin()
	switch {
	case s.cfg.APIKey != "" && r.Header.Get("X-Api-Key") != s.cfg.APIKey:
		apiError(w, http.StatusUnauthorized, "authentication_error", "invalid x-api-key")
		return
	case r.Header.Get("Anthropic-Version") == "":
		apiError(w, http.StatusBadRequest, "invalid_request_error", "anthropic-version: header is required")
		return
	}
	var req Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "invalid_request_error", "could not parse the JSON body of your request: "+err.Error())
		return
	}
	req.Betas = r.Header.Get("Anthropic-Beta")
	if f.Answer(w, func(w http.ResponseWriter, status int) {
		typ := cmp.Or(f.Type, map[int]string{http.StatusTooManyRequests: "rate_limit_error", 529: "overloaded_error"}[status])
		apiError(w, status, typ, fmt.Sprintf("simulated %d", status))
	}) {
		return
	}
	if req.MaxTokens == nil {
		s.Violate("max_tokens_missing", "max_tokens: Field required")
		apiError(w, http.StatusBadRequest, "invalid_request_error", "max_tokens: Field required")
		return
	}
	if refusal := s.check(req); refusal != "" {
		apiError(w, http.StatusBadRequest, "invalid_request_error", refusal)
		return
	}
	reply := s.cfg.Model(req)
	blocks := s.blocksOf(req, reply, seq)
	key := conversationKey(req.Messages)
	s.turns.Said(key, blocks)
	stop := "end_turn"
	if len(reply.Calls) > 0 {
		stop = "tool_use"
	}
	// A prompt cache that grows with the conversation: written the first
	// turn, read after.
	usage := map[string]int{"input_tokens": 10 * len(req.Messages), "output_tokens": len(reply.Content)/4 + 5*len(reply.Calls) + 1,
		"cache_creation_input_tokens": cacheWrite(len(req.Messages)), "cache_read_input_tokens": 100 * (len(req.Messages) - 1)}
	id := fmt.Sprintf("msg_sim%d", seq)
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "type": "message", "role": "assistant", "model": req.Model,
			"content": blocks, "stop_reason": stop, "stop_sequence": nil, "usage": usage})
		s.Delivered(key)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	st := &streamer{Stream: simbase.Stream{W: w, Ctx: r.Context(), Fault: f, Delay: s.cfg.Delay}, wholeCalls: s.cfg.WholeCalls}
	st.event("message_start", map[string]any{"message": map[string]any{"id": id, "type": "message", "role": "assistant", "model": req.Model,
		"content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": map[string]int{"input_tokens": usage["input_tokens"], "output_tokens": 1,
			"cache_creation_input_tokens": usage["cache_creation_input_tokens"], "cache_read_input_tokens": usage["cache_read_input_tokens"]}}})
	for i, raw := range blocks {
		st.block(i, raw)
		if i == 0 {
			st.event("ping", map[string]any{})
		}
	}
	st.event("message_delta", map[string]any{"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]int{"output_tokens": usage["output_tokens"]}})
	st.event("message_stop", map[string]any{})
	if !st.Ended {
		s.Delivered(key)
	}
}

// blocksOf is the assistant content the model's reply makes: a thinking
// block first when the request turns thinking on, its text, then a
// tool_use block per call.
func (s *Sim) blocksOf(req Request, reply simbase.Reply, seq int) []json.RawMessage {
	var out []json.RawMessage
	add := func(v any) {
		raw, _ := json.Marshal(v)
		out = append(out, raw)
	}
	if req.thinking() {
		add(map[string]any{"type": "thinking", "thinking": fmt.Sprintf("Turn %d: which tools answer this?", seq), "signature": fmt.Sprintf("c2lnLXNpbS0%d", seq)})
	}
	if reply.Content != "" {
		add(map[string]any{"type": "text", "text": reply.Content})
	}
	if s.cfg.ServerTool && len(reply.Calls) > 0 {
		id := fmt.Sprintf("srvtoolu_sim%d", seq)
		add(map[string]any{"type": "server_tool_use", "id": id, "name": "web_search", "input": map[string]any{"query": fmt.Sprintf("turn %d", seq)}})
		add(map[string]any{"type": "web_search_tool_result", "tool_use_id": id,
			"content": []any{map[string]any{"type": "web_search_result", "url": "https://example.com/", "title": "Example", "encrypted_content": fmt.Sprintf("ZW5jLXNpbS0%d", seq)}}})
	}
	for i, c := range reply.Calls {
		input := json.RawMessage(c.Args)
		if c.Args == "" {
			input = json.RawMessage("{}")
		}
		add(map[string]any{"type": "tool_use", "id": fmt.Sprintf("toolu_sim%d_%d", seq, i), "name": c.Name, "input": input})
	}
	return out
}

// streamer writes one response's events.
type streamer struct {
	simbase.Stream
	wholeCalls bool
}

// block streams one content block as the API does: its start (a tool_use
// with input {}, text and thinking empty), its deltas, its stop.
func (st *streamer) block(i int, raw json.RawMessage) {
	var b struct {
		Type      string          `json:"type"`
		Text      string          `json:"text"`
		Thinking  string          `json:"thinking"`
		Signature string          `json:"signature"`
		ID        string          `json:"id"`
		Name      string          `json:"name"`
		Input     json.RawMessage `json:"input"`
	}
	_ = json.Unmarshal(raw, &b)
	delta := func(d map[string]any) { st.event("content_block_delta", map[string]any{"index": i, "delta": d}) }
	switch b.Type {
	case "thinking":
		st.event("content_block_start", map[string]any{"index": i, "content_block": map[string]any{"type": "thinking", "thinking": "", "signature": ""}})
		for _, p := range chunk.Pieces(b.Thinking, 12) {
			delta(map[string]any{"type": "thinking_delta", "thinking": p})
		}
		delta(map[string]any{"type": "signature_delta", "signature": b.Signature})
	case "text":
		st.event("content_block_start", map[string]any{"index": i, "content_block": map[string]any{"type": "text", "text": ""}})
		for _, p := range chunk.Pieces(b.Text, 8) {
			delta(map[string]any{"type": "text_delta", "text": p})
		}
	case "tool_use", "server_tool_use":
		if st.wholeCalls && b.Type == "tool_use" {
			st.event("content_block_start", map[string]any{"index": i, "content_block": map[string]any{"type": b.Type, "id": b.ID, "name": b.Name, "input": b.Input}})
			break
		}
		st.event("content_block_start", map[string]any{"index": i, "content_block": map[string]any{"type": b.Type, "id": b.ID, "name": b.Name, "input": map[string]any{}}})
		if in := string(b.Input); in == "{}" {
			delta(map[string]any{"type": "input_json_delta", "partial_json": ""}) // a call without arguments: one empty fragment
		} else {
			for _, p := range chunk.Pieces(in, 7) {
				delta(map[string]any{"type": "input_json_delta", "partial_json": p})
			}
		}
	default: // a block that comes whole in its start (a server tool's result)
		st.event("content_block_start", map[string]any{"index": i, "content_block": raw})
	}
	st.event("content_block_stop", map[string]any{"index": i})
}

// event writes one SSE event, named as its data's type.
func (st *streamer) event(typ string, data map[string]any) {
	if !st.Next(func() {
		et := cmp.Or(st.Fault.ErrorType, "overloaded_error")
		st.Send("error", map[string]any{"type": "error", "error": map[string]any{"type": et, "message": "simulated " + et}})
	}) {
		return
	}
	st.N++
	data["type"] = typ
	st.Send(typ, data)
}

// apiError writes an error in the API's shape.
func apiError(w http.ResponseWriter, status int, typ, msg string) {
	if typ == "" {
		typ = "api_error"
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_sim")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}, "request_id": "req_sim"})
}

// cacheWrite is the prompt cache written by a request of n messages: the
// whole first message, once.
func cacheWrite(n int) int {
	if n == 1 {
		return 100
	}
	return 0
}
