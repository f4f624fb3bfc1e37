package openaiup

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"golang.org/x/sync/errgroup"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/internal/clock"
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
	// MaxResponseBytes bounds one event of a stream while it is read (a
	// longer one fails the run, saying so; an event that can carry every
	// call of a turn, turnCalls times it), the arguments of one call as
	// their fragments arrive (past it they are not kept, and the call gets
	// an invalid_args outcome), and an error body.
	MaxResponseBytes int
	// Unsafe reports a tool that must not run twice: its calls wait for
	// their turn's finish chunk. default: none is
	Unsafe func(tool string) bool
	// Journal keeps the runs, so that a retried request resumes its run
	// (journal.go). nil: runs are not journaled.
	Journal Journal
	Logger  *slog.Logger
}

// Upstream is the executor's Upstream on a model's API. It keeps each
// run's conversation in memory: Begin starts a run, the executor's turns
// extend it, and Result reads how it ended.
type Upstream struct {
	cfg  Config
	api  api
	host string // names the upstream in messages (never its credentials)
	log  *slog.Logger

	mu   sync.Mutex
	runs map[string]*run
}

// New builds the adapter. No I/O.
func New(cfg Config) (*Upstream, error) {
	a, ok := apiOf(cfg.API)
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
	return &Upstream{cfg: cfg, api: a, host: parsed.Host, log: log.With("component", a.kind()), runs: map[string]*run{}}, nil
}

// run is one run being answered, for every request attached to it: the
// conversation so far, the turn whose calls are running, and the text the
// application is given.
type run struct {
	id       string
	key      runKey
	owner    string // the credentials that began it (executor.CallerOf)
	mu       sync.Mutex
	body     map[string]json.RawMessage // the request's fields but messages and stream
	headers  http.Header                // forwarded on every turn
	base     []json.RawMessage          // the request's messages
	messages []json.RawMessage
	appTools map[string]bool // tools the application declared: their calls are its own
	status   string
	began    bool         // a turn was asked for, here or before a crash
	turn     int          // turns asked for
	pending  *pendingTurn // the turn being read or answered
	result   Result
	created  int64
	users    int // requests attached (Begin, End)
	// local: this process drives the run (it listed its open calls or
	// asked a turn); until then Run reads it again from the journal,
	// which another sidecar, or this one before a crash, may have moved.
	local bool
	// fresh: begun under a new id by this request (no key, no run to
	// resume): nobody can name it before its first journal record.
	fresh bool
	// headed: the journal holds the run's header; ended: its end.
	headed, ended bool
	// answering: the upstream took a turn (the application's answer may
	// begin).
	answering bool
	// prev are the last turn's outputs, which ride with the next turn's
	// record (journalTurn) or, when none follows, are written alone.
	prev *turnOutputs
	// carried are the calls of a failed turn that had their outputs: the
	// turn asked for again reuses them (journal.go, Handed).
	carried []carriedCall
	// shown is the text the application is given, every turn's, as it
	// comes; wake is closed and replaced when it grows.
	shown strings.Builder
	wake  chan struct{}
}

// carriedCall is a call with its output, from a failed turn.
type carriedCall struct {
	call   *executor.ToolCall
	output string
}

// createdAt is when the run began.
func (r *run) createdAt() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.created
}

// say adds text the application is given.
func (r *run) say(text string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shown.WriteString(text)
	r.wakeUp()
}

func (r *run) wakeUp() {
	close(r.wake)
	r.wake = make(chan struct{})
}

// follow returns the text given past offset from, whether a turn began,
// and a channel closed when either changes.
func (r *run) follow(from int) (text string, began bool, wake <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.shown.String(); len(s) > from {
		text = s[from:]
	}
	return text, r.answering || r.shown.Len() > 0, r.wake
}

// pendingTurn is a turn whose calls are being answered: its assistant
// message goes into the conversation once each of the sidecar's calls
// has its output. Calls are handed over while the turn streams, so their
// outputs may come before the turn is read whole (read).
type pendingTurn struct {
	read      bool                 // the stream is read whole: assistant, order and calls are set
	assistant json.RawMessage      // with every call of the turn, in the API's shape
	order     []toolCall           // every call of the turn, in order
	calls     []*executor.ToolCall // the sidecar's calls, in order
	handed    map[string]bool      // ids of the calls handed to the executor
	idOf      map[string]string    // the executor's id of each of the sidecar's calls, by the assistant message's id
	ghosts    map[string]bool      // handed by an attempt that was cut, and no part of the turn
	outputs   map[string]string    // by tool_call_id
	actions   map[string]string    // the action id of each output's call, by tool_call_id
	started   map[string]bool      // unsafe calls whose start is journaled, by tool_call_id
	journaled bool                 // the journal holds the turn: its unsafe calls may start
	// written is closed when the turn's journal write, begun as its
	// stream ended, is over (nil: none was begun).
	written chan struct{}
	// outputsJournaled counts the outputs the journal holds.
	outputsJournaled int
}

func newPendingTurn() *pendingTurn {
	return &pendingTurn{handed: map[string]bool{}, ghosts: map[string]bool{}, outputs: map[string]string{}, idOf: map[string]string{},
		started: map[string]bool{}, actions: map[string]string{}}
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
	failed  string // the upstream's error event, which ended the run
}

// ToolCall is a call as an assistant message carries it.
type ToolCall = toolCall

// Begin attaches a request to its run: the run in progress under id, or
// a new one with the request's conversation (messages, restored), the
// rest of the request (model, tools, sampling), the tools the application
// declared, whose calls it runs itself, and the headers its turns
// forward. fresh says that no journal can hold the run yet (a new id of
// its own): it is not read there. Each Begin is paired with an End.
func (u *Upstream) Begin(ref runRef, req *request, messages []json.RawMessage) *run {
	u.mu.Lock()
	defer u.mu.Unlock()
	id, fresh := ref.id, ref.fresh
	if r, ok := u.runs[id]; ok {
		r.mu.Lock()
		r.users++
		r.mu.Unlock()
		return r
	}
	r := &run{id: id, key: req.key, owner: req.owner, body: req.body, headers: req.headers, base: messages, messages: messages, appTools: req.appTools,
		status: executor.RunActive, created: cmp.Or(ref.created, time.Now().Unix()), users: 1, wake: make(chan struct{}), local: fresh, fresh: fresh}
	u.runs[id] = r
	return r
}

// End returns how the request's run ended: as this process drove it, or
// as the journal has it when another sidecar drove it. Unless the run was
// answered (answered: it completed or reached the turn limit) without the
// application's key, the last turn's journal write is over first and the
// outputs no turn record carries are kept: a run that stopped between
// turns (shut down, cut, cancelled) leaves them for the retry, and a key's
// retry after a crash replays the answer it had. A keyless answer does not
// wait for them: journalEnd settles them after it, before the run's end
// (BENCHMARKS.md, "Journal cost").
func (u *Upstream) End(ctx context.Context, r *run, answered bool) Result {
	r.mu.Lock()
	local, explicit, appCalls := r.local, r.key.explicit, len(r.result.AppCalls) > 0
	r.mu.Unlock()
	if local {
		if !answered || explicit || appCalls {
			u.settle(ctx, r)
		}
	} else if err := u.reload(ctx, r); err != nil {
		u.log.Warn("reading the run from the journal", "run_id", r.id, "err", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.result
}

// settle waits for the last turn's journal write and keeps the outputs
// that no turn record carries. The write does not outlive the request.
func (u *Upstream) settle(ctx context.Context, r *run) {
	_ = r.turnWritten(context.WithoutCancel(ctx)) // bounded by journalTimeout
	u.keepOutputs(ctx, r)
}

// Release detaches a request from its run, after its answer and the
// run's end are written: until then the run is live, and no request
// without its key claims it. The last request forgets the run.
func (u *Upstream) Release(r *run) {
	u.mu.Lock()
	defer u.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.users--; r.users == 0 {
		delete(u.runs, r.id)
	}
}

// live reports a run this process holds.
func (u *Upstream) live(id string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	_, ok := u.runs[id]
	return ok
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

// Kind is the API's upstream.kind: "openai", "anthropic".
func (u *Upstream) Kind() string { return u.api.kind() }

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
	if u.cfg.Journal == nil || !u.unsafe(c.Tool) {
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
	if err := u.cfg.Journal.Put(ctx, startKey(c.ActionID), []byte("1")); err != nil {
		return fmt.Errorf("openaiup: journaling the start of %s: %w", c.ToolCallID, err)
	}
	r.mu.Lock()
	p.started[c.ToolCallID] = true
	r.mu.Unlock()
	return nil
}

// Finalise records nothing: the output is the call's whole record.
func (u *Upstream) Finalise(context.Context, *executor.ToolCall, string, map[string]any) error {
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

// turnOutputs are the outputs of turn n, by action id.
type turnOutputs struct {
	n    int
	outs map[string]string
}

// unjournaled are the outputs of the pending turn that the journal lacks,
// or nil. r.mu is held.
func (r *run) unjournaled() *turnOutputs {
	p := r.pending
	if p == nil || len(p.outputs) == p.outputsJournaled {
		return nil
	}
	to := &turnOutputs{n: r.turn, outs: make(map[string]string, len(p.outputs))}
	for id, out := range p.outputs {
		to.outs[p.actions[id]] = out
	}
	p.outputsJournaled = len(p.outputs)
	return to
}

// journalOutputs writes, each as a record of its turn, the outputs that
// wait to ride with the next turn's record and those of the pending turn:
// for a run that ends, or whose turn failed, with no next turn to carry
// them.
func (u *Upstream) journalOutputs(ctx context.Context, r *run) error {
	if u.cfg.Journal == nil {
		return nil
	}
	r.mu.Lock()
	todo := []*turnOutputs{r.prev, r.unjournaled()}
	r.prev = nil
	r.mu.Unlock()
	ctx, cancel := journalCtx(ctx)
	defer cancel()
	for _, to := range todo {
		if to == nil {
			continue
		}
		data, err := json.Marshal(to.outs)
		if err != nil {
			return err
		}
		if err := u.cfg.Journal.Put(ctx, outputsKey(r.id, to.n), data); err != nil {
			return fmt.Errorf("openaiup: journaling the outputs of turn %d: %w", to.n, err)
		}
	}
	return nil
}

// keepOutputs journals the outputs no turn record will carry, saying so
// when it cannot: the retry then finds the replies in the ledger.
func (u *Upstream) keepOutputs(ctx context.Context, r *run) {
	if err := u.journalOutputs(ctx, r); err != nil {
		u.log.Warn("journaling the last outputs", "run_id", r.id, "err", err)
	}
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
// worker's manifest from it; the action id (actionID), the same on every
// retry of the run, is its idempotency key.
func callOf(runID string, turn, pos int, modelID string, c assembled) *executor.ToolCall {
	tc := &executor.ToolCall{RunID: runID, ActionID: actionID(runID, turn, pos, modelID, c.Name, c.Args), ToolCallID: c.ID, Tool: c.Name, Problem: c.Problem}
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
		msg := r.result.failed
		r.mu.Unlock()
		u.keepOutputs(ctx, r)
		return nil, &executor.UpstreamError{Status: http.StatusBadGateway,
			Err: fmt.Errorf("the upstream at %s reported an error in turn %d: %s", u.host, r.turn, msg)}
	}
	if p := r.pending; p != nil {
		if len(r.result.AppCalls) > 0 {
			// The application's calls are answered by the application.
			r.result.Parked, err = p.messages(u.api, false)
			r.status = executor.RunCompleted
			r.mu.Unlock()
			return emptyTurn{}, err
		}
		msgs, err := p.messages(u.api, true)
		if err != nil {
			r.mu.Unlock()
			return nil, err
		}
		r.messages = append(r.messages, msgs...)
		// Its outputs ride with the next turn's record (journalTurn): a
		// crash before that finds the workers' replies in the ledger.
		r.prev = r.unjournaled()
	}
	r.pending = newPendingTurn()
	r.began = true
	r.turn++
	body, err := u.api.turnBody(r.body, r.messages)
	n := r.turn
	t := &turn{u: u, r: r, n: n, ctx: ctx, body: body, runID: req.RunID}
	for _, cc := range r.carried {
		// Not handed to the executor again: a call the turn makes again
		// takes its output (hand).
		r.pending.handed[cc.call.ToolCallID] = true
		r.pending.outputs[cc.call.ToolCallID] = cc.output
		r.pending.actions[cc.call.ToolCallID] = cc.call.ActionID
		t.sent = append(t.sent, &sentCall{call: cc.call})
	}
	r.carried = nil
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

// reload reads the run again from the journal: its delivered turns (the
// conversation after the request's messages, the text, the usage), and
// the last turn's calls with the outputs and starts journaled for them.
// A run the journal does not hold is left as it is.
func (u *Upstream) reload(ctx context.Context, r *run) error {
	if u.cfg.Journal == nil {
		return nil
	}
	jr, err := readJournal(ctx, u.cfg.Journal, r.id)
	if err != nil || !jr.found {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.local {
		return nil // this process began driving it meanwhile
	}
	r.headed, r.created = true, jr.header.Created
	r.messages, r.turn, r.pending, r.result, r.status = slices.Clone(r.base), len(jr.turns), nil, Result{}, executor.RunActive
	r.began = len(jr.turns) > 0
	r.shown.Reset()
	r.carried = nil
	for i, t := range jr.turns {
		if t.Failed != "" && i == len(jr.turns)-1 {
			// The upstream failed this turn: a retry asks for it again,
			// and the calls it had handed over keep their outputs.
			r.turn--
			for _, c := range t.Handed {
				if out, ok := jr.outputs[c.ActionID]; ok {
					r.carried = append(r.carried, carriedCall{c.call(r.id), out})
				}
			}
			break
		}
		r.apply(t)
		r.shown.WriteString(t.Content)
		if r.status != executor.RunActive {
			break
		}
		p := newPendingTurn()
		p.read, p.journaled = true, true
		p.assistant = t.Assistant
		if p.order, err = u.api.callsOf(t.Assistant); err != nil {
			return fmt.Errorf("turn %d's assistant message: %w", i+1, err)
		}
		for _, c := range t.Calls {
			ec := c.call(r.id)
			p.calls = append(p.calls, ec)
			p.idOf[c.MessageID], p.handed[c.ToolCallID] = c.ToolCallID, true
			if out, ok := jr.outputs[c.ActionID]; ok {
				p.outputs[c.ToolCallID], p.actions[c.ToolCallID] = out, c.ActionID
				p.outputsJournaled++
			}
			p.started[c.ToolCallID] = jr.started[c.ActionID]
		}
		if i < len(jr.turns)-1 {
			// An earlier turn's calls all had their outputs before the
			// next turn was asked for.
			msgs, err := p.messages(u.api, true)
			if err != nil {
				return fmt.Errorf("turn %d: %w", i+1, err)
			}
			r.messages = append(r.messages, msgs...)
			continue
		}
		r.pending = p
		r.result.AppCalls = t.AppCalls
		if len(t.AppCalls) > 0 && len(p.calls) == 0 {
			r.result.Parked, _ = p.messages(u.api, false)
			r.status = executor.RunCompleted
		}
	}
	if jr.end != nil && r.status == executor.RunActive {
		r.status = executor.RunCompleted // it ended on the turn limit
	}
	r.wakeUp()
	return nil
}

// apply adds a delivered turn to the run's result, and ends the run when
// the turn had no call, or failed.
func (r *run) apply(t turnRecord) {
	res := &r.result
	if res.Model == "" {
		res.Model, res.Created = t.Model, t.Created
	}
	res.Usage.add(&t.Usage)
	res.Content += t.Content
	res.FinishReason = t.Finish
	switch {
	case t.Failed != "":
		res.failed, r.status = t.Failed, executor.RunFailed
	case len(t.Calls) == 0 && len(t.AppCalls) == 0:
		r.status = executor.RunCompleted
	case len(t.AppCalls) > 0:
		res.FinishReason = "tool_calls"
	}
}

// turnWritten waits for the journal write of the pending turn, begun
// when its stream ended (turn.end).
func (r *run) turnWritten(ctx context.Context) error {
	r.mu.Lock()
	var written chan struct{}
	if r.pending != nil {
		written = r.pending.written
	}
	r.mu.Unlock()
	if written == nil {
		return nil
	}
	select {
	case <-written:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// journalTurn writes a delivered turn, after the run's header the first
// time (and, for a run without the application's key, its place in the
// index of its request). A run without the application's key whose first
// turn ends it is not journaled: no retry would read it.
func (u *Upstream) journalTurn(ctx context.Context, r *run, n int, rec turnRecord) error {
	j := u.cfg.Journal
	if j == nil {
		return nil
	}
	r.mu.Lock()
	headed, key, created, prev := r.headed, r.key, r.created, r.prev
	r.mu.Unlock()
	if !headed && !key.explicit && n == 1 && len(rec.Calls)+len(rec.AppCalls)+len(rec.Handed) == 0 {
		return nil
	}
	if prev != nil && prev.n == n-1 {
		rec.Previous = prev.outs
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	ctx, cancel := journalCtx(ctx)
	defer cancel()
	if !headed {
		// A fresh run's lease is taken while its first turn streams:
		// once the index names the run, other sidecars find it driven.
		if err := executor.Leased(ctx); err != nil {
			return err
		}
	}
	// The records are written at once: none is read without the others
	// being useful (a header without the turn asks for the turn again; a
	// turn without its header is not found), and the turn's unsafe calls
	// wait for all of them.
	g, ctx := errgroup.WithContext(ctx)
	if !headed {
		g.Go(func() error {
			h, _ := json.Marshal(header{Request: key.digest, Created: created})
			if _, err := j.Create(ctx, headerKey(r.id), h); err != nil && !errors.Is(err, ErrJournalExists) {
				return err
			}
			return nil
		})
		if !key.explicit {
			g.Go(func() error { return index(ctx, j, key.digest, r.id) })
		}
	}
	g.Go(func() error { return j.Put(ctx, turnKey(r.id, n), data) })
	if err := g.Wait(); err != nil {
		return err
	}
	r.mu.Lock()
	r.headed = true
	if r.prev == prev && rec.Previous != nil {
		r.prev = nil
	}
	r.mu.Unlock()
	return nil
}

// journalEnd writes how a journaled run ended.
func (u *Upstream) journalEnd(ctx context.Context, r *run, sum executor.Summary) {
	r.mu.Lock()
	local := r.local
	r.mu.Unlock()
	if local {
		u.settle(ctx, r) // the turns' records before the end (done by End for a run with a key)
	}
	r.mu.Lock()
	write := r.headed && !r.ended // requests attached to one run end it once
	r.ended = true
	r.mu.Unlock()
	if u.cfg.Journal == nil || !write {
		return
	}
	ctx, cancel := journalCtx(ctx)
	defer cancel()
	data, _ := json.Marshal(endRecord{Summary: sum})
	if err := u.cfg.Journal.Put(ctx, endKey(r.id), data); err != nil {
		u.log.Warn("journaling the run's end", "run_id", r.id, "err", err)
		return
	}
	if !r.key.explicit {
		if err := unindex(ctx, u.cfg.Journal, r.key.digest, r.id); err != nil {
			u.log.Warn("removing an ended run from its request's index", "run_id", r.id, "err", err)
		}
	}
}

// messages are the turn as the next turn replays it: its assistant
// message and one result per call, in the order of its calls. A call
// without an output is a bug of the loop: the request would be refused
// (400), so it is not sent. With all false, the calls that are not the
// sidecar's are left out (the application answers them).
func (p *pendingTurn) messages(a api, all bool) ([]json.RawMessage, error) {
	var results []result
	for _, c := range p.order {
		id, own := p.idOf[c.ID]
		if !own && !all {
			continue
		}
		content, ok := p.outputs[id]
		if !ok {
			return nil, fmt.Errorf("openaiup: call %s (%s) has no output: the next turn is not asked for", c.ID, c.Function.Name)
		}
		results = append(results, result{ID: c.ID, Content: content})
	}
	return a.followUp(p.assistant, results)
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
func (u *Upstream) post(ctx context.Context, body []byte, headers http.Header, budget time.Duration) (*http.Response, error) {
	key := u.Caller(ctx)
	if key == "" {
		key = u.cfg.APIKey
	}
	b := &backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 5 * time.Second}
	return backoff.Retry(ctx, func() (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.cfg.URL+u.api.turnPath(), bytes.NewReader(body))
		if err != nil {
			return nil, backoff.Permanent(err)
		}
		for name, v := range headers {
			req.Header[name] = v
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		u.api.authorize(req.Header, key)
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
