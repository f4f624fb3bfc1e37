package openaisim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/projectdavid/toolsidecar/sim/internal/chunk"
)

func (s *Sim) completions(w http.ResponseWriter, r *http.Request) {
	var req Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "could not parse the JSON body of your request: "+err.Error())
		return
	}
	seq, f := s.Begin()
	s.mu.Lock()
	s.auth = append(s.auth, r.Header.Get("Authorization"))
	s.mu.Unlock()
	if f.Answer(w, func(w http.ResponseWriter, status int) { apiError(w, status, http.StatusText(status)) }) {
		return
	}
	if refusal := s.check(req.Messages); refusal != "" {
		apiError(w, http.StatusBadRequest, refusal)
		return
	}
	if !req.Stream {
		apiError(w, http.StatusBadRequest, "the simulator answers streams only")
		return
	}
	if req.StreamOptions != nil && !req.StreamOptions.IncludeUsage {
		s.Violate("usage_not_asked", "stream_options without include_usage")
	}
	reply := s.cfg.Model(req)
	calls := make([]sentCall, len(reply.Calls))
	for i, c := range reply.Calls {
		calls[i] = sentCall{name: c.Name, args: c.Args}
		if !s.cfg.NoIDs {
			calls[i].id = fmt.Sprintf("call_%d_%d", seq, i)
		}
	}
	s.mu.Lock()
	key := conversationKey(req.Messages)
	s.said[key] = append(s.said[key], said{content: reply.Content, calls: calls})
	s.mu.Unlock()

	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	st := &streamer{w: w, id: fmt.Sprintf("chatcmpl-sim%d", seq), model: req.Model, delay: s.cfg.Delay, perChunkID: s.cfg.Profile == LiteLLM}
	if f != nil {
		st.fault = f
	}
	st.ctx = r.Context()
	st.send(map[string]any{"role": "assistant", "content": ""}, nil)
	for _, piece := range chunk.Pieces(reply.Content, 8) {
		st.send(map[string]any{"content": piece}, nil)
	}
	s.streamCalls(st, calls)
	finish := "stop"
	if len(calls) > 0 {
		finish = "tool_calls"
	}
	st.send(map[string]any{}, &finish)
	s.mu.Lock()
	s.finished = append(s.finished, time.Now())
	s.mu.Unlock()
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		prompt := int64(10 * len(req.Messages))
		completion := int64(len(reply.Content)/4 + 5*len(calls) + 1)
		st.write(map[string]any{"id": st.chunkID(), "object": "chat.completion.chunk", "created": 1700000000, "model": req.Model,
			"choices": []any{}, "usage": map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
				"prompt_tokens_details":     map[string]int64{"cached_tokens": prompt - 10}, // all but the last message cached
				"completion_tokens_details": map[string]int64{"reasoning_tokens": 2}}})
	}
	s.Delivered(key) // delivered whole: no fault past this point
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
	st.flush()
}

// streamCalls streams the turn's calls as the profile's server does.
func (s *Sim) streamCalls(st *streamer, calls []sentCall) {
	index := func(i int) int {
		if s.cfg.NegativeIndex && len(calls) == 1 {
			return -1
		}
		return i
	}
	head := func(i int, c sentCall, withArgs bool) map[string]any {
		fn := map[string]any{"name": c.name}
		if withArgs {
			fn["arguments"] = ""
		}
		d := map[string]any{"index": index(i), "type": "function", "function": fn}
		if c.id != "" {
			d["id"] = c.id
		}
		return d
	}
	frag := func(i int, c sentCall, piece string) map[string]any {
		d := map[string]any{"index": index(i), "function": map[string]any{"arguments": piece}}
		if s.cfg.Profile == LiteLLM && c.id != "" {
			d["id"], d["type"] = c.id, "function"
		}
		return d
	}
	whole := func(i int, c sentCall) map[string]any {
		d := head(i, c, false)
		d["function"] = map[string]any{"name": c.name, "arguments": c.args}
		return d
	}
	calls1 := func(d map[string]any) { st.send(map[string]any{"tool_calls": []any{d}}, nil) }
	switch s.cfg.Profile {
	case Ollama:
		all := make([]any, len(calls))
		for i, c := range calls {
			d := whole(i, c)
			d["index"] = 0
			all[i] = d
		}
		if len(all) > 0 {
			st.send(map[string]any{"tool_calls": all}, nil)
		}
	case LlamaCpp:
		frags := make([][]string, len(calls))
		for i, c := range calls {
			calls1(head(i, c, true))
			frags[i] = chunk.Pieces(c.args, 5)
		}
		for k := 0; ; k++ {
			sent := false
			for i, c := range calls {
				if k < len(frags[i]) {
					calls1(frag(i, c, frags[i][k]))
					sent = true
				}
			}
			if !sent {
				break
			}
		}
	default: // OpenAI, VLLM, LiteLLM: one call after the other
		for i, c := range calls {
			calls1(head(i, c, s.cfg.Profile != VLLM))
			for _, p := range chunk.Pieces(c.args, 7) {
				calls1(frag(i, c, p))
			}
			if s.cfg.Profile == LiteLLM {
				calls1(whole(i, c)) // its summary chunk
			}
		}
	}
}

// streamer writes one response's chunks.
type streamer struct {
	w          http.ResponseWriter
	id, model  string
	delay      time.Duration
	perChunkID bool
	n          int
	fault      *Fault
	ctx        context.Context
}

func (st *streamer) chunkID() string {
	if st.perChunkID {
		return st.id + "-" + strconv.Itoa(st.n)
	}
	return st.id
}

func (st *streamer) send(delta map[string]any, finish *string) {
	st.write(map[string]any{"id": st.chunkID(), "object": "chat.completion.chunk", "created": 1700000000, "model": st.model,
		"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": nil}}, "usage": nil})
}

func (st *streamer) write(v any) {
	st.fault.Interrupt(st.ctx, st.n, st.flush, func() {
		b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": st.fault.ErrorMessage, "type": "server_error", "param": nil, "code": nil}})
		_, _ = fmt.Fprintf(st.w, "data: %s\n\n", b)
	})
	if st.delay > 0 {
		time.Sleep(st.delay)
	}
	st.n++
	data, _ := json.Marshal(v)
	_, _ = fmt.Fprintf(st.w, "data: %s\n\n", data)
	st.flush()
}

func (st *streamer) flush() { _ = http.NewResponseController(st.w).Flush() }

func apiError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "param": nil, "code": nil}})
}
