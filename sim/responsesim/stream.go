package responsesim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/projectdavid/toolsidecar/sim/internal/chunk"
	"github.com/projectdavid/toolsidecar/sim/internal/simbase"
)

func (s *Sim) responses(w http.ResponseWriter, r *http.Request) {
	var req Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "could not parse the JSON body of your request: "+err.Error())
		return
	}
	seq, f := s.Begin()
	if f.Answer(w, func(w http.ResponseWriter, status int) { apiError(w, status, http.StatusText(status)) }) {
		return
	}
	if refusal := s.conversation(&req); refusal != "" {
		apiError(w, http.StatusBadRequest, refusal)
		return
	}
	if refusal := s.check(req.Items); refusal != "" {
		apiError(w, http.StatusBadRequest, refusal)
		return
	}
	output := itemsOf(req, s.cfg.Model(req), seq, s.cfg.NoItemIDs)
	conv := key(req.Items)
	id := fmt.Sprintf("resp_sim%d", seq)
	s.turns.Said(conv, output)
	s.mu.Lock()
	if req.stores() {
		s.stored[id] = slices.Concat(req.Items, output)
	}
	s.mu.Unlock()
	resp := map[string]any{"id": id, "object": "response", "created_at": 1700000000, "status": "completed", "model": req.Model,
		"output": output, "error": nil, "incomplete_details": nil, "instructions": req.Instructions, "parallel_tool_calls": true,
		"tool_choice": "auto", "tools": []any{}, "store": req.stores(), "previous_response_id": nilIfEmpty(req.PreviousResponseID),
		"usage": map[string]any{"input_tokens": 10 * len(req.Items), "input_tokens_details": map[string]int{"cached_tokens": 10 * (len(req.Items) - 1)}, // all but the last item cached
			"output_tokens": 5 * len(output), "output_tokens_details": map[string]int{"reasoning_tokens": reasoningTokens(req)}, "total_tokens": 10*len(req.Items) + 5*len(output)}}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
		s.Delivered(conv)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	st := &streamer{Stream: simbase.Stream{W: w, Ctx: r.Context(), Fault: f, Delay: s.cfg.Delay}, droppedDeltas: s.cfg.DroppedDeltas}
	begun := map[string]any{}
	for k, v := range resp {
		begun[k] = v
	}
	begun["status"], begun["output"], begun["usage"] = "in_progress", []any{}, nil
	st.event("response.created", map[string]any{"response": begun})
	st.event("response.in_progress", map[string]any{"response": begun})
	for i, raw := range output {
		st.item(i, raw)
	}
	st.event("response.completed", map[string]any{"response": resp})
	if !st.Ended {
		s.Delivered(conv)
	}
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// itemsOf is the output the model's reply makes: a reasoning item first
// when the request asks for reasoning (its encrypted_content when the
// request includes it), a message with the text, then a function_call
// item per call.
func itemsOf(req Request, reply simbase.Reply, seq int, noIDs bool) []json.RawMessage {
	var out []json.RawMessage
	add := func(v any) {
		raw, _ := json.Marshal(v)
		out = append(out, raw)
	}
	if req.reasons() {
		rs := map[string]any{"type": "reasoning", "id": fmt.Sprintf("rs_sim%d", seq), "summary": []any{map[string]any{"type": "summary_text", "text": "Which tools answer this?"}}}
		if slices.Contains(req.Include, "reasoning.encrypted_content") {
			rs["encrypted_content"] = fmt.Sprintf("ZW5jLXNpbS0%d", seq)
		}
		add(rs)
	}
	if reply.Content != "" {
		add(map[string]any{"type": "message", "id": fmt.Sprintf("msg_sim%d", seq), "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": reply.Content, "annotations": []any{}}}})
	}
	for i, c := range reply.Calls {
		args := c.Args
		if args == "" {
			args = "{}"
		}
		fc := map[string]any{"type": "function_call", "id": fmt.Sprintf("fc_sim%d_%d", seq, i), "call_id": fmt.Sprintf("call_sim%d_%d", seq, i),
			"name": c.Name, "arguments": args, "status": "completed"}
		if noIDs {
			delete(fc, "id")
		}
		add(fc)
	}
	return out
}

// streamer writes one response's events, numbered from 0.
type streamer struct {
	simbase.Stream
	droppedDeltas bool
}

// item streams one output item: added, its content as deltas, done.
func (st *streamer) item(i int, raw json.RawMessage) {
	var it map[string]any
	_ = json.Unmarshal(raw, &it)
	id, _ := it["id"].(string)
	begun := map[string]any{}
	for k, v := range it {
		begun[k] = v
	}
	begun["status"] = "in_progress"
	switch it["type"] {
	case "message":
		begun["content"] = []any{}
	case "function_call":
		begun["arguments"] = ""
	}
	st.event("response.output_item.added", map[string]any{"output_index": i, "item": begun})
	switch it["type"] {
	case "message":
		text := parse(raw).text()
		part := map[string]any{"type": "output_text", "text": "", "annotations": []any{}}
		st.event("response.content_part.added", map[string]any{"item_id": id, "output_index": i, "content_index": 0, "part": part})
		for _, p := range chunk.Pieces(text, 8) {
			st.event("response.output_text.delta", map[string]any{"item_id": id, "output_index": i, "content_index": 0, "delta": p, "logprobs": []any{}})
		}
		st.event("response.output_text.done", map[string]any{"item_id": id, "output_index": i, "content_index": 0, "text": text, "logprobs": []any{}})
		st.event("response.content_part.done", map[string]any{"item_id": id, "output_index": i, "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": text, "annotations": []any{}}})
	case "function_call":
		args, _ := it["arguments"].(string)
		for k, p := range chunk.Pieces(args, 7) {
			if k > 0 && st.droppedDeltas {
				break
			}
			st.event("response.function_call_arguments.delta", map[string]any{"item_id": id, "output_index": i, "delta": p})
		}
		st.event("response.function_call_arguments.done", map[string]any{"item_id": id, "output_index": i, "name": it["name"], "arguments": args})
	}
	st.event("response.output_item.done", map[string]any{"output_index": i, "item": it})
}

// event writes one SSE event, named as its data's type, with its
// sequence_number.
func (st *streamer) event(typ string, data map[string]any) {
	if !st.Next(func() {
		st.Send("error", map[string]any{"type": "error", "sequence_number": st.N,
			"error": map[string]any{"type": "server_error", "code": "server_error", "message": st.Fault.ErrorMessage, "param": nil}})
	}) {
		return
	}
	data["type"], data["sequence_number"] = typ, st.N
	st.N++
	st.Send(typ, data)
}

// apiError writes an error in the API's shape.
func apiError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "param": "input", "code": nil}})
}

// reasoningTokens is the output's reasoning part: 3 tokens when the
// request asks for reasoning.
func reasoningTokens(req Request) int {
	if req.reasons() {
		return 3
	}
	return 0
}
