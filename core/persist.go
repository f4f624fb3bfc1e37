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
// tool_call_id, returns it instead of posting again. It retries on
// connection errors, timeouts, 429, 502, 503 and 504, honouring
// Retry-After, until ctx ends.
func (c *Client) RecordToolOutput(ctx context.Context, out ToolOutput) (Message, error) {
	var m Message
	lookup := func(ctx context.Context) (bool, error) {
		found, ok, err := c.FindToolOutput(ctx, out.ThreadID, out.ToolCallID)
		if ok {
			m = found
		}
		return ok, err
	}
	err := c.persist(ctx, "messages_tools", lookup, func(ctx context.Context) error {
		var err error
		m, err = c.SubmitToolOutput(ctx, out)
		return err
	})
	return m, err
}

// FinaliseAction sets an Action's status and result (PUT
// /v1/actions/{id}, idempotent), retrying transient failures until ctx
// ends.
func (c *Client) FinaliseAction(ctx context.Context, actionID string, upd ActionUpdate) (Action, error) {
	var a Action
	err := c.persist(ctx, "actions_update", nil, func(ctx context.Context) error {
		var err error
		a, err = c.UpdateAction(ctx, actionID, upd)
		return err
	})
	return a, err
}

// outputLookback is how many of a thread's newest messages are searched
// for a tool output: more than the largest batch plus the turn's other
// messages.
const outputLookback = 100

// FindToolOutput looks among the thread's newest messages for the tool
// message of toolCallID.
func (c *Client) FindToolOutput(ctx context.Context, threadID, toolCallID string) (Message, bool, error) {
	msgs, err := c.ListMessages(ctx, threadID, outputLookback)
	if err != nil {
		return Message{}, false, err
	}
	for _, m := range msgs {
		if m.Role == "tool" && m.ToolCallID == toolCallID {
			return m, true, nil
		}
	}
	return Message{}, false, nil
}

// ListMessages reads a thread's newest messages, newest first (GET
// /v1/threads/{id}/messages?order=desc&limit=N). Both a bare list and the
// {"data": [...]} list envelope are accepted.
func (c *Client) ListMessages(ctx context.Context, threadID string, limit int) ([]Message, error) {
	var out messageList
	path := "/v1/threads/" + url.PathEscape(threadID) + "/messages?order=desc&limit=" + strconv.Itoa(limit)
	err := c.call(ctx, http.MethodGet, path, "messages_list", nil, &out)
	return out.items, err
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

// persist runs write until it succeeds, fails for good, or ctx ends. Before
// a retry whose previous attempt may have taken effect, landed (when set)
// says whether it did; then persist stops with success.
func (c *Client) persist(ctx context.Context, endpoint string, landed func(context.Context) (bool, error), write func(context.Context) error) error {
	b := &backoff.ExponentialBackOff{InitialInterval: 200 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 10 * time.Second}
	b.Reset()
	uncertain := false
	var lastErr error // the last write's failure: what the caller needs to hear
	for attempt := 1; ; attempt++ {
		if uncertain && landed != nil {
			ok, err := landed(ctx)
			if err == nil && ok {
				return nil
			}
			if err != nil {
				// The read failed: the write's effect is still unknown,
				// so do not write again blindly; wait and read again.
				if werr := sleep(ctx, b.NextBackOff()); werr != nil {
					return fmt.Errorf("%w: %s after %d attempts: %w (then checking whether it landed: %v)", ErrBudget, endpoint, attempt-1, lastErr, err)
				}
				continue
			}
		}
		err := write(ctx)
		if err == nil {
			return nil
		}
		lastErr = err
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %s after %d attempts: %w", ErrBudget, endpoint, attempt, err)
		}
		transient, maybeLanded := classify(err)
		if !transient {
			return err
		}
		uncertain = uncertain || maybeLanded
		wait := b.NextBackOff()
		if ra := retryAfter(err); ra > wait {
			wait = ra
		}
		if werr := sleep(ctx, wait); werr != nil {
			return fmt.Errorf("%w: %s after %d attempts: %w", ErrBudget, endpoint, attempt, err)
		}
	}
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
