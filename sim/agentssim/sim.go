// Package agentssim is an OpenAI Agents API server (OpenAI-Beta:
// agents=v1) for tests and the demo: hosted sessions whose scripted model
// parks on client function tools (../shared/reference/hosted-agents.md,
// part A), events streamed without replay, faults on demand, and a
// contract log of what the API would refuse or what a client must never
// do: a result of the wrong kind, a second different answer for a call, a
// result for a call that is not pending, a request without the beta
// header.
//
// A session's input is a simbase script: each round is one block of the
// turn (its calls listed in required_actions at once); the turn ends with
// the answer and the last round's results. "fail_after": n fails the
// session once n rounds are answered.
//
// It shares no code with the sidecar's adapter (package agentsup), so
// that each checks the other.
package agentssim

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/sim/internal/simbase"
)

// Beta is the header every request must carry.
const Beta = "agents=v1"

// Config configures the simulator.
type Config struct {
	// RaceRejects is how many result posts of each session are refused
	// with 400 "Unknown pending tool call: <id>" although the call is
	// pending: the race between item.added and required_actions.
	RaceRejects int
	// Duplicate delivers every streamed event twice.
	Duplicate bool
	// Delay is the wait before each streamed event.
	Delay time.Duration
	// Script is what the model does with an input that is not a script
	// (a person's question): "toolsidecar sim openai-agents" plays its
	// scenario so. Without rounds, such an input is answered at once.
	Script simbase.Script
}

// Fault is what the next result post (POST .../events carrying results)
// gets instead of its answer: Status with RetryAfter.
type Fault = simbase.Fault

// Violation is an entry of the contract log.
type Violation = simbase.Violation

// Sim is the simulator; it is an http.Handler.
type Sim struct {
	simbase.Base[Fault]
	cfg Config

	mu       sync.Mutex
	sessions map[string]*session
	seq      int
	cuts     simbase.Cuts
}

// New builds a simulator.
func New(cfg Config) *Sim {
	s := &Sim{cfg: cfg, sessions: map[string]*session{}}
	s.Route("POST /v1/agents/sessions", s.create)
	s.Route("GET /v1/agents/sessions/{id}", s.get)
	s.Route("DELETE /v1/agents/sessions/{id}", s.remove)
	s.Route("GET /v1/agents/sessions/{id}/events", s.stream)
	s.Route("POST /v1/agents/sessions/{id}/events", s.post)
	s.Route("GET /_sim/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		session, ok := s.Session(r.PathValue("id"))
		simbase.ServeSession(w, session, ok)
	})
	return s
}

// CutStream makes the next stream opened end, cut, after n events.
func (s *Sim) CutStream(n int) { s.cuts.Add(n) }

// action is a pending function call.
type action struct {
	Type      string          `json:"type"`
	TurnID    string          `json:"turn_id"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// session is one hosted session.
type session struct {
	id, owner string
	created   int64
	status    string // idle | in_progress | requires_action | failed
	deleted   bool
	script    simbase.Script
	failAfter int // rounds answered before the session fails; 0: never
	round     int
	turns     int
	turnID    string
	pending   []action
	results   []string // the round's outputs, in call order
	answers   simbase.Answers
	race      int               // race rejections left
	idem      map[string]string // Idempotency-Key -> body digest
	feed      simbase.Feed
	final     string // the last answer
	eventSeq  int
}

// emit sends an event to every open stream. s.mu is held.
func (s *Sim) emit(ss *session, ev map[string]any) {
	ss.eventSeq++
	ev["event_id"] = fmt.Sprintf("evt_%s_%d", ss.id, ss.eventSeq)
	raw, _ := json.Marshal(ev)
	ss.feed.Send("", raw) // whether the API names its events is unverified: the sidecar must not need it
}

func (ss *session) snapshot() map[string]any {
	acts := ss.pending
	if acts == nil {
		acts = []action{}
	}
	var errv any
	if ss.status == "failed" {
		errv = map[string]any{"code": "server_error", "message": "the session failed"}
	}
	return map[string]any{"id": ss.id, "object": "agent.session", "status": ss.status, "created_at": ss.created,
		"last_active_at": time.Now().Unix(), "error": errv, "metadata": map[string]any{}, "environment": map[string]any{"type": "none"},
		"required_actions": acts}
}

// apiError answers as the API does.
func apiError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"type": typ, "code": nil, "message": msg, "param": nil}})
}

// admit checks the headers every request needs, and finds the caller's
// session: another caller's is not found.
func (s *Sim) admit(w http.ResponseWriter, r *http.Request, id string) (*session, bool) {
	if r.Header.Get("OpenAI-Beta") != Beta {
		s.Violate("missing_beta_header", "%s %s without OpenAI-Beta: %s", r.Method, r.URL.Path, Beta)
		apiError(w, http.StatusBadRequest, "invalid_request_error", "the Agents API requires the OpenAI-Beta: agents=v1 header")
		return nil, false
	}
	if r.Header.Get("Authorization") == "" {
		apiError(w, http.StatusUnauthorized, "invalid_request_error", "You didn't provide an API key.")
		return nil, false
	}
	if id == "" {
		return nil, true
	}
	s.mu.Lock()
	ss, ok := s.sessions[id]
	s.mu.Unlock()
	if !ok || ss.owner != r.Header.Get("Authorization") || ss.deleted {
		apiError(w, http.StatusNotFound, "invalid_request_error", "No session found with id '"+id+"'.")
		return nil, false
	}
	return ss, true
}

func (s *Sim) create(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.admit(w, r, ""); !ok {
		return
	}
	var body struct {
		Agent *struct {
			Model string `json:"model"`
		} `json:"agent"`
		AgentID     string          `json:"agent_id"`
		Environment json.RawMessage `json:"environment"`
		Input       json.RawMessage `json:"input"`
		Stream      bool            `json:"stream"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		apiError(w, http.StatusBadRequest, "invalid_request_error", "could not parse the JSON body: "+err.Error())
		return
	}
	if len(body.Environment) == 0 {
		apiError(w, http.StatusBadRequest, "invalid_request_error", "Missing required parameter: 'environment'.")
		return
	}
	if body.AgentID == "" && (body.Agent == nil || body.Agent.Model == "") {
		apiError(w, http.StatusBadRequest, "invalid_request_error", "Missing required parameter: 'agent.model'.")
		return
	}
	var input string
	_ = json.Unmarshal(body.Input, &input)
	s.mu.Lock()
	s.seq++
	ss := &session{id: fmt.Sprintf("sess_%d", s.seq), owner: r.Header.Get("Authorization"), created: time.Now().Unix(), status: "idle",
		race: s.cfg.RaceRejects,
		idem: map[string]string{}}
	s.sessions[ss.id] = ss
	if body.Stream {
		// 201 with the session's events from its creation, until its turn
		// blocks or ends.
		sub := ss.feed.Open()
		s.emit(ss, map[string]any{"type": "agent.session.created", "session": ss.snapshot()})
		s.startTurn(ss, input)
		s.mu.Unlock()
		ss.feed.Stream(w, r, &s.mu, sub, simbase.StreamOptions{Duplicate: s.cfg.Duplicate, Delay: s.cfg.Delay, Cut: -1, Until: func(frame []byte) bool {
			return bytes.Contains(frame, []byte(`"type":"agent.session.requires_action"`)) || bytes.Contains(frame, []byte(`"type":"agent.session.idle"`)) ||
				bytes.Contains(frame, []byte(`"type":"agent.session.failed"`))
		}}, http.StatusCreated)
		return
	}
	if input != "" {
		s.startTurn(ss, input)
	}
	snap := ss.snapshot()
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(snap)
}

// startTurn begins a turn with the user's input. s.mu is held.
func (s *Sim) startTurn(ss *session, input string) {
	var extra struct {
		FailAfter int `json:"fail_after"`
	}
	var ok bool
	if ss.script, ok = simbase.ParseScript(input); !ok {
		ss.script = s.cfg.Script
	}
	_ = json.Unmarshal([]byte(input), &extra)
	ss.failAfter, ss.round, ss.results = extra.FailAfter, 0, nil
	ss.turns++
	ss.turnID = fmt.Sprintf("turn_%d", ss.turns)
	ss.status = "in_progress"
	s.emit(ss, map[string]any{"type": "agent.session.turn.created", "session_id": ss.id, "turn_id": ss.turnID,
		"turn": map[string]any{"id": ss.turnID, "status": "in_progress"}})
	s.emit(ss, map[string]any{"type": "agent.session.in_progress", "session": ss.snapshot()})
	s.advance(ss)
}

// advance makes the turn's next block, or ends it. s.mu is held.
func (s *Sim) advance(ss *session) {
	if ss.failAfter > 0 && ss.round >= ss.failAfter {
		ss.status, ss.pending = "failed", nil
		s.emit(ss, map[string]any{"type": "agent.session.turn.failed", "session_id": ss.id, "turn_id": ss.turnID, "usage": nil,
			"turn": map[string]any{"id": ss.turnID, "status": "failed", "error": map[string]any{"code": "server_error", "message": "scripted failure"}}})
		s.emit(ss, map[string]any{"type": "agent.session.failed", "session": ss.snapshot()})
		return
	}
	reply := ss.script.Reply(ss.round, ss.results)
	if len(reply.Calls) == 0 {
		ss.final = reply.Content
		s.emit(ss, map[string]any{"type": "agent.session.turn.item.done", "session_id": ss.id, "turn_id": ss.turnID, "output_index": 0,
			"item": map[string]any{"type": "message", "id": "msg_" + ss.turnID, "role": "assistant", "status": "completed",
				"content": []any{map[string]any{"type": "output_text", "text": reply.Content}}}})
		s.emit(ss, map[string]any{"type": "agent.session.turn.completed", "session_id": ss.id, "turn_id": ss.turnID, "usage": nil,
			"turn": map[string]any{"id": ss.turnID, "status": "completed"}})
		ss.status = "idle"
		s.emit(ss, map[string]any{"type": "agent.session.idle", "session": ss.snapshot()})
		return
	}
	ss.pending, ss.results = nil, make([]string, len(reply.Calls))
	for i, c := range reply.Calls {
		args := json.RawMessage(c.Args)
		if c.Args == "" || !json.Valid(args) {
			args = json.RawMessage("{}")
		}
		a := action{Type: "function_call", TurnID: ss.turnID, CallID: fmt.Sprintf("call_%s_%d_%d", ss.turnID, ss.round, i), Name: c.Name, Arguments: args}
		ss.pending = append(ss.pending, a)
		s.emit(ss, map[string]any{"type": "agent.session.turn.item.added", "session_id": ss.id, "turn_id": ss.turnID, "output_index": i + 1,
			"item": map[string]any{"type": "function_call", "id": "fc_" + a.CallID, "call_id": a.CallID, "name": a.Name, "arguments": args,
				"status": "in_progress", "turn_id": ss.turnID}})
	}
	ss.answers.Blocked()
	ss.status = "requires_action"
	s.emit(ss, map[string]any{"type": "agent.session.requires_action", "session": ss.snapshot()})
}

func (s *Sim) get(w http.ResponseWriter, r *http.Request) {
	ss, ok := s.admit(w, r, r.PathValue("id"))
	if !ok {
		return
	}
	s.mu.Lock()
	snap := ss.snapshot()
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(snap)
}

func (s *Sim) remove(w http.ResponseWriter, r *http.Request) {
	ss, ok := s.admit(w, r, r.PathValue("id"))
	if !ok {
		return
	}
	s.mu.Lock()
	ss.deleted = true
	ss.feed.End()
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"id": ss.id, "object": "agent.session.deleted", "deleted": true})
}

// stream serves the session's events from now on: no replay.
func (s *Sim) stream(w http.ResponseWriter, r *http.Request) {
	ss, ok := s.admit(w, r, r.PathValue("id"))
	if !ok {
		return
	}
	cut := s.cuts.Take()
	ss.feed.Serve(w, r, &s.mu, simbase.StreamOptions{Cut: cut, Duplicate: s.cfg.Duplicate, Delay: s.cfg.Delay})
}

// input is an event a client posts.
type input struct {
	Type    string           `json:"type"`
	TurnID  string           `json:"turn_id"`
	CallID  string           `json:"call_id"`
	Success *bool            `json:"success"`
	Output  json.RawMessage  `json:"output"`
	Error   *json.RawMessage `json:"error"`
	Content json.RawMessage  `json:"content"`
}

func (s *Sim) post(w http.ResponseWriter, r *http.Request) {
	ss, ok := s.admit(w, r, r.PathValue("id"))
	if !ok {
		return
	}
	var body struct {
		Events []json.RawMessage `json:"events"`
	}
	raw, err := io.ReadAll(r.Body)
	if err == nil {
		err = json.Unmarshal(raw, &body)
	}
	if err != nil || len(body.Events) == 0 {
		apiError(w, http.StatusBadRequest, "invalid_request_error", "events must be a non-empty array")
		return
	}
	ins := make([]input, len(body.Events))
	results := 0
	for i, ev := range body.Events {
		if err := json.Unmarshal(ev, &ins[i]); err != nil {
			apiError(w, http.StatusBadRequest, "invalid_request_error", fmt.Sprintf("events[%d]: %v", i, err))
			return
		}
		if ins[i].Type == "agent.session.input.tool_result" {
			results++
		}
	}
	if results > 0 {
		if _, f := s.Begin(); f.Answer(w, func(w http.ResponseWriter, status int) {
			apiError(w, status, "server_error", http.StatusText(status))
		}) {
			return
		}
	}
	sum := sha256.Sum256(raw)
	digest := hex.EncodeToString(sum[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	key := r.Header.Get("Idempotency-Key")
	if key != "" {
		if prev, seen := ss.idem[key]; seen {
			if prev != digest {
				s.Violate("idempotency_key_reused", "Idempotency-Key %s sent again with another body", key)
				apiError(w, http.StatusConflict, "invalid_request_error", "Idempotency-Key reused with another request")
				return
			}
			w.WriteHeader(http.StatusAccepted) // the first request's effect, not applied again
			return
		}
	}
	if msg, status := s.check(ss, ins); msg != "" {
		apiError(w, status, "invalid_request_error", msg)
		return
	}
	if key != "" {
		ss.idem[key] = digest
	}
	if results > 0 {
		ss.answers.Posted(results)
	}
	for _, in := range ins {
		switch in.Type {
		case "agent.session.input.tool_result":
			ss.answers.Take(in.CallID, answerOf(in))
			for i, a := range ss.pending {
				if a.CallID == in.CallID {
					ss.results[callIndex(a.CallID)] = resultText(in)
					ss.pending = append(ss.pending[:i:i], ss.pending[i+1:]...)
					break
				}
			}
		case "agent.session.input.cancel":
			s.cancel(ss)
		case "agent.session.input.message":
			var text string
			_ = json.Unmarshal(in.Content, &text)
			s.startTurn(ss, text)
		}
	}
	if results > 0 && len(ss.pending) == 0 && ss.status == "requires_action" {
		ss.round++
		ss.status = "in_progress"
		s.emit(ss, map[string]any{"type": "agent.session.in_progress", "session": ss.snapshot()})
		s.advance(ss)
	}
	w.WriteHeader(http.StatusAccepted)
}

// check applies the API's rules to a post's events; s.mu is held. It
// returns the refusal's message and status, "" when none.
func (s *Sim) check(ss *session, ins []input) (string, int) {
	pending := map[string]action{}
	for _, a := range ss.pending {
		pending[a.CallID] = a
	}
	for _, in := range ins {
		switch in.Type {
		case "agent.session.input.tool_result":
			if in.TurnID == "" || in.CallID == "" || in.Success == nil {
				s.Violate("bad_result", "a tool_result without turn_id, call_id or success: %+v", in)
				return "turn_id, call_id and success are required", http.StatusBadRequest
			}
			if refusal := ss.answers.Check(s, in.CallID, answerOf(in)); refusal != "" {
				return refusal, http.StatusConflict
			}
			a, ok := pending[in.CallID]
			if !ok || a.TurnID != in.TurnID {
				s.Violate("unknown_call", "a result for %s/%s, which is not pending", in.TurnID, in.CallID)
				return "Unknown pending tool call: " + in.CallID, http.StatusBadRequest
			}
			if ss.race > 0 {
				ss.race--
				return "Unknown pending tool call: " + in.CallID, http.StatusBadRequest
			}
		case "agent.session.input.cancel", "agent.session.input.message":
		default:
			s.Violate("wrong_result_kind", "an input event of type %q", in.Type)
			return "unknown event type " + in.Type, http.StatusBadRequest
		}
	}
	return "", 0
}

// cancel ends the turn in progress: its pending calls are void. s.mu is held.
func (s *Sim) cancel(ss *session) {
	if ss.status != "requires_action" && ss.status != "in_progress" {
		return
	}
	for _, a := range ss.pending {
		ss.answers.Void(a.CallID)
	}
	ss.pending = nil
	s.emit(ss, map[string]any{"type": "agent.session.turn.cancelled", "session_id": ss.id, "turn_id": ss.turnID, "usage": nil,
		"turn": map[string]any{"id": ss.turnID, "status": "cancelled"}})
	ss.status = "idle"
	s.emit(ss, map[string]any{"type": "agent.session.idle", "session": ss.snapshot()})
}

// Cancel cancels a session's turn, as the application's own cancel does.
func (s *Sim) Cancel(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss, ok := s.sessions[id]; ok {
		s.cancel(ss)
	}
}

// Fail fails a session.
func (s *Sim) Fail(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss, ok := s.sessions[id]; ok {
		ss.status, ss.pending = "failed", nil
		s.emit(ss, map[string]any{"type": "agent.session.failed", "session": ss.snapshot()})
	}
}

func answerOf(in input) string {
	b, _ := json.Marshal([]any{in.Success, in.Output, in.Error})
	return string(b)
}

// resultText is a result as the model reads it.
func resultText(in input) string {
	if in.Success != nil && !*in.Success && in.Error != nil {
		var e string
		_ = json.Unmarshal(*in.Error, &e)
		return "error: " + e
	}
	var out string
	if json.Unmarshal(in.Output, &out) == nil {
		return out
	}
	return string(in.Output)
}

// callIndex is a call's position in its round, from its id.
func callIndex(id string) int {
	var i int
	if k := strings.LastIndexByte(id, '_'); k >= 0 {
		_, _ = fmt.Sscan(id[k+1:], &i)
	}
	return i
}

// Session is what a test reads of a session.
type Session = simbase.Session

// Sessions lists the sessions' ids.
func (s *Sim) Sessions() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.sessions))
}

// Session reads a session.
func (s *Sim) Session(id string) (Session, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.sessions[id]
	if !ok {
		return Session{}, false
	}
	var pending []string
	for _, a := range ss.pending {
		pending = append(pending, a.CallID)
	}
	v := ss.answers.View(ss.status, pending, ss.final, ss.turns)
	v.Streams = ss.feed.Opened()
	return v, true
}
