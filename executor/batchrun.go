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

	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectdavid/toolsidecar/batch"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// outcome is one call's result on its way to Core.
type outcome struct {
	m        *ToolCall
	res      CallResult
	content  string // the tool message
	status   string // the Action's final status
	done     time.Time
	recorded bool // the tool message is in Core already
	// deferred: the call waited for approval as the sidecar stopped; it
	// records nothing, and its Action stays open for the next drive.
	deferred bool
}

// batchRun is one batch being joined: the calls of a turn, or those a
// reconciliation found open. Its calls are added by one goroutine (the
// stream's reader), each runs on its own, and wait joins them.
type batchRun struct {
	e       *Executor
	ctx     context.Context // the turn's: the calls run under it
	rec     recorder        // where the calls' records go: the upstream
	req     Request
	n       int
	emit    Sink
	log     *slog.Logger
	reg     *registry.Registry
	b       *batch.Batch
	calls   []*call
	seen    map[string]bool
	lanes   map[string]*lane
	failRun error
	// noNextDrive: no later drive will find the batch's calls (an MCP
	// client's call), so none may be left for one.
	noNextDrive bool
	// keepRest, once set, says why the later calls of the batch are not
	// tried but kept for the next drive: a submission ran out of budget,
	// or a call was left for the next drive (its outputs must follow in
	// call order).
	keepRest atomic.Pointer[error]
}

func (e *Executor) newBatch(tctx context.Context, req Request, n int, emit Sink, log *slog.Logger) *batchRun {
	return &batchRun{e: e, ctx: tctx, rec: e.up, req: req, n: n, emit: emit, log: log, reg: e.tools.Load(), b: batch.New(e.cfg.MaxParallel),
		seen: map[string]bool{}, lanes: map[string]*lane{}}
}

// add checks one manifest from the stream and starts its call at once.
// Budgets are counted here, as the calls stream in: the model's order
// decides which calls a budget refuses.
func (br *batchRun) add(ctx context.Context, m *ToolCall) {
	if br.seen[m.ActionID] {
		br.log.Warn("duplicate manifest ignored", "action_id", m.ActionID, "tool_call_id", m.ToolCallID)
		return
	}
	br.seen[m.ActionID] = true
	c := &call{e: br.e, b: br, m: m}
	c.def, c.pre = br.e.precheck(br.reg, m)
	if c.pre != nil && c.pre.Type == tool.NotFound && c.def == nil && br.e.cfg.MissingTool == config.MissingToolFailRun && br.failRun == nil {
		br.failRun = fmt.Errorf("%w: %q", ErrUnknownToolFailRun, m.Tool)
	}
	if c.pre == nil && br.req.budget != nil {
		var which string
		if c.pre, which = br.e.admit(br.req.budget, c.def); c.pre != nil {
			br.e.obs.BudgetExceeded(which)
			br.log.Info("call refused by a budget", "action_id", m.ActionID, "tool", m.Tool, "budget", which)
		}
	}
	br.start(c)
}

// start announces a call and runs it on a goroutine of its own.
func (br *batchRun) start(c *call) {
	c.ran = make(chan struct{})
	if c.def != nil && c.def.Config.Lane != "" && !c.open {
		// Open calls finishing a previous drive's batch run without lanes:
		// the order they were made in is not known here.
		br.lane(c.def.Config.Lane).join(c)
	}
	br.emit(Event{Type: EventToolCall, Turn: br.n, Call: c.ref()})
	br.calls = append(br.calls, c)
	br.b.Go(func(p *batch.Place) error {
		c.place = p
		c.run(br.ctx)
		return nil
	})
}

// ref names the call in the events that come before its outcome.
func (c *call) ref() *CallResult {
	laneName := ""
	if c.ln != nil {
		laneName = c.ln.name
	}
	return &CallResult{Turn: c.b.n, ToolCallID: c.m.ToolCallID, ActionID: c.m.ActionID, Tool: c.m.Tool, Lane: laneName}
}

// wait joins the batch while the watcher asks Core whether the run was
// cancelled meanwhile (if so the turn, and the calls in flight, are
// cancelled with ErrRunCancelled), and sorts the batch's result into tr.
func (br *batchRun) wait(ctx context.Context, tr *turnResult, cancelTurn context.CancelCauseFunc) {
	remove := br.e.watch.add(br.ctx, br.req.RunID, cancelTurn)
	br.b.Wait()
	remove()
	var errs []error
	var first, last time.Time
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
	case br.failRun != nil:
		tr.err = br.failRun
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
	if _, ok := e.routes[def.Route]; !ok {
		return def, tool.NewError(tool.NotFound, "tool %q has route %q, which this sidecar does not serve", def.Name, def.Route)
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
	return log.With("action_id", m.ActionID, "tool_call_id", m.ToolCallID, "tool", m.Tool)
}

// unsafeNotMarked: an unsafe call runs only once Core knows it started, so
// failed is the outcome of a call that failed before it ran.
func (e *Executor) failed(turn int, m *ToolCall, err *tool.Error) *outcome {
	o := newOutcome(turn, m)
	e.settle(o, tool.Outcome{Err: err})
	return o
}

// newOutcome is the outcome of a call, yet to be settled.
func newOutcome(turn int, m *ToolCall) *outcome {
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
		o.res.OK, o.content, o.status = true, string(reply.Data), CallCompleted
	}
	o.res.Output = o.content
	o.done = time.Now()
}

// alreadyRecorded is the outcome of a call whose tool message Core has:
// only its Action is finalised.
func (e *Executor) alreadyRecorded(turn int, m *ToolCall) *outcome {
	o := newOutcome(turn, m)
	o.recorded, o.status, o.res.OK, o.done = true, CallCompleted, true, time.Now()
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
