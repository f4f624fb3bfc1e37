package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectdavid/toolsidecar/batch"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// outcome is one call's result on its way to the upstream.
type outcome struct {
	m       *ToolCall
	res     CallResult
	content string // the tool message
	status  string // the final status
	done    time.Time
	// leaves is what the outcome leaves to record.
	leaves leaving
}

// leaving is what an outcome leaves to record: [call.recordOutput] acts on
// it, in one place.
type leaving int

const (
	// toRecord: the output, then the final status.
	toRecord leaving = iota
	// outputRecorded: the upstream has the output; only the final status
	// is recorded.
	outputRecorded
	// leftOpen: nothing is recorded; the call stays open for the next
	// drive of its run, and so do the calls after it.
	leftOpen
)

// batchRun is one batch being joined: the calls of a turn, or those a
// reconciliation found open. Its calls are added by one goroutine (the
// stream's reader), each runs on its own, and wait joins them.
type batchRun struct {
	e     *Executor
	ctx   context.Context // the turn's: the calls run under it
	rec   recorder        // where the calls' records go: the upstream
	req   Request
	n     int
	emit  Sink
	log   *slog.Logger
	reg   *registry.Registry
	b     *batch.Batch
	calls []*call
	seen  map[string]bool
	scope scope // the policies' state for the batch
	// noNextDrive: no later drive will find the batch's calls (an MCP
	// client's call), so none may be left for one.
	noNextDrive bool
	// keepRest, once set, says why the later calls of the batch are not
	// tried but kept for the next drive: a record ran out of budget, or a
	// call was left for the next drive (its outputs must follow in call
	// order).
	keepRest atomic.Pointer[error]
}

func (e *Executor) newBatch(tctx context.Context, req Request, n int, emit Sink, log *slog.Logger) *batchRun {
	return &batchRun{e: e, ctx: tctx, rec: e.up, req: req, n: n, emit: emit, log: log, reg: e.tools.Load(), b: batch.New(e.cfg.MaxParallel),
		seen: map[string]bool{}}
}

// add starts the call of one tool call read from a turn, at once.
func (br *batchRun) add(m *ToolCall) {
	if br.seen[m.ActionID] {
		callLog(br.log, m).Warn("duplicate tool call ignored")
		return
	}
	br.seen[m.ActionID] = true
	br.start(&call{e: br.e, b: br, m: m})
}

// start runs a call on a goroutine of its own, at the batch's next place.
func (br *batchRun) start(c *call) {
	c.in = callIn{ToolCall: c.m, Found: c.in.Found, Turn: br.n, Drive: br.req.scope, Batch: &br.scope, Log: br.log, Emit: br.emit,
		Leavable: !br.noNextDrive, Caller: br.req.Caller, owner: c}
	br.calls = append(br.calls, c)
	br.b.Go(func(p *batch.Place) error {
		c.place = p
		c.run(br.ctx)
		return nil
	})
}

// wait joins the batch while the watcher asks the upstream whether the
// run was cancelled meanwhile (if so the turn, and the calls in flight,
// are cancelled with ErrRunCancelled), and sorts the batch's result into
// tr.
func (br *batchRun) wait(ctx context.Context, tr *turnResult, cancelTurn context.CancelCauseFunc) {
	remove := br.e.watch.add(br.ctx, br.req.RunID, cancelTurn)
	br.b.Wait()
	remove()
	var errs []error
	var first, last time.Time
	var failRun error
	for i, c := range br.calls {
		tr.calls = append(tr.calls, c.o.res)
		if c.err != nil {
			errs = append(errs, fmt.Errorf("batch: submitting result %d: %w", i, c.err))
		}
		if i == 0 || c.o.done.Before(first) {
			first = c.o.done
		}
		if c.o.done.After(last) {
			last = c.o.done
		}
		if failRun == nil && br.e.cfg.FailRunOnMissingTool && c.def == nil && c.in.Check != nil && c.in.Check.Type == tool.NotFound {
			failRun = fmt.Errorf("%w: %q", ErrUnknownToolFailRun, c.m.Tool)
		}
	}
	if len(br.calls) > 0 {
		br.e.obs.BatchDone(len(br.calls), last.Sub(first))
	}
	serr := errors.Join(errs...)
	switch cause := context.Cause(br.ctx); {
	case serr != nil && errors.Is(serr, ErrLeftForNextDrive):
		tr.interrupted = fmt.Errorf("the sidecar stopped before every call of the batch was submitted; the rest are left, open, for the next drive of the run: %w", serr)
	case serr != nil && errors.Is(serr, ErrSubmitBudget):
		tr.interrupted = fmt.Errorf("%w; the outcomes are kept and the next drive of the run submits them: %w", ErrSubmit, serr)
	case serr != nil:
		tr.err = fmt.Errorf("%w: %w", ErrSubmit, serr)
	case ctx.Err() != nil:
		tr.cancel = context.Cause(ctx)
	case errors.Is(cause, ErrRunCancelled):
		tr.cancel = cause
	case failRun != nil:
		tr.err = failRun
	}
}

// precheck resolves the tool and validates the arguments. The error, if
// any, becomes the call's outcome; the stream goes on.
func (e *Executor) precheck(reg *registry.Registry, m *ToolCall) (*registry.Tool, *tool.Error) {
	if m.Problem != "" {
		return nil, tool.NewError(tool.InvalidArgs, "the tool call could not be read: %s", m.Problem)
	}
	// Ids the upstream sent become subjects, keys and paths once the call
	// is dispatched: a call whose ids are not ids is answered here.
	if err := checkCallIDs(m); err != nil {
		return nil, tool.NewError(tool.InvalidArgs, "the tool call could not be run: %v", err)
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
	return def, nil
}

// checkCallIDs checks the ids of a call the upstream made.
func checkCallIDs(m *ToolCall) error {
	if err := tool.CheckID("action_id", m.ActionID); err != nil {
		return err
	}
	if err := tool.CheckID("run_id", m.RunID); err != nil {
		return err
	}
	return tool.CheckCallID(m.ToolCallID)
}

// startCall starts the call's span, following OpenTelemetry's GenAI
// conventions for a tool execution. The worker continues the span's trace
// when there is one.
func (e *Executor) startCall(ctx context.Context, br *batchRun, m *ToolCall) (context.Context, trace.Span, string) {
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
func callLog(log *slog.Logger, m *ToolCall) *slog.Logger {
	return log.With("action_id", shown(m.ActionID, tool.MaxIDBytes), "tool_call_id", shown(m.ToolCallID, tool.MaxCallIDBytes),
		"tool", shown(m.Tool, tool.MaxCallIDBytes))
}

// shown is an id of a call, or a tool's name, as the log, the events and
// the summary show it: whole when it is within limit, cut otherwise. Ids
// that are not ids are answered with an error outcome, which quotes them
// no further.
func shown(id string, limit int) string { return tool.Truncate(id, limit) }

// newOutcome is the outcome of a call, yet to be settled.
func newOutcome(turn int, m *ToolCall) *outcome {
	return &outcome{m: m, res: CallResult{Turn: turn, ToolCallID: shown(m.ToolCallID, tool.MaxCallIDBytes),
		ActionID: shown(m.ActionID, tool.MaxIDBytes), Tool: shown(m.Tool, tool.MaxCallIDBytes)}, leaves: toRecord}
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
		o.res.OK, o.content, o.status = true, string(reply.Data), CallCompleted
	}
	o.res.Output = o.content
	o.done = time.Now()
}

// alreadyRecorded is the outcome of a call whose output the upstream has:
// only its final status is recorded.
func (e *Executor) alreadyRecorded(turn int, m *ToolCall) *outcome {
	o := newOutcome(turn, m)
	o.leaves, o.status, o.res.OK, o.done = outputRecorded, CallCompleted, true, time.Now()
	return o
}

func (e *Executor) setFailed(o *outcome, err *tool.Error) {
	o.res.ErrorType, o.res.Error = string(err.Type), tool.Truncate(err.Message, e.cfg.MaxErrorBytes)
	err = &tool.Error{Type: err.Type, Code: err.Code, Message: o.res.Error}
	o.content = errorContent(o.m.Tool, err)
	o.status = CallFailed
	if err.Type == tool.Cancelled {
		o.status = CallCancelled
	}
}

// traceparentOf is the W3C traceparent of ctx's span, written by
// OpenTelemetry's propagator.
func traceparentOf(ctx context.Context) string {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier.Get("traceparent")
}

// errorOutput is the tool message the model reads for a failed call.
type errorOutput struct {
	Error     string `json:"error"`
	ErrorType string `json:"error_type"`
	Tool      string `json:"tool"`
}

// errorContent is the tool message the model reads for a failed call.
func errorContent(name string, err *tool.Error) string {
	b, _ := json.Marshal(errorOutput{err.Message, string(err.Type), name})
	return string(b)
}

// FailedOutput reports a call's output that is the executor's account of
// its failure (errorContent), for an API that flags errors apart
// (Messages' tool_result is_error).
func FailedOutput(content string) bool {
	if !strings.HasPrefix(content, `{"error":`) {
		return false
	}
	var o errorOutput
	d := json.NewDecoder(strings.NewReader(content))
	d.DisallowUnknownFields()
	return d.Decode(&o) == nil && o.ErrorType != "" && o.Tool != "" && !d.More()
}

// keep holds an outcome the upstream did not take, for the next drive of its run.
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
