package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// The writes that make a call's outcome count (its tool message and its
// Action's final status) must land exactly once whatever Core does: they
// are retried on every transient failure until the caller's context (the
// submit budget) ends, each attempt bounded by Config.Timeout. A tool
// output whose first attempt may have landed is looked up before it is
// sent again.

// ErrBudget wraps the last failure of a write whose retries ran out of
// time; the write may be tried again later.
var ErrBudget = errors.New("core: submit budget spent")

// RecordToolOutput posts a tool output exactly once (POST
// /v1/messages/tools). After a failure whose effect is uncertain (a
// timeout, a dropped connection, a 5xx after the body was sent) it reads
// the thread's newest messages and, when one carries the output's
// tool_call_id, returns it instead of posting again; a message it posted
// has the content it sent. It retries on connection errors, timeouts, 429,
// 502, 503 and 504, honouring Retry-After, until ctx ends.
func (c *Client) RecordToolOutput(ctx context.Context, out ToolOutput) (Message, error) {
	var m Message
	err := await(func(then func(error)) {
		c.RecordToolOutputThen(ctx, out, func(got Message, err error) { m = got; then(err) })
	})
	return m, err
}

// storedMessage is Message as Core's answer to a posted tool output is
// decoded: without the content, which Core echoes and the client has just
// sent. Decoding it again made a copy of every tool result.
type storedMessage struct {
	ID         string `json:"id"`
	ThreadID   string `json:"thread_id"`
	Role       string `json:"role"`
	Content    string `json:"-"`
	ToolID     string `json:"tool_id,omitempty"`
	ToolCallID string `json:"tool_call_id,omitempty"`
}

// RecordToolOutputThen is RecordToolOutput for a caller that does not
// wait: no goroutine is held while the writes and reads queue, run, or
// wait to be retried. then receives the outcome once, and must not block.
func (c *Client) RecordToolOutputThen(ctx context.Context, out ToolOutput, then func(Message, error)) {
	var m Message
	lookup := func(ctx context.Context, then func(bool, error)) {
		c.findToolOutputThen(ctx, out.ThreadID, out.ToolCallID, func(found Message, ok bool, err error) {
			if ok {
				m = found
			}
			then(ok, err)
		})
	}
	write := func(ctx context.Context, then func(error)) {
		c.callThen(ctx, http.MethodPost, "/v1/messages/tools", "messages_tools", toolMessage(out), (*storedMessage)(&m), func(err error) {
			if err == nil {
				m.Content = out.Content
			}
			then(err)
		})
	}
	c.persistThen(ctx, "messages_tools", lookup, write, func(err error) { then(m, err) })
}

// FinaliseAction sets an Action's status and result (PUT
// /v1/actions/{id}, idempotent), retrying transient failures until ctx
// ends.
func (c *Client) FinaliseAction(ctx context.Context, actionID string, upd ActionUpdate) (Action, error) {
	var a Action
	err := await(func(then func(error)) { c.finaliseThen(ctx, actionID, upd, &a, then) })
	return a, err
}

// FinaliseActionThen is FinaliseAction for a caller that does not wait
// and has no use for the Action Core answers with, which is not decoded
// (measured: 17 allocations and 6.6 us a call): then receives the outcome
// once, and must not block.
func (c *Client) FinaliseActionThen(ctx context.Context, actionID string, upd ActionUpdate, then func(error)) {
	c.finaliseThen(ctx, actionID, upd, nil, then)
}

// finaliseThen writes the Action's status and decodes Core's answer into
// out (an *Action), unless it is nil.
func (c *Client) finaliseThen(ctx context.Context, actionID string, upd ActionUpdate, out any, then func(error)) {
	path := "/v1/actions/" + url.PathEscape(actionID)
	write := func(ctx context.Context, then func(error)) {
		c.callThen(ctx, http.MethodPut, path, "actions_update", upd, out, then)
	}
	c.persistThen(ctx, "actions_update", nil, write, then)
}

// outputLookback is how many of a thread's newest messages are searched
// for a tool output: more than the largest batch plus the turn's other
// messages.
const outputLookback = 100

// findToolOutputThen looks among the thread's newest messages for the
// tool message of toolCallID, and hands then what it found.
func (c *Client) findToolOutputThen(ctx context.Context, threadID, toolCallID string, then func(Message, bool, error)) {
	var msgs messageList
	c.callThen(ctx, http.MethodGet, messagesPath(threadID, outputLookback), "messages_list", nil, &msgs, func(err error) {
		if err != nil {
			then(Message{}, false, err)
			return
		}
		for _, m := range msgs.items {
			if m.Role == "tool" && m.ToolCallID == toolCallID {
				then(m, true, nil)
				return
			}
		}
		then(Message{}, false, nil)
	})
}

// ListMessages reads a thread's newest messages, newest first (GET
// /v1/threads/{id}/messages?order=desc&limit=N). Both a bare list and the
// {"data": [...]} list envelope are accepted.
func (c *Client) ListMessages(ctx context.Context, threadID string, limit int) ([]Message, error) {
	var out messageList
	err := c.call(ctx, http.MethodGet, messagesPath(threadID, limit), "messages_list", nil, &out)
	return out.items, err
}

func messagesPath(threadID string, limit int) string {
	return "/v1/threads/" + url.PathEscape(threadID) + "/messages?order=desc&limit=" + strconv.Itoa(limit)
}

type messageList struct{ items []Message }

func (l *messageList) UnmarshalJSON(data []byte) error {
	if err := json.Unmarshal(data, &l.items); err == nil {
		return nil
	}
	var env struct {
		Data []Message `json:"data"`
	}
	if err := json.Unmarshal(data, &env); err != nil {
		return err
	}
	l.items = env.Data
	return nil
}

// persistThen runs write until it succeeds, fails for good, or ctx ends,
// and hands the result to then. Before a retry whose previous attempt may
// have taken effect, landed (when set) says whether it did; then it stops
// with success. One step runs at a time, each started by the callback of
// the one before, so no goroutine waits between them.
func (c *Client) persistThen(ctx context.Context, endpoint string, landed func(context.Context, func(bool, error)), write func(context.Context, func(error)), then func(error)) {
	p := &persisting{ctx: ctx, endpoint: endpoint, landed: landed, write: write, then: then,
		b: backoff.ExponentialBackOff{InitialInterval: 200 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 10 * time.Second}}
	p.b.Reset()
	p.next()
}

// persisting is one write of [Client.persistThen] on its way.
type persisting struct {
	ctx       context.Context
	endpoint  string
	landed    func(context.Context, func(bool, error))
	write     func(context.Context, func(error))
	then      func(error)
	b         backoff.ExponentialBackOff
	writes    int
	uncertain bool  // a write may have taken effect
	lastErr   error // the last write's failure: what the caller needs to hear
}

// next writes, unless a write may already have landed: then it looks
// first.
func (p *persisting) next() {
	if !p.uncertain || p.landed == nil {
		p.writeOnce()
		return
	}
	p.landed(p.ctx, func(ok bool, err error) {
		switch {
		case err == nil && ok:
			p.then(nil)
		case err != nil:
			// The read failed: the write's effect is still unknown, so
			// do not write again blindly; wait and read again.
			after(p.ctx, p.b.NextBackOff(), p.next, func() {
				p.then(fmt.Errorf("%w: %s after %d attempts: %w (then checking whether it landed: %v)", ErrBudget, p.endpoint, p.writes, p.lastErr, err))
			})
		default:
			p.writeOnce()
		}
	})
}

func (p *persisting) writeOnce() {
	p.writes++
	p.write(p.ctx, func(err error) {
		if err == nil {
			p.then(nil)
			return
		}
		err = withEarlier(err, p.lastErr)
		p.lastErr = err
		spent := func() { p.then(fmt.Errorf("%w: %s after %d attempts: %w", ErrBudget, p.endpoint, p.writes, err)) }
		if p.ctx.Err() != nil {
			spent()
			return
		}
		transient, maybeLanded := classify(err)
		if !transient {
			p.then(err)
			return
		}
		p.uncertain = p.uncertain || maybeLanded
		after(p.ctx, max(p.b.NextBackOff(), retryAfter(err)), p.next, spent)
	})
}

// classify says whether a failed write may succeed when tried again, and
// whether it may already have taken effect.
func classify(err error) (transient, maybeLanded bool) {
	if neverSent(err) {
		return true, false
	}
	switch StatusCode(err) {
	case 0:
		return true, true // timeout or dropped connection after sending
	case http.StatusTooManyRequests:
		return true, false
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true, true
	}
	return false, false
}

// retryAfter is the wait a 429 or 503 asked for, or 0.
func retryAfter(err error) time.Duration {
	var he *HTTPError
	if errors.As(err, &he) {
		return he.RetryAfter
	}
	return 0
}

// parseRetryAfter reads a Retry-After header: seconds or an HTTP date;
// bounded to a minute so that a wild value cannot stall a batch.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	var d time.Duration
	if secs, err := strconv.Atoi(v); err == nil {
		d = time.Duration(secs) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return max(0, min(d, time.Minute))
}
