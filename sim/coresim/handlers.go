package coresim

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/projectdavid/toolsidecar/core"
)

func (s *Sim) routes() {
	s.mux.HandleFunc("POST /v1/completions", s.completions)
	s.mux.HandleFunc("POST /v1/assistants", s.auth(s.createAssistant))
	s.mux.HandleFunc("GET /v1/assistants/{id}", s.auth(s.getAssistant))
	s.mux.HandleFunc("POST /v1/threads", s.auth(s.createThread))
	s.mux.HandleFunc("POST /v1/messages", s.auth(s.createMessage))
	s.mux.HandleFunc("POST /v1/messages/tools", s.auth(s.submitToolOutput))
	s.mux.HandleFunc("POST /v1/runs", s.auth(s.createRun))
	s.mux.HandleFunc("GET /v1/runs", s.auth(s.listRuns))
	s.mux.HandleFunc("GET /v1/runs/{id}", s.auth(s.getRun))
	s.mux.HandleFunc("POST /v1/runs/{id}/cancel", s.auth(s.cancelRun))
	s.mux.HandleFunc("GET /v1/runs/{id}/actions/status", s.auth(s.actionsByStatus))
	s.mux.HandleFunc("GET /v1/actions/{id}", s.auth(s.getAction))
	s.mux.HandleFunc("PUT /v1/actions/{id}", s.auth(s.updateAction))
	s.mux.HandleFunc("GET /v1/actions/pending/{run_id}", s.auth(s.pendingActions))
	s.mux.HandleFunc("GET /v1/threads/{id}/messages", s.auth(s.listMessages))
	// Not Core's: the contract log, for a simulator in another process.
	s.mux.HandleFunc("GET /_sim/violations", s.auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Violations())
	}))
}

// listMessages answers a thread's messages as a list envelope, newest first
// with order=desc, at most limit (default 20, at most 100).
func (s *Sim) listMessages(w http.ResponseWriter, r *http.Request) {
	limit, err := strconv.Atoi(r.URL.Query().Get("limit"))
	if err != nil || limit < 1 {
		limit = 20
	}
	limit = min(limit, 100)
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.lookupThread(w, r, r.PathValue("id"))
	if t == nil {
		return
	}
	msgs := make([]messageRead, 0, len(t.messages))
	for _, m := range t.messages {
		msgs = append(msgs, m.read(t.id))
	}
	if r.URL.Query().Get("order") == "desc" {
		slices.Reverse(msgs)
	}
	msgs = msgs[:min(limit, len(msgs))]
	// first_id and last_id are null on an empty page.
	var first, last *string
	if n := len(msgs); n > 0 {
		first, last = &msgs[0].ID, &msgs[n-1].ID
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": msgs, "first_id": first, "last_id": last, "has_more": len(t.messages) > limit})
}

// ServeHTTP records the request, bounds its body and routes it.
func (s *Sim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.cfg.SplitWrites {
		w = &splitWriter{ResponseWriter: w}
	}
	if s.cfg.MaxLatency > 0 {
		time.Sleep(rand.N(s.cfg.MaxLatency))
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	s.mu.Lock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, Body: body, At: s.now(), Key: r.Header.Get("X-API-Key"),
		Traceparent: r.Header.Get("traceparent")})
	s.mu.Unlock()
	if err != nil {
		detail(w, http.StatusRequestEntityTooLarge, "request body too large")
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if f := s.takeFault(r); f != nil {
		s.serveFault(w, r, f)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// splitWriter sends an answer's head on its own, before the body.
type splitWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *splitWriter) WriteHeader(status int) {
	if !w.wrote {
		w.wrote = true
		w.ResponseWriter.WriteHeader(status)
		http.NewResponseController(w.ResponseWriter).Flush()
	}
}

func (w *splitWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.ResponseWriter.Write(p)
}

// Flush and Hijack are the underlying writer's: streams and dropped
// connections work as without the split.
func (w *splitWriter) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

func (w *splitWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *splitWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// detail writes FastAPI's error shape.
func detail(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"detail": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (s *Sim) auth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.PerKeyUsers {
			if r.Header.Get("X-API-Key") == "" {
				detail(w, http.StatusUnauthorized, "Invalid or missing API key")
				return
			}
			h(w, r)
			return
		}
		if s.cfg.APIKey != "" && r.Header.Get("X-API-Key") != s.cfg.APIKey {
			detail(w, http.StatusUnauthorized, "Invalid or missing API key")
			return
		}
		h(w, r)
	}
}

// user is the caller's identity: its key, with PerKeyUsers; else "".
func (s *Sim) user(r *http.Request) string {
	if !s.cfg.PerKeyUsers {
		return ""
	}
	return r.Header.Get("X-API-Key")
}

// owns reports whether the caller may touch what owner created.
func (s *Sim) owns(r *http.Request, owner string) bool {
	return !s.cfg.PerKeyUsers || owner == s.user(r)
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		detail(w, http.StatusUnprocessableEntity, "invalid body: "+err.Error())
		return false
	}
	return true
}

func (s *Sim) createAssistant(w http.ResponseWriter, r *http.Request) {
	var in core.AssistantCreate
	if !decode(w, r, &in) {
		return
	}
	if in.Tools == nil {
		in.Tools = []core.FunctionTool{}
	}
	s.mu.Lock()
	a := &assistant{Assistant: core.Assistant{ID: s.newID("asst_", 22), Name: in.Name, Model: in.Model, Tools: in.Tools},
		instructions: in.Instructions, createdAt: s.now().Unix()}
	s.assistants[a.ID] = a
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, a.read())
}

func (s *Sim) getAssistant(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	a, ok := s.assistants[r.PathValue("id")]
	s.mu.Unlock()
	if !ok {
		detail(w, http.StatusNotFound, "Assistant not found")
		return
	}
	writeJSON(w, http.StatusOK, a.read())
}

func (s *Sim) createThread(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	t := &thread{id: s.newID("thread_", 22), owner: s.user(r), createdAt: s.now().Unix()}
	s.threads[t.id] = t
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, t.read())
}

func (s *Sim) createMessage(w http.ResponseWriter, r *http.Request) {
	var in core.MessageCreate
	if !decode(w, r, &in) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.lookupThread(w, r, in.ThreadID)
	if t == nil {
		return
	}
	m := message{id: s.newID("message_", 22), role: in.Role, content: in.Content, assistantID: in.AssistantID, createdAt: s.now().Unix()}
	t.messages = append(t.messages, m)
	writeJSON(w, http.StatusOK, m.read(t.id))
}

// submitToolOutput stores a tool message, as Core does, without any
// validation; the contract checks run beside it and only record.
func (s *Sim) submitToolOutput(w http.ResponseWriter, r *http.Request) {
	var in core.ToolOutput
	if !decode(w, r, &in) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.lookupThread(w, r, in.ThreadID)
	if t == nil {
		return
	}
	s.checkOutput(in)
	m := message{id: s.newID("message_", 22), role: "tool", content: in.Content, toolID: in.ToolID, toolCallID: in.ToolCallID,
		assistantID: in.AssistantID, createdAt: s.now().Unix()}
	t.messages = append(t.messages, m)
	writeJSON(w, http.StatusOK, m.read(t.id))
}

func (s *Sim) checkOutput(in core.ToolOutput) {
	a := s.actions[in.ToolID]
	runID := ""
	if a != nil {
		runID = a.RunID
	}
	if in.ToolCallID == "" {
		s.violate(ViolationNoToolCallID, runID, "", "tool output for action "+in.ToolID+" has no tool_call_id")
		return
	}
	byCall := s.actionByCallID(in.ThreadID, in.ToolCallID)
	if byCall == nil {
		s.violate(ViolationUnknownToolCallID, runID, in.ToolCallID, "no manifest carried this tool_call_id")
		return
	}
	if a != byCall && (in.ToolID != "" || core.Addressable(byCall.ID)) { // an Action that cannot be addressed is not named
		s.violate(ViolationToolIDMismatch, byCall.RunID, in.ToolCallID, fmt.Sprintf("tool_id %q, want action %q", in.ToolID, byCall.ID))
	}
	byCall.outputs++
	if byCall.outputs > 1 {
		s.violate(ViolationDuplicateOutput, byCall.RunID, in.ToolCallID, fmt.Sprintf("%d outputs", byCall.outputs))
		return
	}
	for _, sib := range s.runs[byCall.RunID].batches[byCall.batch][byCall.index+1:] {
		if sib.outputs > 0 {
			s.violate(ViolationOutOfOrder, byCall.RunID, in.ToolCallID, "posted after later call "+sib.ToolCallID)
			return
		}
	}
}

// actionByCallID is the first Action of the thread's runs that carried
// callID.
func (s *Sim) actionByCallID(threadID, callID string) *action {
	if t := s.threads[threadID]; t != nil {
		return t.calls[callID]
	}
	return nil
}

func (s *Sim) createRun(w http.ResponseWriter, r *http.Request) {
	var in core.RunCreate
	if !decode(w, r, &in) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.assistants[in.AssistantID]
	if !ok {
		detail(w, http.StatusNotFound, "Assistant not found")
		return
	}
	t := s.lookupThread(w, r, in.ThreadID)
	if t == nil {
		return
	}
	model := in.Model
	if model == "" {
		model = a.Model
	}
	rn := &run{Run: core.Run{ID: s.newID("run_", 22), AssistantID: in.AssistantID, ThreadID: in.ThreadID, Status: core.RunQueued, Model: model, MetaData: in.MetaData},
		owner: s.user(r), createdAt: s.now().Unix(), instructions: cmp.Or(in.Instructions, a.instructions)}
	s.runs[rn.ID] = rn
	s.byCreation = append(s.byCreation, rn)
	writeJSON(w, http.StatusOK, rn.read())
}

// lookupThread finds a thread the caller may use: 404 when there is
// none, 403 when it belongs to another user (PerKeyUsers), as on Core.
func (s *Sim) lookupThread(w http.ResponseWriter, r *http.Request, id string) *thread {
	t, ok := s.threads[id]
	switch {
	case !ok:
		detail(w, http.StatusNotFound, "Thread not found")
		return nil
	case !s.owns(r, t.owner):
		detail(w, http.StatusForbidden, "Not authorized for this thread")
		return nil
	}
	return t
}

// lookupRun finds a run the caller may see; a foreign run is not found.
func (s *Sim) lookupRun(w http.ResponseWriter, r *http.Request, id string) *run {
	rn, ok := s.runs[id]
	if !ok || !s.owns(r, rn.owner) {
		detail(w, http.StatusNotFound, "Run not found")
		return nil
	}
	return rn
}

func (s *Sim) getRun(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rn := s.lookupRun(w, r, r.PathValue("id")); rn != nil {
		writeJSON(w, http.StatusOK, struct {
			runRead
			Actions []any `json:"actions"`
		}{rn.read(), []any{}}) // Core always answers actions: []
	}
}

// listRuns is GET /v1/runs as Core serves it (routers/runs_router.py and
// services/runs_service.py): the caller's runs by creation time, limit
// 1..100 (default 20), order asc (default) or desc, an optional thread_id;
// no cursor. Query values Core's validation rejects get 422.
func (s *Sim) listRuns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > core.MaxRunList {
			detail(w, http.StatusUnprocessableEntity, "limit: Input should be between 1 and 100")
			return
		}
		limit = n
	}
	order := cmp.Or(q.Get("order"), "asc")
	if order != "asc" && order != "desc" {
		detail(w, http.StatusUnprocessableEntity, "order: Input should be 'asc' or 'desc'")
		return
	}
	thread := q.Get("thread_id")
	s.mu.Lock()
	defer s.mu.Unlock()
	data, hasMore := []runRead{}, false
	all := slices.Values(s.byCreation)
	if order == "desc" {
		all = func(yield func(*run) bool) {
			for _, rn := range slices.Backward(s.byCreation) {
				if !yield(rn) {
					return
				}
			}
		}
	}
	for rn := range all {
		if !s.owns(r, rn.owner) || (thread != "" && rn.ThreadID != thread) {
			continue
		}
		if len(data) == limit {
			hasMore = true
			break
		}
		data = append(data, rn.read())
	}
	// first_id and last_id are null on an empty page.
	var first, last *string
	if n := len(data); n > 0 {
		first, last = &data[0].ID, &data[n-1].ID
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": hasMore})
}

func (s *Sim) cancelRun(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rn := s.lookupRun(w, r, r.PathValue("id"))
	if rn == nil {
		return
	}
	if rn.Status == core.RunCompleted || rn.Status == core.RunCancelled {
		detail(w, http.StatusBadRequest, "Run is already finished")
		return
	}
	rn.Status, rn.finishedAt = core.RunCancelled, s.now().Unix()
	writeJSON(w, http.StatusOK, rn.read())
}

// Cancel cancels a run as POST /v1/runs/{id}/cancel does, for tests.
func (s *Sim) Cancel(runID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rn := s.runs[runID]; rn != nil && rn.Status != core.RunCompleted {
		rn.Status, rn.finishedAt = core.RunCancelled, s.now().Unix()
	}
}

func (s *Sim) getAction(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.actions[r.PathValue("id")]
	if !ok {
		detail(w, http.StatusNotFound, "Action not found")
		return
	}
	writeJSON(w, http.StatusOK, a.Action)
}

var actionStatuses = []string{core.ActionPending, core.ActionProcessing, core.ActionCompleted, core.ActionFailed, core.ActionExpired, core.ActionCancelled, core.ActionRetrying}

// updateAction sets the status and overwrites the result (to null when
// omitted), as Core's ActionService does.
func (s *Sim) updateAction(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Status string          `json:"status"`
		Result json.RawMessage `json:"result"`
	}
	if !decode(w, r, &in) {
		return
	}
	if !slices.Contains(actionStatuses, in.Status) {
		detail(w, http.StatusUnprocessableEntity, "invalid action status "+in.Status)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.actions[r.PathValue("id")]
	if !ok {
		detail(w, http.StatusNotFound, "Action not found")
		return
	}
	switch in.Status {
	case core.ActionCompleted, core.ActionFailed, core.ActionCancelled:
		if a.outputs == 0 {
			s.violate(ViolationFinalisedWithoutOutput, a.RunID, a.ToolCallID, "action "+a.ID+" set "+in.Status+" with no tool output")
		}
	case core.ActionPending, core.ActionProcessing:
		switch a.Status {
		case core.ActionCompleted, core.ActionFailed, core.ActionCancelled:
			s.violate(ViolationReopened, a.RunID, a.ToolCallID, "action "+a.ID+" set "+in.Status+" after "+a.Status)
		default:
			if in.Status == core.ActionProcessing && a.outputs > 0 {
				s.violate(ViolationProcessingAfterOutput, a.RunID, a.ToolCallID, "action "+a.ID+" set processing after its tool output")
			}
		}
	}
	a.Status, a.Result = in.Status, in.Result
	if len(a.Result) == 0 {
		a.Result = json.RawMessage("null")
	}
	if in.Status == core.ActionCompleted {
		a.IsProcessed, a.ProcessedAt = true, s.now().Format("2006-01-02T15:04:05")
	}
	writeJSON(w, http.StatusOK, a.Action)
}

func (s *Sim) pendingActions(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []core.PendingAction{}
	if rn := s.runs[r.PathValue("run_id")]; rn != nil {
		for _, b := range rn.batches {
			for _, a := range b {
				if a.Status == core.ActionPending { // Core leaves processing out
					out = append(out, core.PendingAction{ActionID: a.ID, ToolCallID: a.ToolCallID, ActionStatus: a.Status,
						FunctionArguments: a.FunctionArgs, ToolName: a.ToolName, RunID: rn.ID, RunStatus: rn.Status})
				}
			}
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Sim) actionsByStatus(w http.ResponseWriter, r *http.Request) {
	status := r.URL.Query().Get("status")
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []core.Action{}
	if rn := s.runs[r.PathValue("id")]; rn != nil {
		for _, b := range rn.batches {
			for _, a := range b {
				if a.Status == status {
					out = append(out, a.Action)
				}
			}
		}
	}
	writeJSON(w, http.StatusOK, out)
}

var modelPrefixes = []string{"vllm/", "ollama/", "hyperbolic/", "together-ai/"}

func validModel(m string) bool {
	for _, p := range modelPrefixes {
		if strings.HasPrefix(m, p) {
			return true
		}
	}
	return false
}
