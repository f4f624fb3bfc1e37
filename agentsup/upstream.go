// Package agentsup adapts a hosted agent session (the OpenAI Agents API,
// Anthropic Managed Agents; their wire is agentsapi's) to the executor's
// Upstream port. The sidecar does not drive the model: it follows the
// session's events, and whenever the session blocks on client calls of
// the registry's tools it runs them as one batch and posts their results
// in one request.
//
// A session is the executor's run; a turn is the session's stream read
// until it blocks (its pending calls of the registry's tools are the
// turn's calls) or goes idle (the turn has none, and the drive ends).
// Calls of the application's own tools are left for it.
package agentsup

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"iter"
	"log/slog"
	"net/http"
	"sync"

	"github.com/projectdavid/toolsidecar/agentsapi"
	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/runstore"
)

// Config configures the adapter.
type Config struct {
	API agentsapi.API
	// Owns reports a tool of the registry: its calls are the sidecar's;
	// the others are left for the application.
	Owns func(tool string) bool
	// Unsafe reports a tool that must not run twice. default: none is
	Unsafe func(tool string) bool
	// APIKey is the sidecar's own key, used where no caller's is known.
	// Never logged.
	APIKey string
	// Journal keeps, per call, the start of an unsafe call and the answer
	// chosen before it is posted, so that a sidecar after a crash never
	// runs an unsafe call again nor posts another answer. nil: nothing
	// is journaled.
	Journal runstore.Journal
	// Approvals, when set, gets a person's decision on each server call
	// that waits for the client's permission (Anthropic's ask-gated
	// agent.tool_use and agent.mcp_tool_use), which the sidecar then
	// posts (user.tool_confirmation). nil: they are the application's.
	Approvals approval.Store
	Logger    *slog.Logger
}

// Upstream is the executor's Upstream on hosted sessions. It holds the
// sessions being watched (Watcher), each with the calls it waits on.
type Upstream struct {
	executor.CallerInContext // requests carry the caller's key

	cfg   Config
	log   *slog.Logger
	store *runstore.Store // nil without a journal

	mu       sync.Mutex
	sessions map[string]*session
}

// New builds the adapter. No I/O.
func New(cfg Config) (*Upstream, error) {
	if cfg.API == nil || cfg.Owns == nil {
		return nil, fmt.Errorf("agentsup: API and Owns are required")
	}
	if cfg.Unsafe == nil {
		cfg.Unsafe = func(string) bool { return false }
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	u := &Upstream{cfg: cfg, log: log.With("component", cfg.API.Kind()), sessions: map[string]*session{}}
	if cfg.Journal != nil {
		u.store = runstore.New(cfg.Journal)
	}
	return u, nil
}

// Kind is the API's upstream.kind.
func (u *Upstream) Kind() string { return u.cfg.API.Kind() }

// listen subscribes to the results posted to a watched session whose
// owner is caller; false when the session is not watched, or is
// another caller's.
func (u *Upstream) listen(id, caller string) (<-chan agentsapi.Result, func(), bool) {
	s, err := u.session(id)
	if err != nil || s.owner != caller {
		return nil, nil, false
	}
	ch, cancel := s.listen()
	return ch, cancel, true
}

func (u *Upstream) session(id string) (*session, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	s, ok := u.sessions[id]
	if !ok {
		return nil, &executor.UpstreamError{Status: http.StatusNotFound, Err: fmt.Errorf("agentsup: no watched session %s", id)}
	}
	return s, nil
}

// Run reports a watched session as a run: active while it works or
// waits on calls; stopping when a turn whose calls run was cancelled;
// completed when idle; failed or cancelled when it ended. It has calls to
// finish first (not NeverStarted) when the journal knows a pending call
// of its: a sidecar before this one started or answered it.
func (u *Upstream) Run(ctx context.Context, id string) (executor.Run, error) {
	s, err := u.session(id)
	if err != nil {
		return executor.Run{}, err
	}
	journaled, err := u.journaled(ctx, s)
	if err != nil {
		return executor.Run{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	run := executor.Run{ID: id, UpstreamStatus: s.status, Owner: s.owner, NeverStarted: len(journaled) == 0}
	switch {
	case s.status == agentsapi.StatusFailed:
		run.Status = executor.RunFailed
	case s.status == agentsapi.StatusEnded:
		run.Status = executor.RunCancelled
	case s.voided():
		run.Status = executor.RunStopping
	case s.status == agentsapi.StatusIdle:
		run.Status = executor.RunCompleted
	default:
		run.Status = executor.RunActive
	}
	return run, nil
}

// RecentRuns: sessions are read one by one.
func (u *Upstream) RecentRuns(context.Context, int) ([]executor.Run, error) {
	return nil, executor.ErrNoListing
}

// Turn posts what the last drive left unposted, then waits until the
// session blocks on calls of the registry's tools that no batch has
// taken (they are the turn), or goes idle (a turn without calls), or
// fails or ends (an error).
func (u *Upstream) Turn(ctx context.Context, req executor.Request) (executor.Turn, error) {
	s, err := u.session(req.RunID)
	if err != nil {
		return nil, err
	}
	if err := u.post(ctx, s, s.ready()); err != nil {
		return nil, err
	}
	calls, err := s.next(ctx, u.cfg.Owns)
	if err != nil {
		return nil, err
	}
	return turn(calls), nil
}

// turn is a block's calls, as the executor reads a turn.
type turn []*executor.ToolCall

func (t turn) Events() iter.Seq2[executor.TurnEvent, error] {
	return func(yield func(executor.TurnEvent, error) bool) {
		for _, c := range t {
			if !yield(executor.TurnEvent{Kind: executor.TurnToolCall, Call: c}, nil) {
				return
			}
		}
	}
}
func (turn) Close() {}

// MarkStarted journals the start of an unsafe call before it is sent:
// after a crash, a call marked and not answered is answered
// "interrupted", never run again. Other calls may run again: nothing is
// written for them.
func (u *Upstream) MarkStarted(ctx context.Context, c *executor.ToolCall, _ <-chan struct{}) error {
	if u.store == nil || !u.cfg.Unsafe(c.Tool) {
		return nil
	}
	jctx, cancel := runstore.Bound(ctx)
	defer cancel()
	if err := u.store.MarkStarted(jctx, c.ActionID); err != nil {
		return fmt.Errorf("agentsup: journaling the start of %s: %w", c.ToolCallID, err)
	}
	return nil
}

// RecordOutput keeps a call's output for its batch's post.
func (u *Upstream) RecordOutput(_ context.Context, req executor.Request, c *executor.ToolCall, content string) error {
	s, err := u.session(req.RunID)
	if err != nil {
		return err
	}
	return s.record(c.ActionID, content)
}

// Finalise notes how a call ended; the last call of a batch to be
// finalised posts the batch's results, in one request: the batch is
// joined. A cancelled call, or one of a turn the session cancelled, is
// not answered.
func (u *Upstream) Finalise(ctx context.Context, c *executor.ToolCall, status string, _ executor.ResultSummary) error {
	s, err := u.session(c.RunID)
	if err != nil {
		return err
	}
	batch := s.finalise(c.ActionID, status)
	return u.post(ctx, s, batch)
}

// post journals the results' answers, then posts them in one request
// and marks them posted. An answer journaled before (by a sidecar that
// crashed before its post landed) is the one posted.
func (u *Upstream) post(ctx context.Context, s *session, results []agentsapi.Result) error {
	if len(results) == 0 {
		return nil
	}
	before := s.journaledBefore(results)
	if u.store != nil {
		jctx, cancel := runstore.Bound(ctx)
		defer cancel()
		for i, r := range results {
			a, first, err := u.store.WriteAnswer(jctx, actionID(s.id, r.Call.ID), runstore.Answer{OK: r.OK, Output: r.Output})
			if err != nil {
				s.unpost(results)
				return fmt.Errorf("agentsup: journaling the answer of %s: %w", r.Call.ID, err)
			}
			before = before || !first
			results[i].OK, results[i].Output = a.OK, a.Output
		}
	}
	key := s.credential(u.cfg.APIKey)
	if before {
		// Answered by a sidecar before this one (crashed, or another
		// replica behind the same webhook): its post may have landed. The
		// session says which calls still wait; Anthropic has no
		// idempotency key, and OpenAI's covers the same batch only.
		snap, err := u.cfg.API.Read(ctx, key, s.id)
		if err != nil {
			s.unpost(results)
			return fmt.Errorf("agentsup: reading session %s before posting answers journaled before: %w", s.id, err)
		}
		var landed []agentsapi.Result
		results, landed = stillPending(results, snap)
		s.posted(landed)
		if len(results) == 0 {
			return nil
		}
	}
	// The application's streams are told before the post: once the
	// upstream takes it, the session goes on at once, and a result told
	// after could follow the turn's end, where a client stops reading.
	if dropped := s.tell(results); dropped > 0 {
		u.log.Warn("an application stream reads too slowly: results not shown on it", "session", s.id, "dropped", dropped)
	}
	if err := u.cfg.API.Post(ctx, key, s.id, results); err != nil {
		s.unpost(results)
		return fmt.Errorf("agentsup: posting %d results to session %s: %w", len(results), s.id, err)
	}
	s.posted(results)
	u.log.Debug("results posted", "session", s.id, "results", len(results))
	return nil
}

// stillPending splits results into those of calls the session still
// waits on, and the others (answered already).
func stillPending(results []agentsapi.Result, snap agentsapi.Snapshot) (pending, landed []agentsapi.Result) {
	waits := map[string]bool{}
	for _, c := range snap.Pending {
		waits[c.ID] = true
	}
	for _, r := range results {
		if waits[r.Call.ID] {
			pending = append(pending, r)
		} else {
			landed = append(landed, r)
		}
	}
	return pending, landed
}

// OpenCalls takes, as a batch, the session's pending calls of the
// registry's tools that the journal knows: started (an unsafe call a
// crashed sidecar sent; the executor answers it "interrupted" unless the
// ledger kept its reply) or answered (its journaled answer is posted,
// nothing runs). A drive finds the other calls in its turns.
func (u *Upstream) OpenCalls(ctx context.Context, req executor.Request) ([]executor.OpenCall, error) {
	s, err := u.session(req.RunID)
	if err != nil {
		return nil, err
	}
	journaled, err := u.journaled(ctx, s)
	if err != nil || len(journaled) == 0 {
		return nil, err
	}
	return s.takeJournaled(journaled), nil
}

// journaled reads the journal's records of the session's pending calls
// that no batch took.
func (u *Upstream) journaled(ctx context.Context, s *session) ([]journaledCall, error) {
	if u.store == nil {
		return nil, nil
	}
	s.mu.Lock()
	work := s.work(u.cfg.Owns)
	s.mu.Unlock()
	jctx, cancel := runstore.Bound(ctx)
	defer cancel()
	var out []journaledCall
	for _, c := range work {
		id := actionID(s.id, c.ID)
		a, err := u.store.Answer(jctx, id)
		if err != nil {
			return nil, fmt.Errorf("agentsup: reading the journal of %s: %w", c.ID, err)
		}
		started := a != nil
		if a == nil && u.cfg.Unsafe(c.Name) {
			if started, err = u.store.Started(jctx, id); err != nil {
				return nil, fmt.Errorf("agentsup: reading the journal of %s: %w", c.ID, err)
			}
		}
		if started {
			out = append(out, journaledCall{call: c, answer: a})
		}
	}
	return out, nil
}

// LastAnswer is not kept: the application reads the session.
func (u *Upstream) LastAnswer(context.Context, executor.Request) (string, error) { return "", nil }

// actionID names a call for the executor (its idempotency key, the
// ledger's key, the cancel subject's token): a digest of the session and
// the call's identity, the same on every redelivery.
func actionID(session, identity string) string {
	d := sha256.Sum256([]byte(fmt.Sprintf("%d:%s%s", len(session), session, identity)))
	return "ha_" + hex.EncodeToString(d[:20])
}

// credential is the key the session's requests carry: its caller's, or
// the sidecar's own.
func (s *session) credential(own string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cmp.Or(s.key, own)
}
