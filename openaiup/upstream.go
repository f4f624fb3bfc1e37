package openaiup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/internal/clock"
)

// Config configures the adapter.
type Config struct {
	// URL is the API's base URL, with its version: the turns are posted
	// to URL + "/chat/completions" (https://api.openai.com/v1, say).
	URL string
	// APIKey is sent as "Authorization: Bearer", unless the caller's own
	// key rides on the context (AsCaller). Never logged.
	APIKey string
	// Client sends the requests. default: a client of its own, no timeout
	// (a turn is a stream; IdleTimeout bounds its silences)
	Client *http.Client
	// RetryBudget bounds the retries of one turn's request, on 429 (after
	// its Retry-After), 5xx, a refused connection and a stream cut before
	// its finish chunk. Required, as are the two below.
	RetryBudget time.Duration
	// IdleTimeout bounds the silence between a stream's events.
	IdleTimeout time.Duration
	// MaxResponseBytes bounds one event of a stream while it is read (a
	// longer one fails the run, saying so), the arguments of one call as
	// their fragments arrive (past it they are not kept, and the call gets
	// an invalid_args outcome), and an error body.
	MaxResponseBytes int
	// Unsafe reports a tool that must not run twice: its calls wait for
	// their turn's finish chunk. default: none is
	Unsafe func(tool string) bool
	Logger *slog.Logger
}

// Upstream is the executor's Upstream on a Chat Completions server. It
// keeps each run's conversation in memory: Begin starts a run, the
// executor's turns extend it, and Result reads how it ended.
type Upstream struct {
	cfg Config
	log *slog.Logger

	mu   sync.Mutex
	runs map[string]*run
}

// New builds the adapter. No I/O.
func New(cfg Config) (*Upstream, error) {
	if !strings.HasPrefix(cfg.URL, "http://") && !strings.HasPrefix(cfg.URL, "https://") {
		return nil, fmt.Errorf("openaiup: url %q is not an http(s) URL", cfg.URL)
	}
	cfg.URL = strings.TrimSuffix(cfg.URL, "/")
	if cfg.Client == nil {
		cfg.Client = &http.Client{}
	}
	if cfg.RetryBudget <= 0 || cfg.IdleTimeout <= 0 || cfg.MaxResponseBytes <= 0 {
		// The sidecar's config holds their defaults (upstream.retry_budget,
		// upstream.stream_idle_timeout, executor.max_args_bytes).
		return nil, fmt.Errorf("openaiup: RetryBudget (%v), IdleTimeout (%v) and MaxResponseBytes (%d) must be positive",
			cfg.RetryBudget, cfg.IdleTimeout, cfg.MaxResponseBytes)
	}
	if cfg.Unsafe == nil {
		cfg.Unsafe = func(string) bool { return false }
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Upstream{cfg: cfg, log: log.With("component", "openai"), runs: map[string]*run{}}, nil
}

// run is one application request being answered: the conversation so
// far, and the turn whose calls are running.
type run struct {
	mu       sync.Mutex
	body     map[string]json.RawMessage // the request's fields but messages and stream
	messages []json.RawMessage
	appTools map[string]bool // tools the application declared: their calls are its own
	status   string
	began    bool         // a turn was asked for
	turn     int          // turns asked for
	pending  *pendingTurn // the turn being read or answered
	result   Result
}

// pendingTurn is a turn whose calls are being answered: its assistant
// message goes into the conversation once each of the sidecar's calls
// has its output. Calls are handed over while the turn streams, so their
// outputs may come before the turn is read whole (read).
type pendingTurn struct {
	read      bool                 // the stream is read whole: assistant and calls are set
	assistant message              // with every call of the turn
	calls     []*executor.ToolCall // the sidecar's calls, in order
	handed    map[string]bool      // ids of the calls handed to the executor
	idOf      map[string]string    // the executor's id of each of the sidecar's calls, by the assistant message's id
	ghosts    map[string]bool      // handed by an attempt that was cut, and no part of the turn
	outputs   map[string]string    // by tool_call_id
}

func newPendingTurn() *pendingTurn {
	return &pendingTurn{handed: map[string]bool{}, ghosts: map[string]bool{}, outputs: map[string]string{}, idOf: map[string]string{}}
}

// Result is how a run ended, for the application's answer.
type Result struct {
	// Content is what the model said, every turn's text in order.
	Content string
	// FinishReason is the last turn's (stop, length, content_filter), or
	// tool_calls when AppCalls is set.
	FinishReason string
	// AppCalls are the last turn's calls of tools the application
	// declared: it runs them and asks again (see Parked).
	AppCalls []ToolCall
	// Parked is the last turn as the model made it, when it holds
	// AppCalls: its assistant message with every call, and the tool
	// messages of the sidecar's calls. The application's next request
	// gets it back (Restore).
	Parked  []json.RawMessage
	Usage   Usage
	Model   string
	Created int64
}

// ToolCall is a call as an assistant message carries it.
type ToolCall = toolCall

// Begin starts a run: its conversation, the rest of the request (model,
// tools, sampling) and the tools the application declared, whose calls
// it runs itself.
func (u *Upstream) Begin(id string, body map[string]json.RawMessage, messages []json.RawMessage, appTools map[string]bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.runs[id] = &run{body: body, messages: messages, appTools: appTools, status: executor.RunActive}
}

// End forgets a run and returns how it ended.
func (u *Upstream) End(id string) (Result, bool) {
	u.mu.Lock()
	r, ok := u.runs[id]
	delete(u.runs, id)
	u.mu.Unlock()
	if !ok {
		return Result{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.result, true
}

func (u *Upstream) unsafe(tool string) bool { return u.cfg.Unsafe(tool) }

func (u *Upstream) run(id string) (*run, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	r, ok := u.runs[id]
	if !ok {
		return nil, &executor.UpstreamError{Status: http.StatusNotFound, Err: fmt.Errorf("openaiup: no run %s", id)}
	}
	return r, nil
}

// Kind is "openai".
func (u *Upstream) Kind() string { return "openai" }

// Run reports a run the sidecar holds.
func (u *Upstream) Run(_ context.Context, id string) (executor.Run, error) {
	r, err := u.run(id)
	if err != nil {
		return executor.Run{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return executor.Run{ID: id, Status: r.status, UpstreamStatus: r.status, NeverStarted: !r.began}, nil
}

// RecentRuns: the upstream has no runs of its own to list.
func (u *Upstream) RecentRuns(context.Context, int) ([]executor.Run, error) {
	return nil, executor.ErrNoListing
}

// MarkStarted records nothing: the conversation holds no call status.
func (u *Upstream) MarkStarted(context.Context, *executor.ToolCall, <-chan struct{}) error {
	return nil
}

// Finalise records nothing: the output is the call's whole record.
func (u *Upstream) Finalise(context.Context, *executor.ToolCall, string, map[string]any) error {
	return nil
}

// RecordOutput keeps a call's output for the turn's tool messages.
func (u *Upstream) RecordOutput(_ context.Context, req executor.Request, c *executor.ToolCall, content string) error {
	r, err := u.run(req.RunID)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pending
	switch {
	case p == nil || !p.handed[c.ToolCallID]:
		return fmt.Errorf("openaiup: run %s has no open call %s", req.RunID, c.ToolCallID)
	case p.ghosts[c.ToolCallID]:
		return nil // its turn was cut and asked for again without it
	}
	if _, dup := p.outputs[c.ToolCallID]; !dup {
		p.outputs[c.ToolCallID] = content
	}
	return nil
}

// OpenCalls lists the calls of the turn in progress that have no output.
func (u *Upstream) OpenCalls(_ context.Context, req executor.Request) ([]executor.OpenCall, error) {
	r, err := u.run(req.RunID)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending == nil {
		return nil, nil
	}
	var out []executor.OpenCall
	for _, c := range r.pending.calls {
		if _, done := r.pending.outputs[c.ToolCallID]; !done {
			out = append(out, executor.OpenCall{Call: c, Started: true})
		}
	}
	return out, nil
}

// LastAnswer is what the model said.
func (u *Upstream) LastAnswer(_ context.Context, req executor.Request) (string, error) {
	r, err := u.run(req.RunID)
	if err != nil {
		return "", err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.result.Content, nil
}

type callerKey struct{}

// AsCaller makes the turns under ctx carry the caller's own key.
func (u *Upstream) AsCaller(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, callerKey{}, key)
}

// Caller is the caller's key under ctx, or "".
func (u *Upstream) Caller(ctx context.Context) string {
	k, _ := ctx.Value(callerKey{}).(string)
	return k
}

// callOf is a call as the executor runs it. The executor frames the
// worker's manifest from it; the action id, unique to the run,
// turn and call, is its idempotency key.
func callOf(runID string, turn, i int, c assembled) *executor.ToolCall {
	tc := &executor.ToolCall{RunID: runID, ActionID: fmt.Sprintf("%s-%d-%d", runID, turn, i), ToolCallID: c.ID, Tool: c.Name, Problem: c.Problem}
	tc.Args = json.RawMessage(c.Args)
	if c.Problem != "" {
		tc.Args = json.RawMessage("{}")
	}
	return tc
}

// Turn asks the model for the run's next turn, with the last turn's
// assistant message and one tool message per call first. A run whose last
// turn called the application's own tools has no next turn here: it ends,
// and the application gets those calls.
func (u *Upstream) Turn(ctx context.Context, req executor.Request) (executor.Turn, error) {
	r, err := u.run(req.RunID)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if p := r.pending; p != nil && !p.read {
		// The last turn's stream was cut past its retry budget, after
		// some of its calls were handed over: it is not asked for again.
		r.mu.Unlock()
		return nil, fmt.Errorf("openaiup: turn %d was cut before its finish chunk, past the retry budget", r.turn)
	}
	if p := r.pending; p != nil {
		if len(r.result.AppCalls) > 0 {
			// The application's calls are answered by the application.
			r.result.Parked, err = p.messages(false)
			r.status = executor.RunCompleted
			r.mu.Unlock()
			return emptyTurn{}, err
		}
		msgs, err := p.messages(true)
		if err != nil {
			r.mu.Unlock()
			return nil, err
		}
		r.messages = append(r.messages, msgs...)
	}
	r.pending = newPendingTurn()
	r.began = true
	r.turn++
	body, err := r.request()
	n := r.turn
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	t := &turn{u: u, r: r, n: n, ctx: ctx, body: body, runID: req.RunID}
	if err := t.connect(); err != nil {
		return nil, err
	}
	return t, nil
}

// messages are the turn's assistant message and one tool message per
// call, in the order of its calls. A call without an output is a bug of
// the loop: the request would be refused (400), so it is not sent. With
// all false, the calls that are not the sidecar's are left out (the
// application answers them).
func (p *pendingTurn) messages(all bool) ([]json.RawMessage, error) {
	a, err := json.Marshal(p.assistant)
	if err != nil {
		return nil, err
	}
	out := []json.RawMessage{a}
	for _, c := range p.assistant.ToolCalls {
		id, own := p.idOf[c.ID]
		if !own && !all {
			continue
		}
		content, ok := p.outputs[id]
		if !ok {
			return nil, fmt.Errorf("openaiup: call %s (%s) has no output: the next turn is not asked for", c.ID, c.Function.Name)
		}
		m, err := json.Marshal(message{Role: "tool", Content: &content, ToolCallID: c.ID})
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// request is the body of the run's next turn: the application's fields,
// the conversation, and a stream with usage.
func (r *run) request() ([]byte, error) {
	body := make(map[string]json.RawMessage, len(r.body)+3)
	for k, v := range r.body {
		body[k] = v
	}
	msgs, err := json.Marshal(r.messages)
	if err != nil {
		return nil, err
	}
	body["messages"] = msgs
	body["stream"] = json.RawMessage("true")
	body["stream_options"] = json.RawMessage(`{"include_usage":true}`)
	return json.Marshal(body)
}

// emptyTurn is a turn with nothing in it.
type emptyTurn struct{}

func (emptyTurn) Events() iter.Seq2[executor.TurnEvent, error] {
	return func(func(executor.TurnEvent, error) bool) {}
}
func (emptyTurn) Close() {}

// post sends a turn's request, retrying 429s (after their Retry-After),
// 5xx and failed connections within the retry budget. Any other refusal
// is an *executor.UpstreamError with the upstream's status and message.
func (u *Upstream) post(ctx context.Context, body []byte, budget time.Duration) (*http.Response, error) {
	key := u.Caller(ctx)
	if key == "" {
		key = u.cfg.APIKey
	}
	b := &backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 5 * time.Second}
	return backoff.Retry(ctx, func() (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.cfg.URL+"/chat/completions", bytes.NewReader(body))
		if err != nil {
			return nil, backoff.Permanent(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := u.cfg.Client.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return nil, backoff.Permanent(context.Cause(ctx))
			}
			u.log.Warn("turn request failed; retrying", "err", err)
			return nil, err
		}
		if resp.StatusCode == http.StatusOK {
			return resp, nil
		}
		rerr := u.refusal(resp)
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			u.log.Warn("turn request throttled; retrying", "status", resp.StatusCode, "retry_after", resp.Header.Get("Retry-After"))
			if d := clock.RetryAfter(resp.Header.Get("Retry-After"), time.Now()); d > 0 {
				return nil, errors.Join(rerr, backoff.RetryAfter(int(math.Ceil(d.Seconds()))))
			}
			return nil, rerr
		case resp.StatusCode >= 500:
			u.log.Warn("turn request failed; retrying", "status", resp.StatusCode, "err", rerr)
			return nil, rerr
		default:
			return nil, backoff.Permanent(rerr)
		}
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(budget))
}

// refusal reads a refused request's error body into an UpstreamError.
func (u *Upstream) refusal(resp *http.Response) error {
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, int64(u.cfg.MaxResponseBytes)))
	var ae apiError
	msg := strings.TrimSpace(string(data))
	if json.Unmarshal(data, &ae) == nil && ae.Error.Message != "" {
		msg = ae.Error.Message
	}
	return &executor.UpstreamError{Status: resp.StatusCode, Err: &RefusedError{Status: resp.StatusCode, Body: data, Message: msg}}
}

// RefusedError is the upstream's refusal of a turn, with its body as sent
// (the application gets it unchanged when it is in the API's shape).
type RefusedError struct {
	Status  int
	Body    []byte
	Message string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("openaiup: the upstream answered %d: %s", e.Status, e.Message)
}
