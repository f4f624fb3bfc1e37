package openaiup

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/internal/clock"
	"github.com/projectdavid/toolsidecar/internal/frames"
	"github.com/projectdavid/toolsidecar/internal/retry"
	"github.com/projectdavid/toolsidecar/modelapi"
	"github.com/projectdavid/toolsidecar/runstore"
)

var (
	// ErrCut: a stream ended before its finish chunk. Only its calls whose
	// arguments were whole (and whose tools are not unsafe) were handed
	// over; the rest may be half-built and never run.
	ErrCut = errors.New("openaiup: the stream ended before the turn's finish chunk")
	// ErrIdle: a stream was silent for longer than the idle timeout.
	ErrIdle = errors.New("openaiup: the stream was idle too long")
)

// turn is one turn: its stream, asked for again when it is cut before its
// finish chunk. A call is handed to the executor as soon as its arguments
// are whole, so that its tool runs while the model still writes the next
// ones; a call of an unsafe tool waits for the finish chunk, so that an
// unsafe call of a cut stream never runs. When a cut turn is asked for
// again, a call it makes again (same tool, same arguments) is the call
// already handed over, not a second one.
type turn struct {
	u     *Upstream
	r     *run
	n     int // the turn's number in the run
	ctx   context.Context
	req   executor.Request // the drive's: a fresh run's lease, being taken (Leased)
	body  []byte
	runID string
	until time.Time // the end of the retry budget

	stream *attempt
	sent   []*sentCall // handed to the executor, by every attempt
}

// sentCall is a call handed to the executor; used: the current attempt
// made it.
type sentCall struct {
	call *executor.ToolCall
	used bool
}

// attempt is one response to the turn's request.
type attempt struct {
	ctx    context.Context
	read   *frames.EventStream // its events, and the idle timer
	cancel context.CancelCauseFunc
	close  func() error
}

func (t *turn) connect() error {
	now := time.Now()
	if t.until.IsZero() {
		t.until = now.Add(t.u.cfg.RetryBudget)
	}
	ctx, cancel := context.WithCancelCause(t.ctx)
	resp, err := t.u.client.Post(ctx, t.body, t.r.headers, t.u.key(ctx), t.until.Sub(now))
	if err != nil {
		cancel(err)
		return err
	}
	a := &attempt{ctx: ctx, cancel: cancel, close: resp.Body.Close}
	bound := t.u.api.EventBound(t.u.cfg.MaxResponseBytes)
	a.read = frames.ReadEvents(resp.Body, bound, oversizedEvent, t.u.cfg.IdleTimeout, func() { cancel(ErrIdle) })
	t.stream = a
	return nil
}

// oversizedEvent replaces an event too long to read whole; its data is
// the event's size.
func oversizedEvent(o frames.Oversized) []byte {
	return fmt.Appendf(nil, "event: %s\ndata: %d\n\n", frames.OversizedEvent, o.Size)
}

// Close releases the stream.
func (t *turn) Close() {
	if a := t.stream; a != nil {
		a.read.Stop()
		a.cancel(context.Canceled)
		_ = a.close()
	}
}

// reading is what one attempt has read of the turn.
type reading struct {
	text     strings.Builder
	diverged bool // the text went another way than the cut attempts' did
	calls    assembler
	handed   map[*partial]*executor.ToolCall
	finish   string
	usage    modelapi.Usage
	model    string
	created  int64
	failed   string // the upstream's error event
	parser   modelapi.Parser
}

// Events reads the turn: text as it comes, then its calls. A stream cut
// before its finish chunk is asked for again, after a backoff, within the
// retry budget.
func (t *turn) Events() iter.Seq2[executor.TurnEvent, error] {
	return func(yield func(executor.TurnEvent, error) bool) {
		var shown string // the text that attempts cut short gave the application
		b := retry.UpstreamTurn.New()
		for {
			rd, err, more := t.read(yield, shown)
			if !more {
				return
			}
			if err == nil {
				t.end(rd, yield)
				return
			}
			wait := b.NextBackOff()
			if t.ctx.Err() != nil || time.Now().Add(wait).After(t.until) {
				err = fmt.Errorf("the upstream at %s: %w, past upstream.retry_budget", t.u.host, err)
				t.journalFailed(err.Error())
				yield(executor.TurnEvent{}, err)
				return
			}
			if rd.text.Len() > len(shown) {
				shown = rd.text.String()
			}
			t.u.log.Warn("turn cut; asking for it again", "run_id", t.runID, "err", err, "after", wait)
			t.Close()
			if clock.Sleep(t.ctx, wait) != nil {
				yield(executor.TurnEvent{}, context.Cause(t.ctx))
				return
			}
			if cerr := t.connect(); cerr != nil {
				yield(executor.TurnEvent{}, fmt.Errorf("%w; asking again: %w", err, cerr))
				return
			}
		}
	}
}

// read reads one attempt to its end. err is nil when the finish chunk
// came (or the upstream reported an error in the stream), ErrCut or the
// read's error when the stream ended before it. more is false when the
// executor stopped reading.
func (t *turn) read(yield func(executor.TurnEvent, error) bool, shown string) (rd *reading, err error, more bool) {
	rd = &reading{handed: map[*partial]*executor.ToolCall{}, calls: assembler{maxArgs: t.u.cfg.MaxResponseBytes}, parser: t.u.api.NewParser()}
	for _, sc := range t.sent {
		sc.used = false
	}
	a := t.stream
	for ev, rerr := range a.read.Seq {
		if rerr != nil {
			if cause := context.Cause(a.ctx); cause != nil {
				rerr = cause
			}
			return rd, fmt.Errorf("%w: %w", ErrCut, rerr), true
		}
		data := ev.Data
		if ev.Type == frames.OversizedEvent {
			// Its calls, if it held any, cannot be known, so they cannot be
			// answered: the run fails saying so (asking again would bring
			// the same event). The calls handed over already are joined.
			err := fmt.Errorf("the upstream sent an event of %s bytes, over the limit of %d; what it held is lost", data, t.u.api.EventBound(t.u.cfg.MaxResponseBytes))
			if !yield(executor.TurnEvent{}, &executor.LostCallError{Err: err}) {
				return rd, nil, false
			}
			continue
		}
		if data == "" {
			continue
		}
		pc, err := rd.parser.Take(ev)
		if err != nil {
			if !yield(executor.TurnEvent{}, fmt.Errorf("%w: %w", executor.ErrBadFrame, err)) {
				return rd, nil, false
			}
			continue
		}
		if pc.Done {
			break
		}
		if pc.Failed != "" {
			rd.failed = pc.Failed
			if !yield(executor.TurnEvent{Kind: executor.TurnError, Text: rd.failed, Raw: []byte(data)}, nil) {
				return rd, nil, false
			}
			return rd, nil, true
		}
		if !t.take(rd, &pc, []byte(data), shown, yield) {
			return rd, nil, false
		}
	}
	if rd.finish == "" && rd.failed == "" {
		return rd, ErrCut, true
	}
	return rd, nil, true
}

// take applies one event's piece: its text goes to the executor (the part
// the application has not been given yet, when the turn was asked for
// again), its call fragments to the assembler.
func (t *turn) take(rd *reading, pc *modelapi.Piece, raw []byte, shown string, yield func(executor.TurnEvent, error) bool) bool {
	if rd.model == "" {
		rd.model, rd.created = pc.Model, pc.Created
	}
	if pc.Usage != nil {
		rd.usage = *pc.Usage
	}
	if pc.Reasoning != "" && !yield(executor.TurnEvent{Kind: executor.TurnReasoning, Text: pc.Reasoning, Raw: raw}, nil) {
		return false
	}
	if pc.Text != "" {
		if fresh := rd.unshown(pc.Text, shown); fresh != "" {
			t.r.say(fresh)
			if !yield(executor.TurnEvent{Kind: executor.TurnText, Text: fresh, Raw: raw}, nil) {
				return false
			}
		}
	}
	rd.calls.add(pc.Calls)
	if len(pc.Calls) > 0 && !t.handReady(rd, yield) {
		return false
	}
	if pc.Finish != "" && rd.finish == "" {
		rd.finish = pc.Finish // the first wins (two come from some proxies)
	}
	return true
}

// handReady hands the executor each call whose arguments are whole, unless
// its tool is unsafe or the application's.
func (t *turn) handReady(rd *reading, yield func(executor.TurnEvent, error) bool) bool {
	for _, p := range rd.calls.calls {
		if rd.handed[p] != nil || !p.ready() || t.r.appTools[p.name] || t.u.unsafe(p.name) {
			continue
		}
		if c, fresh := t.hand(rd, p); fresh && !yield(executor.TurnEvent{Kind: executor.TurnToolCall, Call: c}, nil) {
			return false
		}
	}
	return true
}

// hand makes p the executor's call: the call an earlier attempt handed
// over with the same tool and arguments, or a new one (fresh). The
// executor's id of the call is unique in the turn; the assistant message
// keeps the model's.
func (t *turn) hand(rd *reading, p *partial) (c *executor.ToolCall, fresh bool) {
	args := p.args.String()
	for _, sc := range t.sent {
		if !sc.used && sc.call.Tool == p.name && sameJSON(string(sc.call.Args), args) {
			sc.used = true
			rd.handed[p] = sc.call
			return sc.call, false
		}
	}
	modelID := p.id
	if !usableID(p.id) || slices.ContainsFunc(rd.calls.calls, func(o *partial) bool { return o != p && o.id == p.id }) {
		p.id, modelID = newCallID(), ""
	}
	a := assemble(p)
	t.r.mu.Lock()
	if t.r.pending.handed[a.ID] {
		a.ID = newCallID() // an attempt that was cut gave this id to another call
	}
	t.r.pending.handed[a.ID] = true
	t.r.mu.Unlock()
	c = callOf(t.runID, t.n, slices.Index(rd.calls.calls, p), modelID, a)
	t.sent = append(t.sent, &sentCall{call: c, used: true})
	rd.handed[p] = c
	return c, true
}

// unshown adds piece to the attempt's text and returns the part of it
// the application has not been given: a turn asked for again after a cut
// usually says the same words again, and shown (what the cut attempts
// gave) is not given twice. Past shown, or once the text has gone another
// way, every piece is new. Each piece is compared once, with its own span
// of shown only.
func (rd *reading) unshown(piece, shown string) string {
	start := rd.text.Len()
	rd.text.WriteString(piece)
	if rd.diverged || start >= len(shown) {
		return piece
	}
	same := min(len(piece), len(shown)-start)
	if piece[:same] != shown[start:start+same] {
		rd.diverged = true
		return piece
	}
	return piece[same:]
}

// end records the finished turn in the run, and hands the executor the
// calls it has not been handed yet, in the order the model made them.
// Calls of tools the application declared are its own: they are kept for
// its answer.
func (t *turn) end(rd *reading, yield func(executor.TurnEvent, error) bool) {
	calls := rd.calls.done()
	var fresh []*executor.ToolCall
	if rd.failed == "" {
		for i, c := range calls {
			part := rd.calls.calls[i]
			if rd.handed[part] != nil || t.r.appTools[c.Name] {
				continue
			}
			if ec, isNew := t.hand(rd, part); isNew {
				fresh = append(fresh, ec)
			}
		}
	}
	r := t.r
	rec := turnRecord{Turn: runstore.Turn{Content: rd.text.String(), Model: rd.model, Created: rd.created, Finish: rd.finish, Failed: rd.failed}, Usage: rd.usage}
	r.mu.Lock()
	p := r.pending
	p.read = true
	for _, sc := range t.sent {
		if !sc.used {
			// An attempt that was cut handed it over, and the last
			// attempt did not make it: it may have run, but it is no
			// part of the turn.
			p.ghosts[sc.call.ToolCallID] = true
		}
	}
	if rd.failed == "" && len(calls) > 0 {
		t.record(rd, calls, &rec)
	}
	if rd.failed != "" {
		rec.Handed = t.handed()
	}
	r.apply(rec)
	if len(rec.AppCalls) > 0 {
		r.result.AppCalls = rec.AppCalls
		if len(p.calls) == 0 {
			// Only the application's calls: nothing for the executor.
			r.result.Parked, _ = p.messages(t.u.api, false)
			r.status = executor.RunCompleted
		}
	}
	// The turn is journaled while its calls run: its unsafe calls start
	// (MarkStarted), the next turn is asked (Turn) and the answer ends
	// (End) only once the write is over. A turn the journal could not
	// take runs its other calls, and a retry asks for it again.
	written := make(chan struct{})
	p.written = written
	r.mu.Unlock()
	go t.journal(p, rec, written)
	for _, c := range fresh {
		if !yield(executor.TurnEvent{Kind: executor.TurnToolCall, Call: c}, nil) {
			return
		}
	}
}

// record adds the calls of the turn, read whole, to its pending turn and
// its record: the assistant message with every call, the sidecar's calls
// (each handed over as it came) and the application's. r.mu is held.
func (t *turn) record(rd *reading, calls []modelapi.Call, rec *turnRecord) {
	p := t.r.pending
	var err error
	if p.assistant, err = rd.parser.Assistant(rec.Content, calls); err != nil {
		t.u.log.Error("the turn's assistant message could not be written", "run_id", t.runID, "err", err)
	}
	for i, c := range calls {
		tc := c.ToolCall()
		p.order = append(p.order, tc)
		if t.r.appTools[c.Name] {
			rec.AppCalls = append(rec.AppCalls, tc)
			continue
		}
		ec := rd.handed[rd.calls.calls[i]]
		if !sameJSON(string(ec.Args), c.Args) && c.Problem == "" {
			t.u.log.Warn("a call's arguments grew after it was handed over", "run_id", t.runID, "tool_call_id", ec.ToolCallID)
		}
		p.idOf[tc.ID] = ec.ToolCallID
		p.calls = append(p.calls, ec)
		rec.Calls = append(rec.Calls, journaledOf(tc.ID, ec))
	}
	rec.Assistant = p.assistant
}

// journal writes the turn's record, and closes written when it is over.
// It is not cancelled with the turn, which ends before the write when it
// made no call: a delivered turn is written (runstore.Timeout).
func (t *turn) journal(p *pendingTurn, rec turnRecord, written chan struct{}) {
	defer close(written)
	err := t.u.journalTurn(context.WithoutCancel(t.ctx), t.req, t.r, t.n, rec)
	if err != nil {
		t.u.log.Warn("journaling the turn failed: its unsafe calls will not run", "run_id", t.runID, "turn", t.n, "err", err)
	}
	t.r.mu.Lock()
	p.journaled = err == nil
	t.r.mu.Unlock()
}

// handed lists the calls the turn handed over, by every attempt.
func (t *turn) handed() []runstore.Call {
	out := make([]runstore.Call, len(t.sent))
	for i, sc := range t.sent {
		out[i] = journaledOf("", sc.call)
	}
	return out
}

// journalFailed journals a turn that ended without its finish chunk: a
// retry asks for it again, reusing the outputs of the calls it had handed
// over.
func (t *turn) journalFailed(why string) {
	if err := t.u.journalTurn(t.ctx, t.req, t.r, t.n, turnRecord{Turn: runstore.Turn{Failed: why, Handed: t.handed()}}); err != nil {
		t.u.log.Warn("journaling the failed turn", "run_id", t.runID, "turn", t.n, "err", err)
	}
}
