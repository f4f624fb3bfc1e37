// Package worker is the Go library for tool workers: it serves handlers over
// NATS in the queue group "toolsidecar", turns errors and panics into
// micro-style error replies, sends progress, cancels a handler's context on
// the cancel subject, and answers micro's discovery. It links neither the
// NATS server nor Prometheus, so a worker binary stays small.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/discovery"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/wire"
)

// Option configures a [Worker].
type Option func(*Worker)

// WithConcurrency bounds the handlers running at once across tools.
// default: 64
func WithConcurrency(n int) Option {
	return func(w *Worker) {
		if n > 0 {
			w.limit = n
		}
	}
}

// WithLogger sets the worker's logger. default: discard
func WithLogger(l *slog.Logger) Option {
	return func(w *Worker) {
		if l != nil {
			w.log = l
		}
	}
}

// WithQueueGroup overrides the queue group (default "toolsidecar"), for
// tests that need two independent workers.
func WithQueueGroup(q string) Option { return func(w *Worker) { w.queue = q } }

// Worker serves handlers over NATS.
type Worker struct {
	nc       *nats.Conn
	prefix   string
	queue    string
	limit    int
	log      *slog.Logger
	handlers map[string]tool.Handler

	jobs     chan job      // unbuffered: a call waits for a free runner
	stop     chan struct{} // closed by Stop once the subscriptions drained
	stopOnce sync.Once
	runners  sync.WaitGroup
	subs     []*nats.Subscription

	mu       sync.Mutex
	inflight map[attemptKey]context.CancelCauseFunc
}

// ErrCancelledBySidecar is the cause of a handler context cancelled through
// the cancel subject.
var ErrCancelledBySidecar = errors.New("worker: cancelled by the sidecar")

// New builds a worker; register handlers, then Start. No I/O.
func New(nc *nats.Conn, subjectPrefix string, opts ...Option) *Worker {
	w := &Worker{nc: nc, prefix: subjectPrefix, queue: wire.QueueGroup, limit: 64,
		log: slog.New(slog.DiscardHandler), handlers: map[string]tool.Handler{}, inflight: map[attemptKey]context.CancelCauseFunc{}}
	for _, o := range opts {
		o(w)
	}
	w.jobs, w.stop = make(chan job), make(chan struct{})
	return w
}

// Handle registers the handler of a tool. It must be called before Start.
func (w *Worker) Handle(name string, h tool.Handler) { w.handlers[name] = h }

type job struct {
	name string
	h    tool.Handler
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
	var endpoints []discovery.Endpoint
	for name, h := range w.handlers {
		subject := wire.Subject(w.prefix, name)
		sub, err := w.nc.QueueSubscribe(subject, w.queue, w.serve(name, h))
		if err != nil {
			w.abort()
			return fmt.Errorf("worker: subscribing %s: %w", name, err)
		}
		w.subs = append(w.subs, sub)
		endpoints = append(endpoints, discovery.Endpoint{Name: name, Subject: subject, QueueGroup: w.queue})
	}
	sub, err := w.nc.Subscribe(wire.CancelWildcard(w.prefix), w.onCancel)
	if err != nil {
		w.abort()
		return fmt.Errorf("worker: subscribing cancel: %w", err)
	}
	w.subs = append(w.subs, sub)
	subs, err := discovery.Serve(w.nc, "toolsidecar-worker", endpoints)
	if err != nil {
		w.abort()
		return err
	}
	w.subs = append(w.subs, subs...)
	return w.nc.Flush()
}

// abort undoes a failed Start.
func (w *Worker) abort() {
	for _, s := range w.subs {
		_ = s.Unsubscribe()
	}
	w.subs = nil
	w.stopOnce.Do(func() { close(w.stop) })
	w.runners.Wait()
}

// Stop drains the subscriptions (no new calls), waits for the calls in
// flight to finish, and, when ctx ends first, cancels them and waits for
// their handlers to return.
func (w *Worker) Stop(ctx context.Context) error {
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
			w.run(j.name, j.h, j.m)
		case <-w.stop:
			return
		}
	}
}

// onCancel stops the calls of an action. With a Tool-Attempt header it
// stops only that attempt: a late cancel of attempt 1 leaves attempt 2 be.
func (w *Worker) onCancel(m *nats.Msg) {
	id := m.Subject[len(wire.CancelSubject(w.prefix, "")):]
	attempt, err := strconv.Atoi(m.Header.Get(tool.HeaderAttempt))
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		if cancel := w.inflight[attemptKey{id, attempt}]; cancel != nil {
			cancel(ErrCancelledBySidecar)
		}
		return
	}
	for k, cancel := range w.inflight { // rare: a cancel that names no attempt
		if k.action == id {
			cancel(ErrCancelledBySidecar)
		}
	}
}

// attemptKey names one attempt of one call in flight. One flat map keyed
// by it costs no allocation per call.
type attemptKey struct {
	action  string
	attempt int
}

// serve hands each message to a runner; it blocks while all runners are
// busy, which holds back this subscription only.
func (w *Worker) serve(name string, h tool.Handler) nats.MsgHandler {
	return func(m *nats.Msg) {
		select {
		case w.jobs <- job{name, h, m}:
		case <-w.stop:
			w.respond(m, nil, tool.NewError(tool.WorkerCrash, "worker stopping"))
		}
	}
}

func (w *Worker) run(name string, h tool.Handler, m *nats.Msg) {
	call, err := tool.ParseCall(name, m.Data)
	if err != nil {
		w.respond(m, nil, err)
		return
	}
	call.Attempt, _ = strconv.Atoi(m.Header.Get(tool.HeaderAttempt))
	call.IdempotencyKey = m.Header.Get(tool.HeaderIdempotencyKey)
	call.Traceparent = m.Header.Get(tool.HeaderTraceparent)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var extend func()
	if ms, err := strconv.ParseInt(m.Header.Get(tool.HeaderDeadline), 10, 64); err == nil {
		call.Deadline = time.UnixMilli(ms)
		budget := time.Until(call.Deadline)
		t := time.AfterFunc(budget, func() { cancel(context.DeadlineExceeded) })
		defer t.Stop()
		// Progress restarts the sidecar's timeout, so it restarts ours.
		extend = func() { t.Reset(budget) }
	}
	if m.Reply != "" {
		call.SetProgress(func() error {
			if err := w.nc.PublishMsg(wire.ProgressMsg(m.Reply)); err != nil {
				return fmt.Errorf("worker: progress: %w", err)
			}
			if extend != nil {
				extend()
			}
			return nil
		})
	}
	if call.ActionID != "" {
		key := attemptKey{call.ActionID, call.Attempt}
		w.mu.Lock()
		w.inflight[key] = cancel
		w.mu.Unlock()
		defer func() {
			w.mu.Lock()
			delete(w.inflight, key)
			w.mu.Unlock()
		}()
	}
	data, err := tool.Invoke(ctx, h, call, w.log)
	if errors.Is(context.Cause(ctx), ErrCancelledBySidecar) {
		return // the sidecar stopped waiting; nobody reads a reply
	}
	w.respond(m, data, err)
}

func (w *Worker) respond(m *nats.Msg, data []byte, err error) {
	if m.Reply == "" {
		return
	}
	out := &nats.Msg{Subject: m.Reply, Data: data} // success: no header to encode
	if err != nil {
		out = wire.ErrorMsg(m.Reply, tool.AsError(err))
	}
	if perr := w.nc.PublishMsg(out); perr != nil {
		w.log.Error("reply failed", "subject", m.Subject, "err", perr)
		if errors.Is(perr, nats.ErrMaxPayload) {
			_ = w.nc.PublishMsg(wire.ErrorMsg(m.Reply, tool.NewError(tool.ToolFailed, "result of %d bytes exceeds the NATS max payload", len(data))))
		}
	}
}
