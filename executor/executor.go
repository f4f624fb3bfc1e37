// Package executor drives the consumer-tool continuation loop of one run.
//
// Per turn it streams POST /v1/completions, routes chunks to a [Sink],
// dispatches each tool_call_manifest the moment it arrives, and joins the
// whole batch: every call gets an outcome, success or error, which is
// submitted with its tool_call_id and whose Action is finalised, in the
// batch's call order. Only then is the next turn requested. The loop stops
// when a turn has no tool call, at the turn limit, on cancellation (the
// caller's context or the run cancelled upstream), or on a fatal upstream
// error.
package executor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// Dispatcher runs one attempt of one call on a route and returns its
// outcome; a failed call is a value in the outcome. The NATS client
// (package bridge) and the in-process routes (package plugins) satisfy it.
type Dispatcher interface {
	Dispatch(ctx context.Context, req tool.Request) tool.Outcome
}

// Recoverer finds the reply of a call whose sidecar went away while it ran
// (package ledger, in durable mode); with await it waits for one still on
// its way until the call's deadline. ok is false when there is none; an
// error wrapping tool.ErrNeverSent says that no attempt ever left.
type Recoverer interface {
	Recover(ctx context.Context, actionID string, await bool) (reply tool.Outcome, ok bool, err error)
	// Intend records that an unsafe call is about to be marked processing
	// and sent, so that a recovery can tell "never sent" from "unknown".
	Intend(ctx context.Context, actionID, runID, tool string) error
	// Running records an attempt of a call that runs in the sidecar's
	// process before it starts, as the NATS client records one it sends;
	// Ran stores its outcome under the reply subject Running returned, as
	// a worker's reply is captured (a call that may run again is recorded
	// only then, whole). An unsafe attempt that Running could not record
	// does not run.
	Running(ctx context.Context, req tool.Request, runID string) (reply string, err error)
	Ran(ctx context.Context, req tool.Request, runID, reply string, out tool.Outcome) error
}

// WithRecoverer consults r, when a drive finishes calls left open, before
// it runs a call again or declares it interrupted. default: none
func WithRecoverer(r Recoverer) Option { return func(e *Executor) { e.recoverer = r } }

// Tools gives the registry in force; *registry.Live satisfies it.
type Tools interface{ Load() *registry.Registry }

// Errors that end a run. They are causes: context.Cause tells them apart.
var (
	// ErrConflict: the request names another thread or assistant than
	// the run's; nothing is driven.
	ErrConflict = errors.New("executor: the request does not match the run")
	// ErrRunCancelled: the run was cancelled upstream.
	ErrRunCancelled = errors.New("executor: run cancelled upstream")
	// ErrTruncatedTurn: a turn's stream ended without its end and the upstream had
	// no pending Action to recover; asking again would make the model
	// answer twice.
	ErrTruncatedTurn = errors.New("executor: turn stream ended without [DONE] and no tool call to recover")
	// ErrSubmit: an outcome could not be recorded upstream, so the batch is
	// incomplete and no further turn is requested.
	ErrSubmit = errors.New("executor: tool outcome not recorded upstream")
	// ErrLostManifest: a tool_call_manifest whose action_id or
	// tool_call_id could not be read; its call cannot get an outcome.
	ErrLostManifest = errors.New("executor: a tool call could not be read, so it cannot be answered")
	// ErrUpstream: the upstream ended a turn with an error and no tool call.
	ErrUpstream = errors.New("executor: the upstream reported an error")
	// ErrUnknownToolFailRun: the model called an unregistered tool under
	// missing_tool: fail_run.
	ErrUnknownToolFailRun = errors.New("executor: unknown tool (missing_tool: fail_run)")
)

// Final statuses of a drive.
const (
	StatusCompleted = "completed"
	StatusMaxTurns  = "max_turns"
	StatusCancelled = "cancelled"
	StatusFailed    = "failed"
	// StatusInterrupted: the sidecar was shutting down (the last batch was
	// joined and submitted), or the upstream did not take the batch's outcomes
	// within the submit budget (they are kept and the next drive of the run
	// submits them); no further turn was requested.
	StatusInterrupted = "interrupted"
)

// Option configures an [Executor].
type Option func(*Executor)

// WithApprovals keeps approvals in s (the durable ledger's); default: a
// store in memory.
func WithApprovals(s approval.Store) Option { return func(e *Executor) { e.approvals = s } }

// WithTap hands every event of every drive, with its run and the caller
// whose drive it is (Request.Caller: "" for an MCP client's call), to tap
// (the live view), as the drive emits it; an MCP client's call is a run
// of its own there. tap is called from many goroutines and must not
// block.
func WithTap(tap func(runID, caller string, ev Event)) Option {
	return func(e *Executor) { e.tap = tap }
}

// tapped returns emit with the tap, if any, hearing each event after it.
func (e *Executor) tapped(runID, caller string, emit Sink) Sink {
	tap := e.tap
	if tap == nil {
		return emit
	}
	return func(ev Event) { emit(ev); tap(runID, caller, ev) }
}

// WithLogger sets the logger; default: discard.
func WithLogger(l *slog.Logger) Option {
	return func(e *Executor) {
		if l != nil {
			e.log = l
		}
	}
}

// WithObserver receives measurements; default: none.
func WithObserver(o Observer) Option {
	return func(e *Executor) {
		if o != nil {
			e.obs = o
		}
	}
}

// WithTracer records drives, turns and calls as OpenTelemetry spans, and
// sends each call's span context to the worker as its traceparent.
// default: no tracing
func WithTracer(t trace.Tracer) Option {
	return func(e *Executor) {
		if t != nil {
			_, off := t.(noop.Tracer)
			e.tracer, e.tracing = t, !off
		}
	}
}

// Executor drives runs. It is safe for concurrent use: each Drive owns its
// goroutines and waits for them.
type Executor struct {
	cfg       Config
	up        Upstream
	tools     Tools
	log       *slog.Logger
	obs       Observer
	recoverer Recoverer
	leases    Leases
	tracer    trace.Tracer
	tracing   bool // false with OpenTelemetry's no-op tracer, whose spans record nothing
	stopping  atomic.Bool
	drained   context.Context    // done once Drain was called
	drain     context.CancelFunc // Drain's: ends drained

	drivesMu sync.Mutex
	drives   map[string]*drive // runs being driven: one driver per run

	keptMu sync.Mutex
	kept   map[string]*outcome // outcomes the upstream did not take, by Action id

	memo    Memo        // results of dedupe tools
	hedge   *hedger     // when to send a straggler again
	results ResultStore // claim-checked results
	watch   *watcher    // cancellation of runs whose batches are in flight
	// approvals holds the calls that wait for a person (approval.go).
	approvals approval.Store
	// tap hears every event of every drive (the live view).
	tap func(runID, caller string, ev Event)
	// dispatch is a call's steps 2 to 4: the policies around its mark and
	// its attempts, composed once for each set of policies (policy.go).
	dispatch *chains
}

// Drain makes every drive end after its current batch is joined and
// submitted, with status "interrupted", and asks for no further turn: the
// first step of a graceful shutdown. It stops nothing in flight, except
// the wait of calls for a person's approval kept in a durable store:
// those are left, open, for the next drive of their run.
func (e *Executor) Drain() {
	e.stopping.Store(true)
	e.drain()
}

// ErrAbandoned is the cause of the drives that Abandon ends.
var ErrAbandoned = fmt.Errorf("%w: the sidecar stopped past its shutdown timeout: %w", ErrLeftForNextDrive, tool.ErrLeft)

// Abandon ends every drive in progress as a crash would, without a write
// to the upstream for the calls that have not finished: their Actions stay
// open (pending, or processing for a call that was sent), their workers
// are not told to stop, and the next drive of each run finishes them, from
// the reply the durable ledger captured meanwhile, by running a call that
// may run again, or with an "interrupted" outcome for an unsafe call whose
// effect is unknown. Outputs being written as it is called are finished;
// none is written after. The drives end "interrupted". The step of a
// graceful shutdown that follows Drain, once its deadline has passed: a
// graceful stop is never worse than a crash.
func (e *Executor) Abandon() {
	e.Drain()
	e.drivesMu.Lock()
	defer e.drivesMu.Unlock()
	for _, d := range e.drives {
		d.cancel(ErrAbandoned)
	}
}

// New builds an executor that drives the runs of up, with the tools in
// force in tools: each call is dispatched by its tool's route kind. cfg
// must be complete (see [Config]). No I/O.
func New(cfg Config, up Upstream, tools Tools, opts ...Option) *Executor {
	e := &Executor{cfg: cfg, up: up, tools: tools,
		log: slog.New(slog.DiscardHandler), obs: nopObserver{}, tracer: noop.NewTracerProvider().Tracer(""),
		drives: map[string]*drive{}, kept: map[string]*outcome{}, memo: newMemMemo(memMemoBytes),
		hedge: &hedger{ratio: cfg.MaxHedgeRatio, tokens: 1}, results: memResults{newMemMemo(memMemoBytes)},
		approvals: approval.NewMemory()}
	e.drained, e.drain = context.WithCancel(context.Background())
	e.watch = &watcher{up: up, interval: cfg.CancelPoll, rps: cfg.CancelPollRPS, runs: map[string]*watch{}}
	for _, o := range opts {
		o(e)
	}
	e.dispatch = newChains(e.policySet(), func(ctx context.Context, in *callIn) answer {
		return answer{Outcome: in.owner.dispatch(ctx)}
	})
	return e
}

// memMemoBytes bounds the results the memo in memory keeps.
const memMemoBytes = 32 << 20

// DriveFunc drives one run, as [Executor.Drive] does: the adapters that
// answer an application's request (proxy mode, the OpenAI-compatible
// endpoint) take one.
type DriveFunc func(ctx context.Context, req Request, sink Sink) (Summary, error)

// Request names the run to drive; the body of every completions request
// is built from it.
type Request struct {
	RunID       string         `json:"run_id"`
	ThreadID    string         `json:"thread_id"`
	AssistantID string         `json:"assistant_id"`
	MessageID   string         `json:"message_id"`
	Model       string         `json:"model"`
	MaxTurns    int            `json:"max_turns,omitempty"`
	MetaData    map[string]any `json:"meta_data,omitempty"`
	// ProviderKey is the LLM provider's key, which Core forwards to the
	// model (the drive body's api_key); not the Core key, nor CallerKey.
	ProviderKey *string `json:"api_key,omitempty"`
	// Traceparent is the caller's W3C trace context, forwarded to workers.
	Traceparent string `json:"-"`
	// CallerKey is the caller's Core API key: every Core request of the
	// drive carries it, and it is used nowhere else (never logged, never
	// stored). Empty: the sidecar's own key, when one is configured.
	CallerKey string `json:"-"`
	// Caller is who asks: the digest of the credentials the request
	// carries ([CallerOf]). A run whose upstream names its owner (the
	// model APIs' runs, which the sidecar holds) is driven, attached to,
	// resumed and read only by that caller.
	Caller string `json:"-"`
	// ResumeAfter is the ID of the last event this caller read of an
	// earlier attachment to the run's drive (SSE's Last-Event-ID). When it
	// names the drive in progress, the caller gets the events after it;
	// when it names another drive of the run (one before a restart), every
	// event the drive in progress still holds. Empty: the events from now
	// on, as for any caller.
	ResumeAfter string `json:"-"`
	// Linger is how long the drive outlives this caller when it is the
	// last to leave: a caller that may come back (an SSE stream, which
	// reconnects with Last-Event-ID) keeps the run going that long. Zero:
	// the drive is cancelled as soon as its last caller leaves.
	Linger time.Duration `json:"-"`

	// Fresh says that the run is new and that no other sidecar can name
	// it before its upstream's first write (an OpenAI-compatible run
	// without Idempotency-Key): in durable mode its lease is taken while
	// its first turn streams, and the upstream waits for it (Leased)
	// before that write.
	Fresh bool `json:"-"`

	leaseLost <-chan struct{} // closed when the run's lease passed to another sidecar
	pending   *pendingLease   // a fresh run's lease, being taken
	scope     *scope          // the policies' state for the drive; set by run
}

// CallerOf is the identity of a caller, from the credentials its request
// carries (its Authorization and X-Api-Key headers): a digest, so that no
// key is kept. Requests without either are one caller.
func CallerOf(h http.Header) string {
	authorization, apiKey := h.Get("Authorization"), h.Get("X-Api-Key")
	d := sha256.New()
	fmt.Fprintf(d, "%d:%s%d:%s", len(authorization), authorization, len(apiKey), apiKey)
	return hex.EncodeToString(d.Sum(nil))
}

// ErrNotOwner: the run was begun by another caller; nothing is driven.
var ErrNotOwner = errors.New("executor: the run belongs to another caller")

// ErrInvalidRequest: a drive request whose ids are not ids (tool.CheckID);
// nothing is driven.
var ErrInvalidRequest = errors.New("executor: invalid request")

// Check reports whether the request's ids may name a run: each is
// tool.CheckID's, or empty where the upstream does not need it.
func (r Request) Check() error {
	for _, f := range []struct{ name, id string }{{"run_id", r.RunID}, {"thread_id", r.ThreadID},
		{"assistant_id", r.AssistantID}, {"message_id", r.MessageID}} {
		if f.id == "" && f.name != "run_id" {
			continue
		}
		if err := tool.CheckID(f.name, f.id); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
	}
	return nil
}

// CallResult is the outcome of one call as the application sees it.
type CallResult struct {
	Turn       int    `json:"turn"`
	ToolCallID string `json:"tool_call_id"`
	ActionID   string `json:"action_id"`
	Tool       string `json:"tool"`
	// Lane is the ordered lane the call ran in, if any.
	Lane       string `json:"lane,omitempty"`
	OK         bool   `json:"ok"`
	ErrorType  string `json:"error_type,omitempty"`
	Error      string `json:"error,omitempty"`
	Attempts   int    `json:"attempts"`
	DurationMS int64  `json:"duration_ms"`
	// Output is the content submitted as the tool message.
	Output string `json:"-"`
	// Submitted reports that the tool message and the Action's final
	// status reached the upstream; for a call whose action_id is not an
	// id, the tool message alone (its Action cannot be addressed).
	Submitted bool `json:"submitted"`
	// ClaimCheck is the handle under which the call's large result was
	// stored; the model read a preview (read_tool_result reads the rest).
	ClaimCheck string `json:"claim_check,omitempty"`
	// Hedged reports that a straggling attempt was sent a second time.
	Hedged bool `json:"hedged,omitempty"`
	// DedupedFrom is the tool_call_id of the earlier call of the run whose
	// result answered this one (dedupe: run); it was not dispatched.
	DedupedFrom string `json:"deduped_from,omitempty"`
	// Approval is how the call's approval ended, for a tool that needs
	// one: the verdict, who decided and why.
	Approval *ApprovalResult `json:"approval,omitempty"`
	// Timeline is when the call's steps happened (the live view draws it).
	Timeline Timeline `json:"-"`
}

// Timeline is when a call's steps happened; a zero time is a step that
// did not happen.
type Timeline struct {
	Started   time.Time // checked and on its way to policies and worker
	Replied   time.Time // the outcome known
	Recorded  time.Time // the tool output recorded upstream
	Finalised time.Time // the Action's final status written
}

// Summary is the result of a drive.
type Summary struct {
	RunID string `json:"run_id"`
	// Upstream is the kind of upstream the run was driven on (its
	// upstream.kind: core, openai, responses, anthropic, openai-agents,
	// anthropic-agents); mcp for an MCP client's call, which has none.
	Upstream string       `json:"upstream"`
	Status   string       `json:"status"`
	Turns    int          `json:"turns"`
	Content  string       `json:"content"`
	Calls    []CallResult `json:"calls"`
	Error    string       `json:"error,omitempty"`
	// Budget is the drive's spending against its budgets, when any is set.
	Budget *BudgetReport `json:"budget,omitempty"`
	// TraceID is the drive's trace, when it is traced (tracing on, or a
	// caller's traceparent followed).
	TraceID string `json:"trace_id,omitempty"`
}
