package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectdavid/toolsidecar/batch"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// Drive runs the loop for one run until it stops, and returns its summary.
// The error is non-nil only when the run failed (Status "failed"); a failed
// tool is a value in Summary.Calls, a cancelled drive is Status
// "cancelled". No goroutine started by Drive outlives it.
func (e *Executor) Drive(ctx context.Context, req Request, sink Sink) (Summary, error) {
	ctx, span := e.tracer.Start(ctx, "toolsidecar.drive", trace.WithAttributes(attribute.String("run_id", req.RunID)))
	defer span.End()
	emit := serial(sink)
	log := e.log.With("run_id", req.RunID)
	maxTurns := e.cfg.MaxTurns
	if req.MaxTurns > 0 {
		maxTurns = req.MaxTurns
	}
	sum := Summary{RunID: req.RunID, Calls: []CallResult{}}
	e.obs.RunStarted()
	var err error
	for {
		if sum.Turns >= maxTurns {
			sum.Status = StatusMaxTurns
			sum.Error = fmt.Sprintf("turn limit of %d reached", maxTurns)
			break
		}
		if e.stopping.Load() {
			sum.Status, sum.Error = StatusInterrupted, "sidecar shutting down"
			break
		}
		if cause := e.runCancelled(ctx, req.RunID); cause != nil {
			sum.Status, sum.Error = StatusCancelled, cause.Error()
			break
		}
		sum.Turns++
		emit(Event{Type: EventTurn, Turn: sum.Turns})
		tr := e.turn(ctx, req, sum.Turns, emit, log)
		sum.Calls = append(sum.Calls, tr.calls...)
		if tr.content != "" || len(tr.calls) == 0 {
			sum.Content = tr.content
		}
		if tr.cancel != nil {
			sum.Status, sum.Error = StatusCancelled, tr.cancel.Error()
			break
		}
		if tr.err != nil {
			sum.Status, sum.Error, err = StatusFailed, tr.err.Error(), tr.err
			break
		}
		if len(tr.calls) == 0 {
			sum.Status = StatusCompleted
			break
		}
	}
	log.Info("drive ended", "status", sum.Status, "turns", sum.Turns, "calls", len(sum.Calls), "err", sum.Error)
	span.SetAttributes(attribute.String("status", sum.Status), attribute.Int("turns", sum.Turns), attribute.Int("calls", len(sum.Calls)))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	e.obs.RunDone(sum.Status, sum.Turns)
	emit(Event{Type: EventDone, Turn: sum.Turns, Summary: &sum})
	return sum, err
}

// runCancelled reports why no further turn may be requested: the caller's
// context ended, or Core says the run is cancelled or expired.
func (e *Executor) runCancelled(ctx context.Context, runID string) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	run, err := e.core.GetRun(ctx, runID)
	if err != nil {
		return nil // the stream request that follows reports Core's state
	}
	switch run.Status {
	case core.RunCancelled, core.RunCancelling, core.RunExpired:
		return fmt.Errorf("%w (status %s)", ErrRunCancelled, run.Status)
	}
	return nil
}

type turnResult struct {
	content string
	calls   []CallResult
	err     error // fatal: the run fails
	cancel  error // cause of a cancellation
}

// outcome is one call's result on its way to Core.
type outcome struct {
	m       *core.Manifest
	res     CallResult
	content string // the tool message
	status  string // the Action's final status
	done    time.Time
}

func (e *Executor) turn(ctx context.Context, req Request, n int, emit Sink, log *slog.Logger) turnResult {
	ctx, span := e.tracer.Start(ctx, "toolsidecar.turn", trace.WithAttributes(attribute.Int("turn", n)))
	defer span.End()
	var tr turnResult
	tctx, cancelTurn := context.WithCancelCause(ctx)
	defer cancelTurn(nil)
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
		return tr
	}
	defer stream.Close()

	b := batch.New(tctx, e.cfg.MaxParallel, func(i int, o *outcome) error {
		return e.submit(ctx, req, o, emit, log)
	})
	reg := e.tools.Load()
	seen := map[string]bool{}
	var failRun error
	var upstreamErr string
	var content strings.Builder
	add := func(m *core.Manifest) {
		if seen[m.ActionID] {
			log.Warn("duplicate manifest ignored", "action_id", m.ActionID, "tool_call_id", m.ToolCallID)
			return
		}
		seen[m.ActionID] = true
		def, pre := e.precheck(reg, m)
		if pre != nil && pre.Type == tool.NotFound && e.cfg.MissingTool == config.MissingToolFailRun && failRun == nil {
			failRun = fmt.Errorf("%w: %q", ErrUnknownToolFailRun, m.Tool)
		}
		emit(Event{Type: EventToolCall, Turn: n, Call: &CallResult{Turn: n, ToolCallID: m.ToolCallID, ActionID: m.ActionID, Tool: m.Tool}})
		b.Go(func(ctx context.Context) *outcome { return e.call(ctx, n, m, def, pre, req.Traceparent, log) })
	}

	var endErr error
	for c, err := range stream.Chunks() {
		switch {
		case err == nil:
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
			add(c.Manifest)
		case core.KindContent:
			content.WriteString(c.Text)
			emit(Event{Type: EventContent, Turn: n, Text: c.Text, Raw: c.Raw})
		case core.KindReasoning:
			emit(Event{Type: EventReasoning, Turn: n, Text: c.Text, Raw: c.Raw})
		case core.KindError:
			log.Warn("error chunk from Core", "text", c.Text)
			upstreamErr = c.Text
			emit(Event{Type: EventError, Turn: n, Text: c.Text, Raw: c.Raw})
		default:
			emit(Event{Type: EventChunk, Turn: n, Raw: c.Raw})
		}
	}
	if endErr != nil && tctx.Err() == nil {
		// The stream dropped before [DONE]. Asking again would make the
		// model answer twice: recover the turn's calls from Core instead.
		log.Warn("stream ended early; recovering from pending actions", "err", endErr)
		emit(Event{Type: EventError, Turn: n, Text: endErr.Error()})
		e.recoverPending(ctx, req.RunID, seen, add, log)
		if b.Len() == 0 {
			tr.err = fmt.Errorf("%w: %w", ErrTruncatedTurn, endErr)
		}
	}

	b.Close()
	e.awaitBatch(tctx, req.RunID, b.Done(), cancelTurn)
	outs, serr := b.Wait()
	tr.content = content.String()
	for _, o := range outs {
		tr.calls = append(tr.calls, o.res)
	}
	if len(outs) > 0 {
		first, last := outs[0].done, outs[0].done
		for _, o := range outs[1:] {
			first, last = minTime(first, o.done), maxTime(last, o.done)
		}
		e.obs.BatchDone(len(outs), last.Sub(first))
	}
	switch cause := context.Cause(tctx); {
	case ctx.Err() != nil:
		tr.cancel = context.Cause(ctx)
	case errors.Is(cause, ErrRunCancelled):
		tr.cancel = cause
	case serr != nil:
		tr.err = fmt.Errorf("%w: %w", ErrSubmit, serr)
	case failRun != nil:
		tr.err = failRun
	case len(outs) == 0 && upstreamErr != "" && tr.err == nil:
		tr.err = fmt.Errorf("%w: %s", ErrUpstream, upstreamErr)
	}
	return tr
}

// awaitBatch waits for the batch to be joined and submitted, asking Core
// every cancel_poll whether the run was cancelled meanwhile; if so it
// cancels the turn (the calls in flight) with ErrRunCancelled. It runs on
// the turn's own goroutine: while the stream is open, Core itself ends the
// stream of a cancelled run.
func (e *Executor) awaitBatch(ctx context.Context, runID string, done <-chan struct{}, cancel context.CancelCauseFunc) {
	t := time.NewTicker(e.cfg.CancelPoll)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		if ctx.Err() != nil {
			continue // already cancelled: wait for the outcomes to be submitted
		}
		run, err := e.core.GetRun(ctx, runID)
		if err == nil && (run.Status == core.RunCancelled || run.Status == core.RunCancelling) {
			cancel(ErrRunCancelled)
		}
	}
}

// recoverPending adds the run's pending Actions that the dropped stream
// did not deliver.
func (e *Executor) recoverPending(ctx context.Context, runID string, seen map[string]bool, add func(*core.Manifest), log *slog.Logger) {
	pending, err := e.core.PendingActions(ctx, runID)
	if err != nil {
		log.Error("listing pending actions after a dropped stream", "err", err)
		return
	}
	for _, p := range pending {
		if seen[p.ActionID] {
			continue
		}
		m := &core.Manifest{Type: string(core.KindManifest), RunID: runID, ActionID: p.ActionID, ToolCallID: p.ToolCallID, Tool: p.ToolName, Args: argsOrEmpty(p.FunctionArguments)}
		m.Raw, _ = json.Marshal(m) // the manifest as Core would have framed it
		log.Info("recovered pending action", "action_id", p.ActionID, "tool_call_id", p.ToolCallID, "tool", p.ToolName)
		add(m)
	}
}

func argsOrEmpty(a json.RawMessage) json.RawMessage {
	if len(a) == 0 || string(a) == "null" {
		return json.RawMessage("{}")
	}
	return a
}

// precheck resolves the tool and validates the arguments. The error, if
// any, becomes the call's outcome; the stream goes on.
func (e *Executor) precheck(reg *registry.Registry, m *core.Manifest) (*registry.Tool, *tool.Error) {
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
// final error, or the retry budget. It never returns an error: a failed
// call is an outcome.
func (e *Executor) call(ctx context.Context, turn int, m *core.Manifest, def *registry.Tool, pre *tool.Error, traceparent string, log *slog.Logger) *outcome {
	ctx, span := e.tracer.Start(ctx, "toolsidecar.call", trace.WithAttributes(attribute.String("tool", m.Tool),
		attribute.String("action_id", m.ActionID), attribute.String("tool_call_id", m.ToolCallID)))
	defer span.End()
	if sc := span.SpanContext(); sc.IsValid() {
		traceparent = formatTraceparent(sc) // the worker continues this call's trace
	}
	start := time.Now()
	e.obs.CallsInFlight(1)
	defer e.obs.CallsInFlight(-1)
	o := &outcome{m: m, res: CallResult{Turn: turn, ToolCallID: m.ToolCallID, ActionID: m.ActionID, Tool: m.Tool}}
	log = log.With("action_id", m.ActionID, "tool_call_id", m.ToolCallID, "tool", m.Tool)

	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.finaliseTimeout)
	if _, err := e.core.UpdateAction(pctx, m.ActionID, core.ActionUpdate{Status: core.ActionProcessing}); err != nil {
		log.Warn("marking action processing failed", "err", err)
	}
	cancel()

	var reply tool.Outcome
	if pre != nil {
		reply.Err = pre
	} else {
		reply = e.attempts(ctx, m, def, traceparent, &o.res)
	}
	if reply.Err == nil && len(reply.Data) > e.cfg.MaxResultBytes {
		reply.Err = tool.NewError(tool.ToolFailed, "result of %d bytes exceeds the limit of %d bytes", len(reply.Data), e.cfg.MaxResultBytes)
	}
	o.res.DurationMS = time.Since(start).Milliseconds()
	if reply.Err != nil {
		o.res.ErrorType, o.res.Error = string(reply.Err.Type), reply.Err.Message
		o.content = errorContent(m.Tool, reply.Err)
		o.status = core.ActionFailed
		if reply.Err.Type == tool.Cancelled {
			o.status = core.ActionCancelled
		}
		log.Info("call failed", "error_type", reply.Err.Type, "err", reply.Err.Message, "attempts", o.res.Attempts)
		span.SetStatus(codes.Error, string(reply.Err.Type))
		e.obs.CallDone(m.Tool, string(reply.Err.Type), time.Since(start))
	} else {
		o.res.OK = true
		o.content = string(reply.Data)
		o.status = core.ActionCompleted
		e.obs.CallDone(m.Tool, "ok", time.Since(start))
	}
	o.res.Output = o.content
	o.done = time.Now()
	span.SetAttributes(attribute.Int("attempts", o.res.Attempts), attribute.Bool("ok", o.res.OK))
	return o
}

// formatTraceparent renders a span context as a W3C traceparent.
func formatTraceparent(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// attempts dispatches with the tool's retry policy: retry a timeout, no
// responders or a retryable worker error, but never resend an unsafe tool
// once a worker may have received it.
func (e *Executor) attempts(ctx context.Context, m *core.Manifest, def *registry.Tool, traceparent string, res *CallResult) tool.Outcome {
	d := e.routes[def.Route]
	body := m.Raw
	// Jittered exponential backoff between attempts, from 50ms, capped at 1s.
	b := &backoff.ExponentialBackOff{InitialInterval: 50 * time.Millisecond, RandomizationFactor: 1, Multiplier: 2, MaxInterval: time.Second}
	b.Reset()
	for attempt := 1; ; attempt++ {
		res.Attempts = attempt
		reply := d.Dispatch(ctx, tool.Request{Tool: def.Name, Body: body, ActionID: m.ActionID, Attempt: attempt, Timeout: def.Timeout, Traceparent: traceparent})
		if reply.Err == nil || attempt > def.Retries || ctx.Err() != nil || !reply.Err.Retryable() {
			return reply
		}
		if reply.Sent && def.SideEffects == config.Unsafe {
			return reply
		}
		wait := time.NewTimer(b.NextBackOff())
		select {
		case <-ctx.Done():
			wait.Stop()
			return tool.Outcome{Err: tool.NewError(tool.Cancelled, "call cancelled between attempts: %v", context.Cause(ctx))}
		case <-wait.C:
		}
	}
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
// tool_call_id, then the Action's final status with a result summary. It
// runs even after a cancellation, under its own deadline.
func (e *Executor) submit(ctx context.Context, req Request, o *outcome, emit Sink, log *slog.Logger) error {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.finaliseTimeout)
	defer cancel()
	m := o.m
	log = log.With("action_id", m.ActionID, "tool_call_id", m.ToolCallID)
	_, err := e.core.SubmitToolOutput(sctx, core.ToolOutput{
		Content: o.content, ThreadID: req.ThreadID, AssistantID: req.AssistantID,
		ToolID: m.ActionID, ToolCallID: m.ToolCallID,
	})
	if err != nil {
		log.Error("tool output not recorded", "err", err)
		// Do not leave the Action processing: it failed to be recorded.
		_, _ = e.core.UpdateAction(sctx, m.ActionID, core.ActionUpdate{Status: core.ActionFailed, Result: map[string]any{"ok": false, "error": "tool output not recorded: " + err.Error()}})
		return fmt.Errorf("call %s (%s): %w", m.ToolCallID, m.Tool, err)
	}
	result := map[string]any{"ok": o.res.OK, "attempts": o.res.Attempts, "duration_ms": o.res.DurationMS, "bytes": len(o.content)}
	if !o.res.OK {
		result["error_type"], result["error"] = o.res.ErrorType, o.res.Error
	}
	if _, err := e.core.UpdateAction(sctx, m.ActionID, core.ActionUpdate{Status: o.status, Result: result}); err != nil {
		log.Error("action not finalised", "status", o.status, "err", err)
		return fmt.Errorf("call %s (%s): finalising action: %w", m.ToolCallID, m.Tool, err)
	}
	o.res.Submitted = true
	res := o.res
	emit(Event{Type: EventToolResult, Turn: res.Turn, Call: &res})
	return nil
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
