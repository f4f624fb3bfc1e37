package coresim

import (
	"cmp"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/projectdavid/toolsidecar/core"
)

// completions plays one scripted turn over SSE, framed as Core frames it:
// "data: <python json>\n\n" per chunk, no heartbeat, [DONE] at the end
// (also after an in-band error), no [DONE] after a router exception.
func (s *Sim) completions(w http.ResponseWriter, r *http.Request) {
	var req core.CompletionRequest
	if !decode(w, r, &req) {
		return
	}
	s.mu.Lock()
	rn, ok := s.runs[req.RunID]
	switch {
	case !ok:
		s.mu.Unlock()
		detail(w, http.StatusNotFound, "Run not found.")
		return
	case rn.ThreadID != req.ThreadID:
		s.mu.Unlock()
		detail(w, http.StatusForbidden, "Thread ID does not match the run.")
		return
	case rn.AssistantID != req.AssistantID:
		s.mu.Unlock()
		detail(w, http.StatusForbidden, "Assistant ID does not match the run.")
		return
	case !validModel(req.Model):
		s.mu.Unlock()
		detail(w, http.StatusInternalServerError, "Invalid or unknown model identifier prefix")
		return
	}
	s.checkPreviousBatch(rn)
	rn.turns++
	turn, scripted := s.scriptedTurn(rn)
	rn.CurrentTurn = rn.turns
	if rn.turns == 1 {
		rn.StartedAt = strconv.AppendInt(nil, time.Now().Unix(), 10)
	}
	s.mu.Unlock()

	if turn.HTTPStatus != 0 {
		detail(w, turn.HTTPStatus, fmt.Sprintf("scripted HTTP %d", turn.HTTPStatus))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("Connection", "keep-alive")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	p := &player{s: s, w: w, r: r, rn: rn, turn: turn}
	if !scripted {
		turn = Turn{Error: fmt.Sprintf("coresim: scenario has no turn %d", rn.turns)}
		p.turn = turn
	}
	p.play()
}

// checkPreviousBatch records a violation for each call of the run's last
// batch that has no tool output when the next turn is requested.
func (s *Sim) checkPreviousBatch(rn *run) {
	if len(rn.batches) == 0 {
		return
	}
	for _, a := range rn.batches[len(rn.batches)-1] {
		if a.outputs == 0 && !a.checked {
			a.checked = true
			s.violate(ViolationMissingOutput, rn.ID, a.ToolCallID, "next turn requested before tool output for action "+a.ID)
		}
	}
}

func (s *Sim) scriptedTurn(rn *run) (Turn, bool) {
	turns := s.cfg.Scenario.Turns
	if rn.turns > len(turns) {
		return Turn{}, false
	}
	return turns[rn.turns-1].pick(s.lastResults(rn.ThreadID)), true
}

type player struct {
	s      *Sim
	w      http.ResponseWriter
	r      *http.Request
	rn     *run
	turn   Turn
	frames int
}

// emit waits the frame delay, then writes one frame; it reports false when
// the turn must stop (client gone, run cancelled, or the drop point).
func (p *player) emit(chunk object) bool {
	return p.pause() && p.write(chunk)
}

// pause sleeps the frame delay; false when the client left or the run was
// cancelled meanwhile.
func (p *player) pause() bool {
	if d := p.turn.FrameDelay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-p.r.Context().Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
	return !p.cancelled()
}

// write sends one frame, unless the scripted drop point is reached.
func (p *player) write(chunk object) bool {
	if p.turn.DropAfter > 0 && p.frames >= p.turn.DropAfter {
		return false
	}
	p.frames++
	fmt.Fprintf(p.w, "data: %s\n\n", dumps(chunk))
	p.w.(http.Flusher).Flush()
	return p.r.Context().Err() == nil
}

func (p *player) cancelled() bool {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	return p.rn.Status == core.RunCancelled
}

func (p *player) done() {
	if p.turn.DropAfter > 0 && p.frames >= p.turn.DropAfter {
		return // dropped connection: no [DONE]
	}
	fmt.Fprint(p.w, "data: [DONE]\n\n")
	p.w.(http.Flusher).Flush()
}

func (p *player) play() {
	id := p.rn.ID
	t := p.turn
	if !p.emit(object{{"type", "status"}, {"status", "started"}, {"run_id", id}}) {
		p.finish()
		return
	}
	if t.Error != "" {
		if p.emit(object{{"type", "error"}, {"content", t.Error}, {"run_id", id}}) {
			p.done()
		}
		return
	}
	if t.Reasoning != "" && !p.emit(object{{"type", "reasoning"}, {"content", t.Reasoning}, {"run_id", id}}) {
		p.finish()
		return
	}
	if t.Content != "" {
		if !p.emit(object{{"type", "content"}, {"content", content(t, p)}, {"run_id", id}}) {
			p.finish()
			return
		}
	}
	if t.RouterError != "" {
		p.emit(object{{"type", "error"}, {"run_id", id}, {"message", t.RouterError}})
		return
	}
	for _, c := range t.Calls {
		args := string(dumps(c.argsJSON()))
		if !p.emit(object{{"type", "tool_call"}, {"content", object{{"name", c.Tool}, {"arguments", args}}}, {"run_id", id}}) {
			p.finish()
			return
		}
	}
	if !p.emit(object{{"type", "status"}, {"status", "processing"}, {"run_id", id}}) {
		p.finish()
		return
	}
	if len(t.Calls) == 0 {
		text := content(t, p)
		p.s.mu.Lock()
		p.s.saveAssistant(p.rn, text)
		p.rn.Status, p.rn.finishedAt = core.RunCompleted, p.s.now().Unix()
		p.s.endRunLocked(p.rn)
		p.s.mu.Unlock()
		if p.emit(object{{"type", "status"}, {"status", "complete"}, {"run_id", id}}) {
			p.done()
		}
		return
	}
	p.s.mu.Lock()
	p.rn.batches = append(p.rn.batches, nil)
	calls := p.s.assignCallIDs(t.Calls)
	p.s.saveAssistant(p.rn, string(toolCallsJSON(calls)))
	// Core's finalize writes completed, then the worker action_required,
	// both before the first manifest.
	if p.rn.Status != core.RunCancelled {
		p.rn.Status = core.RunActionRequired
	}
	p.s.mu.Unlock()
	for _, c := range calls {
		if !p.pause() {
			p.finish()
			return
		}
		// The Action exists before its frame is written: a drop here
		// leaves it pending in Core, as on the real server.
		a := p.s.newAction(p.rn, c)
		var toolV, argsV any = c.Tool, c.argsJSON()
		if c.RawTool != "" {
			toolV = verbatim(c.RawTool)
		}
		if c.RawArgs != "" {
			argsV = verbatim(c.RawArgs)
		}
		if !p.write(object{{"type", "tool_call_manifest"}, {"run_id", id}, {"action_id", a.ID},
			{"tool_call_id", a.ToolCallID}, {"tool", toolV}, {"args", argsV}}) {
			p.finish()
			return
		}
		p.s.setRunStatus(p.rn, core.RunActionRequired)
	}
	p.done()
}

// finish ends a turn that stopped early: a cancelled run still gets its
// [DONE] (Core's monitor breaks the loop and the router closes normally).
func (p *player) finish() {
	if p.cancelled() && p.r.Context().Err() == nil {
		p.done()
	}
}

// newAction creates the Action row before its manifest is sent, as Core does.
func (s *Sim) newAction(rn *run, c Call) *action {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := len(rn.batches) - 1
	a := &action{batch: b, index: len(rn.batches[b])}
	a.ID = cmp.Or(c.ActionID, s.newID("act_", 22))
	a.ToolCallID = c.ID
	a.RunID, a.ToolName, a.Status = rn.ID, c.Tool, core.ActionPending
	a.FunctionArgs = dumps(c.argsJSON())
	a.Result = []byte("null")
	// Pydantic's naive datetime, in microseconds; Core's inserts are far
	// slower than that, so no two calls of a run share a stamp.
	at := s.now().Truncate(time.Microsecond)
	if !at.After(s.lastTriggered) {
		at = s.lastTriggered.Add(time.Microsecond)
	}
	s.lastTriggered = at
	a.TriggeredAt = at.Format("2006-01-02T15:04:05.000000")
	rn.batches[b] = append(rn.batches[b], a)
	s.actions[a.ID] = a
	if t := s.threads[rn.ThreadID]; t != nil {
		if t.calls == nil {
			t.calls = map[string]*action{}
		}
		if _, seen := t.calls[c.ID]; !seen {
			t.calls[c.ID] = a
		}
	}
	return a
}

func (s *Sim) setRunStatus(rn *run, status string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rn.Status != core.RunCancelled {
		rn.Status = status
	}
}

// content renders the turn's text with the tool results it may quote.
func content(t Turn, p *player) string {
	if !strings.Contains(t.Content, "{{results}}") {
		return t.Content
	}
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	return strings.ReplaceAll(t.Content, "{{results}}", p.s.lastResults(p.rn.ThreadID))
}

// assignCallIDs gives each call without an id the parser's call_ + 8 hex.
func (s *Sim) assignCallIDs(calls []Call) []Call {
	out := make([]Call, len(calls))
	for i, c := range calls {
		if c.ID == "" {
			s.seq++
			c.ID = fmt.Sprintf("call_%08x", s.seq)
		}
		out[i] = c
	}
	return out
}

// toolCallsJSON is the assistant message Core saves for a batch.
func toolCallsJSON(calls []Call) []byte {
	list := make([]object, len(calls))
	for i, c := range calls {
		list[i] = object{{"id", c.ID}, {"type", "function"}, {"function", object{{"name", c.Tool}, {"arguments", string(dumps(c.argsJSON()))}}}}
	}
	return dumps(list)
}

func (s *Sim) saveAssistant(rn *run, text string) {
	if t := s.threads[rn.ThreadID]; t != nil {
		t.messages = append(t.messages, message{id: s.newID("message_", 22), role: "assistant", content: text, assistantID: rn.AssistantID, createdAt: s.now().Unix()})
	}
}
