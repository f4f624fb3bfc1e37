// Package core is a typed client of Project David Core's HTTP API: the
// completions SSE stream, tool output, actions, runs, and the set-up calls
// (assistants, threads, messages) an end-to-end flow needs.
//
// Every call takes a context; bodies are bounded both ways; calls that are
// safe to repeat (GET, PUT) are retried with jittered backoff, and a POST is
// retried only when the request never reached Core (connection refused).
package core

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
	// completions streams, which have one each); more requests wait for
	// one, where a write no longer needed can still be withdrawn.
	// default: 64
	MaxConns int
	// IdleTimeout is how long a connection to Core is kept idle. Below
	// Core's own keep-alive timeout, the sidecar closes an idle
	// connection first, so a request never meets a close that Core sent
	// as it went out (a POST is not sent twice).
	// default: 4s (uvicorn closes after 5 s)
	IdleTimeout time.Duration
	// ConnectTimeout bounds one connection's opening, and the retries of
	// a call that could not connect: a Core that cannot be reached fails
	// the call after it, not after Timeout.
	// default: 5s
	ConnectTimeout time.Duration
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
			switch t := hc.Transport.(type) {
			case *http.Transport:
				t.TLSClientConfig = tc.Clone()
			case *conns:
				if t.tls != nil { // https: plain HTTP stays plain, as net/http would have it
					t.tls = tlsFor(tc, c.host)
				}
			default:
				return fmt.Errorf("core: WithTLS needs the client's own transports, the client has a %T", hc.Transport)
			}
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
	host     string       // Core's host name, as its certificate names it
	basic    []string     // the Authorization header of the URL's userinfo, if any
	hc       *http.Client // short calls: connections pooled and bounded
	streamHC *http.Client // completions streams: one connection each at a time
	otherHC  *http.Client // requests on others' behalf: see Transport
	observe  Observer
	gap      func(time.Duration)
	// slots admits at most cfg.MaxConns short calls at once; the others
	// wait in once, where a write that is no longer needed can still be
	// withdrawn (WithWithdraw). queued counts them.
	slots  chan struct{}
	queued atomic.Int64
	// shed counts the withdrawable writes not queued (WithWithdraw).
	shed atomic.Int64
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
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	var basic []string
	if u.User != nil { // as http.Client would send it
		password, _ := u.User.Password()
		basic = []string{"Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+password))}
		u.User = nil
	}
	c := &Client{cfg: cfg, base: u.String(), host: u.Hostname(), basic: basic, observe: func(string, int, time.Duration) {}, gap: func(time.Duration) {},
		slots: make(chan struct{}, cfg.MaxConns)}
	// The proxy (HTTP_PROXY, HTTPS_PROXY, NO_PROXY) is read now, not once
	// per process as http.ProxyFromEnvironment does.
	proxy, err := httpproxy.FromEnvironment().ProxyFunc()(u)
	if err != nil {
		return nil, fmt.Errorf("core: the proxy for %s: %w", u.Redacted(), err)
	}
	// Short calls share at most MaxConns connections; completions streams,
	// each holding one for a whole turn, and requests on others' behalf
	// have transports of their own, so that neither waits behind the other.
	//
	// A completions stream is a POST that must not be sent twice, so it
	// must not meet a kept connection Core closes as it leaves. The
	// client's own connections (conns) keep one only while it has been
	// idle for less than IdleTimeout, under Core's keep-alive, and peek at
	// it before it is used again: a stream then goes out on a kept
	// connection, which spares each turn a handshake, and leaves no socket
	// waiting out TIME_WAIT per turn. Through a proxy (net/http's
	// Transport, which does not peek) each stream opens a connection of
	// its own.
	if proxy == nil {
		var tc *tls.Config
		if u.Scheme == "https" {
			tc = tlsFor(nil, c.host)
		}
		addr := hostPort(u)
		c.hc = &http.Client{Transport: newConns(addr, tc, cfg.ConnectTimeout, cfg.IdleTimeout, true, max(cfg.MaxConns, 64), &c.dialed)}
		c.streamHC = &http.Client{Transport: newConns(addr, tc, cfg.ConnectTimeout, cfg.IdleTimeout, true, maxIdleStreams, &c.streamsDialed)}
	} else {
		c.hc = &http.Client{Transport: newTransport(cfg.MaxConns, cfg.IdleTimeout, cfg.ConnectTimeout, &c.dialed)}
		// A negative MaxIdleConnsPerHost keeps no idle connection without
		// asking Core to close: DisableKeepAlives would send "Connection:
		// close", after which Go's server no longer watches the connection
		// for the client going away.
		streams := newTransport(0, cfg.IdleTimeout, cfg.ConnectTimeout, &c.streamsDialed)
		streams.MaxIdleConnsPerHost = -1
		c.streamHC = &http.Client{Transport: streams}
	}
	c.otherHC = &http.Client{Transport: newTransport(0, cfg.IdleTimeout, cfg.ConnectTimeout, &c.streamsDialed)}
	for _, hc := range c.clients() {
		if t, ok := hc.Transport.(*http.Transport); ok {
			t.Proxy = http.ProxyURL(proxy)
		}
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

// maxIdleStreams bounds the connections kept for the next turns' streams:
// one per drive whose turn ended in the last IdleTimeout, up to a
// thousand sockets.
const maxIdleStreams = 1024

// DefaultMaxConns bounds the connections of short calls by default. A
// batch of thousands of calls then queues for a connection instead of
// opening thousands (each with its buffers, in the sidecar and in Core).
// Streams have their own transport: one long-lived connection per open
// turn.
const DefaultMaxConns = 64

// newTransport is a transport of at most maxConns connections (0: no
// bound) that keeps up to 64 of them idle, or maxConns if more, so that
// the next request finds one open: without it, over TLS, each would pay a
// handshake. It keeps an idle connection for idle, gives up opening one
// after connect, and counts the connections it opens in dialed.
func newTransport(maxConns int, idle, connect time.Duration, dialed *atomic.Int64) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}).DialContext
	t.IdleConnTimeout = idle
	t.MaxConnsPerHost = maxConns
	t.MaxIdleConnsPerHost = max(maxConns, 64)
	t.MaxIdleConns = max(4*t.MaxIdleConnsPerHost, 256)
	dial := t.DialContext
	slots := make(chan struct{}, maxDials)
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		select { // as conns.dials
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		conn, err := dial(ctx, network, addr)
		if err != nil {
			<-slots
			return nil, err
		}
		dialed.Add(1)
		return &unanswered{Conn: conn, answered: sync.OnceFunc(func() { <-slots })}, nil
	}
	return t
}

// unanswered is a new connection that holds its place among the
// transport's new connections until the first bytes from Core (its
// answer, or a proxy's, or a TLS handshake's), or its end.
type unanswered struct {
	net.Conn
	answered func()
}

func (c *unanswered) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 || err != nil {
		c.answered()
	}
	return n, err
}

func (c *unanswered) Close() error {
	c.answered()
	return c.Conn.Close()
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
	err := c.call(ctx, http.MethodGet, "/v1/actions/"+url.PathEscape(actionID), "actions_get", nil, &named[Action]{v: &a, id: &a.ID})
	return a, err
}

// named is the answer to a read of one resource, which must name one
// (an id): "{}" answers another request.
type named[T any] struct {
	v  *T
	id *string
}

func (n *named[T]) UnmarshalJSON(data []byte) error { return json.Unmarshal(data, n.v) }

func (n *named[T]) check() error {
	if *n.id == "" {
		return ErrOutOfStep
	}
	return nil
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
	err := c.call(ctx, http.MethodGet, "/v1/runs/"+url.PathEscape(runID), "runs_get", nil, &named[Run]{v: &r, id: &r.ID})
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
