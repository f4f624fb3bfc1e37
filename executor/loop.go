package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectdavid/toolsidecar/batch"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/internal/clock"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// run is the loop of one drive: check the run, reconcile with Core, then
// turns until the run ends.
// Its span is the drive's, which Drive started.
func (e *Executor) run(ctx context.Context, req Request, run core.Run, emit Sink) (Summary, error) {
	span := trace.SpanFromContext(ctx)
	log := e.log.With("run_id", req.RunID)
	sum := Summary{RunID: req.RunID, Calls: []CallResult{}}
	e.obs.RunStarted()
	req.budget = newBudget(e.cfg.RunBudget)
	err := e.loop(ctx, req, run, emit, log, &sum)
	if budgeted(e.cfg.RunBudget, e.tools.Load()) {
		sum.Budget = req.budget.report()
	}
	log.InfoContext(ctx, "drive ended", "status", sum.Status, "turns", sum.Turns, "calls", len(sum.Calls), "err", sum.Error)
	span.SetAttributes(attribute.String("toolsidecar.status", sum.Status), attribute.Int("toolsidecar.turns", sum.Turns),
		attribute.Int("toolsidecar.calls", len(sum.Calls)))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	e.obs.RunDone(sum.Status, sum.Turns)
	emit(Event{Type: EventDone, Turn: sum.Turns, Summary: &sum})
	return sum, err
}

func (e *Executor) loop(ctx context.Context, req Request, run core.Run, emit Sink, log *slog.Logger, sum *Summary) error {
	maxTurns := e.cfg.MaxTurns
	if req.MaxTurns > 0 && req.MaxTurns < maxTurns {
		maxTurns = req.MaxTurns // a caller may tighten the operator's limit, never loosen it
	}
	if core.RunTerminal(run.Status) {
		return e.finished(ctx, req, run, sum)
	}
	// Finish the last batch first: calls a previous drive (or a sidecar
	// that died) left without an outcome in Core. A run that never began a
	// turn has none, and Core need not be asked.
	var tr turnResult
	if !run.NeverStarted() {
		tr = e.reconcile(ctx, req, emit, log)
	}
	sum.Calls = append(sum.Calls, tr.calls...)
	if done, err := e.ended(tr, sum); done {
		return err
	}
	last := tr.calls
	// The run was read just before this drive began: unless the
	// reconciliation took time, that read answers the first turn's check.
	fresh := &run
	if len(tr.calls) > 0 {
		fresh = nil
	}
	for {
		if sum.Turns >= maxTurns {
			sum.Status, sum.Error = StatusMaxTurns, fmt.Sprintf("turn limit of %d reached", maxTurns)
			return nil
		}
		if e.stopping.Load() {
			sum.Status, sum.Error = StatusInterrupted, "sidecar shutting down"
			return nil
		}
		if leaseLost(req.leaseLost) {
			sum.Status, sum.Error = StatusInterrupted, ErrLeaseLost.Error()
			return nil
		}
		if cause := e.runCancelled(ctx, req.RunID, fresh); cause != nil {
			sum.Status, sum.Error = StatusCancelled, cause.Error()
			return nil
		}
		fresh = nil
		if err := e.guard(last); err != nil {
			sum.Status, sum.Error = StatusFailed, err.Error()
			return err
		}
		sum.Turns++
		emit(Event{Type: EventTurn, Turn: sum.Turns})
		tr := e.turn(ctx, req, sum.Turns, emit, log)
		sum.Calls = append(sum.Calls, tr.calls...)
		if tr.content != "" || len(tr.calls) == 0 {
			sum.Content = tr.content
		}
		if done, err := e.ended(tr, sum); done {
			return err
		}
		if len(tr.calls) == 0 {
			return e.completed(ctx, req.RunID, sum)
		}
		if req.budget.stopped() {
			sum.Status, sum.Error = StatusBudget, "a call exceeded its budget and run_budget.on_budget is stop: no further turn was requested"
			return nil
		}
		last = tr.calls
	}
}

// ended applies a batch's fatal result to the summary.
func (e *Executor) ended(tr turnResult, sum *Summary) (bool, error) {
	switch {
	case tr.cancel != nil:
		sum.Status, sum.Error = StatusCancelled, tr.cancel.Error()
	case tr.interrupted != nil:
		sum.Status, sum.Error = StatusInterrupted, tr.interrupted.Error()
	case tr.err != nil:
		sum.Status, sum.Error = StatusFailed, tr.err.Error()
		return true, tr.err
	default:
		return false, nil
	}
	return true, nil
}

// ErrGuard: the previous turn's calls are not all recorded and finalised,
// yet another turn was about to be requested. It is a bug guard: the batch
// join makes it impossible, and a test that sees it fails.
var ErrGuard = errors.New("executor: next turn refused: a call of the previous batch has no recorded outcome")

// guard checks, from the executor's own records, that every call of the
// previous batch has its output recorded and its Action finalised.
func (e *Executor) guard(last []CallResult) error {
	for _, c := range last {
		if !c.Submitted {
			e.obs.GuardTripped()
			return fmt.Errorf("%w (call %s, action %s)", ErrGuard, c.ToolCallID, c.ActionID)
		}
	}
	return nil
}

// finished reports a run that Core says has ended, without asking the model
// anything: its status and, where Core has it, the final assistant text.
func (e *Executor) finished(ctx context.Context, req Request, run core.Run, sum *Summary) error {
	switch run.Status {
	case core.RunCompleted:
		sum.Status = StatusCompleted
	case core.RunFailed:
		sum.Status = StatusFailed
	default:
		sum.Status = StatusCancelled
	}
	sum.Error = "the run had already ended in Core (status " + run.Status + "); nothing was driven"
	if msgs, err := e.core.ListMessages(ctx, req.ThreadID, 20); err == nil {
		for _, m := range msgs {
			if m.Role == "assistant" {
				sum.Content = m.Content
				break
			}
		}
	}
	return nil
}

// completed confirms a turn without tool calls with Core: the drive is
// completed only when Core's run is. Core writes the final status around
// [DONE], so it is read a few times before the run is declared stuck.
func (e *Executor) completed(ctx context.Context, runID string, sum *Summary) error {
	var status string
	for range 5 {
		run, err := e.core.GetRun(ctx, runID)
		if err == nil {
			if status = run.Status; status == core.RunCompleted {
				sum.Status = StatusCompleted
				return nil
			}
		}
		if clock.Sleep(ctx, 100*time.Millisecond) != nil {
			break
		}
	}
	sum.Status = StatusFailed
	sum.Error = fmt.Sprintf("the final turn asked for no tool, but Core reports the run %q, not completed", status)
	return fmt.Errorf("%w: %s", ErrUpstream, sum.Error)
}

// runCancelled reports why no further turn may be requested: the caller's
// context ended, or Core says the run is cancelled or expired. fresh, when
// set, is a read of the run made just now, which spares another.
func (e *Executor) runCancelled(ctx context.Context, runID string, fresh *core.Run) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	run := fresh
	if run == nil {
		r, err := e.core.GetRun(ctx, runID)
		if err != nil {
			return nil // the stream request that follows reports Core's state
		}
		run = &r
	}
	if core.RunStopped(run.Status) {
		return fmt.Errorf("%w (status %s)", ErrRunCancelled, run.Status)
	}
	return nil
}

type turnResult struct {
	content     string
	calls       []CallResult
	err         error // fatal: the run fails
	cancel      error // cause of a cancellation
	interrupted error // Core did not take the outcomes within the budget
}

// outcome is one call's result on its way to Core.
type outcome struct {
	m        *core.Manifest
	res      CallResult
	content  string // the tool message
	status   string // the Action's final status
	done     time.Time
	recorded bool     // the tool message is in Core already
	mark     *marking // the processing mark, which the final status waits for
}

// batchRun is one batch being joined: the calls of a turn, or those a
// reconciliation found open.
type batchRun struct {
	ctx      context.Context // the drive's: for lookups while the stream is read
	e        *Executor
	req      Request
	n        int
	emit     Sink
	log      *slog.Logger
	b        *batch.Batch[*outcome]
	reg      *registry.Registry
	seen     map[string]bool
	lanes    map[string]*lane
	failRun  error
	coreDown atomic.Bool // a submission ran out of budget: keep the rest
}

func (e *Executor) newBatch(ctx, tctx context.Context, req Request, n int, emit Sink, log *slog.Logger) *batchRun {
	br := &batchRun{ctx: ctx, e: e, req: req, n: n, emit: emit, log: log, reg: e.tools.Load(), seen: map[string]bool{}, lanes: map[string]*lane{}}
	br.b = batch.NewThen(tctx, e.cfg.MaxParallel, func(i int, o *outcome, done func(error)) { br.submit(ctx, o, done) })
	return br
}

// add dispatches one manifest from the stream at once.
func (br *batchRun) add(m *core.Manifest) {
	if br.seen[m.ActionID] {
		br.log.Warn("duplicate manifest ignored", "action_id", m.ActionID, "tool_call_id", m.ToolCallID)
		return
	}
	br.seen[m.ActionID] = true
	def, pre := br.e.precheck(br.reg, m)
	if pre != nil && pre.Type == tool.NotFound && def == nil && br.e.cfg.MissingTool == config.MissingToolFailRun && br.failRun == nil {
		br.failRun = fmt.Errorf("%w: %q", ErrUnknownToolFailRun, m.Tool)
	}
	var memoKey string
	if pre == nil {
		var hit *MemoEntry
		if hit, memoKey = br.e.deduped(br.ctx, m, def); hit != nil {
			br.log.Info("call answered from an earlier call of the run", "action_id", m.ActionID, "tool", m.Tool, "from", hit.ToolCallID)
			br.e.obs.CallDeduped(m.Tool)
			br.startNow(m, nil, func(context.Context) *outcome { return br.e.fromMemo(br.n, m, hit) })
			return
		}
	}
	if pre == nil && br.req.budget != nil {
		// Admitted here, as the calls stream in: the model's order decides
		// which calls a budget refuses.
		var which string
		if pre, which = br.e.admit(br.req.budget, def); pre != nil {
			br.e.obs.BudgetExceeded(which)
			br.log.Info("call refused by a budget", "action_id", m.ActionID, "tool", m.Tool, "budget", which)
		}
	}
	var ln *lane
	if def != nil && def.Config.Lane != "" {
		ln = br.lane(def.Config.Lane)
	}
	br.start(m, ln, func(ctx context.Context, r *reporter) { br.e.call(ctx, br, m, def, pre, memoKey, r) })
}

// lane is an ordered lane of one batch: the calls whose tools name it run
// one after another, in the order the model made them.
type lane struct {
	name     string
	skipRest bool
	last     int                    // batch index of the lane's last call; -1 before the first
	failed   atomic.Pointer[string] // under skip_rest: why the rest does not run
}

func (br *batchRun) lane(name string) *lane {
	ln := br.lanes[name]
	if ln == nil {
		ln = &lane{name: name, last: -1, skipRest: br.e.cfg.Lanes[name].OnError == config.LaneSkipRest}
		br.lanes[name] = ln
	}
	return ln
}

// start announces a call and runs it in the batch, after the previous call
// of its lane when it has one. run reports the call's outcome through r,
// at once or later from another goroutine (a call waiting for its worker
// holds no goroutine).
func (br *batchRun) start(m *core.Manifest, ln *lane, run func(ctx context.Context, r *reporter)) {
	laneName := ""
	if ln != nil {
		laneName = ln.name
	}
	br.emit(Event{Type: EventToolCall, Turn: br.n, Call: &CallResult{Turn: br.n, ToolCallID: m.ToolCallID, ActionID: m.ActionID, Tool: m.Tool, Lane: laneName}})
	task := func(ctx context.Context, done func(*outcome)) {
		r := &reporter{br: br, m: m, ln: ln, done: done}
		if ln != nil {
			if why := ln.failed.Load(); why != nil {
				br.e.obs.CallDone(m.Tool, string(tool.Skipped), 0)
				r.report(br.e.failed(br.n, m, tool.NewError(tool.Skipped, "not run: %s", *why)))
				return
			}
		}
		r.guard(func() { run(ctx, r) })
	}
	if ln == nil {
		br.b.StartAfter(-1, task)
		return
	}
	ln.last = br.b.StartAfter(ln.last, task)
}

// startNow is start for a call whose outcome is known at once.
func (br *batchRun) startNow(m *core.Manifest, ln *lane, f func(ctx context.Context) *outcome) {
	br.start(m, ln, func(ctx context.Context, r *reporter) { r.report(f(ctx)) })
}

// reporter hands one call's outcome to its batch, exactly once.
type reporter struct {
	br       *batchRun
	m        *core.Manifest
	ln       *lane
	done     func(*outcome)
	cleanup  func() // the call's span and gauge: run before the outcome is handed over
	reported atomic.Bool
}

// report hands o over, and under skip_rest a failure closes the lane.
func (r *reporter) report(o *outcome) {
	if !r.reported.CompareAndSwap(false, true) {
		panic(fmt.Sprintf("executor: call %s reported twice", r.m.ActionID))
	}
	if r.cleanup != nil {
		r.cleanup()
	}
	if ln := r.ln; ln != nil {
		o.res.Lane = ln.name
		if ln.skipRest && !o.res.OK {
			why := fmt.Sprintf("call %s (%s) earlier in lane %q failed with %s, and the lane skips the rest", r.m.ToolCallID, r.m.Tool, ln.name, o.res.ErrorType)
			ln.failed.CompareAndSwap(nil, &why)
		}
	}
	r.done(o)
}

// guard runs f, a part of the call in the sidecar's own code; a panic in
// it becomes the call's error outcome. A panic after the outcome was
// handed over is not the call's, and goes on.
func (r *reporter) guard(f func()) {
	defer func() {
		if p := recover(); p != nil {
			if r.reported.Load() {
				panic(p)
			}
			r.br.log.Error("call panicked in the sidecar", "action_id", r.m.ActionID, "panic", fmt.Sprint(p))
			r.report(r.br.e.failed(r.br.n, r.m, tool.NewError(tool.WorkerCrash, "the sidecar failed while running the call: %v", p)))
		}
	}()
	f()
}

// wait closes the batch, joins it, and sorts its result into tr.
func (br *batchRun) wait(ctx, tctx context.Context, tr *turnResult, awaited func()) {
	br.b.Close()
	if awaited != nil {
		awaited()
	}
	outs, serr := br.b.Wait()
	for _, o := range outs {
		tr.calls = append(tr.calls, o.res)
	}
	if len(outs) > 0 {
		first, last := outs[0].done, outs[0].done
		for _, o := range outs[1:] {
			first, last = minTime(first, o.done), maxTime(last, o.done)
		}
		br.e.obs.BatchDone(len(outs), last.Sub(first))
	}
	switch cause := context.Cause(tctx); {
	case serr != nil && errors.Is(serr, core.ErrBudget):
		tr.interrupted = fmt.Errorf("%w; the outcomes are kept and the next drive of the run submits them: %w", ErrSubmit, serr)
	case serr != nil:
		tr.err = fmt.Errorf("%w: %w", ErrSubmit, serr)
	case ctx.Err() != nil:
		tr.cancel = context.Cause(ctx)
	case errors.Is(cause, ErrRunCancelled):
		tr.cancel = cause
	case br.failRun != nil:
		tr.err = br.failRun
	}
}

func (e *Executor) turn(ctx context.Context, req Request, n int, emit Sink, log *slog.Logger) turnResult {
	ctx, span := e.tracer.Start(ctx, "toolsidecar.turn", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.Int("toolsidecar.turn", n)))
	defer span.End()
	var tr turnResult
	tctx, cancelTurn := context.WithCancelCause(ctx)
	defer cancelTurn(nil)
	// The stream is read on a goroutine that ends with it. Its HTTP
	// client and decoding grow a stack to 16 KiB or more; this goroutine
	// then waits for the batch, as long as the tools run, on a stack that
	// never grew (BENCHMARKS.md, "the stream on a goroutine of its own").
	var s streamed
	onFreshStack(func() { e.readTurn(ctx, tctx, req, n, emit, log, &tr, &s) })
	br := s.br
	if br == nil {
		return tr
	}
	br.wait(ctx, tctx, &tr, func() { e.awaitBatch(tctx, req.RunID, br.b.Done(), cancelTurn) })
	tr.content = s.content.String()
	switch {
	case tr.err != nil || tr.cancel != nil || tr.interrupted != nil:
	case s.lost != nil:
		tr.err = s.lost
	case len(tr.calls) == 0 && s.upstreamErr != "":
		tr.err = fmt.Errorf("%w: %s", ErrUpstream, s.upstreamErr)
	}
	return tr
}

// streamed is what a turn's stream left: the batch of its calls (nil
// when the stream did not open) and what the model said.
type streamed struct {
	br          *batchRun
	content     strings.Builder
	upstreamErr string
	lost        error // a manifest whose call cannot be answered
}

// readTurn opens the turn's stream and reads it to its end, starting each
// call as its manifest arrives. A stream that cannot be opened, or that
// drops with no call to finish, is recorded in tr.
func (e *Executor) readTurn(ctx, tctx context.Context, req Request, n int, emit Sink, log *slog.Logger, tr *turnResult, s *streamed) {
	stream, err := e.core.Stream(tctx, core.CompletionRequest{
		Model: req.Model, APIKey: req.APIKey, ThreadID: req.ThreadID, MessageID: req.MessageID,
		RunID: req.RunID, AssistantID: req.AssistantID, MetaData: req.MetaData,
	})
	if err != nil {
		if ctx.Err() != nil {
			tr.cancel = context.Cause(ctx)
		} else {
			tr.err = fmt.Errorf("executor: turn %d: %w", n, err)
		}
		return
	}
	defer stream.Close()

	br := e.newBatch(ctx, tctx, req, n, emit, log)
	s.br = br
	var endErr error
	for c, err := range stream.Chunks() {
		var fe *core.FrameError
		switch {
		case err == nil:
		case errors.As(err, &fe) && fe.Manifest:
			log.Error("tool_call_manifest without its IDs: the call cannot be answered", "err", err)
			emit(Event{Type: EventError, Turn: n, Text: err.Error()})
			if s.lost == nil {
				s.lost = fmt.Errorf("%w: %w", ErrLostManifest, err)
			}
			continue
		case errors.Is(err, core.ErrFrame):
			// One bad frame never abandons the rest of the stream.
			log.Warn("undecodable frame skipped", "err", err)
			emit(Event{Type: EventError, Turn: n, Text: err.Error()})
			continue
		default:
			endErr = err // the stream ended without [DONE]; nothing follows
			continue
		}
		switch c.Kind {
		case core.KindManifest:
			br.add(c.Manifest)
		case core.KindContent:
			s.content.WriteString(c.Text)
			emit(Event{Type: EventContent, Turn: n, Text: c.Text, Raw: c.Raw})
		case core.KindReasoning:
			emit(Event{Type: EventReasoning, Turn: n, Text: c.Text, Raw: c.Raw})
		case core.KindError:
			log.Warn("error chunk from Core", "text", c.Text)
			s.upstreamErr = c.Text
			emit(Event{Type: EventError, Turn: n, Text: c.Text, Raw: c.Raw})
		default:
			emit(Event{Type: EventChunk, Turn: n, Raw: c.Raw})
		}
	}
	if endErr != nil && tctx.Err() == nil {
		// The stream dropped before [DONE]. Asking again would make the
		// model answer twice: finish the calls Core created instead.
		log.Warn("stream ended early; finishing the calls Core has open", "err", endErr)
		emit(Event{Type: EventError, Turn: n, Text: endErr.Error()})
		br.addOpen(ctx)
		if br.b.Len() == 0 {
			tr.err = fmt.Errorf("%w: %w", ErrTruncatedTurn, endErr)
		}
	}
}

// onFreshStack runs f on a goroutine of its own and waits for it to
// return. A panic in f is raised again on the caller's goroutine, where it
// would have been raised without this.
func onFreshStack(f func()) {
	var p any
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { p = recover() }()
		f()
	}()
	<-done
	if p != nil {
		panic(p)
	}
}

// reconcile finishes, before any turn, the calls Core has open for the
// run: Actions pending or processing that a previous drive, or a sidecar
// that died, left without a recorded outcome.
func (e *Executor) reconcile(ctx context.Context, req Request, emit Sink, log *slog.Logger) turnResult {
	var tr turnResult
	tctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	br := e.newBatch(ctx, tctx, req, 0, emit, log)
	br.addOpen(ctx)
	if br.b.Len() > 0 {
		log.Info("reconciled open calls with Core", "calls", br.b.Len())
	}
	br.wait(ctx, tctx, &tr, func() { e.awaitBatch(tctx, req.RunID, br.b.Done(), cancel) })
	return tr
}

// openCall is an Action Core has open for a run.
type openCall struct {
	m      *core.Manifest
	status string
}

// addOpen adds the run's open Actions that the batch has not seen. For
// each: an output already in the thread is not posted again (its Action is
// only finalised); an outcome this sidecar kept is submitted; otherwise the
// call runs again when its tool may be repeated, and an unsafe call that
// may have run gets an "interrupted" outcome instead.
func (br *batchRun) addOpen(ctx context.Context) {
	e := br.e
	open, err := e.openCalls(ctx, br.req.RunID)
	if err != nil {
		br.log.Error("listing the run's open Actions", "err", err)
		return
	}
	var recorded map[string]bool
	for _, oc := range open {
		m := oc.m
		if br.seen[m.ActionID] {
			continue
		}
		br.seen[m.ActionID] = true
		if recorded == nil {
			recorded = e.recordedOutputs(ctx, br.req.ThreadID)
		}
		kept := e.takeKept(m.ActionID)
		switch {
		case kept != nil:
			br.log.Info("submitting a kept outcome", "action_id", m.ActionID, "tool_call_id", m.ToolCallID)
			kept.res.Turn = br.n
			kept.recorded = kept.recorded || recorded[m.ToolCallID]
			br.startNow(m, nil, func(context.Context) *outcome { return kept })
		case recorded[m.ToolCallID]:
			br.log.Info("output already in Core; finalising the Action", "action_id", m.ActionID, "tool_call_id", m.ToolCallID)
			br.startNow(m, nil, func(context.Context) *outcome { return e.alreadyRecorded(br.n, m) })
		default:
			def, pre := e.precheck(br.reg, m)
			processing := oc.status == core.ActionProcessing
			br.log.Info("finishing an open call", "action_id", m.ActionID, "tool_call_id", m.ToolCallID, "status", oc.status)
			// Open calls finishing a previous drive's batch run without
			// lanes: the order they were made in is not known here.
			br.start(m, nil, func(ctx context.Context, r *reporter) {
				if processing {
					// It may have run: its reply may be in the ledger.
					o, neverSent := e.recovered(ctx, br, m, def)
					if o != nil {
						r.report(o)
						return
					}
					if pre == nil && def.SideEffects == config.Unsafe && !neverSent {
						pre = tool.NewError(tool.Interrupted, "the call of unsafe tool %q was started before a fault and its effect is unknown; "+
							"it was not run again. Check its effect before you call it again", m.Tool)
					}
				}
				e.call(ctx, br, m, def, pre, "", r)
			})
		}
	}
}

// recovered is the outcome from the reply that the durable ledger kept for
// a call that was running when its sidecar went away, or nil. An unsafe
// call cannot run again, so its reply is awaited until its deadline.
// neverSent: the ledger knows that no attempt left (the sidecar died
// between marking the Action processing and sending the request), so
// running the call now is its first run.
func (e *Executor) recovered(ctx context.Context, br *batchRun, m *core.Manifest, def *registry.Tool) (o *outcome, neverSent bool) {
	if e.recoverer == nil {
		return nil, false
	}
	await := def != nil && def.SideEffects == config.Unsafe
	reply, ok, err := e.recoverer.Recover(ctx, m.ActionID, await)
	if errors.Is(err, tool.ErrNeverSent) {
		br.log.Info("the call was never sent: running it", "action_id", m.ActionID, "tool_call_id", m.ToolCallID)
		return nil, true
	}
	if err != nil {
		br.log.Warn("reading the ledger", "action_id", m.ActionID, "err", err)
	}
	if !ok {
		return nil, false
	}
	br.log.Info("the call's reply outlived its sidecar: submitting it", "action_id", m.ActionID, "tool_call_id", m.ToolCallID)
	e.obs.CallRecovered()
	o = newOutcome(br.n, m)
	o.res.Attempts = 1
	e.settle(o, reply)
	return o, false
}

// openCalls lists the run's Actions that are pending or processing, in
// call order as far as Core tells it (turn, then creation time, then id).
func (e *Executor) openCalls(ctx context.Context, runID string) ([]openCall, error) {
	pending, err := e.core.PendingActions(ctx, runID)
	if err != nil {
		return nil, err
	}
	processing, err := e.core.ActionsByStatus(ctx, runID, core.ActionProcessing)
	if err != nil {
		return nil, err
	}
	type row struct {
		core.Action
		status string
	}
	var rows []row
	for _, p := range pending {
		rows = append(rows, row{core.Action{ID: p.ActionID, ToolCallID: p.ToolCallID, ToolName: p.ToolName, FunctionArgs: p.FunctionArguments}, core.ActionPending})
	}
	for _, a := range processing {
		rows = append(rows, row{a, core.ActionProcessing})
	}
	slices.SortStableFunc(rows, func(a, b row) int {
		if a.TurnIndex != b.TurnIndex {
			return a.TurnIndex - b.TurnIndex
		}
		return strings.Compare(a.ID, b.ID)
	})
	out := make([]openCall, 0, len(rows))
	for _, r := range rows {
		m := &core.Manifest{Type: string(core.KindManifest), RunID: runID, ActionID: r.ID, ToolCallID: r.ToolCallID, Tool: r.ToolName, Args: argsOrEmpty(r.FunctionArgs)}
		m.Raw, _ = json.Marshal(m) // the manifest as Core would have framed it
		out = append(out, openCall{m: m, status: r.status})
	}
	return out, nil
}

// recordedOutputs lists the tool_call_ids whose tool message is in the
// thread. On error it says none are: the write itself reads again before
// posting, so nothing is posted twice.
func (e *Executor) recordedOutputs(ctx context.Context, threadID string) map[string]bool {
	out := map[string]bool{}
	msgs, err := e.core.ListMessages(ctx, threadID, 100)
	if err != nil {
		e.log.Warn("listing the thread's tool messages", "thread_id", threadID, "err", err)
		return out
	}
	for _, m := range msgs {
		if m.Role == "tool" && m.ToolCallID != "" {
			out[m.ToolCallID] = true
		}
	}
	return out
}

func argsOrEmpty(a json.RawMessage) json.RawMessage {
	if len(a) == 0 || string(a) == "null" {
		return json.RawMessage("{}")
	}
	return a
}

// awaitBatch waits for the batch to be joined and submitted while the
// watcher asks Core whether the run was cancelled meanwhile; if so the
// turn (the calls in flight) is cancelled with ErrRunCancelled.
func (e *Executor) awaitBatch(ctx context.Context, runID string, done <-chan struct{}, cancel context.CancelCauseFunc) {
	remove := e.watch.add(ctx, runID, cancel)
	defer remove()
	<-done
}

// precheck resolves the tool and validates the arguments. The error, if
// any, becomes the call's outcome; the stream goes on.
func (e *Executor) precheck(reg *registry.Registry, m *core.Manifest) (*registry.Tool, *tool.Error) {
	if m.Problem != "" {
		return nil, tool.NewError(tool.InvalidArgs, "the tool call could not be read: %s", m.Problem)
	}
	def, ok := reg.Lookup(m.Tool)
	if !ok {
		return nil, tool.NewError(tool.NotFound, "unknown tool %q; the registered tools are: %s", m.Tool, strings.Join(reg.Names(), ", "))
	}
	if len(m.Args) > e.cfg.MaxArgsBytes {
		return def, tool.NewError(tool.InvalidArgs, "arguments of %d bytes exceed the limit of %d bytes", len(m.Args), e.cfg.MaxArgsBytes)
	}
	if err := def.Validate(m.Args); err != nil {
		return def, tool.NewError(tool.InvalidArgs, "%s", err.Error())
	}
	if _, ok := e.routes[def.Route]; !ok {
		return def, tool.NewError(tool.NotFound, "tool %q has route %q, which this sidecar does not serve", def.Name, def.Route)
	}
	return def, nil
}

// call runs one call: Action processing, then attempts until success, a
// final error, or the retry budget, and reports its outcome through r. A
// failed call is an outcome. While an attempt waits for its worker on a
// route that sends without waiting (NATS), no goroutine is held: the
// reply's callback goes on with the call.
func (e *Executor) call(ctx context.Context, br *batchRun, m *core.Manifest, def *registry.Tool, pre *tool.Error, memoKey string, r *reporter) {
	c := &callRun{e: e, br: br, m: m, def: def, pre: pre, memoKey: memoKey, r: r, start: time.Now(), o: newOutcome(br.n, m)}
	c.ctx, c.span, c.traceparent = e.startCall(ctx, br, m)
	e.obs.CallsInFlight(1)
	r.cleanup = func() {
		c.span.End()
		e.obs.CallsInFlight(-1)
	}
	switch {
	case pre != nil:
		c.end(tool.Outcome{Err: pre})
		return
	case def.SideEffects != config.Unsafe:
		// Core hears that the call started while it runs; the final
		// status is written only after that write.
		c.o.mark = e.markOnSend(c.ctx, m, br.log)
		c.sent = c.o.mark.send
	case !e.markProcessing(c.ctx, m, br.log):
		c.end(tool.Outcome{Err: unsafeNotMarked(m)})
		return
	}
	c.progress = br.progress(m)
	c.attempt = 1
	c.run()
}

// callRun is one call in flight, between its attempts.
type callRun struct {
	e           *Executor
	br          *batchRun
	m           *core.Manifest
	def         *registry.Tool
	pre         *tool.Error
	memoKey     string
	r           *reporter
	ctx         context.Context
	span        trace.Span
	traceparent string
	start       time.Time
	o           *outcome
	sent        func() // OnSent: the processing mark of a tool that is not unsafe
	progress    func()
	attempt     int
	b           *backoff.ExponentialBackOff // made on the first retry
}

// run makes attempts until one is on its way to a worker that answers
// through a callback, or the call has ended.
func (c *callRun) run() {
	for {
		reply, used, waiting := c.try()
		if waiting || !c.again(reply, used) {
			return
		}
	}
}

// try makes one attempt. waiting: it was sent, and its reply goes to
// c.replied. A hedging tool and a route that only dispatches hold the
// goroutine until the reply (used: the attempt numbers it took).
func (c *callRun) try() (reply tool.Outcome, used int, waiting bool) {
	e, def := c.e, c.def
	d := e.routes[def.Route]
	req := tool.Request{Tool: def.Name, Body: c.m.Raw, ActionID: c.m.ActionID, RunID: c.m.RunID, Attempt: c.attempt, Timeout: def.Timeout,
		MaxDuration: def.MaxDuration, Traceparent: c.traceparent, Unsafe: def.SideEffects == config.Unsafe, OnProgress: c.progress, OnSent: c.sent}
	start := time.Now()
	if after, ok := e.hedge.delay(def); ok {
		reply, used = e.hedged(c.ctx, d, def, req, &c.o.res, start, after)
		return reply, used, false
	}
	if s, ok := d.(Sender); ok {
		reply, sent := s.Send(c.ctx, req, func(reply tool.Outcome) { c.replied(reply, start) })
		return reply, 1, sent
	}
	reply = d.Dispatch(c.ctx, req)
	c.observe(reply, start)
	return reply, 1, false
}

// observe gives the hedger the latency of an attempt sent at start that
// succeeded.
func (c *callRun) observe(reply tool.Outcome, start time.Time) {
	if reply.Err == nil {
		c.e.hedge.observe(c.def, time.Since(start))
	}
}

// replied goes on with the call when the reply of an attempt sent at
// start comes.
func (c *callRun) replied(reply tool.Outcome, start time.Time) {
	c.r.guard(func() {
		c.observe(reply, start)
		if c.again(reply, 1) {
			c.run()
		}
	})
}

// again settles an attempt's reply under the tool's retry policy: retry a
// timeout, no responders or a retryable worker error, but never resend an
// unsafe tool once a worker may have received it. It reports true after
// the backoff when another attempt is due, or ends the call.
func (c *callRun) again(reply tool.Outcome, used int) bool {
	c.attempt += used - 1
	c.o.res.Attempts = c.attempt
	def := c.def
	if reply.Err == nil || c.attempt > def.Retries || c.ctx.Err() != nil || !reply.Err.Retryable() ||
		(reply.Sent && def.SideEffects == config.Unsafe) {
		c.end(reply)
		return false
	}
	if c.b == nil {
		c.b = retryBackoff()
	}
	// The wait holds the goroutine: retries are rare, and a second at most.
	if clock.Sleep(c.ctx, c.b.NextBackOff()) != nil {
		c.end(tool.Outcome{Err: tool.NewError(tool.Cancelled, "call cancelled between attempts: %v", context.Cause(c.ctx))})
		return false
	}
	c.attempt++
	return true
}

// end settles the call's last reply into its outcome and reports it.
func (c *callRun) end(reply tool.Outcome) {
	c.o.mark.withdraw()
	c.e.endCall(c.ctx, c.br, c.m, c.def, c.pre, c.o, reply, c.start, c.span)
	c.e.remember(c.ctx, c.memoKey, c.def, c.o)
	c.r.report(c.o)
}

// startCall starts the call's span, following OpenTelemetry's GenAI
// conventions for a tool execution. The worker continues the span's trace
// when there is one.
func (e *Executor) startCall(ctx context.Context, br *batchRun, m *core.Manifest) (context.Context, trace.Span, string) {
	if !e.tracing {
		// The span would record nothing: its name, attributes and context
		// are not made, and the worker gets the trace context that a no-op
		// span would pass on.
		traceparent := br.req.Traceparent
		if trace.SpanContextFromContext(ctx).IsValid() {
			traceparent = traceparentOf(ctx)
		}
		return ctx, noSpan, traceparent
	}
	ctx, span := e.tracer.Start(ctx, "execute_tool "+m.Tool, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
		attribute.String("gen_ai.operation.name", "execute_tool"), attribute.String("gen_ai.tool.name", m.Tool),
		attribute.String("gen_ai.tool.call.id", m.ToolCallID), attribute.String("toolsidecar.action_id", m.ActionID)))
	traceparent := br.req.Traceparent
	if span.SpanContext().IsValid() {
		traceparent = traceparentOf(ctx)
	}
	return ctx, span, traceparent
}

// noSpan is the span of a call when nothing is traced: it records nothing.
var noSpan = trace.SpanFromContext(context.Background())

// callLog is log with a call's attributes. It is made where a call logs,
// which most calls never do: a logger made for each call as it started
// was held for as long as the call ran.
func callLog(log *slog.Logger, m *core.Manifest) *slog.Logger {
	return log.With("action_id", m.ActionID, "tool_call_id", m.ToolCallID, "tool", m.Tool)
}

// unsafeNotMarked: an unsafe call runs only once Core knows it started, so
// that a later reconciliation does not run it a second time.
func unsafeNotMarked(m *core.Manifest) *tool.Error {
	return tool.NewError(tool.Interrupted, "Core could not be told that the call of unsafe tool %q started, so it was not run", m.Tool)
}

// progress is the call's progress notification: an event for the drive's
// followers.
func (br *batchRun) progress(m *core.Manifest) func() {
	return func() {
		br.emit(Event{Type: EventProgress, Turn: br.n, Call: &CallResult{Turn: br.n, ToolCallID: m.ToolCallID, ActionID: m.ActionID, Tool: m.Tool}})
	}
}

// endCall settles the reply into the call's outcome (a large result goes
// to the claim-check store first), spends the run's budget, and records
// the call in the log, the span and the metrics.
func (e *Executor) endCall(ctx context.Context, br *batchRun, m *core.Manifest, def *registry.Tool, pre *tool.Error, o *outcome,
	reply tool.Outcome, start time.Time, span trace.Span) {
	o.res.DurationMS = time.Since(start).Milliseconds()
	if cc := e.cfg.ClaimCheckBytes; cc > 0 && reply.Err == nil && len(reply.Data) > cc && len(reply.Data) <= e.cfg.MaxResultBytes && def.Route != registry.Builtin {
		reply.Data, o.res.ClaimCheck = e.claimCheck(ctx, m, reply.Data, br.log)
	}
	e.settle(o, reply)
	if pre == nil && br.req.budget != nil {
		br.req.budget.spend(time.Since(start), len(o.content))
	}
	if !o.res.OK {
		callLog(br.log, m).InfoContext(ctx, "call failed", "error_type", o.res.ErrorType, "err", o.res.Error, "attempts", o.res.Attempts,
			"duration", time.Since(start))
		span.SetStatus(codes.Error, o.res.ErrorType)
		e.obs.CallDone(m.Tool, o.res.ErrorType, time.Since(start))
	} else {
		e.obs.CallDone(m.Tool, "ok", time.Since(start))
	}
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.Int("toolsidecar.attempts", o.res.Attempts), attribute.Bool("toolsidecar.ok", o.res.OK))
	if !o.res.OK {
		span.SetAttributes(attribute.String("error.type", o.res.ErrorType))
	}
}

// marking is the processing mark of a call whose tool is not unsafe. Its
// write is sent when the first attempt leaves, and no goroutine waits for
// it: the call's final status, which must come after it, is written from
// its callback when submit gets there first.
type marking struct {
	send func() // the attempts' OnSent: the first sends the write
	sent atomic.Bool
	drop func() bool // withdraws the write while it is queued; set by send

	mu    sync.Mutex
	ended bool   // the write has landed, failed or was withdrawn
	next  func() // what waits for it to end
}

// markOnSend is the processing mark of a call whose tool is not unsafe:
// best effort. A hedge's copy that leaves after the first attempt makes no
// second write.
//
// The write outlives the call's context, and its only bound is the Core
// client's core.timeout, which starts when the write is sent: while it
// waits in the client's queue, the call's end withdraws it. A deadline of
// its own from the start held a timer, a context and its parent's child
// registration for each queued write: about 55 MiB of peak RSS at 10,000
// runs (BENCHMARKS.md).
func (e *Executor) markOnSend(ctx context.Context, m *core.Manifest, log *slog.Logger) *marking {
	mk := &marking{}
	mk.send = func() {
		if !mk.sent.CompareAndSwap(false, true) {
			return
		}
		mk.drop = e.core.UpdateActionThen(context.WithoutCancel(ctx), m.ActionID, core.ActionUpdate{Status: core.ActionProcessing}, func(err error) {
			if err != nil {
				callLog(log, m).Warn("marking action processing failed", "err", err)
			}
			mk.end()
		})
	}
	return mk
}

// withdraw drops the mark's write when the call has ended before the
// write left the Core client's queue: Core, so far behind, would hear that
// the call started after it had finished, and the final status follows.
// It saves Core a write per call exactly when Core is the bottleneck.
func (mk *marking) withdraw() {
	if mk == nil || !mk.sent.Load() || !mk.drop() {
		return
	}
	mk.end()
}

// end records that the write has ended and runs what waited for it.
func (mk *marking) end() {
	mk.mu.Lock()
	mk.ended = true
	next := mk.next
	mk.next = nil
	mk.mu.Unlock()
	if next != nil {
		next()
	}
}

// whenEnded runs f once the mark's write has ended (at once when it was
// never sent), or when ctx ends first.
func (mk *marking) whenEnded(ctx context.Context, f func()) {
	if mk == nil || !mk.sent.Load() {
		f()
		return
	}
	var once atomic.Bool
	run := func() {
		if once.CompareAndSwap(false, true) {
			f()
		}
	}
	mk.mu.Lock()
	if mk.ended {
		mk.mu.Unlock()
		f()
		return
	}
	stop := context.AfterFunc(ctx, run)
	mk.next = func() {
		stop()
		run()
	}
	mk.mu.Unlock()
}

// intendTimeout bounds the ledger write before an unsafe call is marked
// processing.
const intendTimeout = 2 * time.Second

// markProcessing sets the Action of an unsafe call processing before
// it is sent: the write must land (within the submit budget), or the call
// does not run.
func (e *Executor) markProcessing(ctx context.Context, m *core.Manifest, log *slog.Logger) bool {
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
	if _, err := e.core.FinaliseAction(pctx, m.ActionID, core.ActionUpdate{Status: core.ActionProcessing}); err != nil {
		callLog(log, m).Error("marking an unsafe call processing failed: not running it", "err", err)
		return false
	}
	return true
}

// failed is the outcome of a call that failed before it ran.
func (e *Executor) failed(turn int, m *core.Manifest, err *tool.Error) *outcome {
	o := newOutcome(turn, m)
	e.settle(o, tool.Outcome{Err: err})
	return o
}

// newOutcome is the outcome of a call, yet to be settled.
func newOutcome(turn int, m *core.Manifest) *outcome {
	return &outcome{m: m, res: CallResult{Turn: turn, ToolCallID: m.ToolCallID, ActionID: m.ActionID, Tool: m.Tool}}
}

// settle turns a reply into the call's outcome: the tool message, the
// Action's final status and the summary's fields. Every reply goes through
// here, a live one or one the ledger kept, so each gets the same bound on
// result size and error text.
func (e *Executor) settle(o *outcome, reply tool.Outcome) {
	if reply.Err == nil && len(reply.Data) > e.cfg.MaxResultBytes {
		reply.Err = tool.NewError(tool.ToolFailed, "result of %d bytes exceeds the limit of %d bytes", len(reply.Data), e.cfg.MaxResultBytes)
	}
	if reply.Err != nil {
		e.setFailed(o, reply.Err)
	} else {
		o.res.OK, o.content, o.status = true, string(reply.Data), core.ActionCompleted
	}
	o.res.Output = o.content
	o.done = time.Now()
}

// fromMemo is the outcome of a call answered by an earlier call's result.
func (e *Executor) fromMemo(turn int, m *core.Manifest, hit *MemoEntry) *outcome {
	o := newOutcome(turn, m)
	e.settle(o, tool.Outcome{Data: []byte(hit.Content)})
	o.res.DedupedFrom = hit.ToolCallID
	return o
}

// alreadyRecorded is the outcome of a call whose tool message Core has:
// only its Action is finalised.
func (e *Executor) alreadyRecorded(turn int, m *core.Manifest) *outcome {
	o := newOutcome(turn, m)
	o.recorded, o.status, o.res.OK, o.done = true, core.ActionCompleted, true, time.Now()
	return o
}

func (e *Executor) setFailed(o *outcome, err *tool.Error) {
	o.res.ErrorType, o.res.Error = string(err.Type), truncate(err.Message, e.cfg.MaxErrorBytes)
	err = &tool.Error{Type: err.Type, Code: err.Code, Message: o.res.Error}
	o.content = errorContent(o.m.Tool, err)
	o.status = core.ActionFailed
	if err.Type == tool.Cancelled {
		o.status = core.ActionCancelled
	}
}

// truncate bounds a worker's error text before the model reads it, on a
// rune boundary, saying how much was cut.
func truncate(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… (%d more bytes cut)", len(s)-cut)
}

// traceparentOf is the W3C traceparent of ctx's span, written by
// OpenTelemetry's propagator.
func traceparentOf(ctx context.Context) string {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier.Get("traceparent")
}

// retryBackoff is the wait between attempts: jittered, exponential from
// 50ms, capped at 1s.
func retryBackoff() *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{InitialInterval: 50 * time.Millisecond, RandomizationFactor: 1, Multiplier: 2, MaxInterval: time.Second}
	b.Reset()
	return b
}

// errorContent is the tool message the model reads for a failed call.
func errorContent(name string, err *tool.Error) string {
	b, _ := json.Marshal(struct {
		Error     string `json:"error"`
		ErrorType string `json:"error_type"`
		Tool      string `json:"tool"`
	}{err.Message, string(err.Type), name})
	return string(b)
}

// submit records one outcome in Core: the tool message with its
// tool_call_id (exactly once: core.RecordToolOutputThen reads before it posts
// again), then the Action's final status with a result summary. The Action
// is never finalised before its output is recorded. It runs even after a
// cancellation, within the submit budget; an outcome Core did not take is
// kept for the next drive of the run. done receives the error once, from
// the callback of the last step: no goroutine waits for Core meanwhile.
func (br *batchRun) submit(ctx context.Context, o *outcome, done func(error)) {
	if br.coreDown.Load() {
		br.e.keep(o)
		done(fmt.Errorf("call %s (%s): %w: not tried, an earlier submission of the batch ran out of budget", o.m.ToolCallID, o.m.Tool, core.ErrBudget))
		return
	}
	s := &submission{br: br, o: o, done: done}
	s.ctx, s.cancel = context.WithTimeout(context.WithoutCancel(ctx), br.e.cfg.SubmitBudget)
	if o.recorded {
		s.finalise()
		return
	}
	m := o.m
	br.e.core.RecordToolOutputThen(s.ctx, core.ToolOutput{
		Content: o.content, ThreadID: br.req.ThreadID, AssistantID: br.req.AssistantID,
		ToolID: m.ActionID, ToolCallID: m.ToolCallID,
	}, func(_ core.Message, err error) {
		if err != nil {
			s.end(br.keepAfter(o, "tool output not recorded", err))
			return
		}
		o.recorded = true
		s.finalise()
	})
}

// submission is one outcome on its way to Core.
type submission struct {
	br     *batchRun
	o      *outcome
	ctx    context.Context // the submit budget
	cancel context.CancelFunc
	done   func(error)
}

// finalise writes the Action's final status, once the processing mark,
// which it must not be overtaken by, has ended.
func (s *submission) finalise() {
	o := s.o
	result := map[string]any{"ok": o.res.OK, "attempts": o.res.Attempts, "duration_ms": o.res.DurationMS, "bytes": len(o.content)}
	if !o.res.OK {
		result["error_type"], result["error"] = o.res.ErrorType, o.res.Error
	}
	o.mark.whenEnded(s.ctx, func() {
		s.br.e.core.FinaliseActionThen(s.ctx, o.m.ActionID, core.ActionUpdate{Status: o.status, Result: result}, func(err error) {
			if err != nil {
				s.end(s.br.keepAfter(o, "action not finalised", err))
				return
			}
			o.res.Submitted = true
			res := o.res
			s.br.emit(Event{Type: EventToolResult, Turn: res.Turn, Call: &res})
			// The summary keeps no tool output: a drive's memory does not
			// grow with what its tools return.
			o.res.Output, o.content = "", ""
			s.end(nil)
		})
	})
}

func (s *submission) end(err error) {
	s.cancel()
	s.done(err)
}

func (br *batchRun) keepAfter(o *outcome, what string, err error) error {
	br.log.Error(what+"; the outcome is kept for the next drive", "action_id", o.m.ActionID, "tool_call_id", o.m.ToolCallID, "err", err)
	br.e.keep(o)
	if errors.Is(err, core.ErrBudget) {
		br.coreDown.Store(true)
	}
	return fmt.Errorf("call %s (%s): %s: %w", o.m.ToolCallID, o.m.Tool, what, err)
}

// keep holds an outcome Core did not take, for the next drive of its run.
func (e *Executor) keep(o *outcome) {
	e.keptMu.Lock()
	defer e.keptMu.Unlock()
	e.kept[o.m.ActionID] = o
}

// takeKept returns and forgets the outcome kept for an Action.
func (e *Executor) takeKept(actionID string) *outcome {
	e.keptMu.Lock()
	defer e.keptMu.Unlock()
	o := e.kept[actionID]
	delete(e.kept, actionID)
	return o
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
