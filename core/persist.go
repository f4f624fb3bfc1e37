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

	"github.com/projectdavid/toolsidecar/internal/clock"
	"github.com/projectdavid/toolsidecar/internal/retry"
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
// dropped connection, a 5xx after the body was sent) it reads the
// thread's newest messages and, when one carries the output's
// tool_call_id, returns it instead of posting again; a message it posted
// has the content it sent. It retries on connection errors, 429, 502, 503
// and 504, honouring Retry-After, until ctx ends.
func (c *Client) RecordToolOutput(ctx context.Context, out ToolOutput) (Message, error) {
	var m Message
	landed := func(ctx context.Context) (bool, error) {
		found, ok, err := c.findToolOutput(ctx, out.ThreadID, out.ToolCallID)
		if ok {
			m = found
		}
		return ok, err
	}
	write := func(ctx context.Context) error {
		err := c.write(ctx, http.MethodPost, "/v1/messages/tools", "messages_tools", toolMessage(out), &postedOutput{storedMessage: (*storedMessage)(&m), of: out})
		if err == nil {
			m.Content = out.Content
		}
		return err
	}
	err := c.persist(ctx, "messages_tools", landed, write)
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

// postedOutput is Core's answer to a posted tool output: a message, of
// the output's thread and call where it names them.
type postedOutput struct {
	*storedMessage
	of ToolOutput
}

func (p *postedOutput) check() error {
	if p.ID == "" || (p.ThreadID != "" && p.ThreadID != p.of.ThreadID) || (p.ToolCallID != "" && p.ToolCallID != p.of.ToolCallID) {
		return ErrOutOfStep
	}
	return nil
}

// WriteAction sets an Action's status and result (PUT /v1/actions/{id},
// idempotent), retrying transient failures until ctx ends. Of Core's
// answer only the Action's id and status are read: they must be the
// write's.
func (c *Client) WriteAction(ctx context.Context, actionID string, upd ActionUpdate) error {
	path := "/v1/actions/" + url.PathEscape(actionID)
	return c.persist(ctx, "actions_update", nil, func(ctx context.Context) error {
		return c.write(ctx, http.MethodPut, path, "actions_update", upd, &writtenAction{id: actionID, status: upd.Status})
	})
}

// writtenAction is Core's answer to an Action write: the Action written,
// in the status written.
type writtenAction struct {
	ID         string `json:"id"`
	Status     string `json:"status"`
	id, status string
}

func (a *writtenAction) check() error {
	if a.ID != a.id || a.Status != a.status {
		return ErrOutOfStep
	}
	return nil
}

// write is one attempt of a write that makes an outcome count. It waits
// for Core's answer as long as ctx allows (the submit budget), not only
// Config.Timeout: a write given up on may still be applied by Core later,
// after the call's next write, and Core would then see the call's writes
// out of order (a processing mark after the final status, or an output
// posted twice).
func (c *Client) write(ctx context.Context, method, path, endpoint string, in, out any) error {
	body, err := encode(method, endpoint, in)
	if err != nil {
		return err
	}
	return c.once(ctx, method, path, endpoint, body, out)
}

// outputLookback is how many of a thread's newest messages are searched
// for a tool output: more than the largest batch plus the turn's other
// messages.
const outputLookback = 100

// findToolOutput looks among the thread's newest messages for the tool
// message of toolCallID.
func (c *Client) findToolOutput(ctx context.Context, threadID, toolCallID string) (Message, bool, error) {
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
		Data *[]Message `json:"data"`
	}
	if err := json.Unmarshal(data, &env); err != nil {
		return err
	}
	if env.Data == nil {
		// Not a listing (a stray answer, "{}", say): read as an empty
		// one, it would have a landed output posted again.
		return errors.New("core: a list of messages is neither a list nor an envelope with data")
	}
	l.items = *env.Data
	return nil
}

// persist runs write until it succeeds, fails for good, or ctx ends.
// Before a retry whose previous attempt may have taken effect, landed
// (when set) says whether it did; then it stops with success. A read that
// fails leaves the write's effect unknown, so it is not written again
// blindly: the read is tried again after the backoff.
func (c *Client) persist(ctx context.Context, endpoint string, landed func(context.Context) (bool, error), write func(context.Context) error) error {
	b := retry.CoreWrite.New()
	var (
		writes    int
		uncertain bool  // a write may have taken effect
		lastErr   error // the last write's failure: what the caller needs to hear
	)
	for {
		if uncertain && landed != nil {
			ok, err := landed(ctx)
			if err == nil && ok {
				return nil
			}
			if err != nil {
				if clock.Sleep(ctx, b.NextBackOff()) != nil {
					return fmt.Errorf("%w: %s after %d attempts: %w (then checking whether it landed: %v)", ErrBudget, endpoint, writes, lastErr, err)
				}
				continue
			}
		}
		writes++
		err := write(ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrWithdrawn) || errors.Is(err, ErrInvalidID) {
			return err // never sent, and never will be: nothing to retry
		}
		// Once an attempt has left, the write is no longer withdrawn: its
		// effect may be in Core already.
		ctx = context.WithValue(ctx, withdrawKey{}, (<-chan struct{})(nil))
		err = withEarlier(err, lastErr)
		lastErr = err
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %s after %d attempts: %w", ErrBudget, endpoint, writes, err)
		}
		transient, maybeLanded := classify(err)
		if !transient {
			return err
		}
		uncertain = uncertain || maybeLanded
		if clock.Sleep(ctx, max(b.NextBackOff(), retryAfter(err))) != nil {
			return fmt.Errorf("%w: %s after %d attempts: %w", ErrBudget, endpoint, writes, err)
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
