// Package openaiup adapts a model's API (Chat Completions, OpenAI
// Responses, Anthropic Messages; their wire is modelapi's) to the
// executor's Upstream port, and serves the same API to applications: an
// unmodified client that changes only its base URL gets answers whose
// tool calls the sidecar ran.
//
// The upstream is stateless, so the sidecar holds each run's
// conversation: a run is one application request, driven in memory and
// journaled (package runstore), so that a retry resumes it.
package openaiup

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/modelapi"
	"github.com/projectdavid/toolsidecar/runstore"
)

// Config configures the adapter.
type Config struct {
	// API is the upstream's API: "openai" (Chat Completions, the default),
	// "responses" (OpenAI Responses) or "anthropic" (Messages), as
	// upstream.kind names them.
	API string
	// URL is the API's base URL, as its official client takes it: the
	// turns are posted to URL + "/chat/completions" for Chat Completions
	// (https://api.openai.com/v1, say), URL + "/responses" for Responses,
	// URL + "/v1/messages" for Messages (https://api.anthropic.com).
	URL string
	// APIKey is sent as the API sends its key (Authorization: Bearer;
	// x-api-key), unless the caller's own key rides on the context
	// (AsCaller). Never logged.
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
	// ConnectTimeout bounds the retries of a turn's request that cannot
	// connect to the upstream; 0: RetryBudget alone bounds them.
	ConnectTimeout time.Duration
	// MaxResponseBytes bounds one event of a stream while it is read (a
	// longer one fails the run, saying so; an event that can carry every
	// call of a turn, more: modelapi.Codec's EventBound), the arguments of
	// one call as their fragments arrive (past it they are not kept, and
	// the call gets an invalid_args outcome), and an error body.
	MaxResponseBytes int
	// Unsafe reports a tool that must not run twice: its calls wait for
	// their turn's finish chunk. default: none is
	Unsafe func(tool string) bool
	// Journal keeps the runs, so that a retried request resumes its run
	// (journaling.go). nil: runs are not journaled.
	Journal runstore.Journal
	Logger  *slog.Logger
}

// Upstream is the executor's Upstream on a model's API. It keeps each
// run's conversation in memory: Begin starts a run, the executor's turns
// extend it, and Result reads how it ended.
type Upstream struct {
	executor.CallerInContext // the turns carry the caller's own key

	cfg    Config
	api    modelapi.Codec
	client *modelapi.Client // posts the turns
	host   string           // names the upstream in messages (never its credentials)
	log    *slog.Logger
	// store reads and writes the journal; nil without one.
	store *runstore.Store

	mu   sync.Mutex
	runs map[string]*run
}

// New builds the adapter. No I/O.
func New(cfg Config) (*Upstream, error) {
	a, ok := modelapi.CodecOf(cfg.API)
	if !ok {
		return nil, fmt.Errorf("openaiup: API %q is not one of openai, responses, anthropic", cfg.API)
	}
	parsed, err := url.Parse(cfg.URL)
	if err != nil || (parsed.Scheme != "http" && parsed.Scheme != "https") || parsed.Host == "" {
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
	u := &Upstream{cfg: cfg, api: a, host: parsed.Host, log: log.With("component", a.Kind()), runs: map[string]*run{}}
	u.client = &modelapi.Client{Codec: a, URL: cfg.URL, HTTP: cfg.Client, MaxErrorBytes: cfg.MaxResponseBytes, Logger: u.log, ConnectTimeout: cfg.ConnectTimeout}
	if cfg.Journal != nil {
		u.store = runstore.New(cfg.Journal)
	}
	return u, nil
}

// Kind is the API's upstream.kind: "openai", "anthropic".
func (u *Upstream) Kind() string { return u.api.Kind() }

// Run reports a run the sidecar holds, read again from the journal while
// this process does not drive it.
func (u *Upstream) Run(ctx context.Context, id string) (executor.Run, error) {
	r, err := u.run(id)
	if err != nil {
		return executor.Run{}, err
	}
	r.mu.Lock()
	local := r.local
	r.mu.Unlock()
	if !local {
		if err := u.reload(ctx, r); err != nil {
			return executor.Run{}, fmt.Errorf("openaiup: reading run %s from the journal: %w", id, err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return executor.Run{ID: id, Status: r.status, UpstreamStatus: r.status, NeverStarted: !r.began, Owner: r.owner}, nil
}

// RecentRuns: the upstream has no runs of its own to list.
func (u *Upstream) RecentRuns(context.Context, int) ([]executor.Run, error) {
	return nil, executor.ErrNoListing
}

// MarkStarted journals the start of an unsafe call before it is sent, so
// that a run resumed after a crash runs it only if it never started. The
// calls of other tools may run again: nothing is written for them.
func (u *Upstream) MarkStarted(ctx context.Context, c *executor.ToolCall, _ <-chan struct{}) error {
	if u.store == nil || !u.unsafe(c.Tool) {
		return nil
	}
	r, err := u.run(c.RunID)
	if err != nil {
		return err
	}
	if err := r.turnWritten(ctx); err != nil {
		return err
	}
	r.mu.Lock()
	p := r.pending
	journaled := p != nil && p.journaled
	r.mu.Unlock()
	if !journaled {
		return fmt.Errorf("openaiup: turn %d of run %s is not in the journal, so its unsafe call %s may not start", r.turn, r.id, c.ToolCallID)
	}
	if err := u.store.MarkStarted(ctx, c.ActionID); err != nil {
		return fmt.Errorf("openaiup: journaling the start of %s: %w", c.ToolCallID, err)
	}
	r.mu.Lock()
	p.started[c.ToolCallID] = true
	r.mu.Unlock()
	return nil
}

// Finalise records nothing: the output is the call's whole record.
func (u *Upstream) Finalise(context.Context, *executor.ToolCall, string, executor.ResultSummary) error {
	return nil
}

// RecordOutput keeps a call's output for the turn's tool messages; the
// turn's outputs are journaled together before the next turn
// (journalOutputs), the worker's reply having been captured by the ledger
// meanwhile.
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
		p.outputs[c.ToolCallID], p.actions[c.ToolCallID] = content, c.ActionID
	}
	return nil
}

// OpenCalls lists the calls of the turn in progress that have no output.
// An unsafe call counts as started only once its start is journaled; the
// others may have run whenever they were handed over.
func (u *Upstream) OpenCalls(_ context.Context, req executor.Request) ([]executor.OpenCall, error) {
	r, err := u.run(req.RunID)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.local = true
	if r.pending == nil {
		return nil, nil
	}
	var out []executor.OpenCall
	for _, c := range r.pending.calls {
		if _, done := r.pending.outputs[c.ToolCallID]; !done {
			out = append(out, executor.OpenCall{Call: c, Started: !u.unsafe(c.Tool) || r.pending.started[c.ToolCallID]})
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

// key is the key a turn under ctx is sent with: the caller's, or the
// adapter's own.
func (u *Upstream) key(ctx context.Context) string { return cmp.Or(u.Caller(ctx), u.cfg.APIKey) }

// callOf is a call as the executor runs it. The executor frames the
// worker's manifest from it; the action id (runstore.ActionID), the same on every
// retry of the run, is its idempotency key.
func callOf(runID string, turn, pos int, modelID string, c modelapi.Call) *executor.ToolCall {
	tc := &executor.ToolCall{RunID: runID, ActionID: runstore.ActionID(runID, turn, pos, modelID, c.Name, c.Args), ToolCallID: c.ID, Tool: c.Name, Problem: c.Problem}
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
	// The last turn's record comes before this one's, and carries the
	// run's header the first time.
	if err := r.turnWritten(ctx); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.local = true
	if p := r.pending; p != nil && !p.read {
		// The last turn's stream was cut past its retry budget, after
		// some of its calls were handed over: it is not asked for again.
		r.mu.Unlock()
		u.keepOutputs(ctx, r)
		return nil, &executor.UpstreamError{Status: http.StatusBadGateway,
			Err: fmt.Errorf("the upstream at %s cut turn %d before its finish chunk, past upstream.retry_budget", u.host, r.turn)}
	}
	if r.status == executor.RunFailed {
		// The upstream's error event ended the run; the calls it had
		// started are joined and journaled, and no turn follows.
		msg := r.failed
		r.mu.Unlock()
		u.keepOutputs(ctx, r)
		return nil, &executor.UpstreamError{Status: http.StatusBadGateway,
			Err: fmt.Errorf("the upstream at %s reported an error in turn %d: %s", u.host, r.turn, msg)}
	}
	if parked, err := u.closeTurn(r); parked || err != nil {
		r.mu.Unlock()
		if parked {
			return emptyTurn{}, err
		}
		return nil, err
	}
	r.pending = newPendingTurn()
	r.began = true
	r.turn++
	body, err := u.api.TurnBody(r.body, r.messages)
	t := &turn{u: u, r: r, n: r.turn, ctx: ctx, req: req, body: body, runID: req.RunID}
	t.carry()
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := t.connect(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.answering = true
	r.wakeUp()
	r.mu.Unlock()
	return t, nil
}

// closeTurn adds the pending turn to the conversation: its assistant
// message and one result per call. A turn that called the application's
// tools is the run's last (parked): the application answers them. r.mu is
// held.
func (u *Upstream) closeTurn(r *run) (parked bool, err error) {
	p := r.pending
	if p == nil {
		return false, nil
	}
	if len(r.result.AppCalls) > 0 {
		r.result.Parked, err = p.messages(u.api, false)
		r.status = executor.RunCompleted
		return true, err
	}
	msgs, err := p.messages(u.api, true)
	if err != nil {
		return false, err
	}
	r.messages = append(r.messages, msgs...)
	// Its outputs ride with the next turn's record (journalTurn): a crash
	// before that finds the workers' replies in the ledger.
	r.prev = r.unjournaled()
	return false, nil
}

// carry gives the turn the calls that a failed attempt at it handed over
// and that have their outputs. They are not handed to the executor again:
// a call the turn makes again takes its output (hand). r.mu is held.
func (t *turn) carry() {
	r := t.r
	for _, cc := range r.carried {
		r.pending.handed[cc.call.ToolCallID] = true
		r.pending.outputs[cc.call.ToolCallID] = cc.output
		r.pending.actions[cc.call.ToolCallID] = cc.call.ActionID
		t.sent = append(t.sent, &sentCall{call: cc.call})
	}
	r.carried = nil
}

// emptyTurn is a turn with nothing in it.
type emptyTurn struct{}

func (emptyTurn) Events() iter.Seq2[executor.TurnEvent, error] {
	return func(func(executor.TurnEvent, error) bool) {}
}
func (emptyTurn) Close() {}
