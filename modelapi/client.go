package modelapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/internal/clock"
	"github.com/projectdavid/toolsidecar/internal/retry"
)

// Client posts a model API's turns. The stream a turn is answered with
// is the caller's to read, through the codec's [Parser].
type Client struct {
	// Codec is the API: where a turn is posted, and how the key is sent.
	Codec Codec
	// URL is the API's base URL, as its official client takes it.
	URL string
	// HTTP sends the requests.
	HTTP *http.Client
	// MaxErrorBytes bounds the error body read from a refusal.
	MaxErrorBytes int
	// Logger hears the retries. nil: they are not logged.
	Logger *slog.Logger
	// ConnectTimeout bounds the retries of failed connections (refused,
	// unresolved, not opened) from a turn's first attempt: an upstream that
	// cannot be reached is not worth the whole budget. 0: the budget alone.
	ConnectTimeout time.Duration
}

// Post sends a turn's request (body, with headers and the API's key),
// retrying 429s (after their Retry-After), 5xx and failed connections
// within budget. Any other refusal is an *[executor.UpstreamError] with
// the upstream's status, whose cause is a *[RefusedError].
func (c *Client) Post(ctx context.Context, body []byte, headers http.Header, key string, budget time.Duration) (*http.Response, error) {
	log := c.Logger
	if log == nil {
		log = discard
	}
	b := &connectBackOff{BackOff: retry.UpstreamTurn.New(), deadline: time.Now().Add(c.ConnectTimeout)}
	return backoff.Retry(ctx, func() (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+c.Codec.TurnPath(), bytes.NewReader(body))
		if err != nil {
			return nil, backoff.Permanent(err)
		}
		for name, v := range headers {
			req.Header[name] = v
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		c.Codec.Authorize(req.Header, key)
		resp, err := c.HTTP.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return nil, backoff.Permanent(context.Cause(ctx))
			}
			b.unreachable = c.ConnectTimeout > 0 && unreachable(err)
			if b.unreachable && !time.Now().Before(b.deadline) {
				return nil, backoff.Permanent(fmt.Errorf("the upstream cannot be reached (tried for upstream.connect_timeout, %s): %w", c.ConnectTimeout, err))
			}
			log.Warn("turn request failed; retrying", "err", err)
			return nil, err
		}
		b.unreachable = false
		if resp.StatusCode == http.StatusOK {
			return resp, nil
		}
		rerr := c.refusal(resp)
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			log.Warn("turn request throttled; retrying", "status", resp.StatusCode, "retry_after", resp.Header.Get("Retry-After"))
			if d := clock.RetryAfter(resp.Header.Get("Retry-After"), time.Now()); d > 0 {
				return nil, errors.Join(rerr, backoff.RetryAfter(int(math.Ceil(d.Seconds()))))
			}
			return nil, rerr
		case resp.StatusCode >= 500:
			log.Warn("turn request failed; retrying", "status", resp.StatusCode, "err", rerr)
			return nil, rerr
		default:
			return nil, backoff.Permanent(rerr)
		}
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(budget))
}

// connectBackOff is a turn's backoff that, while the upstream cannot be
// reached, waits no later than the connect deadline: the last attempt is
// made at the deadline, not one interval past it.
type connectBackOff struct {
	backoff.BackOff
	deadline    time.Time
	unreachable bool // the last attempt could not connect
}

// NextBackOff is the wait before the next attempt.
func (b *connectBackOff) NextBackOff() time.Duration {
	d := b.BackOff.NextBackOff()
	if left := time.Until(b.deadline); b.unreachable && d > left {
		return max(left, 0)
	}
	return d
}

// unreachable says whether err is a failure to connect (refused, no
// such host, the dial timed out): no byte of the request was sent.
func unreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// refusal reads a refused request's error body into an UpstreamError.
func (c *Client) refusal(resp *http.Response) error {
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, int64(c.MaxErrorBytes)))
	var ae APIError
	msg := strings.TrimSpace(string(data))
	if json.Unmarshal(data, &ae) == nil && ae.Error.Message != "" {
		msg = ae.Error.Message
	}
	return &executor.UpstreamError{Status: resp.StatusCode, Err: &RefusedError{Status: resp.StatusCode, Body: data, Message: msg}}
}

var discard = slog.New(slog.DiscardHandler)

// RefusedError is the upstream's refusal of a turn, with its body as sent
// (the application gets it unchanged when it is in the API's shape).
type RefusedError struct {
	Status  int
	Body    []byte
	Message string
}

// Error keeps the words applications have read in a failed run's message
// since the adapter sent the turns itself.
func (e *RefusedError) Error() string {
	return fmt.Sprintf("openaiup: the upstream answered %d: %s", e.Status, e.Message)
}
