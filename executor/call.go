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
	"github.com/projectdavid/toolsidecar/internal/clock"
	"github.com/projectdavid/toolsidecar/internal/retry"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// call is one tool call, owned by one goroutine from its arrival to its
// final record. [call.run] shows its steps in the order the upstream sees
// them; nothing about the call happens elsewhere.
type call struct {
	e   *Executor
	b   *batchRun
	m   *ToolCall
	def *registry.Tool // nil for an unknown tool
	in  callIn         // what the policies see of the call

	// started: a reconciliation found the call open and marked started,
	// so it may have run.
	started bool
	// known is an outcome known before the call runs: one an earlier
	// drive kept, or one whose output the upstream has already.
	known *outcome
	// settled: c.o is the call's outcome and nothing runs (known, or
	// recovered from the ledger).
	settled bool

	place *batch.Place
	o     *outcome
	mark  startMark
	err   error // why the outcome did not reach the upstream, if it did not

	traceparent string // the worker's trace context
}

// run is the whole life of the call. A failed tool is a value in the
// outcome; only a record the upstream did not take is the call's error,
// kept in c.err.
func (c *call) run(ctx context.Context) {
	ctx, observed := c.observe(ctx)
	c.check(ctx)         // 1. check the tool, its arguments and its admission
	a := c.policies(ctx) // 2. the policies, around 3. the started mark and 4. dispatch (c.dispatch)
	c.settle(a)
	observed()
	sctx, cancel := c.record(ctx) // 5. record the output, in call order
	defer cancel()
	c.finalise(sctx) // 6. the final record; the application hears the result in call order
}

// observe starts the call's span and counts it in flight; the function
// it returns records the outcome in the log, the span and the metrics.
// A call settled by an earlier drive is not observed again.
func (c *call) observe(ctx context.Context) (context.Context, func()) {
	start := time.Now()
	if c.known != nil {
		return ctx, func() { c.o.res.Timeline.Started, c.o.res.Timeline.Replied = start, c.o.done }
	}
	ctx, span, traceparent := c.e.startCall(ctx, c.b, c.m)
	c.traceparent = traceparent
	c.e.obs.CallsInFlight(1)
	return ctx, func() {
		c.e.observeCall(ctx, c, start, span)
		c.e.obs.CallsInFlight(-1)
		span.End()
		c.o.res.Timeline.Started, c.o.res.Timeline.Replied = start, c.o.done
	}
}

// check is step 1: the tool, its arguments and its ids are checked, and
// the admitting policies decide on the call as it arrives, in the model's
// order (the batch's arrival turn), where the application hears of it. A
// call found started may have run before a fault: its reply may be in the
// ledger, and an unsafe one is not run again.
func (c *call) check(ctx context.Context) {
	defer c.guard()
	if c.known != nil {
		c.o, c.settled = c.known, true
	} else {
		c.o = newOutcome(c.b.n, c.m)
		c.def, c.in.Check = c.e.precheck(c.b.reg, c.m)
		c.in.Tool = c.def
	}
	c.in.Res = &c.o.res
	c.place.Arrive(func() {
		if !c.settled && !c.in.Found {
			c.e.dispatch.admit(&c.in)
		}
		c.b.emit(Event{Type: EventToolCall, Turn: c.b.n, Call: c.in.ref()})
	})
	if c.settled || !c.started || c.in.Check != nil {
		return
	}
	if rec, neverSent := c.e.recovered(ctx, c.b, c.m, c.def); rec != nil {
		c.o, c.settled = rec, true
	} else if c.def.Unsafe() && !neverSent {
		c.in.Check = tool.NewError(tool.Interrupted, "the call of unsafe tool %q was started before a fault and its effect is unknown; "+
			"it was not run again. Check its effect before you call it again", c.m.Tool)
	}
}

// guard turns a panic in the sidecar's own code into the call's error
// outcome.
func (c *call) guard() {
	if p := recover(); p != nil {
		if c.o == nil {
			c.o = newOutcome(c.b.n, c.m)
		}
		c.in.Check = c.panicked(p)
		c.settled = c.known != nil // a known outcome stands; nothing runs again
	}
}

// panicked logs a panic of the sidecar's own code in the call and is the
// error outcome it becomes.
func (c *call) panicked(p any) *tool.Error {
	callLog(c.b.log, c.m).Error("call panicked in the sidecar", "panic", fmt.Sprint(p))
	return tool.NewError(tool.WorkerCrash, "the sidecar failed while running the call: %v", p)
}

// policies is step 2: the call goes through the policies that concern it
// (policy.go), each of which may answer it without a worker; at the
// bottom, dispatch marks it started and sends it (steps 3 and 4).
func (c *call) policies(ctx context.Context) (a answer) {
	if c.settled {
		return answer{}
	}
	defer func() {
		if p := recover(); p != nil {
			a = answer{Outcome: tool.Outcome{Err: c.panicked(p)}}
		}
	}()
	return c.e.dispatch.of(&c.in)(ctx, &c.in)
}

// settle makes the answer the call's outcome, unless it was settled.
func (c *call) settle(a answer) {
	if c.settled {
		return
	}
	c.e.settle(c.o, a.Outcome)
	if a.left {
		c.o.leaves = leftOpen
	}
}

// dispatch is steps 3 and 4, at the bottom of the policies: with a slot
// of the batch, mark the call started and send attempts under the tool's
// retry policy.
func (c *call) dispatch(ctx context.Context) tool.Outcome {
	release, err := c.place.Slot(ctx)
	if err != nil {
		return tool.Outcome{Err: tool.NewError(tool.Cancelled, "call cancelled before it was sent: %v", err)}
	}
	defer release()
	// 3. An unsafe tool is sent only once the upstream knows it started,
	// so that a reconciliation never runs it twice. Any other tool is
	// marked as its first attempt leaves, and its output waits for that
	// mark's answer.
	if c.def.Unsafe() {
		c.mark.send(func(<-chan struct{}) error { return c.e.markProcessing(ctx, c.b.rec, c.m, c.b.log) })
		if c.mark.await() != nil {
			return tool.Outcome{Err: unsafeNotMarked(c.m)}
		}
	}
	// 4. Attempts, until success, a final error or the retry budget.
	reply := c.attempts(ctx, &c.o.res)
	c.mark.close() // no mark starts after the attempts, and a waiting one is withdrawn
	if c.def.Unsafe() && reply.Sent && reply.Err != nil && reply.Err.Type == tool.Cancelled {
		// The call left before the drive was cancelled (the application
		// went away, or the run was cancelled): its effect is unknown, and
		// who left does not change what the model is told.
		reply.Err = tool.NewError(tool.Interrupted, "the call of unsafe tool %q was sent, then abandoned before it answered, so its effect is unknown; "+
			"check its effect before you call it again", c.m.Tool)
	}
	return reply
}

// attempts sends the call until a reply settles it: a timeout, no
// responders or a retryable worker error is tried again, but an unsafe
// tool is never resent once a worker may have received it.
func (c *call) attempts(ctx context.Context, res *CallResult) tool.Outcome {
	var d Dispatcher = kindRoute{c.def, c.e.recoverer, c.b.log}
	if c.def.Route == registry.Builtin {
		d = builtin{c.e}
	}
	var b interface{ NextBackOff() time.Duration }
	body := c.m.body()
	for attempt := 1; ; attempt++ {
		req := tool.Request{Tool: c.def.Name, Body: body, ActionID: c.m.ActionID, RunID: c.m.RunID, Attempt: attempt,
			Timeout: c.def.Timeout, MaxDuration: c.def.MaxDuration, Traceparent: c.traceparent,
			Unsafe: c.def.Unsafe(), OnProgress: c.progress, OnSent: c.markOnSend(ctx)}
		reply, used := c.e.send(ctx, d, c.def, req, res)
		attempt += used - 1
		res.Attempts = attempt
		if reply.Err == nil || attempt > c.def.Retries || ctx.Err() != nil || !reply.Err.Retryable() ||
			(reply.Sent && c.def.Unsafe()) {
			return reply
		}
		if b == nil {
			b = retry.Attempt.New()
		}
		if clock.Sleep(ctx, b.NextBackOff()) != nil {
			return tool.Outcome{Err: tool.NewError(tool.Cancelled, "call cancelled between attempts: %v", context.Cause(ctx))}
		}
	}
}

// kindRoute sends an attempt through the tool's route kind. In durable
// mode an attempt that runs in the sidecar's process (a tool with a
// handler: exec, http, mcp) is recorded in the ledger before it runs and
// its outcome stored as it ends, as the NATS client records an attempt it
// sends and the ledger captures the worker's reply: one crash rule for
// every route (docs/durable-mode.md).
type kindRoute struct {
	def    *registry.Tool
	ledger Recoverer // nil when not durable
	log    *slog.Logger
}

func (k kindRoute) Dispatch(ctx context.Context, req tool.Request) tool.Outcome {
	if k.ledger == nil || k.def.Handler == nil { // a call that leaves the process is recorded by its transport
		return k.def.Kind.Dispatch(ctx, k.def, req)
	}
	reply, err := k.ledger.Running(ctx, req, req.RunID)
	if err != nil {
		return tool.Outcome{Err: tool.NewError(tool.WorkerCrash, "the call was not run: the ledger could not record it: %v", err)}
	}
	out := k.def.Kind.Dispatch(ctx, k.def, req)
	if out.Sent && !final(out, req) {
		// Not the call's outcome: a cancelled attempt's effect is unknown
		// (an unsafe call is then interrupted, another runs again), and a
		// retryable failure of a call that may run again is followed by
		// another attempt, or by a new run after a crash. (An attempt that
		// never reached its tool goes to Ran, which says so.)
		return out
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), intendTimeout)
	defer cancel()
	if err := k.ledger.Ran(sctx, req, req.RunID, reply, out); err != nil {
		k.log.Warn("storing the outcome of a call in the ledger; should the sidecar stop before it is recorded upstream, "+
			"the call runs again, or is interrupted if unsafe", "action_id", tool.Excerpt(req.ActionID), "tool", req.Tool, "err", err)
	}
	return out
}

// final reports an outcome that a later drive may take as the call's:
// neither cancelled nor, for a call that may run again, a retryable
// failure.
func final(out tool.Outcome, req tool.Request) bool {
	switch {
	case out.Err == nil:
		return true
	case out.Err.Type == tool.Cancelled:
		return false
	default:
		return req.Unsafe || !out.Err.Retryable()
	}
}

// startMark is the record that a call started. An unsafe call's is sent
// before the call and awaited there. Another's is sent as its first
// attempt leaves, on a goroutine that the call awaits before its output,
// and withdrawn if it still waits to leave once the tool has answered (the
// upstream, so far behind, would hear that the call started after it had
// ended; pending to final is allowed).
type startMark struct {
	once     sync.Once
	answered chan struct{} // closed once err is the mark's answer; nil when none was sent
	err      error
	withdraw chan struct{} // closed once no mark may leave any more
}

// send sends the mark with f, once, unless the mark was closed.
func (m *startMark) send(f func(withdraw <-chan struct{}) error) {
	m.once.Do(func() {
		m.answered, m.withdraw = make(chan struct{}), make(chan struct{})
		go func() {
			m.err = f(m.withdraw)
			close(m.answered)
		}()
	})
}

// close lets no mark start any more, and withdraws one still waiting.
func (m *startMark) close() {
	m.once.Do(func() {})
	if m.withdraw != nil {
		select {
		case <-m.withdraw:
		default:
			close(m.withdraw)
		}
	}
}

// await waits for the mark's answer; nil when none was sent.
func (m *startMark) await() error {
	m.once.Do(func() {}) // no mark starts after this
	if m.answered == nil {
		return nil
	}
	<-m.answered
	return m.err
}

// markOnSend is the attempts' OnSent for a tool that is not unsafe: the
// first attempt to leave sends the started mark.
func (c *call) markOnSend(ctx context.Context) func() {
	if c.def.Unsafe() {
		return nil
	}
	return func() {
		c.mark.send(func(withdraw <-chan struct{}) error { return c.e.markStarted(ctx, c.b.rec, c.m, withdraw) })
	}
}

// progress tells the drive's followers that the worker reported progress.
func (c *call) progress() {
	c.b.emit(Event{Type: EventProgress, Turn: c.b.n, Call: &CallResult{Turn: c.b.n, ToolCallID: c.m.ToolCallID, ActionID: c.m.ActionID, Tool: c.m.Tool}})
}

// record is step 5: once the upstream has answered the started mark,
// and after the previous call of the batch has recorded its own (an
// upstream appends tool messages in arrival order), the output is
// recorded, exactly once (the upstream adapter reads back before it
// records again after an uncertain failure). A cancelled run is still
// recorded, within the submit budget, which starts when the output can be
// recorded: waiting for an earlier call (one that waits for a person, say)
// spends none of it; the final record that follows spends the rest. What
// the outcome leaves decides what is recorded.
func (c *call) record(ctx context.Context) (submit context.Context, cancel context.CancelFunc) {
	mark := c.mark.await()
	if mark != nil && !errors.Is(mark, ErrWithdrawn) && !errors.Is(mark, ErrSubmitBudget) && !c.def.Unsafe() {
		// The upstream refused the mark, its notice that the call
		// started: the outcome is what counts. (An unsafe call's mark
		// failure was logged as it kept the call from running.)
		callLog(c.b.log, c.m).Warn("recording that the call started failed", "err", mark)
	}
	c.place.InOrder(func() {
		submit, cancel = context.WithTimeout(context.WithoutCancel(ctx), c.e.cfg.SubmitBudget)
		if errors.Is(mark, ErrSubmitBudget) {
			// The mark was given up unanswered, and the upstream may still
			// apply it: after the final status it would reopen the call.
			// The outcome waits for the next drive, as one not recorded.
			c.err = c.keepAfter("the call's started mark went unanswered, and may still be applied; its output not recorded", mark)
			return
		}
		c.err = c.recordOutput(submit)
	})
	c.o.res.Timeline.Recorded = time.Now()
	return submit, cancel
}

// recordOutput records the call's output, or says why it does not. After
// a record of the batch ran out of budget, the rest are kept for the next
// drive without being tried.
func (c *call) recordOutput(ctx context.Context) error {
	o := c.o
	if o.leaves == leftOpen {
		why := fmt.Errorf("%w: call %s (%s) before it waits for approval", ErrLeftForNextDrive, c.m.ToolCallID, c.m.Tool)
		c.b.keepRest.CompareAndSwap(nil, &why)
		return fmt.Errorf("call %s (%s): %w: it waits for approval as the sidecar stops", c.m.ToolCallID, c.m.Tool, ErrLeftForNextDrive)
	}
	if why := c.b.keepRest.Load(); why != nil {
		c.e.keep(o)
		return fmt.Errorf("call %s (%s): not tried: %w", c.m.ToolCallID, c.m.Tool, *why)
	}
	if o.leaves == outputRecorded {
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
	o.leaves = outputRecorded
	return nil
}

// finalise is step 6: the call's final status with a summary of the
// result, its last record. It may overlap the next calls' outputs; the
// application hears the results in the order the model made the calls.
func (c *call) finalise(ctx context.Context) {
	if c.err == nil {
		c.err = c.finalStatus(ctx)
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

// finalStatus records the final status with a summary of the result.
// An Action whose id is not an id cannot be addressed: it is left as the
// upstream has it (the call's output, its error, is recorded all the
// same), and the run goes on.
func (c *call) finalStatus(ctx context.Context) error {
	o := c.o
	if tool.CheckID("action_id", c.m.ActionID) != nil {
		callLog(c.b.log, c.m).Warn("the call's action_id is not an id: its Action is left as the upstream has it")
		o.res.Submitted = true // all of the outcome that can reach the upstream has
		return nil
	}
	result := ResultSummary{OK: o.res.OK, Attempts: o.res.Attempts, DurationMS: o.res.DurationMS, Bytes: len(o.content),
		ErrorType: o.res.ErrorType, Error: o.res.Error}
	if err := c.b.rec.Finalise(ctx, c.m, o.status, result); err != nil {
		return c.keepAfter("action not finalised", err)
	}
	o.res.Submitted = true
	return nil
}

// keepAfter keeps the outcome the upstream did not take for the next
// drive of the run, and says which record failed.
func (c *call) keepAfter(what string, err error) error {
	callLog(c.b.log, c.m).Error(what+"; the outcome is kept for the next drive", "err", err)
	c.e.keep(c.o)
	if errors.Is(err, ErrSubmitBudget) {
		why := fmt.Errorf("%w: an earlier submission of the batch ran out of budget", ErrSubmitBudget)
		c.b.keepRest.CompareAndSwap(nil, &why)
	}
	return fmt.Errorf("call %s (%s): %s: %w", c.m.ToolCallID, c.m.Tool, what, err)
}

// markStarted records that a call of a tool that is not unsafe started:
// its answer is awaited before the output, within the submit budget, even
// when the run is cancelled meanwhile, so that the upstream never applies
// the mark after a later record of the call.
func (e *Executor) markStarted(ctx context.Context, rec recorder, m *ToolCall, withdraw <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.SubmitBudget)
	defer cancel()
	return rec.MarkStarted(ctx, m, withdraw)
}

// intendTimeout bounds the ledger write before an unsafe call is marked
// started.
const intendTimeout = 2 * time.Second

// markProcessing records that an unsafe call started before it is sent
// (Core: its Action to processing): the record must land (within the
// submit budget), or the call does not run.
func (e *Executor) markProcessing(ctx context.Context, rec recorder, m *ToolCall, log *slog.Logger) error {
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
	err := rec.MarkStarted(pctx, m, nil)
	if err != nil {
		callLog(log, m).Error("recording that an unsafe call started failed: not running it", "err", err)
	}
	return err
}

// unsafeNotMarked: an unsafe call runs only once the upstream knows it
// started, so that a later reconciliation does not run it a second time.
func unsafeNotMarked(m *ToolCall) *tool.Error {
	return tool.NewError(tool.Interrupted, "the upstream could not be told that the call of unsafe tool %q started, so it was not run", m.Tool)
}

// observeCall records the call's outcome in the log, the span and the
// metrics.
func (e *Executor) observeCall(ctx context.Context, c *call, start time.Time, span trace.Span) {
	o := c.o
	d := time.Since(start)
	o.res.DurationMS = d.Milliseconds()
	if !o.res.OK {
		callLog(c.b.log, c.m).InfoContext(ctx, "call failed", "error_type", o.res.ErrorType, "err", o.res.Error, "attempts", o.res.Attempts, "duration", d)
		span.SetStatus(codes.Error, o.res.ErrorType)
		e.obs.CallDone(ctx, c.m.Tool, o.res.ErrorType, d)
	} else {
		e.obs.CallDone(ctx, c.m.Tool, "ok", d)
	}
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.Int("toolsidecar.attempts", o.res.Attempts), attribute.Bool("toolsidecar.ok", o.res.OK))
	if !o.res.OK {
		span.SetAttributes(attribute.String("error.type", o.res.ErrorType))
	}
}
