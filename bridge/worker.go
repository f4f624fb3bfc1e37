package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Call is what a handler receives: the manifest's fields, the raw manifest,
// and the protocol headers.
type Call struct {
	Tool       string          `json:"tool"`
	RunID      string          `json:"run_id"`
	ActionID   string          `json:"action_id"`
	ToolCallID string          `json:"tool_call_id"`
	Args       json.RawMessage `json:"args"`
	// Manifest is the request body as received.
	Manifest       []byte    `json:"-"`
	Attempt        int       `json:"-"`
	Deadline       time.Time `json:"-"`
	IdempotencyKey string    `json:"-"`
	Traceparent    string    `json:"-"`

	nc     *nats.Conn
	reply  string
	budget time.Duration
	extend func(time.Duration)
}

// Progress tells the sidecar the call is alive, which restarts its
// deadline, and extends the handler's own deadline by the same budget.
func (c *Call) Progress() error {
	if c.reply == "" {
		return nil
	}
	m := nats.NewMsg(c.reply)
	m.Header.Set(HeaderProgress, "1")
	if err := c.nc.PublishMsg(m); err != nil {
		return fmt.Errorf("bridge: progress: %w", err)
	}
	if c.extend != nil {
		c.extend(c.budget)
	}
	return nil
}

// Handler serves one tool. A returned error is sent as an error reply: an
// *Error keeps its type, any other error is a tool_error. A panic is
// recovered and sent as worker_crash.
type Handler func(ctx context.Context, call *Call) ([]byte, error)

// WorkerOption configures a [Worker].
type WorkerOption func(*Worker)

// WithConcurrency bounds the handlers running at once across tools.
// default: 64
func WithConcurrency(n int) WorkerOption {
	return func(w *Worker) {
		if n > 0 {
			w.limit = n
		}
	}
}

// WithLogger sets the worker's logger. default: discard
func WithLogger(l *slog.Logger) WorkerOption {
	return func(w *Worker) {
		if l != nil {
			w.log = l
		}
	}
}

// WithQueueGroup overrides the queue group (default "toolsidecar"), for
// tests that need two independent workers.
func WithQueueGroup(q string) WorkerOption { return func(w *Worker) { w.queue = q } }

// Worker serves handlers over NATS.
type Worker struct {
	nc       *nats.Conn
	prefix   string
	queue    string
	limit    int
	log      *slog.Logger
	handlers map[string]Handler

	jobs     chan job      // unbuffered: a call waits for a free runner
	stop     chan struct{} // closed by Stop once the subscriptions drained
	stopOnce sync.Once
	runners  sync.WaitGroup
	subs     []*nats.Subscription

	mu       sync.Mutex
	inflight map[string]context.CancelCauseFunc
	stopped  bool
}

// ErrCancelledBySidecar is the cause of a handler context cancelled through
// the cancel subject.
var ErrCancelledBySidecar = errors.New("bridge: cancelled by the sidecar")

// NewWorker builds a worker; register handlers, then Start. No I/O.
func NewWorker(nc *nats.Conn, subjectPrefix string, opts ...WorkerOption) *Worker {
	w := &Worker{nc: nc, prefix: subjectPrefix, queue: QueueGroup, limit: 64,
		log: slog.New(slog.DiscardHandler), handlers: map[string]Handler{}, inflight: map[string]context.CancelCauseFunc{}}
	for _, o := range opts {
		o(w)
	}
	w.jobs, w.stop = make(chan job), make(chan struct{})
	return w
}

// Handle registers the handler of a tool. It must be called before Start.
func (w *Worker) Handle(tool string, h Handler) { w.handlers[tool] = h }

type job struct {
	tool string
	h    Handler
	m    *nats.Msg
}

// Start starts the runners, then subscribes every registered tool, the
// cancel subject and micro's discovery subjects.
func (w *Worker) Start() error {
	// A fixed set of long-lived runners, not a goroutine per call: their
	// stacks stay grown, which matters on the hot path (JSON decoding).
	for range w.limit {
		w.runners.Go(w.runLoop)
	}
	for tool, h := range w.handlers {
		sub, err := w.nc.QueueSubscribe(w.prefix+"."+tool, w.queue, w.serve(tool, h))
		if err != nil {
			w.unsubscribe()
			return fmt.Errorf("bridge: subscribing %s: %w", tool, err)
		}
		w.subs = append(w.subs, sub)
	}
	sub, err := w.nc.Subscribe(w.prefix+".cancel.*", w.onCancel)
	if err != nil {
		w.unsubscribe()
		return fmt.Errorf("bridge: subscribing cancel: %w", err)
	}
	w.subs = append(w.subs, sub)
	if err := w.serveDiscovery(); err != nil {
		w.unsubscribe()
		return err
	}
	return w.nc.Flush()
}

// Stop drains the subscriptions (no new calls), waits for the calls in
// flight to finish, and, when ctx ends first, cancels them and waits for
// their handlers to return.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	for _, s := range w.subs {
		_ = s.Drain()
	}
	// Drain is asynchronous: wait until every subscription has delivered
	// what it had, so that no callback hands a call over after the stop.
	for _, s := range w.subs {
		for s.IsValid() && ctx.Err() == nil && w.nc.IsConnected() {
			time.Sleep(5 * time.Millisecond)
		}
		// Disconnected, a drain cannot finish: drop the subscription here.
		_ = s.Unsubscribe()
	}
	w.stopOnce.Do(func() { close(w.stop) })
	done := make(chan struct{})
	go func() { w.runners.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		w.mu.Lock()
		for _, cancel := range w.inflight {
			cancel(context.Cause(ctx))
		}
		w.mu.Unlock()
		<-done
		return nil
	}
}

// runLoop runs calls until the worker stops.
func (w *Worker) runLoop() {
	for {
		select {
		case j := <-w.jobs:
			w.run(j.tool, j.h, j.m)
		case <-w.stop:
			return
		}
	}
}

func (w *Worker) unsubscribe() {
	for _, s := range w.subs {
		_ = s.Unsubscribe()
	}
	w.subs = nil
}

func (w *Worker) onCancel(m *nats.Msg) {
	id := m.Subject[len(w.prefix)+len(".cancel."):]
	w.mu.Lock()
	cancel := w.inflight[id]
	w.mu.Unlock()
	if cancel != nil {
		cancel(ErrCancelledBySidecar)
	}
}

// serve hands each message to a runner; it blocks while all runners are
// busy, which holds back this subscription only.
func (w *Worker) serve(tool string, h Handler) nats.MsgHandler {
	return func(m *nats.Msg) {
		select {
		case w.jobs <- job{tool, h, m}:
		case <-w.stop:
			w.respond(m, nil, NewError(WorkerCrash, "worker stopping"))
		}
	}
}

func (w *Worker) run(tool string, h Handler, m *nats.Msg) {
	call, err := ParseCall(tool, m.Data)
	if err != nil {
		w.respond(m, nil, err)
		return
	}
	call.nc, call.reply = w.nc, m.Reply
	call.Attempt, _ = strconv.Atoi(m.Header.Get(HeaderAttempt))
	call.IdempotencyKey = m.Header.Get(HeaderIdempotencyKey)
	call.Traceparent = m.Header.Get(HeaderTraceparent)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	if ms, err := strconv.ParseInt(m.Header.Get(HeaderDeadline), 10, 64); err == nil {
		call.Deadline = time.UnixMilli(ms)
		call.budget = time.Until(call.Deadline)
		t := time.AfterFunc(call.budget, func() { cancel(context.DeadlineExceeded) })
		defer t.Stop()
		call.extend = func(d time.Duration) { t.Reset(d) }
	}
	key := call.ActionID
	if key != "" {
		w.mu.Lock()
		w.inflight[key] = cancel
		w.mu.Unlock()
		defer func() {
			w.mu.Lock()
			delete(w.inflight, key)
			w.mu.Unlock()
		}()
	}
	data, err := Invoke(ctx, h, call, w.log)
	if errors.Is(context.Cause(ctx), ErrCancelledBySidecar) {
		return // the sidecar stopped waiting; nobody reads a reply
	}
	w.respond(m, data, err)
}

// ParseCall reads a request body (the manifest) into a Call for tool.
func ParseCall(tool string, body []byte) (*Call, error) {
	m, err := parseManifest(body)
	if err != nil {
		return nil, NewError(InvalidArgs, "request body is not a manifest: %v", err)
	}
	return &Call{Tool: tool, RunID: m.runID, ActionID: m.actionID, ToolCallID: m.toolCallID, Args: m.args, Manifest: body}, nil
}

// Invoke runs a handler at the tool-call boundary: a panic becomes a
// worker_crash error (logged with its stack), and an untyped error after
// ctx ended becomes timeout or cancelled. Workers and in-process routes
// share it.
func Invoke(ctx context.Context, h Handler, call *Call, log *slog.Logger) (data []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			log.Error("tool handler panicked", "tool", call.Tool, "action_id", call.ActionID, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			data, err = nil, NewError(WorkerCrash, "worker panicked: %v", p)
		}
	}()
	data, err = h(ctx, call)
	if err != nil && ctx.Err() != nil && !errors.As(err, new(*Error)) {
		if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			return nil, NewError(Timeout, "deadline passed: %v", err)
		}
		return nil, NewError(Cancelled, "%v: %v", context.Cause(ctx), err)
	}
	return data, err
}

func (w *Worker) respond(m *nats.Msg, data []byte, err error) {
	if m.Reply == "" {
		return
	}
	out := &nats.Msg{Subject: m.Reply, Data: data} // success: no header to encode
	if err != nil {
		e := AsError(err)
		out = nats.NewMsg(m.Reply)
		out.Header.Set(HeaderServiceError, e.Message)
		out.Header.Set(HeaderServiceCode, itoa(e.Code))
		out.Header.Set(HeaderErrorType, string(e.Type))
	}
	if perr := w.nc.PublishMsg(out); perr != nil {
		w.log.Error("reply failed", "subject", m.Subject, "err", perr)
		if errors.Is(perr, nats.ErrMaxPayload) {
			fail := nats.NewMsg(m.Reply)
			fail.Header.Set(HeaderServiceError, fmt.Sprintf("result of %d bytes exceeds the NATS max payload", len(data)))
			fail.Header.Set(HeaderServiceCode, itoa(codes[ToolFailed]))
			fail.Header.Set(HeaderErrorType, string(ToolFailed))
			_ = w.nc.PublishMsg(fail)
		}
	}
}
