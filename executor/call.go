package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectdavid/toolsidecar/batch"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/internal/clock"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// call is one tool call, owned by one goroutine from its manifest to its
// Action's final status. [call.run] shows its steps in the order Core sees
// them; nothing about the call happens elsewhere.
type call struct {
	e   *Executor
	b   *batchRun
	m   *ToolCall
	def *registry.Tool // nil for an unknown tool
	pre *tool.Error    // why the call fails before it is dispatched, if it does
	ln  *lane          // its ordered lane, if any
	// laneBefore is closed when the call before it in its lane has its
	// outcome; nil when it is the first.
	laneBefore <-chan struct{}

	// Set when a reconciliation found the call open in Core.
	open     bool     // found open in the upstream, not read from the stream
	started  bool     // found open and marked started: it may have run
	kept     *outcome // the outcome a previous drive kept when Core did not take it
	recorded bool     // its output is in Core already: only its Action is finalised

	place  *batch.Place
	o      *outcome
	ran    chan struct{} // closed once o is known: the next call of its lane may start
	marked chan error    // the processing mark's answer, when one was sent
	// markDone withdraws the processing mark if it still waits to leave
	// once the tool has answered: Core, so far behind, would hear that the
	// call started after it had ended; pending to final is allowed.
	markDone chan struct{}
	markOne  sync.Once
	err      error // why the outcome did not reach Core, if it did not

	traceparent string // the worker's trace context
}

// run is the whole life of the call. A failed tool is a value in the
// outcome; only a submission Core did not take is the call's error, kept
// in c.err.
func (c *call) run(ctx context.Context) {
	// 1–4: check the call, apply the policies, mark processing and
	// dispatch; the outcome, success or error, is known after this.
	start := time.Now()
	if c.kept != nil || c.recorded {
		c.o = c.outcome(ctx) // settled by an earlier drive: nothing runs
	} else {
		var span trace.Span
		ctx, span, c.traceparent = c.e.startCall(ctx, c.b, c.m)
		c.e.obs.CallsInFlight(1)
		c.o = c.outcome(ctx)
		c.e.observeCall(ctx, c, start, span)
		c.e.obs.CallsInFlight(-1)
		span.End()
	}
	c.o.res.Timeline.Started, c.o.res.Timeline.Replied = start, c.o.done
	close(c.ran)

	// 5. Record the output: once Core has answered the processing mark,
	// and after the previous call of the batch has recorded its own (Core
	// appends tool messages in arrival order). A cancelled run is still
	// submitted, within the submit budget, which starts when the output
	// can be submitted: waiting for an earlier call (one that waits for a
	// person, say) spends none of it.
	c.awaitMark()
	cancel := context.CancelFunc(func() {})
	defer func() { cancel() }()
	c.place.InOrder(func() {
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), c.e.cfg.SubmitBudget)
		c.err = c.record(ctx)
	})
	c.o.res.Timeline.Recorded = time.Now()

	// 6. Finalise the Action: its status is the call's last write. It may
	// overlap the next calls' outputs; the application hears the results
	// in the order the model made the calls.
	if c.err == nil {
		c.err = c.finalise(ctx)
	}
	c.o.res.Timeline.Finalised = time.Now()
	c.place.ThenInOrder(func() {
		if c.err == nil {
			res := c.o.res
			c.b.emit(Event{Type: EventToolResult, Turn: res.Turn, Call: &res})
			// The summary keeps no tool output: a drive's memory does
			// not grow with what its tools return.
			c.o.res.Output, c.o.content = "", ""
		}
	})
}

// outcome runs steps 1 to 4. A panic in the sidecar's own code becomes
// the call's error outcome.
func (c *call) outcome(ctx context.Context) (o *outcome) {
	defer func() {
		if p := recover(); p != nil {
			callLog(c.b.log, c.m).Error("call panicked in the sidecar", "panic", fmt.Sprint(p))
			o = c.e.failed(c.b.n, c.m, tool.NewError(tool.WorkerCrash, "the sidecar failed while running the call: %v", p))
		}
	}()
	switch {
	case c.kept != nil:
		return c.kept
	case c.recorded:
		return c.e.alreadyRecorded(c.b.n, c.m)
	}
	o = newOutcome(c.b.n, c.m)
	// 1. Check: the tool, its arguments and its route (done as the
	// manifest arrived, so that budgets count calls in the model's order).
	// A call found processing may have run before a fault: its reply may
	// be in the ledger, and an unsafe one is not run again.
	if c.pre == nil && c.started {
		if rec, neverSent := c.e.recovered(ctx, c.b, c.m, c.def); rec != nil {
			return rec
		} else if c.def.SideEffects == config.Unsafe && !neverSent {
			c.pre = tool.NewError(tool.Interrupted, "the call of unsafe tool %q was started before a fault and its effect is unknown; "+
				"it was not run again. Check its effect before you call it again", c.m.Tool)
		}
	}
	// 2. Policies (policies.go): each may answer the call without a
	// worker, whose Action then goes from pending to its final status; a
	// call that failed its check is answered there, in its lane's order.
	// 3–4. The innermost step, dispatch, marks the call processing and
	// sends it until the worker's final reply.
	reply := c.e.dispatch.of(c)(ctx, c, o)
	c.e.settle(o, reply)
	return o
}

// dispatch is steps 3 and 4: with a slot of the batch, mark the Action
// processing and send attempts under the tool's retry policy.
func (c *call) dispatch(ctx context.Context, o *outcome) tool.Outcome {
	release, err := c.place.Slot(ctx)
	if err != nil {
		return tool.Outcome{Err: tool.NewError(tool.Cancelled, "call cancelled before it was sent: %v", err)}
	}
	defer release()
	// 3. An unsafe tool is sent only once Core knows it started, so that a
	// reconciliation never runs it twice. Any other tool is marked as its
	// first attempt leaves, and its output waits for that mark's answer.
	if c.def.SideEffects == config.Unsafe && !c.e.markProcessing(ctx, c.b.rec, c.m, c.b.log) {
		return tool.Outcome{Err: unsafeNotMarked(c.m)}
	}
	// 4. Attempts, until success, a final error or the retry budget.
	reply := c.attempts(ctx, o)
	c.markOne.Do(func() {}) // no mark starts after the attempts
	if c.markDone != nil {
		close(c.markDone)
	}
	return reply
}

// attempts sends the call until a reply settles it: a timeout, no
// responders or a retryable worker error is tried again, but an unsafe
// tool is never resent once a worker may have received it.
func (c *call) attempts(ctx context.Context, o *outcome) tool.Outcome {
	d := c.e.routes[c.def.Route]
	var b interface{ NextBackOff() time.Duration }
	for attempt := 1; ; attempt++ {
		req := tool.Request{Tool: c.def.Name, Body: c.m.Raw, ActionID: c.m.ActionID, RunID: c.m.RunID, Attempt: attempt,
			Timeout: c.def.Timeout, MaxDuration: c.def.MaxDuration, Traceparent: c.traceparent,
			Unsafe: c.def.SideEffects == config.Unsafe, OnProgress: c.progress, OnSent: c.markOnSend(ctx)}
		reply, used := c.e.send(ctx, d, c.def, req, &o.res)
		attempt += used - 1
		o.res.Attempts = attempt
		if reply.Err == nil || attempt > c.def.Retries || ctx.Err() != nil || !reply.Err.Retryable() ||
			(reply.Sent && c.def.SideEffects == config.Unsafe) {
			return reply
		}
		if b == nil {
			b = retryBackoff()
		}
		if clock.Sleep(ctx, b.NextBackOff()) != nil {
			return tool.Outcome{Err: tool.NewError(tool.Cancelled, "call cancelled between attempts: %v", context.Cause(ctx))}
		}
	}
}

// markOnSend is the attempts' OnSent for a tool that is not unsafe: the
// first attempt to leave sends the processing mark, on a goroutine that
// [call.awaitMark] waits for.
func (c *call) markOnSend(ctx context.Context) func() {
	if c.def.SideEffects == config.Unsafe {
		return nil
	}
	return func() {
		c.markOne.Do(func() {
			c.marked, c.markDone = make(chan error, 1), make(chan struct{})
			go func() { c.marked <- c.e.mark(ctx, c.b.rec, c.m, c.markDone) }()
		})
	}
}

// awaitMark waits for the processing mark's answer, if a mark was sent.
// A failed mark is logged and the call goes on: the mark is Core's
// notice that the call started, and the outcome is what counts.
func (c *call) awaitMark() {
	c.markOne.Do(func() {}) // no mark starts after this
	if c.marked == nil {
		return
	}
	if err := <-c.marked; err != nil && !errors.Is(err, ErrWithdrawn) {
		callLog(c.b.log, c.m).Warn("marking action processing failed", "err", err)
	}
}

// progress tells the drive's followers that the worker reported progress.
func (c *call) progress() {
	c.b.emit(Event{Type: EventProgress, Turn: c.b.n, Call: &CallResult{Turn: c.b.n, ToolCallID: c.m.ToolCallID, ActionID: c.m.ActionID, Tool: c.m.Tool}})
}

// record posts the call's tool message, exactly once (the Core client reads
// the thread back before it posts again after an uncertain failure).
// After a submission of the batch ran out of budget, the rest are kept
// for the next drive without being tried.
func (c *call) record(ctx context.Context) error {
	o := c.o
	if o.deferred {
		why := fmt.Errorf("%w: call %s (%s) before it waits for approval", ErrLeftForNextDrive, c.m.ToolCallID, c.m.Tool)
		c.b.keepRest.CompareAndSwap(nil, &why)
		return fmt.Errorf("call %s (%s): %w: it waits for approval as the sidecar stops", c.m.ToolCallID, c.m.Tool, ErrLeftForNextDrive)
	}
	if why := c.b.keepRest.Load(); why != nil {
		c.e.keep(o)
		return fmt.Errorf("call %s (%s): not tried: %w", c.m.ToolCallID, c.m.Tool, *why)
	}
	if o.recorded {
		return nil
	}
	if cause := context.Cause(c.b.ctx); errors.Is(cause, tool.ErrLeft) {
		// Abandoned: no output is written after the sidecar gave up its
		// drives, this call's or (call order) a later one's.
		why := fmt.Errorf("call %s (%s): %w", c.m.ToolCallID, c.m.Tool, cause)
		c.b.keepRest.CompareAndSwap(nil, &why)
		return why
	}
	if err := c.b.rec.RecordOutput(ctx, c.b.req, c.m, o.content); err != nil {
		return c.keepAfter("tool output not recorded", err)
	}
	o.recorded = true
	return nil
}

// finalise writes the Action's final status with a summary of the result.
func (c *call) finalise(ctx context.Context) error {
	o := c.o
	result := map[string]any{"ok": o.res.OK, "attempts": o.res.Attempts, "duration_ms": o.res.DurationMS, "bytes": len(o.content)}
	if !o.res.OK {
		result["error_type"], result["error"] = o.res.ErrorType, o.res.Error
	}
	if err := c.b.rec.Finalise(ctx, c.m, o.status, result); err != nil {
		return c.keepAfter("action not finalised", err)
	}
	o.res.Submitted = true
	return nil
}

// keepAfter keeps the outcome Core did not take for the next drive of the
// run, and says which write failed.
func (c *call) keepAfter(what string, err error) error {
	callLog(c.b.log, c.m).Error(what+"; the outcome is kept for the next drive", "err", err)
	c.e.keep(c.o)
	if errors.Is(err, ErrSubmitBudget) {
		why := fmt.Errorf("%w: an earlier submission of the batch ran out of budget", ErrSubmitBudget)
		c.b.keepRest.CompareAndSwap(nil, &why)
	}
	return fmt.Errorf("call %s (%s): %s: %w", c.m.ToolCallID, c.m.Tool, what, err)
}

// mark sets the Action processing for a tool that is not unsafe: its
// answer is awaited before the output, within the submit budget, even
// when the run is cancelled meanwhile, so that Core never applies the
// mark after a later write of the call.
func (e *Executor) mark(ctx context.Context, rec recorder, m *ToolCall, withdraw <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.SubmitBudget)
	defer cancel()
	return rec.MarkStarted(ctx, m, withdraw)
}

// intendTimeout bounds the ledger write before an unsafe call is marked
// processing.
const intendTimeout = 2 * time.Second

// markProcessing sets the Action of an unsafe call processing before it
// is sent: the write must land (within the submit budget), or the call
// does not run.
func (e *Executor) markProcessing(ctx context.Context, rec recorder, m *ToolCall, log *slog.Logger) bool {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.SubmitBudget)
	defer cancel()
	if e.recoverer != nil {
		// Without it a crash before the send leaves the call "unknown"
		// (interrupted), never run twice: best effort, and bounded, since a
		// write lost with a NATS node would otherwise hold the call for the
		// whole budget.
		ictx, icancel := context.WithTimeout(pctx, intendTimeout)
		if err := e.recoverer.Intend(ictx, m.ActionID, m.RunID, m.Tool); err != nil {
			callLog(log, m).Warn("recording the intent to send an unsafe call", "err", err)
		}
		icancel()
	}
	if err := rec.MarkStarted(pctx, m, nil); err != nil {
		callLog(log, m).Error("marking an unsafe call processing failed: not running it", "err", err)
		return false
	}
	return true
}

// unsafeNotMarked: an unsafe call runs only once Core knows it started, so
// that a later reconciliation does not run it a second time.
func unsafeNotMarked(m *ToolCall) *tool.Error {
	return tool.NewError(tool.Interrupted, "Core could not be told that the call of unsafe tool %q started, so it was not run", m.Tool)
}

// observeCall records the call's outcome in the log, the span and the
// metrics.
func (e *Executor) observeCall(ctx context.Context, c *call, start time.Time, span trace.Span) {
	o := c.o
	d := time.Since(start)
	o.res.DurationMS = d.Milliseconds()
	if c.ln != nil {
		o.res.Lane = c.ln.name
	}
	if !o.res.OK {
		callLog(c.b.log, c.m).InfoContext(ctx, "call failed", "error_type", o.res.ErrorType, "err", o.res.Error, "attempts", o.res.Attempts, "duration", d)
		span.SetStatus(codes.Error, o.res.ErrorType)
		e.obs.CallDone(c.m.Tool, o.res.ErrorType, d)
	} else {
		e.obs.CallDone(c.m.Tool, "ok", d)
	}
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.Int("toolsidecar.attempts", o.res.Attempts), attribute.Bool("toolsidecar.ok", o.res.OK))
	if !o.res.OK {
		span.SetAttributes(attribute.String("error.type", o.res.ErrorType))
	}
}
