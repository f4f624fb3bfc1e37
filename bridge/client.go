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

	mu       sync.Mutex
	pending  map[string]*waiter
	subjects map[string]string // by tool: built once
	closed   bool
	done     chan struct{} // closed by Close: wakes the calls in flight
	resyncs  sync.WaitGroup
}

// waiter is one attempt's wait: its reply channels, its timer, and the
// message it sends. Waiters are pooled: a call allocates none of them.
type waiter struct {
	final    chan *nats.Msg // cap 1: the first final reply wins
	progress chan struct{}  // cap 1: progress notifications coalesce
	timer    *time.Timer
	msg      nats.Msg
	vals     [4]string // the header values; the header map's slices point here
}

var waiters = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	w := &waiter{final: make(chan *nats.Msg, 1), progress: make(chan struct{}, 1), timer: t}
	w.msg.Header = make(nats.Header, len(w.vals))
	return w
}}

// release returns w to the pool. The caller has removed it from pending
// under the client's lock, and route sends only under that lock, so no
// reply can reach it any more: what is buffered is drained here.
func (w *waiter) release() {
	w.timer.Stop()
	select {
	case <-w.final:
	default:
	}
	select {
	case <-w.progress:
	default:
	}
	w.msg.Data, w.msg.Subject, w.msg.Reply = nil, "", ""
	w.vals = [4]string{}
	waiters.Put(w)
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

// Open subscribes the client's inbox on nc.
func Open(nc *nats.Conn, subjectPrefix string, opts ...Option) (*Client, error) {
	c := &Client{nc: nc, prefix: subjectPrefix, inbox: nc.NewInbox(), pending: map[string]*waiter{}, subjects: map[string]string{}, done: make(chan struct{})}
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
	if !c.closed {
		c.closed = true
		close(c.done)
	}
	c.mu.Unlock()
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

// route hands an inbox message to its waiter without blocking: a reply for
// a call that gave up is dropped.
func (c *Client) route(m *nats.Msg) {
	token := m.Subject[len(c.inbox)+1:]
	progress := wire.IsProgress(m)
	// The sends never block, and they happen under the lock so that a
	// waiter removed from pending (and then pooled) receives nothing more.
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.pending[token]
	switch {
	case w == nil:
	case progress:
		select {
		case w.progress <- struct{}{}:
		default:
		}
	default:
		select {
		case w.final <- m:
		default:
		}
	}
}

// Dispatch sends one attempt and waits for its outcome, the timeout, or
// ctx. On timeout or cancellation the worker is told on the cancel subject.
// The failure of a call is a value in Reply.Err, never an error return.
func (c *Client) Dispatch(ctx context.Context, req tool.Request) tool.Outcome {
	sent := time.Now()
	w, token, failed := c.send(ctx, &req, sent)
	if w == nil {
		return failed
	}
	defer c.forget(token, w)
	// A reply that comes meanwhile waits in the waiter.
	req.Sent()
	return c.await(ctx, &req, w, sent)
}

// send registers a waiter and publishes the attempt. On failure it returns
// a nil waiter and the outcome.
//
// Dispatch is split so that a call waiting for its reply sits on small
// frames: at thousands of waiting calls, a goroutine stack that stays
// under a quarter of its size is halved by the collector.
//
//go:noinline
func (c *Client) send(ctx context.Context, req *tool.Request, sent time.Time) (*waiter, string, tool.Outcome) {
	if err := ctx.Err(); err != nil {
		return nil, "", tool.Outcome{Err: tool.NewError(tool.Cancelled, "call cancelled before dispatch: %v", context.Cause(ctx))}
	}
	// The worker's deadline and the sidecar's timer count from one instant.
	strs := requestStrings(c.inbox, sent.Add(req.TimeoutOrDefault()), req.Traceparent)
	w := waiters.Get().(*waiter)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		waiters.Put(w)
		return nil, "", tool.Outcome{Err: tool.NewError(tool.WorkerCrash, "%v", ErrClosed)}
	}
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
		err = c.ledger.Dispatched(ctx, *req, req.RunID, msg.Reply)
	}
	if err == nil {
		if err = c.nc.PublishMsg(msg); err != nil {
			err = fmt.Errorf("publishing to %s: %w", subject, err)
		}
	}
	if err != nil {
		c.forget(strs.token, w)
		return nil, "", tool.Outcome{Err: tool.NewError(tool.WorkerCrash, "%v", err)}
	}
	return w, strs.token, tool.Outcome{}
}

// forget removes a waiter from pending and pools it.
func (c *Client) forget(token string, w *waiter) {
	c.mu.Lock()
	delete(c.pending, token)
	c.mu.Unlock()
	w.release()
}

// await waits for the outcome of an attempt sent at sent. One timer: it
// fires at the timeout, which progress restarts, or at the hard bound of
// max_duration, which nothing extends.
func (c *Client) await(ctx context.Context, req *tool.Request, w *waiter, sent time.Time) tool.Outcome {
	hard := sent.Add(req.MaxDurationOrDefault())
	w.timer.Reset(min(req.TimeoutOrDefault()-time.Since(sent), time.Until(hard)))
	progress := 0
	for {
		select {
		case m := <-w.final:
			return c.outcome(m, req, progress)
		case <-w.progress:
			progress++
			w.timer.Reset(min(req.TimeoutOrDefault(), time.Until(hard)))
			if req.OnProgress != nil {
				req.OnProgress()
			}
		case <-w.timer.C:
			if m, ok := ready(w.final); ok {
				return c.outcome(m, req, progress) // came as the timer fired, or while OnSent ran
			}
			c.cancel(req.ActionID, req.Attempt)
			if !time.Now().Before(hard) {
				return gaveUp(ctx, req, progress, stopMaxDuration)
			}
			return gaveUp(ctx, req, progress, stopTimeout)
		case <-ctx.Done():
			if m, ok := ready(w.final); ok {
				return c.outcome(m, req, progress)
			}
			c.cancel(req.ActionID, req.Attempt)
			return gaveUp(ctx, req, progress, stopCancelled)
		case <-c.done:
			return gaveUp(ctx, req, progress, stopClosed)
		}
	}
}

// ready takes a reply that is already there. select picks at random among
// ready cases, so a reply that is in must be looked for before the sidecar
// gives up on it.
func ready(final <-chan *nats.Msg) (*nats.Msg, bool) {
	select {
	case m := <-final:
		return m, true
	default:
		return nil, false
	}
}

// outcome decodes a final reply.
//
//go:noinline
func (c *Client) outcome(m *nats.Msg, req *tool.Request, progress int) tool.Outcome {
	if wire.IsNoResponders(m) {
		return tool.Outcome{Err: tool.NewError(tool.NotFound, "no worker is serving tool %q (no responders on %s)", req.Tool, wire.Subject(c.prefix, req.Tool))}
	}
	return wire.DecodeOutcome(m, progress)
}

// stop says why the sidecar stopped waiting for an attempt.
type stop int

const (
	stopTimeout     stop = iota // the timeout passed without progress
	stopMaxDuration             // max_duration passed, progress or not
	stopCancelled               // the call's context ended
	stopClosed                  // the client closed
)

// gaveUp is the outcome of an attempt the sidecar stopped waiting for.
//
//go:noinline
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
	if actionID == "" {
		return
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
