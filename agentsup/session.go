package agentsup

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/agentsapi"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/runstore"
	"github.com/projectdavid/toolsidecar/tool"
)

// seenWindow bounds the event ids a session remembers, to drop
// redelivered events (the OpenAI SDK's helper keeps as many).
const seenWindow = 1024

// session is one watched session: its status and the calls it waits on,
// as its events and reads tell, and the calls batches took.
type session struct {
	id    string
	key   string // the credential it is followed with: memory only, never logged
	owner string // the caller that the credential names (executor.CallerOf)

	mu      sync.Mutex
	status  string // an agentsapi status; "" before the first read
	why     string
	pending []agentsapi.Call      // as the session last listed them, the posted ones left out
	asks    []agentsapi.Call      // server calls awaiting permission, as last listed
	asked   map[string]bool       // the confirmations posted, by call id
	calls   map[string]*callState // by action id: every call a batch took
	batch   []string              // action ids of the batch in progress, each once
	seen    map[string]bool       // event ids, the last seenWindow
	order   []string
	wake    chan struct{} // closed and replaced when the session changes
	// restSince is when the session was last seen going idle or
	// blocking; zero while it runs. The watch of the one resting the
	// longest goes first when the table is full (Watcher.evictLocked).
	restSince time.Time
	// tells are the application's streams through the sidecar that are
	// told of each result posted (Endpoint.merge).
	tells map[chan agentsapi.Result]struct{}
}

// tellBuffer bounds the results queued for one application stream that
// reads slower than batches are posted; past it a result is not told
// (the session's own events still say the call was answered).
const tellBuffer = 256

// listen subscribes to the results posted; cancel unsubscribes.
func (s *session) listen() (results <-chan agentsapi.Result, cancel func()) {
	ch := make(chan agentsapi.Result, tellBuffer)
	s.mu.Lock()
	if s.tells == nil {
		s.tells = map[chan agentsapi.Result]struct{}{}
	}
	s.tells[ch] = struct{}{}
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		delete(s.tells, ch)
		s.mu.Unlock()
	}
}

// tell queues results about to be posted for every listening stream,
// without waiting for any; a result told before (its post tried again)
// is not told twice.
func (s *session) tell(results []agentsapi.Result) (dropped int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fresh := results[:0:0]
	for _, r := range results {
		if cs := s.calls[actionID(s.id, r.Call.ID)]; cs != nil {
			if cs.told {
				continue
			}
			cs.told = true
		}
		fresh = append(fresh, r)
	}
	for ch := range s.tells {
		for _, r := range fresh {
			select {
			case ch <- r:
			default:
				dropped++
			}
		}
	}
	return dropped
}

// callState is a call a batch took.
type callState struct {
	call     agentsapi.Call
	answer   *runstore.Answer // journaled by a sidecar before this one: posted as it is
	output   string
	recorded bool
	status   string // its final status, once finalised
	posting  bool
	posted   bool
	voided   bool // its turn was cancelled or interrupted: never answered
	told     bool // shown on the application's streams
}

func newSession(id, key, owner string) *session {
	return &session{id: id, key: key, owner: owner, calls: map[string]*callState{}, seen: map[string]bool{}, wake: make(chan struct{})}
}

// changed wakes whoever waits on the session. s.mu is held.
func (s *session) changed() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// apply takes a snapshot of the session: its status and pending calls.
func (s *session) apply(snap agentsapi.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applyLocked(snap)
}

func (s *session) applyLocked(snap agentsapi.Snapshot) {
	switch {
	case snap.Status != agentsapi.StatusIdle && snap.Status != agentsapi.StatusBlocked:
		s.restSince = time.Time{}
	case s.restSince.IsZero() || snap.Status != s.status:
		s.restSince = time.Now()
	}
	s.status, s.why = snap.Status, snap.Why
	s.asks = snap.Confirmations
	s.pending = s.pending[:0]
	// A block that lists one call identity twice (a hostile or broken
	// upstream) would put one action id in a batch twice: the first stands.
	listed := make(map[string]bool, len(snap.Pending))
	for _, c := range snap.Pending {
		if listed[c.ID] {
			continue
		}
		listed[c.ID] = true
		if cs := s.calls[actionID(s.id, c.ID)]; cs != nil && (cs.posted || cs.voided) {
			continue // a stale list: answered, or its turn cancelled
		}
		s.pending = append(s.pending, c)
	}
	s.changed()
}

// update applies one event, once: a redelivered event is dropped. It
// reports whether the session ended (failed, terminated, deleted).
func (s *session) update(u agentsapi.Update) (ended bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u.EventID != "" && len(u.EventID) <= tool.MaxCallIDBytes {
		if s.seen[u.EventID] {
			return s.endedLocked()
		}
		s.seen[u.EventID] = true
		s.order = append(s.order, u.EventID)
		if len(s.order) > seenWindow {
			delete(s.seen, s.order[0])
			s.order = s.order[1:]
		}
	}
	if u.CancelledTurn != "" {
		s.void(u.CancelledTurn)
	}
	if u.Snapshot != nil {
		s.applyLocked(*u.Snapshot)
	}
	return s.endedLocked()
}

// void marks the calls of a cancelled turn ("*": every call not yet
// answered): they are never answered, and a batch running them stops.
// s.mu is held.
func (s *session) void(turnID string) {
	for _, cs := range s.calls {
		if !cs.posted && (turnID == "*" || cs.call.TurnID == turnID) {
			cs.voided = true
		}
	}
	keep := s.pending[:0]
	for _, c := range s.pending {
		if turnID != "*" && c.TurnID != turnID {
			keep = append(keep, c)
		}
	}
	s.pending = keep
	s.changed()
}

// voided reports a call of the batch in progress whose turn was
// cancelled. s.mu is held.
func (s *session) voided() bool {
	for _, id := range s.batch {
		if cs := s.calls[id]; cs != nil && cs.voided && cs.status == "" {
			return true
		}
	}
	return false
}

func (s *session) endedLocked() bool {
	return s.status == agentsapi.StatusFailed || s.status == agentsapi.StatusEnded
}

func (s *session) ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endedLocked()
}

// work reports pending calls of the registry's tools that no batch took.
// s.mu is held.
func (s *session) work(owns func(string) bool) []agentsapi.Call {
	var out []agentsapi.Call
	for _, c := range s.pending {
		if owns(c.Name) && s.calls[actionID(s.id, c.ID)] == nil {
			out = append(out, c)
		}
	}
	return out
}

// unpostedLocked reports results that a post failed to deliver (past its
// retry budget) of calls the session still waits on, with no batch in
// progress: a drive posts them (Turn), since no new block may come to
// start one. s.mu is held.
func (s *session) unpostedLocked() bool {
	if len(s.batch) > 0 {
		return false
	}
	for _, c := range s.pending {
		cs := s.calls[actionID(s.id, c.ID)]
		if cs != nil && cs.recorded && cs.status != "" && cs.status != executor.CallCancelled && !cs.voided && !cs.posted && !cs.posting {
			return true
		}
	}
	return false
}

// waitWork waits until the session blocks on calls for the sidecar, or
// holds results of such calls still to post; it reports false when the
// session ended or ctx did.
func (s *session) waitWork(ctx context.Context, owns func(string) bool) bool {
	for {
		s.mu.Lock()
		ended, work, wake := s.endedLocked(), len(s.work(owns)) > 0 || s.unpostedLocked(), s.wake
		s.mu.Unlock()
		switch {
		case ended:
			return false
		case work:
			return true
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return false
		}
	}
}

// next waits for the session's next block on calls of the registry's
// tools and takes them as a batch; nil when the session went idle.
func (s *session) next(ctx context.Context, owns func(string) bool) ([]*executor.ToolCall, error) {
	for {
		s.mu.Lock()
		if s.endedLocked() {
			why := s.why
			s.mu.Unlock()
			return nil, &executor.UpstreamError{Status: http.StatusBadGateway, Err: fmt.Errorf("session %s %s: %s", s.id, s.status, why)}
		}
		if work := s.work(owns); len(work) > 0 {
			out := make([]*executor.ToolCall, len(work))
			s.batch = make([]string, len(work))
			for i, c := range work {
				id := actionID(s.id, c.ID)
				s.calls[id] = &callState{call: c}
				s.batch[i] = id
				out[i] = toolCall(s.id, id, c)
			}
			s.mu.Unlock()
			return out, nil
		}
		idle, wake := s.status == agentsapi.StatusIdle, s.wake
		s.mu.Unlock()
		if idle {
			return nil, nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// toolCall is a hosted call as the executor runs it.
func toolCall(session, actionID string, c agentsapi.Call) *executor.ToolCall {
	callID := c.CallID
	if callID == "" {
		callID = c.ID
	}
	tc := &executor.ToolCall{RunID: session, ActionID: actionID, ToolCallID: callID, Tool: c.Name, Args: c.Args, Problem: c.Problem}
	if c.Problem != "" || !json.Valid(tc.Args) {
		tc.Args = json.RawMessage("{}")
	}
	return tc
}

// journaledCall is a pending call the journal knows: started, or
// answered when answer is set.
type journaledCall struct {
	call   agentsapi.Call
	answer *runstore.Answer
}

// takeJournaled takes the journaled calls that no batch took meanwhile as
// the batch in progress.
func (s *session) takeJournaled(calls []journaledCall) []executor.OpenCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []executor.OpenCall
	s.batch = nil
	for _, jc := range calls {
		id := actionID(s.id, jc.call.ID)
		if s.calls[id] != nil {
			continue
		}
		cs := &callState{call: jc.call, answer: jc.answer}
		if jc.answer != nil {
			cs.output, cs.recorded = jc.answer.Output, true
		}
		s.calls[id] = cs
		s.batch = append(s.batch, id)
		out = append(out, executor.OpenCall{Call: toolCall(s.id, id, jc.call), Started: true, Recorded: jc.answer != nil})
	}
	return out
}

// record keeps a call's output.
func (s *session) record(actionID, content string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs := s.calls[actionID]
	if cs == nil {
		return fmt.Errorf("agentsup: session %s has no call %s", s.id, actionID)
	}
	if !cs.recorded {
		cs.output, cs.recorded = content, true
	}
	return nil
}

// finalise notes a call's final status; when it is the batch's last, it
// returns the batch's results to post (none for a call cancelled, or
// voided by the session).
func (s *session) finalise(actionID, status string) []agentsapi.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs := s.calls[actionID]
	if cs == nil || cs.status != "" {
		return nil
	}
	cs.status = status
	// Done when every call of the batch is final, counted from the calls
	// themselves: a counter drifts when an id is listed twice or a call
	// outside the batch is finalised.
	for _, id := range s.batch {
		if b := s.calls[id]; b != nil && b.status == "" {
			return nil
		}
	}
	if len(s.batch) == 0 {
		return nil
	}
	batch := s.batch
	s.batch = nil
	return s.resultsLocked(batch)
}

// ready are the results a failed post left: the next turn posts them
// first.
func (s *session) ready() []agentsapi.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.batch) > 0 {
		return nil
	}
	ids := make([]string, 0, len(s.calls))
	for id := range s.calls {
		ids = append(ids, id)
	}
	return s.resultsLocked(ids)
}

// resultsLocked are the results of the calls named, that may be posted
// and are not: each marked posting. s.mu is held.
func (s *session) resultsLocked(ids []string) []agentsapi.Result {
	var out []agentsapi.Result
	for _, id := range ids {
		cs := s.calls[id]
		if cs == nil || !cs.recorded || cs.status == "" || cs.status == executor.CallCancelled || cs.voided || cs.posted || cs.posting {
			continue
		}
		cs.posting = true
		r := agentsapi.Result{Call: cs.call, OK: cs.status == executor.CallCompleted, Output: cs.output}
		if a := cs.answer; a != nil {
			r.OK, r.Output = a.OK, a.Output
		}
		out = append(out, r)
	}
	return out
}

// releasable reports, for a session that rests with nothing of the
// sidecar's in flight (no call taken and not answered, no call untaken, no
// server call waiting for its confirmation), since when it rests: its
// watch may end, and a read, a post or a webhook starts another. It rests
// when idle, or blocked on calls of the application's own tools only:
// what it waits for is the application's, which answers through the
// sidecar or reads the session again.
func (s *session) releasable(owns func(string) bool) (since time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	blocked := s.status == agentsapi.StatusBlocked && len(s.pending) > 0
	for _, c := range s.pending {
		blocked = blocked && !owns(c.Name)
	}
	if (s.status != agentsapi.StatusIdle && !blocked) || s.busyLocked() || len(s.work(owns)) > 0 {
		return time.Time{}, false
	}
	for _, c := range s.asks {
		if !s.asked[c.ID] {
			return time.Time{}, false
		}
	}
	return s.restSince, true
}

// busy reports a batch in progress, or a call taken and not answered.
func (s *session) busy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.busyLocked()
}

func (s *session) busyLocked() bool {
	if len(s.batch) > 0 {
		return true
	}
	for _, cs := range s.calls {
		if !cs.posted && !cs.voided && cs.status != executor.CallCancelled {
			return true
		}
	}
	return false
}

// nextAsk waits for a server call awaiting permission that no
// confirmation answered; false when the session ended or ctx did.
func (s *session) nextAsk(ctx context.Context) (agentsapi.Call, bool) {
	for {
		s.mu.Lock()
		ended, wake := s.endedLocked(), s.wake
		for _, c := range s.asks {
			if !s.asked[c.ID] {
				s.mu.Unlock()
				return c, true
			}
		}
		s.mu.Unlock()
		if ended {
			return agentsapi.Call{}, false
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return agentsapi.Call{}, false
		}
	}
}

// confirmed marks a confirmation posted.
func (s *session) confirmed(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.asked == nil {
		s.asked = map[string]bool{}
	}
	s.asked[id] = true
}

// journaledBefore reports a result whose answer a sidecar before this
// one journaled.
func (s *session) journaledBefore(results []agentsapi.Result) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range results {
		if cs := s.calls[actionID(s.id, r.Call.ID)]; cs != nil && cs.answer != nil {
			return true
		}
	}
	return false
}

// posted marks results posted: the session's list no longer holds them.
func (s *session) posted(results []agentsapi.Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	done := map[string]bool{}
	for _, r := range results {
		if cs := s.calls[actionID(s.id, r.Call.ID)]; cs != nil {
			cs.posting, cs.posted = false, true
		}
		done[r.Call.ID] = true
	}
	keep := s.pending[:0]
	for _, c := range s.pending {
		if !done[c.ID] {
			keep = append(keep, c)
		}
	}
	s.pending = keep
	s.changed()
}

// unpost takes back the marks of a post that failed.
func (s *session) unpost(results []agentsapi.Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range results {
		if cs := s.calls[actionID(s.id, r.Call.ID)]; cs != nil {
			cs.posting = false
		}
	}
}
