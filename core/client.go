// Package core is a typed client of Project David Core's HTTP API: the
// completions SSE stream, tool output, actions, runs, and the set-up calls
// (assistants, threads, messages) an end-to-end flow needs.
//
// Every call takes a context; bodies are bounded both ways; calls that are
// safe to repeat (GET, PUT) are retried with jittered backoff, and a POST is
// retried only when the request never reached Core (connection refused).
package core

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/projectdavid/toolsidecar/internal/clock"
	"github.com/projectdavid/toolsidecar/tool"
	"golang.org/x/net/http/httpproxy"
)

// Config is the client's configuration. Zero values mean the defaults.
type Config struct {
	// URL is Core's base URL, without the /v1 suffix.
	URL string
	// APIKey goes in X-API-Key. It is a secret: it is never logged and
	// never part of an error.
	APIKey string
	// Timeout bounds each non-streaming call, retries and the wait for a
	// connection included. The writes that make a call's outcome count
	// (RecordToolOutput, WriteAction) are bounded by their caller's
	// context instead: one of them given up on could still be applied by
	// Core after the call's next write.
	// default: 30s
	Timeout time.Duration
	// StreamIdleTimeout bounds the silence between two frames of a
	// completions stream. Core sends no heartbeat.
	// default: 280s (the SDK's timeout_per_chunk)
	StreamIdleTimeout time.Duration
	// MaxBodyBytes bounds every response body read whole.
	// default: 8 MiB
	MaxBodyBytes int64
	// MaxFrameBytes bounds one SSE frame of the completions stream, while
	// it is read: a longer frame is skipped as it arrives, and a manifest
	// among them is a call whose Problem says so (stream.go).
	// default: 4 MiB
	MaxFrameBytes int
	// Retries is the number of extra attempts for a retryable failure.
	// default: 3; negative disables retries
	Retries int
	// MaxConns bounds the connections of short calls (every call but the
	// completions streams, which have one each); more requests wait in
	// net/http's Transport for one.
	// default: 64
	MaxConns int
	// IdleTimeout is how long a connection to Core is kept idle. Below
	// Core's own keep-alive timeout, the sidecar closes an idle
	// connection first, so a request never meets a close that Core sent
	// as it went out (a POST is not sent twice).
	// default: 4s (uvicorn closes after 5 s)
	IdleTimeout time.Duration
}

// DefaultIdleTimeout is [Config.IdleTimeout]'s default: a second under
// uvicorn's keep-alive timeout, which Core's server uses.
const DefaultIdleTimeout = 4 * time.Second

// Observer is told of every HTTP exchange with Core: the endpoint template
// (bounded cardinality), the status code (0 on a transport error) and the
// duration. Metrics hang off it.
type Observer func(endpoint string, status int, d time.Duration)

// Option configures a [Client].
type Option func(*Client) error

// WithHTTPClient sets the transport (TLS, proxy) of every call: only hc's
// Transport is used, so neither a Timeout, which would cut long streams,
// nor a redirect policy or cookie jar applies (no redirect is followed).
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) error {
		if hc == nil {
			return errors.New("core: nil http client")
		}
		c.hc, c.streamHC, c.otherHC = hc, hc, hc
		return nil
	}
}

// WithTLS sets the TLS configuration of every connection to Core (a
// private CA, a client certificate), keeping the client's own pooling and
// bounds, which WithHTTPClient replaces.
func WithTLS(tc *tls.Config) Option {
	return func(c *Client) error {
		for _, hc := range c.clients() {
			t, ok := hc.Transport.(*http.Transport)
			if !ok {
				return fmt.Errorf("core: WithTLS needs the client's own transports, the client has a %T", hc.Transport)
			}
			t.TLSClientConfig = tc.Clone()
		}
		return nil
	}
}

// WithRoundTripper wraps the transport of every call (after
// WithHTTPClient, if both are given): tracing, say.
func WithRoundTripper(wrap func(http.RoundTripper) http.RoundTripper) Option {
	return func(c *Client) error {
		for _, hc := range c.clients() {
			rt := hc.Transport
			if rt == nil {
				rt = http.DefaultTransport
			}
			hc.Transport = wrap(rt)
		}
		return nil
	}
}

// WithObserver registers an [Observer].
func WithObserver(o Observer) Option {
	return func(c *Client) error { c.observe = o; return nil }
}

// Client talks to one Core. It is safe for concurrent use.
type Client struct {
	cfg      Config
	base     string       // Core's URL, without userinfo or a trailing slash
	basic    []string     // the Authorization header of the URL's userinfo, if any
	hc       *http.Client // short calls: connections pooled and bounded
	streamHC *http.Client // completions streams: one connection each
	otherHC  *http.Client // requests on others' behalf: see Transport
	observe  Observer
	gap      func(time.Duration)
	// slots admits at most cfg.MaxConns short calls at once; the others
	// wait in once, where a write that is no longer needed can still be
	// withdrawn (WithWithdraw). queued counts them.
	slots  chan struct{}
	queued atomic.Int64
	// dialed counts the connections opened, for short calls and streams.
	dialed, streamsDialed atomic.Int64
}

// New builds a client. It does no I/O.
func New(cfg Config, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(cfg.URL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("core: url %q is not an http(s) URL", cfg.URL)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.StreamIdleTimeout == 0 {
		cfg.StreamIdleTimeout = 280 * time.Second
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 8 << 20
	}
	if cfg.MaxFrameBytes == 0 {
		cfg.MaxFrameBytes = 4 << 20
	}
	if cfg.Retries == 0 {
		cfg.Retries = 3
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	var basic []string
	if u.User != nil { // as http.Client would send it
		password, _ := u.User.Password()
		basic = []string{"Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+password))}
		u.User = nil
	}
	c := &Client{cfg: cfg, base: u.String(), basic: basic, observe: func(string, int, time.Duration) {}, gap: func(time.Duration) {},
		slots: make(chan struct{}, cfg.MaxConns)}
	// Short calls share at most MaxConns connections; completions streams,
	// each holding one for a whole turn, and requests on others' behalf
	// have transports of their own, so that neither waits behind the other.
	c.hc = &http.Client{Transport: newTransport(cfg.MaxConns, cfg.IdleTimeout, &c.dialed)}
	// A completions stream is a POST that must not be sent twice, and
	// net/http does not resend one that meets a connection Core closed
	// (Core restarted, or its keep-alive ended) as it left. Each stream
	// therefore opens a connection of its own: one handshake per turn of
	// model inference. (A negative MaxIdleConnsPerHost keeps no idle
	// connection without asking Core to close: DisableKeepAlives would
	// send "Connection: close", after which Go's server no longer watches
	// the connection for the client going away.)
	streams := newTransport(0, cfg.IdleTimeout, &c.streamsDialed)
	streams.MaxIdleConnsPerHost = -1
	c.streamHC = &http.Client{Transport: streams}
	c.otherHC = &http.Client{Transport: newTransport(0, cfg.IdleTimeout, &c.streamsDialed)}
	// The proxy (HTTP_PROXY, HTTPS_PROXY, NO_PROXY) is read now, not once
	// per process as http.ProxyFromEnvironment does.
	proxy, err := httpproxy.FromEnvironment().ProxyFunc()(u)
	if err != nil {
		return nil, fmt.Errorf("core: the proxy for %s: %w", u.Redacted(), err)
	}
	for _, hc := range c.clients() {
		hc.Transport.(*http.Transport).Proxy = http.ProxyURL(proxy)
	}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Transport is the round tripper for requests made to Core on another's
// behalf (a proxy, a probe): net/http's, for any request, with the
// client's TLS and tracing, its connections kept, and no bound shared with
// the client's own short calls, so that they never wait behind them.
func (c *Client) Transport() http.RoundTripper { return c.otherHC.Transport }

// clients are the client's HTTP clients, each once.
func (c *Client) clients() []*http.Client {
	var out []*http.Client
	for _, hc := range []*http.Client{c.hc, c.streamHC, c.otherHC} {
		if !slices.Contains(out, hc) {
			out = append(out, hc)
		}
	}
	return out
}

// DefaultMaxConns bounds the connections of short calls by default. A
// batch of thousands of calls then queues for a connection instead of
// opening thousands (each with its buffers, in the sidecar and in Core).
// Streams have their own transport: one long-lived connection per open
// turn.
const DefaultMaxConns = 64

// newTransport is a transport of at most maxConns connections (0: no
// bound) that keeps up to 64 of them idle, or maxConns if more, so that
// the next request finds one open: without it, over TLS, each would pay a
// handshake. It keeps an idle connection for idle, and counts the
// connections it opens in dialed.
func newTransport(maxConns int, idle time.Duration, dialed *atomic.Int64) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.IdleConnTimeout = idle
	t.MaxConnsPerHost = maxConns
	t.MaxIdleConnsPerHost = max(maxConns, 64)
	t.MaxIdleConns = max(4*t.MaxIdleConnsPerHost, 256)
	dial := t.DialContext
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err == nil {
			dialed.Add(1)
		}
		return conn, err
	}
	return t
}

// HTTPError is a non-2xx answer from Core. Body is a bounded excerpt.
type HTTPError struct {
	Method string
	Path   string
	Status int
	Body   string
	// RetryAfter is the wait the answer's Retry-After header asked for.
	RetryAfter time.Duration
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("core: %s %s: HTTP %d: %s", e.Method, e.Path, e.Status, e.Body)
}

// StatusCode returns the HTTP status of err when it is an *HTTPError, else 0.
func StatusCode(err error) int {
	var he *HTTPError
	if errors.As(err, &he) {
		return he.Status
	}
	return 0
}

const errorExcerpt = 512

// Stream opens POST /v1/completions and returns the open stream. A non-2xx
// answer before the stream is an *HTTPError. The stream is bound to ctx.
func (c *Client) Stream(ctx context.Context, req CompletionRequest) (*Stream, error) {
	req.Stream = true
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("core: encoding completion request: %w", err)
	}
	sctx, cancel := context.WithCancelCause(ctx)
	hreq, err := c.newRequest(sctx, http.MethodPost, "/v1/completions", body)
	if err != nil {
		cancel(err)
		return nil, err
	}
	hreq.Header.Set("Accept", "text/event-stream")
	start := time.Now()
	resp, err := send(c.streamHC, hreq)
	if err != nil {
		c.observe("completions", 0, time.Since(start))
		cancel(err)
		if cause := context.Cause(ctx); cause != nil {
			return nil, fmt.Errorf("core: opening completions stream: %w", cause)
		}
		return nil, fmt.Errorf("core: opening completions stream: %w", err)
	}
	c.observe("completions", resp.StatusCode, time.Since(start))
	if resp.StatusCode/100 != 2 {
		herr := c.httpError(hreq, resp)
		cancel(herr)
		return nil, herr
	}
	s := newStream(sctx, cancel, resp.Body, c.cfg.StreamIdleTimeout, c.cfg.MaxFrameBytes)
	s.gap, s.last = c.gap, time.Now()
	return s, nil
}

// SubmitToolOutput posts a tool result (POST /v1/messages/tools). Role,
// meta_data and attachments are filled as the SDK fills them.
func (c *Client) SubmitToolOutput(ctx context.Context, out ToolOutput) (Message, error) {
	var m Message
	err := c.call(ctx, http.MethodPost, "/v1/messages/tools", "messages_tools", toolMessage(out), &m)
	return m, err
}

// toolMessage is out with the fields the SDK fills.
func toolMessage(out ToolOutput) ToolOutput {
	out.Role = "tool"
	if out.MetaData == nil {
		out.MetaData = map[string]any{}
	}
	if out.Attachments == nil {
		out.Attachments = []any{}
	}
	return out
}

// UpdateAction sets an Action's status and result (PUT /v1/actions/{id}).
func (c *Client) UpdateAction(ctx context.Context, actionID string, upd ActionUpdate) (Action, error) {
	var a Action
	err := c.call(ctx, http.MethodPut, "/v1/actions/"+url.PathEscape(actionID), "actions_update", upd, &a)
	return a, err
}

// GetAction reads one Action.
func (c *Client) GetAction(ctx context.Context, actionID string) (Action, error) {
	var a Action
	err := c.call(ctx, http.MethodGet, "/v1/actions/"+url.PathEscape(actionID), "actions_get", nil, &a)
	return a, err
}

// PendingActions lists a run's Actions still pending. Core leaves
// "processing" Actions out of this list.
func (c *Client) PendingActions(ctx context.Context, runID string) ([]PendingAction, error) {
	var out []PendingAction
	err := c.call(ctx, http.MethodGet, "/v1/actions/pending/"+url.PathEscape(runID), "actions_pending", nil, &out)
	return out, err
}

// ActionsByStatus lists a run's Actions with exactly the given status.
func (c *Client) ActionsByStatus(ctx context.Context, runID, status string) ([]Action, error) {
	var out []Action
	path := "/v1/runs/" + url.PathEscape(runID) + "/actions/status?status=" + url.QueryEscape(status)
	err := c.call(ctx, http.MethodGet, path, "actions_by_status", nil, &out)
	return out, err
}

// GetRun reads a run.
func (c *Client) GetRun(ctx context.Context, runID string) (Run, error) {
	var r Run
	err := c.call(ctx, http.MethodGet, "/v1/runs/"+url.PathEscape(runID), "runs_get", nil, &r)
	return r, err
}

// ListRuns lists the runs of the user whose key is under ctx, at most
// limit (1 to [MaxRunList]) of them, ordered by creation time: the newest
// first when newestFirst. Core has no cursor on this listing, so it shows
// only the newest (or oldest) [MaxRunList] runs of a user.
func (c *Client) ListRuns(ctx context.Context, limit int, newestFirst bool) (RunList, error) {
	order := "asc"
	if newestFirst {
		order = "desc"
	}
	var l RunList
	err := c.call(ctx, http.MethodGet, "/v1/runs?limit="+strconv.Itoa(limit)+"&order="+order, "runs_list", nil, &l)
	return l, err
}

// CancelRun cancels a run. Core answers 400 when it is already finished.
func (c *Client) CancelRun(ctx context.Context, runID string) (Run, error) {
	var r Run
	err := c.call(ctx, http.MethodPost, "/v1/runs/"+url.PathEscape(runID)+"/cancel", "runs_cancel", nil, &r)
	return r, err
}

// CreateRun creates a run; use the returned ID, Core ignores a client one.
func (c *Client) CreateRun(ctx context.Context, rc RunCreate) (Run, error) {
	if rc.MetaData == nil {
		rc.MetaData = map[string]any{}
	}
	var r Run
	err := c.call(ctx, http.MethodPost, "/v1/runs", "runs_create", rc, &r)
	return r, err
}

// CreateAssistant creates an assistant.
func (c *Client) CreateAssistant(ctx context.Context, ac AssistantCreate) (Assistant, error) {
	var a Assistant
	err := c.call(ctx, http.MethodPost, "/v1/assistants", "assistants_create", ac, &a)
	return a, err
}

// GetAssistant reads an assistant.
func (c *Client) GetAssistant(ctx context.Context, id string) (Assistant, error) {
	var a Assistant
	err := c.call(ctx, http.MethodGet, "/v1/assistants/"+url.PathEscape(id), "assistants_get", nil, &a)
	return a, err
}

// CreateThread creates a thread.
func (c *Client) CreateThread(ctx context.Context) (Thread, error) {
	var t Thread
	err := c.call(ctx, http.MethodPost, "/v1/threads", "threads_create", map[string]any{"meta_data": map[string]any{}}, &t)
	return t, err
}

// CreateMessage adds a user message to a thread.
func (c *Client) CreateMessage(ctx context.Context, threadID, assistantID, content string) (Message, error) {
	mc := MessageCreate{
		Content: content, ThreadID: threadID, AssistantID: assistantID, Role: "user",
		MetaData: map[string]any{}, Attachments: []any{},
	}
	var m Message
	err := c.call(ctx, http.MethodPost, "/v1/messages", "messages_create", mc, &m)
	return m, err
}

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
	for {
		err := withEarlier(c.once(ctx, method, path, endpoint, body, out), earlier)
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
	b          backoff.ExponentialBackOff
}

// retries sets r up for an exchange of method.
func (c *Client) retries(r *retryPolicy, method string) {
	// Jittered exponential backoff from 100ms, capped at 2s.
	*r = retryPolicy{idempotent: method == http.MethodGet || method == http.MethodPut, max: c.cfg.Retries,
		b: backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 1, Multiplier: 2, MaxInterval: 2 * time.Second}}
	r.b.Reset()
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
	if out == nil {
		// The 2xx says the request took effect; its answer is not read.
		// It is drained up to the bound so that the connection is kept,
		// and past it the connection is dropped, never the answer: an
		// Action whose arguments are huge answers a write with all of them.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, c.cfg.MaxBodyBytes))
		return nil
	}
	data, err := readBody(resp, c.cfg.MaxBodyBytes)
	n := int64(len(data))
	if err != nil {
		return fmt.Errorf("core: %s %s: reading body: %w", method, req.URL.Path, err)
	}
	if n > c.cfg.MaxBodyBytes {
		return fmt.Errorf("core: %s %s: response body over %d bytes", method, req.URL.Path, c.cfg.MaxBodyBytes)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("core: %s %s: decoding response: %w", method, req.URL.Path, err)
	}
	return nil
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
// Core is too far behind to take it in time.
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
