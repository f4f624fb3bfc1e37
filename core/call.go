package core

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/projectdavid/toolsidecar/internal/clock"
	"github.com/projectdavid/toolsidecar/internal/retry"
	"github.com/projectdavid/toolsidecar/tool"
)

// The exchanges of the client with Core: one JSON call, retried while it
// may be; one attempt, bounded both ways; the request, checked before it is
// sent.

// call performs one JSON exchange, retrying a transient failure of a
// request that may be repeated, all within Config.Timeout.
func (c *Client) call(ctx context.Context, method, path, endpoint string, in, out any) error {
	body, err := encode(method, endpoint, in)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	var r retryPolicy
	c.retries(&r, method)
	var earlier error
	start := time.Now()
	for {
		err := withEarlier(c.once(ctx, method, path, endpoint, body, out), earlier)
		if neverSent(err) && time.Since(start) >= c.cfg.ConnectTimeout {
			return fmt.Errorf("%w (Core cannot be reached: tried for core.connect_timeout, %s)", err, c.cfg.ConnectTimeout)
		}
		if !r.again(err) {
			return err
		}
		earlier = err
		if clock.Sleep(ctx, r.b.NextBackOff()) != nil {
			return withEarlier(fmt.Errorf("core: %s %s: not sent again: %w", method, path, context.Cause(ctx)), earlier)
		}
	}
}

// withEarlier adds to err, when its attempt was ended by its context, the
// failure of the attempt before it: when a budget runs out while a retry
// waits, the reason it was a retry (Core's 503, say) is what its caller
// needs to hear. Both stay in the chain.
func withEarlier(err, earlier error) error {
	if earlier == nil || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return err
	}
	return fmt.Errorf("%w (the attempt before: %w)", err, earlier)
}

// encode is the JSON body of a request; nil for none.
func encode(method, endpoint string, in any) ([]byte, error) {
	if in == nil {
		return nil, nil
	}
	body, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("core: encoding %s %s: %w", method, endpoint, err)
	}
	return body, nil
}

// retryPolicy counts the attempts of one exchange. GET and PUT are
// retried after any transient failure; the others only when the request
// never reached Core.
type retryPolicy struct {
	idempotent bool
	attempt    int
	max        int
	b          *backoff.ExponentialBackOff
}

// retries sets r up for an exchange of method.
func (c *Client) retries(r *retryPolicy, method string) {
	*r = retryPolicy{idempotent: method == http.MethodGet || method == http.MethodPut, max: c.cfg.Retries, b: retry.CoreCall.New()}
}

// again reports whether an attempt that ended with err is tried again.
func (r *retryPolicy) again(err error) bool {
	if err == nil || r.attempt >= r.max || !retryable(err, r.idempotent) {
		return false
	}
	r.attempt++
	return true
}

func (c *Client) once(ctx context.Context, method, path, endpoint string, body []byte, out any) error {
	if err := checkPath(path); err != nil {
		return fmt.Errorf("core: %s %s: %w", method, endpoint, err)
	}
	withdraw, _ := ctx.Value(withdrawKey{}).(<-chan struct{})
	if q := c.queued.Load(); withdraw != nil && q >= int64(c.cfg.MaxConns) {
		// Core is a round of requests behind: a write that a later event
		// makes needless is not queued behind the writes that count.
		c.shed.Add(1)
		return fmt.Errorf("core: %s %s: %w: %d requests wait for one of %d connections", method, path, ErrWithdrawn, q, c.cfg.MaxConns)
	}
	c.queued.Add(1)
	select {
	case c.slots <- struct{}{}:
		c.queued.Add(-1)
	case <-withdraw:
		c.queued.Add(-1)
		return fmt.Errorf("core: %s %s: %w", method, path, ErrWithdrawn)
	case <-ctx.Done():
		c.queued.Add(-1)
		return fmt.Errorf("core: %s %s: not sent: %w", method, path, context.Cause(ctx))
	}
	select {
	case <-withdraw: // withdrawn as the slot came: the select above chose either
		<-c.slots
		return fmt.Errorf("core: %s %s: %w", method, path, ErrWithdrawn)
	default:
	}
	defer func() { <-c.slots }()
	req, err := c.newRequest(ctx, method, path, body)
	if err != nil {
		return err
	}
	start := time.Now()
	resp, err := send(c.hc, req)
	if err != nil {
		c.observe(endpoint, 0, time.Since(start))
		return fmt.Errorf("core: %s %s: %w", method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	c.observe(endpoint, resp.StatusCode, time.Since(start))
	if resp.StatusCode/100 != 2 {
		return c.httpError(req, resp)
	}
	data, err := readBody(resp, c.cfg.MaxBodyBytes)
	n := int64(len(data))
	rec, isRecord := out.(record)
	switch {
	case isRecord && method != http.MethodGet && (err != nil || n > c.cfg.MaxBodyBytes):
		// The 2xx says the write took effect; its record is too long to
		// read (an Action with huge arguments) or cut, and its connection
		// is not kept. A stray answer comes whole, and short.
		return nil
	case err != nil:
		return fmt.Errorf("core: %s %s: reading body: %w", method, req.URL.Path, err)
	case n > c.cfg.MaxBodyBytes:
		return fmt.Errorf("core: %s %s: response body over %d bytes", method, req.URL.Path, c.cfg.MaxBodyBytes)
	case !isRecord && len(bytes.TrimSpace(data)) == 0:
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		c.dropConns(resp) // an answer that is not the request's may have put its connection out of step
		return fmt.Errorf("core: %s %s: decoding response: %w", method, req.URL.Path, err)
	}
	if isRecord && rec.check() != nil {
		c.dropConns(resp)
		return fmt.Errorf("core: %s %s: %w", method, req.URL.Path, ErrOutOfStep)
	}
	return nil
}

// record is an answer that names its request: Core's record of a write
// that makes an outcome count, or of the resource read. check tells it
// from the answer to another request.
type record interface{ check() error }

// ErrOutOfStep: the answer read is not Core's record of its request.
// A Core or a proxy that sent an answer no request asked for (a second
// one after an answer) puts a kept connection out of step: the next
// request on it reads that answer as its own, while Core has perhaps not
// taken the request yet. The write's effect is then unknown, as after a
// dropped connection.
var ErrOutOfStep = errors.New("the answer is not Core's record of the request: the connection is out of step with its requests")

// dropConns closes resp and the idle connections, which the one that
// read it, perhaps out of step, may be among (a transport keeps a
// connection as its answer is read to the end). The request's error is
// then a transport's: a read is sent again, a write's effect is unknown.
func (c *Client) dropConns(resp *http.Response) {
	resp.Body.Close()
	c.hc.CloseIdleConnections()
}

// readBody reads a response's body, up to one byte more than max. A body
// whose length is announced within max is read in one allocation of that
// size, not grown from 512 bytes by doubling.
func readBody(resp *http.Response, max int64) ([]byte, error) {
	if n := resp.ContentLength; n >= 0 && n <= max {
		data := make([]byte, n)
		_, err := io.ReadFull(resp.Body, data)
		return data, err
	}
	return io.ReadAll(io.LimitReader(resp.Body, max+1))
}

// send sends req on hc's transport, without http.Client: a redirect from
// Core is an answer like any other non-2xx, not followed, so that the API
// key never goes to another host; and a request is not made to pay for
// the copies of its headers that following one would need.
func send(hc *http.Client, req *http.Request) (*http.Response, error) {
	rt := hc.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	return rt.RoundTrip(req)
}

func (c *Client) newRequest(ctx context.Context, method, path string, body []byte) (*http.Request, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, r)
	if err != nil {
		return nil, fmt.Errorf("core: building %s %s: %w", method, path, err)
	}
	// The keys are canonical already, and the constant values are shared
	// by every request: no request changes a header's values in place,
	// and an append to one of these (length and capacity 1) copies it.
	if body != nil {
		req.Header["Content-Type"] = jsonType
	}
	req.Header["Accept"] = jsonType
	if c.basic != nil {
		req.Header["Authorization"] = c.basic
	}
	if key := c.keyFor(ctx); key != "" {
		req.Header["X-Api-Key"] = []string{key}
	}
	return req, nil
}

// ErrWithdrawn: a write withdrawn (WithWithdraw) while it waited for a
// connection; it was never sent.
var ErrWithdrawn = errors.New("withdrawn before it was sent")

// ErrInvalidID: a request whose path would hold an id that is not an id
// (tool.CheckID); nothing is sent.
var ErrInvalidID = errors.New("an id in the path is not an id, so nothing was sent")

// Addressable reports whether id can name a resource in a path of Core's
// API (tool.CheckID): a client leaves an Action whose id is not an id as
// it is, and posts its tool message without a tool_id.
func Addressable(id string) bool { return tool.CheckID("id", id) == nil }

// checkPath refuses a path with a segment that is not an id. The ids in
// the client's paths come from callers, from Core's own answers and from
// the model's stream: one that is not an id (a 100,000-character
// action_id, say) never reaches Core as a path, nor a log or an error
// message whole. An id that needs escaping is not an id either.
func checkPath(path string) error {
	p, _, _ := strings.Cut(path, "?")
	for seg := range strings.SplitSeq(strings.TrimPrefix(p, "/"), "/") {
		if err := tool.CheckID("a path segment", seg); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidID, err)
		}
	}
	return nil
}

// withdrawKey is the context key of a write's withdrawal.
type withdrawKey struct{}

// WithWithdraw lets the writes under ctx be withdrawn while they wait for
// one of the client's connections: once withdraw is closed, a write not
// yet sent fails with ErrWithdrawn and is never sent; one already sent
// goes on to its answer. It is for a write that a later event makes
// needless (a processing mark, once the call's tool has answered), when
// Core is too far behind to take it in time. Such a write is not queued
// at all (ErrWithdrawn at once) while as many requests as the client has
// connections already wait for one: Core is then a round of requests
// behind, and the writes that count come first.
func WithWithdraw(ctx context.Context, withdraw <-chan struct{}) context.Context {
	return context.WithValue(ctx, withdrawKey{}, withdraw)
}

// jsonType is the value of the Content-Type and Accept headers.
var jsonType = []string{"application/json"}

// callerKey is the context key of a caller's Core API key.
type callerKey struct{}

// AsCaller makes every request under ctx carry the caller's X-API-Key
// instead of the client's own: the sidecar acts with the identity of the
// application it serves, not as a deputy with its own rights. The key
// lives only as long as ctx.
func AsCaller(ctx context.Context, apiKey string) context.Context {
	return context.WithValue(ctx, callerKey{}, apiKey)
}

// CallerOf is the caller's key under ctx, or "" when requests under ctx
// carry the client's own. It is a secret: group by it, never log it.
func CallerOf(ctx context.Context) string {
	k, _ := callerOf(ctx)
	return k
}

// callerOf is the caller's key under ctx, if AsCaller set one.
func callerOf(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(callerKey{}).(string)
	return k, ok
}

// keyFor is the caller's key under ctx, else the client's own.
func (c *Client) keyFor(ctx context.Context) string {
	if k, ok := callerOf(ctx); ok {
		return k
	}
	return c.cfg.APIKey
}

func (c *Client) httpError(req *http.Request, resp *http.Response) *HTTPError {
	excerpt, _ := io.ReadAll(io.LimitReader(resp.Body, errorExcerpt))
	resp.Body.Close()
	return &HTTPError{Method: req.Method, Path: req.URL.Path, Status: resp.StatusCode, Body: strings.TrimSpace(string(excerpt)),
		RetryAfter: clock.RetryAfter(resp.Header.Get("Retry-After"), time.Now())}
}

// retryable decides whether a failed call may be sent again. A request that
// never reached Core (connection refused) is always safe to resend.
func retryable(err error, idempotent bool) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrInvalidID) {
		return false
	}
	if neverSent(err) {
		return true
	}
	if !idempotent {
		return false
	}
	switch StatusCode(err) {
	case 0:
		return true // transport error on an idempotent call
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// neverSent reports a request that never reached Core: the connection was
// refused or could not be dialled.
func neverSent(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var opErr *net.OpError
	return errors.As(err, &opErr) && opErr.Op == "dial"
}
