// Package bridge is the sidecar's NATS client: it publishes one attempt of
// a call to <prefix>.<tool> with a reply subject of its own, waits for the
// outcome, lets progress messages extend the deadline, and publishes
// <prefix>.cancel.<action_id> when it gives up. It satisfies the executor's
// Dispatcher. The worker side is package worker; the protocol they share is
// package wire.
package bridge

import (
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/wire"
)

// ErrClosed is returned by Dispatch after Close.
var ErrClosed = errors.New("bridge: client closed")

// Client dispatches calls from the sidecar. It multiplexes every reply on
// one wildcard inbox subscription, as nats.go's own requests do. It is safe
// for concurrent use.
type Client struct {
	nc     *nats.Conn
	prefix string
	inbox  string
	sub    *nats.Subscription
	ledger Ledger // nil: not durable
	// progressDropped counts the progress messages not shown (nil: not
	// counted).
	progressDropped prometheus.Counter

	mu       sync.Mutex
	pending  map[string]*waiter
	subjects map[string]string // by tool: built once
	closed   bool
	done     chan struct{} // closed by Close
	resyncs  sync.WaitGroup
	waiters  sync.Pool // of *waiter, each tied to this client
}

// waiter is one attempt's wait. It holds no goroutine: the reply (on the
// inbox subscription), its timer, the end of its context and Close each
// try to settle it, and the first one does, exactly once. Waiters are
// pooled; gen tells a callback that fired late that its wait is over.
type waiter struct {
	c     *Client     // set once
	timer *time.Timer // runs expire
	msg   nats.Msg
	vals  [4]string // the header values; the header map's slices point here

	// Guarded by c.mu.
	gen      uint64
	token    string
	req      tool.Request
	ctx      context.Context
	stopCtx  func() bool // unregisters the context's callback
	done     func(tool.Outcome)
	sent     time.Time
	due      time.Time // when the timer is due: a late expire of a reused waiter sees it ahead
	armed    bool      // OnSent has returned: the wait has begun
	settled  bool
	final    *nats.Msg // a final reply that came before armed
	progress int
	shown    *rate.Limiter // the progress shown (OnProgress); made on the first
}

// newWaiter is the waiter pool's constructor.
func (c *Client) newWaiter() any {
	w := &waiter{c: c, settled: true}
	w.timer = time.AfterFunc(time.Hour, w.expire)
	w.timer.Stop()
	w.msg.Header = make(nats.Header, len(w.vals))
	return w
}

// Ledger records an attempt before it is sent, with its reply subject, so
// that a restarted sidecar finds the reply (package ledger).
type Ledger interface {
	Dispatched(ctx context.Context, req tool.Request, runID, reply string) error
	// Reply is the last message captured on a reply subject, if any.
	Reply(ctx context.Context, subject string) (*nats.Msg, bool, error)
}

// Option configures a [Client].
type Option func(*Client)

// WithInbox sends requests with reply subjects under inbox instead of a
// random _INBOX: a durable sidecar's reply namespace, which a JetStream
// stream captures.
func WithInbox(inbox string) Option { return func(c *Client) { c.inbox = inbox } }

// WithLedger records every attempt in l before it is sent.
func WithLedger(l Ledger) Option { return func(c *Client) { c.ledger = l } }

// WithMetrics registers the client's metrics on reg:
// toolsidecar_nats_progress_dropped_total.
func WithMetrics(reg prometheus.Registerer) Option {
	return func(c *Client) {
		c.progressDropped = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "toolsidecar", Subsystem: "nats", Name: "progress_dropped_total",
			Help: "Progress messages past a call's rate (10 at once, then one per 100 ms): they keep the call alive, and are not shown to its followers."})
		reg.MustRegister(c.progressDropped)
	}
}

// A call's progress is shown to its followers (OnProgress) progressBurst
// times at once, then once per progressEvery: a worker may send progress
// as fast as the bus carries it, and showing each one took the sidecar's
// cores.
const (
	progressEvery = 100 * time.Millisecond
	progressBurst = 10
)

// Open subscribes the client's inbox on nc.
func Open(nc *nats.Conn, subjectPrefix string, opts ...Option) (*Client, error) {
	c := &Client{nc: nc, prefix: subjectPrefix, inbox: nc.NewInbox(), pending: map[string]*waiter{}, subjects: map[string]string{}, done: make(chan struct{})}
	c.waiters.New = c.newWaiter
	for _, o := range opts {
		o(c)
	}
	sub, err := nc.Subscribe(c.inbox+".*", c.route)
	if err != nil {
		return nil, fmt.Errorf("bridge: subscribing inbox: %w", err)
	}
	if err := sub.SetPendingLimits(-1, 64<<20); err != nil {
		return nil, fmt.Errorf("bridge: inbox limits: %w", err)
	}
	c.sub = sub
	return c, nil
}

// Close stops receiving replies; calls in flight end with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	var armed []*waiter
	if !c.closed {
		c.closed = true
		close(c.done)
		for _, w := range c.pending {
			if w.armed { // the others end when their OnSent returns
				armed = append(armed, w)
			}
		}
	}
	c.mu.Unlock()
	for _, w := range armed {
		c.mu.Lock()
		if w.settled {
			c.mu.Unlock()
			continue
		}
		done, out := c.settleLocked(w, nil, stopClosed)
		done(out) // done never blocks
	}
	c.resyncs.Wait()
	return c.sub.Unsubscribe()
}

// resyncWindow is how long after a reconnection the client keeps looking
// for replies that arrived while it was cut off: the workers reconnect, and
// send what they buffered, on their own schedule.
const resyncWindow = 10 * time.Second

// Resync looks, after a reconnection, for the replies that arrived while
// the client was disconnected: in durable mode the reply stream captured
// them, and each waiting call gets its own. It returns at once; the lookup
// repeats for resyncWindow while calls still wait, and Close waits for it.
func (c *Client) Resync() {
	if c.ledger == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.resyncs.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), resyncWindow)
		defer cancel()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			c.mu.Lock()
			tokens := make([]string, 0, len(c.pending))
			for t := range c.pending {
				tokens = append(tokens, t)
			}
			c.mu.Unlock()
			for _, t := range tokens {
				if m, ok, err := c.ledger.Reply(ctx, c.inbox+"."+t); err == nil && ok {
					c.route(m)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-c.done:
				return
			case <-tick.C:
			}
		}
	})
}

// route hands an inbox message to its waiter: a reply for a call that
// gave up is dropped. It runs on the subscription's goroutine, so the
// call's continuation runs on a goroutine of its own.
func (c *Client) route(m *nats.Msg) {
	token := m.Subject[len(c.inbox)+1:]
	progress := wire.IsProgress(m)
	c.mu.Lock()
	w := c.pending[token]
	switch {
	case w == nil:
		c.mu.Unlock()
	case progress:
		// Cheap, whatever the rate: the deadline moves, and the timer,
		// when it fires, sets itself to it (expire); the followers are
		// told at the rate of progressEvery.
		w.progress++
		now := time.Now()
		if w.armed {
			w.due = now.Add(min(w.req.TimeoutOrDefault(), w.sent.Add(w.req.MaxDurationOrDefault()).Sub(now)))
		}
		if w.shown == nil {
			w.shown = rate.NewLimiter(rate.Every(progressEvery), progressBurst)
		}
		show := w.shown.AllowN(now, 1)
		onProgress := w.req.OnProgress
		c.mu.Unlock()
		switch {
		case !show:
			if c.progressDropped != nil {
				c.progressDropped.Inc()
			}
		case onProgress != nil:
			onProgress()
		}
	case !w.armed:
		// OnSent is still running: the reply waits for it, so that the
		// call's start is recorded before its end.
		if w.final == nil {
			w.final = m
		}
		c.mu.Unlock()
	default:
		done, out := c.settleLocked(w, m, stopReplied)
		done(out)
	}
}

// Dispatch sends one attempt and waits for its outcome, the timeout, or
// ctx. On timeout or cancellation the worker is told on the cancel subject.
// The failure of a call is a value in the Outcome's Err, never an error return.
func (c *Client) Dispatch(ctx context.Context, req tool.Request) tool.Outcome {
	// The outcome is handed over on a buffered channel, so that the
	// client's reply handler, timer or Close never blocks on the caller.
	ch := make(chan tool.Outcome, 1)
	if out, sent := c.send(ctx, req, func(o tool.Outcome) { ch <- o }); !sent {
		return out
	}
	return <-ch
}

// send sends one attempt and returns once it has left and req.OnSent has
// returned. done receives the outcome exactly once and must not block.
// When the attempt cannot be sent, send returns its outcome and false, and
// done is never called.
func (c *Client) send(ctx context.Context, req tool.Request, done func(tool.Outcome)) (tool.Outcome, bool) {
	if err := ctx.Err(); err != nil {
		return tool.Outcome{Err: tool.NewError(tool.Cancelled, "call cancelled before dispatch: %v", context.Cause(ctx))}, false
	}
	sent := time.Now()
	// The worker's deadline and the sidecar's timer count from one instant.
	strs := requestStrings(c.inbox, sent.Add(req.TimeoutOrDefault()), req.Traceparent)
	w := c.waiters.Get().(*waiter)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.waiters.Put(w)
		return tool.Outcome{Err: tool.NewError(tool.WorkerCrash, "%v", ErrClosed)}, false
	}
	w.token, w.req, w.ctx, w.done, w.sent = strs.token, req, ctx, done, sent
	w.settled, w.armed, w.final, w.progress, w.shown = false, false, nil, 0, nil
	c.pending[strs.token] = w
	subject := c.subject(req.Tool)
	c.mu.Unlock()

	msg := &w.msg
	msg.Subject, msg.Reply, msg.Data = subject, strs.reply, req.Body
	w.vals = [4]string{strs.deadline, strconv.Itoa(max(req.Attempt, 1)), req.ActionID, strs.traceparent}
	msg.Header[tool.HeaderDeadline] = w.vals[0:1:1]
	msg.Header[tool.HeaderAttempt] = w.vals[1:2:2]
	msg.Header[tool.HeaderIdempotencyKey] = w.vals[2:3:3]
	msg.Header[tool.HeaderTraceparent] = w.vals[3:4:4]
	var err error
	if c.ledger != nil {
		// Recorded before it is sent: a call the ledger does not know was
		// never sent.
		err = c.ledger.Dispatched(ctx, req, req.RunID, msg.Reply)
	}
	if err == nil {
		if err = c.nc.PublishMsg(msg); err != nil {
			err = fmt.Errorf("publishing to %s: %w", subject, err)
		}
	}
	if err != nil {
		c.mu.Lock()
		c.settleLocked(w, nil, stopUnsent)
		return tool.Outcome{Err: tool.NewError(tool.WorkerCrash, "%v", err)}, false
	}
	req.Sent()
	c.arm(w)
	return tool.Outcome{}, true
}

// arm begins the wait once OnSent has returned: what came meanwhile (a
// reply, Close, the end of ctx, the timeout) settles the call now.
func (c *Client) arm(w *waiter) {
	c.mu.Lock()
	w.armed = true
	var why stop
	switch {
	case w.final != nil:
		why = stopReplied
	case c.closed:
		why = stopClosed
	case w.ctx.Err() != nil:
		why = stopCancelled
	default:
		if w.progress > 0 {
			c.resetLocked(w, w.req.TimeoutOrDefault())
		} else {
			c.resetLocked(w, w.req.TimeoutOrDefault()-time.Since(w.sent))
		}
		if w.ctx.Done() != nil {
			gen := w.gen
			w.stopCtx = context.AfterFunc(w.ctx, func() { c.ended(w, gen) })
		}
		c.mu.Unlock()
		return
	}
	done, out := c.settleLocked(w, w.final, why)
	done(out)
}

// resetLocked sets w's timer to d from now, never past the hard bound of
// max_duration. The caller holds c.mu.
func (c *Client) resetLocked(w *waiter, d time.Duration) {
	d = min(d, time.Until(w.sent.Add(w.req.MaxDurationOrDefault())))
	w.due = time.Now().Add(d)
	w.timer.Reset(d)
}

// expire is w's timer: the timeout passed without progress, or
// max_duration did. Progress moves w.due without the timer, which then
// sets itself to it.
func (w *waiter) expire() {
	c := w.c
	c.mu.Lock()
	if w.settled || !w.armed {
		c.mu.Unlock() // settled meanwhile, or a late firing for a reused waiter
		return
	}
	if d := time.Until(w.due); d > 0 {
		w.timer.Reset(d) // progress came, or a late firing for a reused waiter: its due stands
		c.mu.Unlock()
		return
	}
	why := stopTimeout
	if !time.Now().Before(w.sent.Add(w.req.MaxDurationOrDefault())) {
		why = stopMaxDuration
	}
	done, out := c.settleLocked(w, nil, why)
	done(out)
}

// ended is the callback of w's context.
func (c *Client) ended(w *waiter, gen uint64) {
	c.mu.Lock()
	if w.gen != gen || w.settled {
		c.mu.Unlock()
		return
	}
	done, out := c.settleLocked(w, nil, stopCancelled)
	done(out)
}

// settleLocked ends w's wait for why (with m, the reply, for stopReplied),
// returns it to the pool, and returns the call's done and outcome. The
// caller holds c.mu; settleLocked releases it.
func (c *Client) settleLocked(w *waiter, m *nats.Msg, why stop) (func(tool.Outcome), tool.Outcome) {
	w.settled = true
	w.gen++
	delete(c.pending, w.token)
	req, ctx, done, progress, stopCtx := w.req, w.ctx, w.done, w.progress, w.stopCtx
	// Removed from pending under the lock under which replies are handed
	// over: a late reply cannot reach the waiter's next user.
	w.req, w.ctx, w.done, w.stopCtx, w.final, w.token = tool.Request{}, nil, nil, nil, nil, ""
	c.mu.Unlock()
	w.timer.Stop()
	if stopCtx != nil {
		stopCtx()
	}
	w.msg.Data, w.msg.Subject, w.msg.Reply = nil, "", ""
	w.vals = [4]string{}
	c.waiters.Put(w)
	var out tool.Outcome
	switch why {
	case stopUnsent:
	case stopReplied:
		out = c.outcome(m, &req, progress)
	case stopTimeout, stopMaxDuration, stopCancelled:
		if why != stopCancelled || !errors.Is(context.Cause(ctx), tool.ErrLeft) {
			// A call left by a stopping sidecar is not cancelled, as a
			// crash would not cancel it: its reply is captured.
			c.cancel(req.ActionID, req.Attempt)
		}
		out = gaveUp(ctx, &req, progress, why)
	default:
		out = gaveUp(ctx, &req, progress, why)
	}
	return done, out
}

// outcome decodes a final reply.
func (c *Client) outcome(m *nats.Msg, req *tool.Request, progress int) tool.Outcome {
	if wire.IsNoResponders(m) {
		return tool.Outcome{Err: tool.NewError(tool.NotFound, "no worker is serving tool %q (no responders on %s)", req.Tool, wire.Subject(c.prefix, req.Tool))}
	}
	return wire.DecodeOutcome(m, progress)
}

// stop says why the sidecar stopped waiting for an attempt.
type stop int

const (
	stopReplied     stop = iota // the final reply came
	stopUnsent                  // the attempt could not be sent
	stopTimeout                 // the timeout passed without progress
	stopMaxDuration             // max_duration passed, progress or not
	stopCancelled               // the call's context ended
	stopClosed                  // the client closed
)

// gaveUp is the outcome of an attempt the sidecar stopped waiting for.
func gaveUp(ctx context.Context, req *tool.Request, progress int, why stop) tool.Outcome {
	out := tool.Outcome{Sent: true, Progress: progress}
	switch why {
	case stopCancelled:
		out.Err = tool.NewError(tool.Cancelled, "call cancelled: %v", context.Cause(ctx))
	case stopMaxDuration:
		out.Err = tool.NewError(tool.Timeout, "tool %q ran past its max_duration of %s (progress does not extend it)", req.Tool, req.MaxDurationOrDefault())
	case stopClosed:
		out.Err = tool.NewError(tool.WorkerCrash, "%v while waiting for tool %q", ErrClosed, req.Tool)
	default:
		out.Err = tool.NewError(tool.Timeout, "tool %q did not answer within %s", req.Tool, req.TimeoutOrDefault())
	}
	return out
}

// cancel tells the worker that this attempt is abandoned. The attempt
// travels in the Tool-Attempt header, so that a cancel that arrives late
// cannot stop the next attempt of the same call.
func (c *Client) cancel(actionID string, attempt int) {
	if tool.CheckID("action_id", actionID) != nil {
		return // never a subject: the executor sends no such call
	}
	m := nats.NewMsg(wire.CancelSubject(c.prefix, actionID))
	m.Header.Set(tool.HeaderAttempt, strconv.Itoa(max(attempt, 1)))
	// Best effort: a worker that missed it still hits its deadline.
	_ = c.nc.PublishMsg(m)
}

// maxSubjects bounds the cache of tool subjects; names beyond it are
// joined on each call.
const maxSubjects = 1024

// subject is the subject of a tool, built once. The caller holds c.mu.
func (c *Client) subject(name string) string {
	if s, ok := c.subjects[name]; ok {
		return s
	}
	s := wire.Subject(c.prefix, name)
	if len(c.subjects) < maxSubjects {
		c.subjects[name] = s
	}
	return s
}

// reqStrings are the strings of one attempt, cut from a single allocation.
type reqStrings struct {
	reply, token, deadline, traceparent string
}

// requestStrings makes the reply subject, <inbox>.<token>, the deadline
// header and, when the call has none, a traceparent.
//
// The token is 128 random bits, so that a worker that saw the subject of
// its own request cannot guess another's and forge its outcome. A
// traceparent made here is not sampled (flags 00): the sidecar records no
// trace for the call, and a sampled flag would also make the NATS server
// parse every request's headers for its own message tracing.
func requestStrings(inbox string, deadline time.Time, traceparent string) reqStrings {
	var tok [16]byte
	_, _ = crand.Read(tok[:])
	var enc [22]byte
	base64.RawURLEncoding.Encode(enc[:], tok[:])
	var dl [20]byte
	dlb := strconv.AppendInt(dl[:0], deadline.UnixMilli(), 10)
	var b strings.Builder
	b.Grow(len(inbox) + 1 + len(enc) + len(dlb) + traceparentLen)
	b.WriteString(inbox)
	b.WriteByte('.')
	b.Write(enc[:])
	replyEnd := b.Len()
	b.Write(dlb)
	dlEnd := b.Len()
	if traceparent == "" {
		appendTraceparent(&b, "00")
	}
	s := b.String()
	if traceparent == "" {
		traceparent = s[dlEnd:]
	}
	return reqStrings{reply: s[:replyEnd], token: s[len(inbox)+1 : replyEnd], deadline: s[replyEnd:dlEnd], traceparent: traceparent}
}

// traceparentLen is the length of a W3C traceparent of version 00.
const traceparentLen = 55

// NewTraceparent makes a sampled W3C traceparent with a random trace and
// span id, for a caller that records the trace.
func NewTraceparent() string {
	var b strings.Builder
	b.Grow(traceparentLen)
	appendTraceparent(&b, "01")
	return b.String()
}

// appendTraceparent writes a traceparent with random ids and the given
// flags. Trace ids need to be unique, not secret: math/rand keeps this off
// the crypto path on every call.
func appendTraceparent(b *strings.Builder, flags string) {
	var id [24]byte
	for i := 0; i < len(id); i += 8 {
		binary.LittleEndian.PutUint64(id[i:], rand.Uint64())
	}
	var h [48]byte
	hex.Encode(h[:], id[:])
	b.WriteString("00-")
	b.Write(h[:32])
	b.WriteByte('-')
	b.Write(h[32:])
	b.WriteByte('-')
	b.WriteString(flags)
}
