// Package managedsim is an Anthropic Managed Agents server
// (anthropic-beta: managed-agents-2026-04-01) for tests and the demo:
// agents with custom tools, sessions whose scripted model parks on them
// (agent.custom_tool_use events, then session.status_idle with
// stop_reason requires_action and the blocking event_ids), the history as
// a list, a stream without replay, faults on demand, and a contract log
// (../shared/reference/hosted-agents.md, part B): a missing beta or
// version header, a result of the wrong kind (user.tool_result for a
// custom call), a second different answer, a result for an unknown or
// cancelled call, a session_thread_id not echoed.
//
// A session's first user.message is a simbase script: each round is one
// block; "fail_after": n terminates the session once n rounds are
// answered; "threads": true puts a session_thread_id on every call. A
// call named "server:<name>" is a server tool whose permission policy
// evaluated to ask: an agent.tool_use with evaluated_permission "ask" in
// the block, answered by user.tool_confirmation (allow, or deny with an
// optional deny_message).
//
// It shares no code with the sidecar's adapter (package agentsup), so
// that each checks the other.
package managedsim

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/sim/internal/simbase"
)

// The headers every request must carry: the beta among anthropic-beta's
// list, and an anthropic-version (the reference's clients send
// 2023-06-01; @anthropic-ai/sdk 1.17 sends a later date).
const (
	Beta    = "managed-agents-2026-04-01"
	Version = "2023-06-01"
)

// Config configures the simulator.
type Config struct {
	// Duplicate delivers every streamed event twice.
	Duplicate bool
	// Delay is the wait before each streamed event.
	Delay time.Duration
	// Script is what the model does with a message that is not a script
	// (a person's question): "toolsidecar sim anthropic-agents" plays its
	// scenario so. Without rounds, such a message is answered at once.
	Script simbase.Script
}

// Fault is what the next result post gets instead of its answer: Status
// (429 rate_limit_error, 529 overloaded_error, 5xx api_error) with
// RetryAfter.
type Fault = simbase.Fault

// Violation is an entry of the contract log.
type Violation = simbase.Violation

// Sim is the simulator; it is an http.Handler.
type Sim struct {
	simbase.Base[Fault]
	cfg Config

	mu       sync.Mutex
	agents   map[string]string // agent id -> its owner's key
	sessions map[string]*session
	seq      int
	cuts     simbase.Cuts
}

// New builds a simulator.
func New(cfg Config) *Sim {
	s := &Sim{cfg: cfg, agents: map[string]string{}, sessions: map[string]*session{}}
	s.Route("POST /v1/agents", s.createAgent)
	s.Route("POST /v1/sessions", s.create)
	s.Route("GET /v1/sessions/{id}", s.get)
	s.Route("GET /v1/sessions/{id}/events", s.list)
	s.Route("GET /v1/sessions/{id}/events/stream", s.stream)
	s.Route("POST /v1/sessions/{id}/events", s.post)
	s.Route("GET /_sim/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		session, ok := s.Session(r.PathValue("id"))
		simbase.ServeSession(w, session, ok)
	})
	return s
}

// CutStream makes the next stream opened end, cut, after n events.
func (s *Sim) CutStream(n int) { s.cuts.Add(n) }

type call struct {
	id, name, thread string
	confirm          bool // an ask-gated agent.tool_use: answered by user.tool_confirmation
}

type session struct {
	id, owner string
	status    string // idle | running | terminated
	script    simbase.Script
	failAfter int
	threads   bool
	round     int
	pending   []call // the block's calls not answered
	block     []call // the block's calls, in order
	results   map[string]string
	answers   simbase.Answers
	events    []json.RawMessage // persisted, in order
	feed      simbase.Feed
	final     string
	turns     int
}

func apiError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}, "request_id": "req_sim"})
}

// admit checks the headers every request needs, and finds the caller's
// session (another caller's is not found).
func (s *Sim) admit(w http.ResponseWriter, r *http.Request, id string) (*session, bool) {
	if !slices.Contains(strings.Split(strings.ReplaceAll(r.Header.Get("anthropic-beta"), " ", ""), ","), Beta) || r.Header.Get("anthropic-version") == "" {
		s.Violate("missing_beta_header", "%s %s with anthropic-beta %q and anthropic-version %q", r.Method, r.URL.Path,
			r.Header.Get("anthropic-beta"), r.Header.Get("anthropic-version"))
		apiError(w, http.StatusBadRequest, "invalid_request_error", "managed agents require anthropic-beta: "+Beta)
		return nil, false
	}
	if credential(r) == "" {
		apiError(w, http.StatusUnauthorized, "authentication_error", "x-api-key header is required")
		return nil, false
	}
	if id == "" {
		return nil, true
	}
	s.mu.Lock()
	ss, ok := s.sessions[id]
	s.mu.Unlock()
	if !ok || ss.owner != credential(r) {
		apiError(w, http.StatusNotFound, "not_found_error", "session "+id+" not found")
		return nil, false
	}
	return ss, true
}

// credential is the request's key: x-api-key, or a bearer token
// (@anthropic-ai/sdk 1.17 sends its apiKey so).
func credential(r *http.Request) string {
	if k := r.Header.Get("x-api-key"); k != "" {
		return k
	}
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
}

func (s *Sim) createAgent(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.admit(w, r, ""); !ok {
		return
	}
	var body struct {
		Name  string `json:"name"`
		Model string `json:"model"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Model == "" {
		apiError(w, http.StatusBadRequest, "invalid_request_error", "model is required")
		return
	}
	s.mu.Lock()
	s.seq++
	id := fmt.Sprintf("agent_%d", s.seq)
	s.agents[id] = credential(r)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "type": "agent", "name": body.Name, "model": body.Model})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// userEvent is an event a client posts.
type userEvent struct {
	Type            string          `json:"type"`
	Content         json.RawMessage `json:"content"`
	CustomToolUseID string          `json:"custom_tool_use_id"`
	ToolUseID       string          `json:"tool_use_id"`
	IsError         bool            `json:"is_error"`
	SessionThreadID string          `json:"session_thread_id"`
	Result          string          `json:"result"`       // user.tool_confirmation: allow | deny
	DenyMessage     *string         `json:"deny_message"` // with deny only
}

func (s *Sim) create(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.admit(w, r, ""); !ok {
		return
	}
	var body struct {
		Agent         json.RawMessage `json:"agent"`
		InitialEvents []userEvent     `json:"initial_events"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		apiError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	var agent string
	if json.Unmarshal(body.Agent, &agent) != nil {
		var o struct{ ID string }
		_ = json.Unmarshal(body.Agent, &o)
		agent = o.ID
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if owner, ok := s.agents[agent]; !ok || owner != credential(r) {
		apiError(w, http.StatusNotFound, "not_found_error", "agent "+agent+" not found")
		return
	}
	s.seq++
	ss := &session{id: fmt.Sprintf("sesn_%d", s.seq), owner: credential(r), status: "idle"}
	s.sessions[ss.id] = ss
	for _, e := range body.InitialEvents {
		if e.Type == "user.message" {
			s.persist(ss, map[string]any{"type": "user.message", "content": e.Content})
			s.startTurn(ss, text(e.Content))
		}
	}
	writeJSON(w, http.StatusOK, ss.object())
}

func (ss *session) object() map[string]any {
	return map[string]any{"id": ss.id, "type": "session", "status": ss.status, "agent": map[string]any{"type": "agent"}}
}

// text is the text of a message's content: a string or text blocks.
func text(content json.RawMessage) string {
	var str string
	if json.Unmarshal(content, &str) == nil {
		return str
	}
	var blocks []struct{ Type, Text string }
	_ = json.Unmarshal(content, &blocks)
	out := ""
	for _, b := range blocks {
		out += b.Text
	}
	return out
}

// persist stamps an event with its id and time, keeps it in the history
// and streams it. s.mu is held.
func (s *Sim) persist(ss *session, ev map[string]any) map[string]any {
	s.seq++
	ev["id"] = fmt.Sprintf("sevt_%d", s.seq)
	ev["processed_at"] = time.Now().UTC().Format(time.RFC3339Nano)
	raw, _ := json.Marshal(ev)
	ss.events = append(ss.events, raw)
	ss.feed.Send(ev["type"].(string), raw)
	return ev
}

func (s *Sim) startTurn(ss *session, input string) {
	var extra struct {
		FailAfter int  `json:"fail_after"`
		Threads   bool `json:"threads"`
	}
	var ok bool
	if ss.script, ok = simbase.ParseScript(input); !ok {
		ss.script = s.cfg.Script
	}
	_ = json.Unmarshal([]byte(input), &extra)
	ss.failAfter, ss.threads, ss.round, ss.turns = extra.FailAfter, extra.Threads, 0, ss.turns+1
	ss.status = "running"
	s.persist(ss, map[string]any{"type": "session.status_running"})
	s.advance(ss)
}

// advance makes the next block, or ends the turn. s.mu is held.
func (s *Sim) advance(ss *session) {
	if ss.failAfter > 0 && ss.round >= ss.failAfter {
		ss.status, ss.pending = "terminated", nil
		s.persist(ss, map[string]any{"type": "session.error", "error": map[string]any{"type": "unknown_error", "message": "scripted failure",
			"retry_status": map[string]any{"type": "terminal"}}})
		s.persist(ss, map[string]any{"type": "session.status_terminated"})
		ss.feed.End()
		return
	}
	var results []string
	for _, c := range ss.block {
		results = append(results, ss.results[c.id])
	}
	reply := ss.script.Reply(ss.round, results)
	if len(reply.Calls) == 0 {
		ss.final = reply.Content
		s.persist(ss, map[string]any{"type": "agent.message", "content": []any{map[string]any{"type": "text", "text": reply.Content}}})
		ss.status = "idle"
		s.persist(ss, map[string]any{"type": "session.status_idle", "stop_reason": map[string]any{"type": "end_turn"}})
		return
	}
	ss.block, ss.pending, ss.results = nil, nil, map[string]string{}
	var ids []string
	for i, c := range reply.Calls {
		args := json.RawMessage(c.Args)
		if c.Args == "" || !json.Valid(args) {
			args = json.RawMessage("{}")
		}
		ev := map[string]any{"type": "agent.custom_tool_use", "name": c.Name, "input": args}
		server, confirm := strings.CutPrefix(c.Name, "server:")
		if confirm {
			// A server tool whose permission policy evaluated to ask.
			ev = map[string]any{"type": "agent.tool_use", "name": server, "input": args, "evaluated_permission": "ask"}
		}
		thread := ""
		if ss.threads && !confirm {
			thread = "sthr_" + strconv.Itoa(i%2)
			ev["session_thread_id"] = thread
		}
		ev = s.persist(ss, ev)
		id := ev["id"].(string)
		ss.block = append(ss.block, call{id: id, name: c.Name, thread: thread, confirm: confirm})
		ids = append(ids, id)
	}
	ss.answers.Blocked()
	ss.pending = append([]call(nil), ss.block...)
	ss.status = "idle"
	s.persist(ss, map[string]any{"type": "session.status_idle", "stop_reason": map[string]any{"type": "requires_action", "event_ids": ids}})
}

func (s *Sim) get(w http.ResponseWriter, r *http.Request) {
	ss, ok := s.admit(w, r, r.PathValue("id"))
	if !ok {
		return
	}
	s.mu.Lock()
	obj := ss.object()
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, obj)
}

// list answers the history, oldest first, limit a page (page is the
// offset of the next, as a string).
func (s *Sim) list(w http.ResponseWriter, r *http.Request) {
	ss, ok := s.admit(w, r, r.PathValue("id"))
	if !ok {
		return
	}
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	if limit <= 0 || limit > 1000 {
		limit = 20
	}
	from, _ := strconv.Atoi(r.URL.Query().Get("page"))
	s.mu.Lock()
	all := ss.events
	s.mu.Unlock()
	if types := r.URL.Query()["types[]"]; len(types) > 0 {
		all = ofTypes(all, types)
	}
	from = min(max(from, 0), len(all))
	to := min(from+limit, len(all))
	var next any
	if to < len(all) {
		next = strconv.Itoa(to)
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": all[from:to], "next_page": next})
}

// ofTypes are the events of the types named (types[]), in order.
func ofTypes(events []json.RawMessage, types []string) []json.RawMessage {
	var out []json.RawMessage
	for _, raw := range events {
		var e struct{ Type string }
		if json.Unmarshal(raw, &e) == nil && slices.Contains(types, e.Type) {
			out = append(out, raw)
		}
	}
	return out
}

func (s *Sim) stream(w http.ResponseWriter, r *http.Request) {
	ss, ok := s.admit(w, r, r.PathValue("id"))
	if !ok {
		return
	}
	cut := s.cuts.Take()
	s.mu.Lock()
	ended := ss.status == "terminated"
	s.mu.Unlock()
	if ended {
		apiError(w, http.StatusConflict, "invalid_request_error", "session "+ss.id+" is terminated")
		return
	}
	ss.feed.Serve(w, r, &s.mu, simbase.StreamOptions{Cut: cut, Duplicate: s.cfg.Duplicate, Delay: s.cfg.Delay})
}

func (s *Sim) post(w http.ResponseWriter, r *http.Request) {
	ss, ok := s.admit(w, r, r.PathValue("id"))
	if !ok {
		return
	}
	var body struct {
		Events []userEvent `json:"events"`
	}
	raw, err := io.ReadAll(r.Body)
	if err == nil {
		err = json.Unmarshal(raw, &body)
	}
	if err != nil || len(body.Events) == 0 {
		apiError(w, http.StatusBadRequest, "invalid_request_error", "events must be a non-empty array")
		return
	}
	results := 0
	for _, e := range body.Events {
		if e.Type == "user.custom_tool_result" || e.Type == "user.tool_result" || e.Type == "user.tool_confirmation" {
			results++
		}
	}
	if results > 0 {
		if _, f := s.Begin(); f.Answer(w, func(w http.ResponseWriter, status int) {
			typ := "api_error"
			switch status {
			case http.StatusTooManyRequests:
				typ = "rate_limit_error"
			case 529:
				typ = "overloaded_error"
			}
			apiError(w, status, typ, http.StatusText(status))
		}) {
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss.status == "terminated" {
		apiError(w, http.StatusConflict, "invalid_request_error", "session "+ss.id+" is terminated")
		return
	}
	if msg := s.check(ss, body.Events); msg != "" {
		apiError(w, http.StatusBadRequest, "invalid_request_error", msg)
		return
	}
	var echoed []any
	answered := 0
	for _, e := range body.Events {
		switch e.Type {
		case "user.custom_tool_result":
			ev := map[string]any{"type": e.Type, "custom_tool_use_id": e.CustomToolUseID, "content": e.Content, "is_error": e.IsError}
			if e.SessionThreadID != "" {
				ev["session_thread_id"] = e.SessionThreadID
			}
			echoed = append(echoed, s.persist(ss, ev))
			ss.answers.Take(e.CustomToolUseID, answerOf(e))
			ss.results[e.CustomToolUseID] = resultText(e)
			answered++
			for i, c := range ss.pending {
				if c.id == e.CustomToolUseID {
					ss.pending = append(ss.pending[:i:i], ss.pending[i+1:]...)
					break
				}
			}
		case "user.tool_confirmation":
			ev := map[string]any{"type": e.Type, "tool_use_id": e.ToolUseID, "result": e.Result}
			echoed = append(echoed, s.persist(ss, ev))
			text := e.Result
			if e.DenyMessage != nil {
				text += ": " + *e.DenyMessage
			}
			ss.answers.Take(e.ToolUseID, text)
			ss.results[e.ToolUseID] = text
			answered++
			for i, c := range ss.pending {
				if c.id == e.ToolUseID {
					ss.pending = append(ss.pending[:i:i], ss.pending[i+1:]...)
					break
				}
			}
		case "user.tool_result":
			// The wrong kind for a custom call: it answers nothing, and the
			// session stays blocked (check logged it).
			echoed = append(echoed, s.persist(ss, map[string]any{"type": e.Type, "tool_use_id": e.ToolUseID}))
		case "user.interrupt":
			echoed = append(echoed, s.persist(ss, map[string]any{"type": e.Type}))
			s.interrupt(ss)
		case "user.message":
			echoed = append(echoed, s.persist(ss, map[string]any{"type": e.Type, "content": e.Content}))
			s.startTurn(ss, text(e.Content))
		}
	}
	if answered > 0 {
		ss.answers.Posted(answered)
		if len(ss.pending) > 0 {
			// A partial answer: the idle event again, with the rest.
			var ids []string
			for _, c := range ss.pending {
				ids = append(ids, c.id)
			}
			s.persist(ss, map[string]any{"type": "session.status_idle", "stop_reason": map[string]any{"type": "requires_action", "event_ids": ids}})
		} else {
			ss.round++
			ss.status = "running"
			s.persist(ss, map[string]any{"type": "session.status_running"})
			s.advance(ss)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": echoed})
}

// check applies the API's rules to a post; s.mu is held. It returns the
// refusal, "" when none.
func (s *Sim) check(ss *session, events []userEvent) string {
	pending := map[string]call{}
	for _, c := range ss.pending {
		pending[c.id] = c
	}
	for _, e := range events {
		switch e.Type {
		case "user.custom_tool_result":
			id := e.CustomToolUseID
			if refusal := ss.answers.Check(s, id, answerOf(e)); refusal != "" {
				return refusal
			}
			c, ok := pending[id]
			if ok && c.confirm {
				s.Violate("wrong_result_kind", "user.custom_tool_result for %s, an ask-gated agent.tool_use", id)
				return "`custom_tool_use_id` \"" + id + "\" is an agent.tool_use awaiting a user.tool_confirmation"
			}
			if !ok {
				s.Violate("unknown_call", "a result for %s, which is not pending", id)
				return "`custom_tool_use_id` \"" + id + "\" does not match any pending agent.custom_tool_use event in this session"
			}
			if c.thread != e.SessionThreadID {
				s.Violate("thread_not_echoed", "the result for %s has session_thread_id %q, the call %q", id, e.SessionThreadID, c.thread)
			}
		case "user.tool_confirmation":
			c, ok := pending[e.ToolUseID]
			if refusal := ss.answers.Check(s, e.ToolUseID, e.Result); refusal != "" {
				return refusal
			}
			switch {
			case !ok || !c.confirm:
				s.Violate("unknown_call", "a confirmation for %s, which awaits none", e.ToolUseID)
				return "`tool_use_id` \"" + e.ToolUseID + "\" awaits no confirmation"
			case e.Result != "allow" && e.Result != "deny":
				s.Violate("bad_confirmation", "result %q is not allow or deny", e.Result)
				return "result must be allow or deny"
			case e.DenyMessage != nil && e.Result != "deny":
				s.Violate("bad_confirmation", "deny_message with result %q", e.Result)
				return "deny_message is allowed only with deny"
			}
		case "user.tool_result":
			if _, custom := pending[e.ToolUseID]; custom {
				s.Violate("wrong_result_kind", "user.tool_result for the custom call %s", e.ToolUseID)
			}
		case "user.interrupt", "user.message":
		default:
			s.Violate("wrong_result_kind", "an event of type %q", e.Type)
			return "unknown event type " + e.Type
		}
	}
	return ""
}

func answerOf(e userEvent) string {
	b, _ := json.Marshal([]any{e.IsError, e.Content})
	return string(b)
}

func resultText(e userEvent) string {
	t := text(e.Content)
	if e.IsError {
		return "error: " + t
	}
	return t
}

// interrupt ends the turn: its pending calls are void. s.mu is held.
func (s *Sim) interrupt(ss *session) {
	for _, c := range ss.pending {
		ss.answers.Void(c.id)
	}
	ss.pending = nil
	ss.status = "idle"
	s.persist(ss, map[string]any{"type": "session.status_idle", "stop_reason": map[string]any{"type": "end_turn"}})
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
	for _, c := range ss.pending {
		pending = append(pending, c.id)
	}
	v := ss.answers.View(ss.status, pending, ss.final, ss.turns)
	v.Streams = ss.feed.Opened()
	return v, true
}
