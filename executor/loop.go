package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectdavid/toolsidecar/internal/clock"
)

// run is the loop of one drive: check the run, reconcile with the upstream, then
// turns until the run ends.
// Its span is the drive's, which Drive started.
func (e *Executor) run(ctx context.Context, req Request, run Run, emit Sink) (Summary, error) {
	span := trace.SpanFromContext(ctx)
	began := time.Now()
	log := e.log.With("run_id", req.RunID)
	sum := Summary{RunID: req.RunID, Upstream: e.up.Kind(), Calls: []CallResult{}}
	if sc := span.SpanContext(); sc.IsValid() {
		sum.TraceID = sc.TraceID().String()
	}
	emit = e.tapped(req.RunID, req.Caller, emit)
	replayed := run.Ended() // its drive counted when it ran
	if !replayed {
		e.obs.RunStarted()
	}
	req.scope = &scope{}
	err := e.loop(ctx, req, run, emit, log, &sum)
	e.dispatch.report(req.scope, &sum)
	level := slog.LevelInfo
	if sum.Status == StatusFailed {
		level = slog.LevelWarn // a failed drive is never only in the metrics
	}
	log.Log(ctx, level, "drive ended", "status", sum.Status, "turns", sum.Turns, "calls", len(sum.Calls), "err", sum.Error)
	span.SetAttributes(attribute.String("toolsidecar.status", sum.Status), attribute.Int("toolsidecar.turns", sum.Turns),
		attribute.Int("toolsidecar.calls", len(sum.Calls)))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	if replayed {
		e.obs.RunReplayed(sum.Status)
	} else {
		e.obs.RunDone(ctx, sum.Status, sum.Turns, time.Since(began))
	}
	emit(Event{Type: EventDone, Turn: sum.Turns, Summary: &sum})
	return sum, err
}

func (e *Executor) loop(ctx context.Context, req Request, run Run, emit Sink, log *slog.Logger, sum *Summary) error {
	maxTurns := e.cfg.MaxTurns
	if req.MaxTurns > 0 && req.MaxTurns < maxTurns {
		maxTurns = req.MaxTurns // a caller may tighten the operator's limit, never loosen it
	}
	if run.Ended() {
		return e.finished(ctx, req, run, sum)
	}
	// Finish the last batch first: calls a previous drive (or a sidecar
	// that died) left without an outcome upstream. A run that never began a
	// turn has none, and the upstream need not be asked.
	var tr turnResult
	if !run.NeverStarted {
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
		if err := req.leaseGone(); err != nil {
			sum.Status, sum.Error = StatusInterrupted, err.Error()
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
		if status, why := e.dispatch.stops(req.scope); status != "" {
			sum.Status, sum.Error = status, why
			return nil
		}
		last = tr.calls
	}
}

// ended applies a batch's fatal result to the summary.
func (e *Executor) ended(tr turnResult, sum *Summary) (bool, error) {
	switch {
	case tr.cancel != nil && errors.Is(tr.cancel, ErrLeftForNextDrive):
		sum.Status, sum.Error = StatusInterrupted, tr.cancel.Error()
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

// finished reports a run that the upstream says has ended, without asking
// the model anything: its status and, where the upstream has it, the final
// answer.
func (e *Executor) finished(ctx context.Context, req Request, run Run, sum *Summary) error {
	switch run.Status {
	case RunCompleted:
		sum.Status = StatusCompleted
	case RunFailed:
		sum.Status = StatusFailed
	default:
		sum.Status = StatusCancelled
	}
	sum.Error = "the run had already ended upstream (status " + run.UpstreamStatus + "); nothing was driven"
	if text, err := e.up.LastAnswer(ctx, req); err == nil {
		sum.Content = text
	}
	return nil
}

// completed confirms a turn without tool calls with the upstream: the
// drive is completed only when the upstream's run is. Core writes the final status around
// [DONE], so it is read a few times before the run is declared stuck.
func (e *Executor) completed(ctx context.Context, runID string, sum *Summary) error {
	var status string
	for range 5 {
		run, err := e.up.Run(ctx, runID)
		if err == nil {
			if status = run.UpstreamStatus; run.Status == RunCompleted {
				sum.Status = StatusCompleted
				return nil
			}
		}
		if clock.Sleep(ctx, 100*time.Millisecond) != nil {
			break
		}
	}
	sum.Status = StatusFailed
	sum.Error = fmt.Sprintf("the final turn asked for no tool, but the upstream reports the run %q, not completed", status)
	return fmt.Errorf("%w: %s", ErrUpstream, sum.Error)
}

// runCancelled reports why no further turn may be requested: the caller's
// context ended, or the upstream says the run is cancelled or expired. fresh, when
// set, is a read of the run made just now, which spares another.
func (e *Executor) runCancelled(ctx context.Context, runID string, fresh *Run) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	run := fresh
	if run == nil {
		r, err := e.up.Run(ctx, runID)
		if err != nil {
			return nil // the stream request that follows reports the upstream's state
		}
		run = &r
	}
	if run.Stopped() {
		return fmt.Errorf("%w (status %s)", ErrRunCancelled, run.UpstreamStatus)
	}
	return nil
}

type turnResult struct {
	content     string
	calls       []CallResult
	err         error // fatal: the run fails
	cancel      error // cause of a cancellation
	interrupted error // the upstream did not take the outcomes within the budget
}

// turn streams one turn and joins its batch: each manifest starts its
// call at once, and the turn ends when every call has its outcome
// recorded and its Action finalised, or the turn failed.
func (e *Executor) turn(ctx context.Context, req Request, n int, emit Sink, log *slog.Logger) turnResult {
	ctx, span := e.tracer.Start(ctx, "toolsidecar.turn", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.Int("toolsidecar.turn", n)))
	defer span.End()
	var tr turnResult
	tctx, cancelTurn := context.WithCancelCause(ctx)
	defer cancelTurn(nil)
	stream, err := e.up.Turn(tctx, req)
	if err != nil {
		if ctx.Err() != nil {
			tr.cancel = context.Cause(ctx)
		} else {
			tr.err = fmt.Errorf("executor: turn %d: %w", n, err)
		}
		return tr
	}
	br := e.newBatch(tctx, req, n, emit, log)
	content, upstreamErr, lost := e.readTurn(ctx, tctx, stream, br, &tr)
	stream.Close()
	br.wait(ctx, &tr, cancelTurn)
	tr.content = content
	switch {
	case tr.err != nil || tr.cancel != nil || tr.interrupted != nil:
	case lost != nil:
		tr.err = lost
	case len(tr.calls) == 0 && upstreamErr != "":
		tr.err = fmt.Errorf("%w: %s", ErrUpstream, upstreamErr)
	}
	return tr
}

// readTurn reads the turn's stream to its end, starting each call as its
// manifest arrives. It returns what the model said, the text of the upstream's
// error chunk if one came, and why a manifest could not be answered, if
// one could not. A stream that drops with no call to finish is recorded
// in tr.
func (e *Executor) readTurn(ctx, tctx context.Context, stream Turn, br *batchRun, tr *turnResult) (content, upstreamErr string, lost error) {
	n, emit, log := br.n, br.emit, br.log
	var text strings.Builder
	var endErr error
	for ev, err := range stream.Events() {
		var lc *LostCallError
		switch {
		case err == nil:
		case errors.As(err, &lc):
			log.Error("a tool call without its IDs: it cannot be answered", "err", err)
			emit(Event{Type: EventError, Turn: n, Text: err.Error()})
			if lost == nil {
				lost = fmt.Errorf("%w: %w", ErrLostManifest, err)
			}
			continue
		case errors.Is(err, ErrBadFrame):
			// One bad frame never abandons the rest of the stream.
			log.Warn("undecodable frame skipped", "err", err)
			emit(Event{Type: EventError, Turn: n, Text: err.Error()})
			continue
		default:
			endErr = err // the stream ended without its clean end; nothing follows
			continue
		}
		switch ev.Kind {
		case TurnToolCall:
			br.add(ev.Call)
		case TurnText:
			text.WriteString(ev.Text)
			emit(Event{Type: EventContent, Turn: n, Text: ev.Text, Raw: ev.Raw})
		case TurnReasoning:
			emit(Event{Type: EventReasoning, Turn: n, Text: ev.Text, Raw: ev.Raw})
		case TurnError:
			log.Warn("error event from the upstream", "text", ev.Text)
			upstreamErr = ev.Text
			emit(Event{Type: EventError, Turn: n, Text: ev.Text, Raw: ev.Raw})
		default:
			emit(Event{Type: EventChunk, Turn: n, Raw: ev.Raw})
		}
	}
	if endErr != nil && tctx.Err() == nil {
		// The stream dropped before [DONE]. Asking again would make the
		// model answer twice: finish the calls the upstream made instead.
		log.Warn("stream ended early; finishing the calls the upstream has open", "err", endErr)
		emit(Event{Type: EventError, Turn: n, Text: endErr.Error()})
		br.addOpen(ctx)
		if br.b.Len() == 0 {
			tr.err = fmt.Errorf("%w: %w", ErrTruncatedTurn, endErr)
		}
	}
	return text.String(), upstreamErr, lost
}
