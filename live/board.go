// Package live is the live view of the sidecar: a board of the runs in
// flight and the recent ones, built from the executor's events, and one
// page (/ui) that draws each turn's batch as a timeline, lists the pending
// approvals with Approve and Deny buttons, and follows changes over SSE
// (/ui/events). The page is embedded in the binary and needs no network
// beyond the sidecar.
package live

import (
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/projectdavid/toolsidecar/executor"
)

// Bounds of what the board keeps: it shows, it does not archive.
const (
	maxCallsPerRun = 1000 // calls drawn per run; more are counted only
	maxTextBytes   = 200  // of an error or a result preview
)

// Run is one run as the live view shows it.
type Run struct {
	ID      string  `json:"id"`
	Status  string  `json:"status"` // running, or the drive's final status
	Started int64   `json:"started"`
	Ended   int64   `json:"ended,omitempty"`
	Turns   []*Turn `json:"turns"`
	Calls   int     `json:"calls"`
	Errors  int     `json:"errors"`
	Error   string  `json:"error,omitempty"`
	// TraceID is the last drive's trace, when it was traced.
	TraceID string `json:"trace_id,omitempty"`
	// owner is the caller whose drive began the row (executor.CallerOf, a
	// digest; "" for a run of no caller): who may see it (Access). Never
	// shown.
	owner string
}

// Turn is one turn of a run and its batch.
type Turn struct {
	N       int     `json:"n"`
	Started int64   `json:"started"`
	Calls   []*Call `json:"calls"`
}

// Call is one call of a batch. Times are Unix milliseconds; 0 is a step
// that has not happened (or never will).
type Call struct {
	ToolCallID string `json:"tool_call_id"`
	ActionID   string `json:"action_id"`
	Tool       string `json:"tool"`
	Lane       string `json:"lane,omitempty"`
	Dispatched int64  `json:"dispatched"`
	// ApprovalAsked and Decided bracket the wait for a person.
	ApprovalAsked int64  `json:"approval_asked,omitempty"`
	Decided       int64  `json:"decided,omitempty"`
	Approval      string `json:"approval,omitempty"` // waiting, or the verdict's outcome
	Approver      string `json:"approver,omitempty"`
	Replied       int64  `json:"replied,omitempty"`
	Recorded      int64  `json:"recorded,omitempty"`
	Finalised     int64  `json:"finalised,omitempty"`
	// Outcome is "" while the call runs, then ok or an error type.
	Outcome     string `json:"outcome,omitempty"`
	Error       string `json:"error,omitempty"`
	Preview     string `json:"preview,omitempty"` // the start of the output
	Attempts    int    `json:"attempts,omitempty"`
	Hedged      bool   `json:"hedged,omitempty"`
	DedupedFrom string `json:"deduped_from,omitempty"`
	ClaimCheck  bool   `json:"claim_check,omitempty"`
}

// Board keeps the runs in flight and the last History finished ones, and
// tells its watchers what changed. It is safe for concurrent use; Observe
// never blocks on a watcher.
type Board struct {
	history int

	mu       sync.Mutex
	runs     map[string]*Run
	finished []string // oldest first, at most history
	watchers map[*watcher]struct{}

	closed    chan struct{} // closed by Close: the pages' streams end
	closeOnce sync.Once
}

// watcher is one page's queue of changes: the runs changed since it last
// looked, and whether the approvals did.
type watcher struct {
	wake      chan struct{} // cap 1
	runs      map[string]bool
	approvals bool
}

// NewBoard returns a board that keeps history finished runs.
func NewBoard(history int) *Board {
	return &Board{history: max(1, history), runs: map[string]*Run{}, watchers: map[*watcher]struct{}{}, closed: make(chan struct{})}
}

// Close ends the pages' streams, so that a browser left open on the view
// does not hold the server's graceful shutdown (register it with
// http.Server.RegisterOnShutdown). The board still folds events.
func (b *Board) Close() { b.closeOnce.Do(func() { close(b.closed) }) }

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// cut bounds a text the page shows.
func cut(s string) string {
	if len(s) <= maxTextBytes {
		return s
	}
	i := maxTextBytes
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// Observe is the executor's tap (executor.WithTap): it folds one event of
// a run, driven for caller, into the board. The row is the caller's whose
// drive began it: a later drive of the run by another caller (one Core let
// read it) leaves it so.
func (b *Board) Observe(runID, caller string, ev executor.Event) {
	switch ev.Type {
	case executor.EventContent, executor.EventReasoning, executor.EventChunk, executor.EventError, executor.EventProgress:
		return // text, raw chunks and progress: the view does not show them, and they are most events
	}
	now := time.Now().UnixMilli()
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.runs[runID]
	switch {
	case r == nil:
		r = &Run{ID: runID, Status: "running", Started: now, Turns: []*Turn{}, owner: caller}
		b.runs[runID] = r
	case r.Ended != 0 && ev.Type == executor.EventDone:
		// A drive of a run that had ended, answered with its state and
		// nothing run: the row keeps what the run did, and how long.
		return
	case r.Ended != 0:
		// A run that stopped (interrupted, say) driven again: its row
		// goes on, with the turns it had, from this drive's start.
		b.forget(runID)
		r.Status, r.Ended, r.Error, r.Started = "running", 0, "", now
	}
	approvals := false
	switch ev.Type {
	case executor.EventTurn:
		r.turn(ev.Turn, now)
	case executor.EventToolCall:
		if r.Calls < maxCallsPerRun {
			t := r.turn(ev.Turn, now)
			t.Calls = append(t.Calls, &Call{ToolCallID: ev.Call.ToolCallID, ActionID: ev.Call.ActionID, Tool: ev.Call.Tool,
				Lane: ev.Call.Lane, Dispatched: now})
		}
		r.Calls++
	case executor.EventApprovalRequired:
		approvals = true
		if c := r.call(ev.Turn, ev.Call.ActionID); c != nil {
			c.ApprovalAsked, c.Approval = now, "waiting"
		}
	case executor.EventApprovalDecided:
		approvals = true
		if c := r.call(ev.Turn, ev.Call.ActionID); c != nil && ev.Approval != nil && ev.Approval.Verdict != nil {
			c.Decided, c.Approval, c.Approver = now, ev.Approval.Verdict.Outcome, ev.Approval.Verdict.Approver
			if c.ApprovalAsked == 0 { // decided while no sidecar listened
				c.ApprovalAsked = c.Decided
			}
		}
	case executor.EventToolResult:
		res := ev.Call
		if !res.OK {
			r.Errors++
		}
		if c := r.call(ev.Turn, res.ActionID); c != nil {
			c.fill(res)
		}
	case executor.EventDone:
		r.Ended = now
		if ev.Summary != nil {
			r.Status, r.Error, r.TraceID = ev.Summary.Status, cut(ev.Summary.Error), ev.Summary.TraceID
		}
		b.finished = append(b.finished, runID)
		if len(b.finished) > b.history {
			delete(b.runs, b.finished[0])
			b.finished = b.finished[1:]
		}
	}
	for w := range b.watchers {
		w.runs[runID] = true
		w.approvals = w.approvals || approvals
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// forget drops a run from the finished list; called with mu held.
func (b *Board) forget(runID string) {
	if i := slices.Index(b.finished, runID); i >= 0 {
		b.finished = slices.Delete(b.finished, i, i+1)
	}
}

// turn returns the run's turn n, starting it if it has not started.
func (r *Run) turn(n int, now int64) *Turn {
	for _, t := range r.Turns {
		if t.N == n {
			return t
		}
	}
	t := &Turn{N: n, Started: now, Calls: []*Call{}}
	r.Turns = append(r.Turns, t)
	return t
}

// call finds a call of turn n by its Action.
func (r *Run) call(n int, actionID string) *Call {
	for _, t := range r.Turns {
		if t.N != n {
			continue
		}
		for _, c := range t.Calls {
			if c.ActionID == actionID {
				return c
			}
		}
	}
	return nil
}

// fill sets a call's outcome from its result.
func (c *Call) fill(res *executor.CallResult) {
	c.Outcome = "ok"
	if !res.OK {
		c.Outcome, c.Error = res.ErrorType, cut(res.Error)
	} else {
		c.Preview = cut(res.Output)
	}
	c.Attempts, c.Hedged, c.DedupedFrom, c.ClaimCheck = res.Attempts, res.Hedged, res.DedupedFrom, res.ClaimCheck != ""
	tl := res.Timeline
	c.Replied, c.Recorded, c.Finalised = ms(tl.Replied), ms(tl.Recorded), ms(tl.Finalised)
	if res.Approval != nil {
		c.Approval, c.Approver = res.Approval.Outcome, res.Approval.Approver
	}
}

// snapshot copies the runs, the most recent first.
func (b *Board) snapshot() []Run {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Run, 0, len(b.runs))
	for _, r := range b.runs {
		out = append(out, r.copy())
	}
	slices.SortFunc(out, func(a, b Run) int { return int(b.Started - a.Started) })
	return out
}

// run copies one run.
func (b *Board) run(id string) (Run, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.runs[id]
	if !ok {
		return Run{}, false
	}
	return r.copy(), true
}

// copy is a deep copy of the run, to encode outside the lock.
func (r *Run) copy() Run {
	c := *r
	c.Turns = make([]*Turn, len(r.Turns))
	for i, t := range r.Turns {
		tc := *t
		tc.Calls = make([]*Call, len(t.Calls))
		for j, call := range t.Calls {
			cc := *call
			tc.Calls[j] = &cc
		}
		c.Turns[i] = &tc
	}
	return c
}

// watch registers a watcher; stop unregisters it.
func (b *Board) watch() (w *watcher, stop func()) {
	w = &watcher{wake: make(chan struct{}, 1), runs: map[string]bool{}}
	b.mu.Lock()
	b.watchers[w] = struct{}{}
	b.mu.Unlock()
	return w, func() {
		b.mu.Lock()
		delete(b.watchers, w)
		b.mu.Unlock()
	}
}

// changes takes the watcher's queue: copies of the runs that changed
// (those forgotten since are left out) and whether the approvals did.
func (b *Board) changes(w *watcher) (runs []Run, approvals bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id := range w.runs {
		if r := b.runs[id]; r != nil {
			runs = append(runs, r.copy())
		}
	}
	clear(w.runs)
	approvals, w.approvals = w.approvals, false
	return runs, approvals
}
