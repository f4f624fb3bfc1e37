package bridge

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// ErrClosed is returned by Dispatch after Close.
var ErrClosed = errors.New("bridge: client closed")

// Request is one attempt of one call.
type Request struct {
	// Tool names the tool, for messages; Subject is where it is served.
	Tool    string
	Subject string
	// Body is the manifest exactly as Core sent it.
	Body []byte
	// ActionID is the idempotency key and names the cancel subject.
	ActionID string
	Attempt  int
	// Timeout bounds the wait for the reply; each progress message
	// restarts it.
	Timeout time.Duration
	// Traceparent is forwarded; a new one is made when empty.
	Traceparent string
}

// Reply is the outcome of one attempt: Data on success, Err otherwise.
type Reply struct {
	Data     []byte
	Err      *Error
	Progress int // progress messages seen
	// Sent is false when the request never reached a worker (no
	// responders), so even an unsafe tool may be retried.
	Sent bool
}

// Client dispatches calls from the sidecar. It multiplexes every reply on
// one wildcard inbox subscription, as nats.go's own requests do. It is safe
// for concurrent use.
type Client struct {
	nc     *nats.Conn
	prefix string
	inbox  string
	sub    *nats.Subscription
	seq    atomic.Uint64

	mu      sync.Mutex
	pending map[string]*waiter
	closed  bool
}

type waiter struct {
	final    chan *nats.Msg // cap 1: the first final reply wins
	progress chan struct{}  // cap 1: progress notifications coalesce
}

// Open subscribes the client's inbox on nc.
func Open(nc *nats.Conn, subjectPrefix string) (*Client, error) {
	c := &Client{nc: nc, prefix: subjectPrefix, inbox: nc.NewInbox(), pending: map[string]*waiter{}}
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
	c.closed = true
	c.mu.Unlock()
	return c.sub.Unsubscribe()
}

// route hands an inbox message to its waiter without blocking: a reply for
// a call that gave up is dropped.
func (c *Client) route(m *nats.Msg) {
	token := m.Subject[len(c.inbox)+1:]
	c.mu.Lock()
	w := c.pending[token]
	c.mu.Unlock()
	if w == nil {
		return
	}
	if m.Header.Get(HeaderProgress) != "" {
		select {
		case w.progress <- struct{}{}:
		default:
		}
		return
	}
	select {
	case w.final <- m:
	default:
	}
}

// CancelSubject is where the cancellation of an action is published.
func CancelSubject(prefix, actionID string) string { return prefix + ".cancel." + actionID }

// Dispatch sends one attempt and waits for its outcome, the timeout, or
// ctx. On timeout or cancellation the worker is told on the cancel subject.
// The failure of a call is a value in Reply.Err, never an error return.
func (c *Client) Dispatch(ctx context.Context, req Request) Reply {
	if err := ctx.Err(); err != nil {
		return Reply{Err: NewError(Cancelled, "call cancelled before dispatch: %v", context.Cause(ctx))}
	}
	token := strconv.FormatUint(c.seq.Add(1), 36)
	w := &waiter{final: make(chan *nats.Msg, 1), progress: make(chan struct{}, 1)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return Reply{Err: NewError(WorkerCrash, "%v", ErrClosed)}
	}
	c.pending[token] = w
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, token)
		c.mu.Unlock()
	}()

	timeout := req.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	msg := nats.NewMsg(req.Subject)
	msg.Reply = c.inbox + "." + token
	msg.Data = req.Body
	msg.Header.Set(HeaderDeadline, strconv.FormatInt(time.Now().Add(timeout).UnixMilli(), 10))
	msg.Header.Set(HeaderAttempt, itoa(max(req.Attempt, 1)))
	msg.Header.Set(HeaderIdempotencyKey, req.ActionID)
	tp := req.Traceparent
	if tp == "" {
		tp = NewTraceparent()
	}
	msg.Header.Set(HeaderTraceparent, tp)
	if err := c.nc.PublishMsg(msg); err != nil {
		return Reply{Err: NewError(WorkerCrash, "publishing to %s: %v", req.Subject, err)}
	}

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	progress := 0
	for {
		select {
		case m := <-w.final:
			if isNoResponders(m) {
				return Reply{Err: NewError(NotFound, "no worker is serving tool %q (no responders on %s)", req.Tool, req.Subject)}
			}
			return decodeReply(m, progress)
		case <-w.progress:
			progress++
			timer.Reset(timeout)
		case <-timer.C:
			c.cancel(req.ActionID)
			return Reply{Sent: true, Progress: progress, Err: NewError(Timeout, "tool %q did not answer within %s", req.Tool, timeout)}
		case <-ctx.Done():
			c.cancel(req.ActionID)
			return Reply{Sent: true, Progress: progress, Err: NewError(Cancelled, "call cancelled: %v", context.Cause(ctx))}
		}
	}
}

func (c *Client) cancel(actionID string) {
	if actionID != "" {
		// Best effort: a worker that missed it still hits its deadline.
		_ = c.nc.Publish(CancelSubject(c.prefix, actionID), nil)
	}
}

func isNoResponders(m *nats.Msg) bool {
	return len(m.Data) == 0 && m.Header.Get("Status") == "503" // the server's no-responders status
}

func decodeReply(m *nats.Msg, progress int) Reply {
	codeStr := m.Header.Get(HeaderServiceCode)
	if codeStr == "" && m.Header.Get(HeaderErrorType) == "" {
		return Reply{Data: m.Data, Progress: progress, Sent: true}
	}
	code, _ := strconv.Atoi(codeStr)
	t := ErrorType(m.Header.Get(HeaderErrorType))
	if _, known := codes[t]; !known {
		t = typeOfCode(code)
	}
	if code == 0 {
		code = codes[t]
	}
	msg := m.Header.Get(HeaderServiceError)
	if msg == "" {
		msg = string(m.Data)
	}
	return Reply{Progress: progress, Sent: true, Err: &Error{Type: t, Code: code, Message: msg}}
}

// NewTraceparent makes a W3C traceparent with a random trace and span id.
// Trace ids need to be unique, not secret: math/rand keeps this off the
// crypto path on every call.
func NewTraceparent() string {
	var b [24]byte
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rand.Uint64())
	}
	return "00-" + hex.EncodeToString(b[:16]) + "-" + hex.EncodeToString(b[16:]) + "-01"
}
