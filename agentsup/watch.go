package agentsup

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/agentsapi"
	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/internal/clock"
	"github.com/projectdavid/toolsidecar/tool"
)

// WatcherConfig configures the watches.
type WatcherConfig struct {
	Upstream *Upstream
	// Drive drives a session's batches (executor.Drive).
	Drive executor.DriveFunc
	// Max bounds the sessions watched at once. Required.
	Max int
	// MaxPerOwner bounds the sessions watched at once for one owner
	// (executor.CallerOf of the credential the upstream checks), the
	// sessions webhooks name and those of WatchShared excepted: one caller
	// cannot take every slot. 0: Max/2, at least 1.
	MaxPerOwner int
}

// Watcher follows sessions: for each, one goroutine reads its event
// stream (reopened and reconciled from a read of the session after a
// cut) and one drives its batches. It owns them: a watch ends when its
// session fails, terminates or is deleted, when its credential is refused,
// when its slot is taken while the session rests (idle, or waiting only on
// the application's own tools) with nothing in flight, or at Close.
type Watcher struct {
	cfg  WatcherConfig
	base context.Context
	stop context.CancelFunc
	// drained ends at Drain: no drive begins after it.
	drained context.Context
	drain   context.CancelFunc

	mu      sync.Mutex
	watches map[string]*watching
	wg      sync.WaitGroup // every watch's goroutines
	drivers sync.WaitGroup // the drive loops
}

// watching is one session's watch.
type watching struct {
	s      *session
	cancel context.CancelFunc
}

// ErrTooManyWatches: the sidecar watches WatcherConfig.Max sessions, or
// the caller its WatcherConfig.MaxPerOwner, none of them resting with
// nothing in flight.
var ErrTooManyWatches = errors.New("agentsup: too many sessions watched")

// NewWatcher builds the watches. No I/O.
func NewWatcher(cfg WatcherConfig) (*Watcher, error) {
	if cfg.Upstream == nil || cfg.Drive == nil || cfg.Max <= 0 || cfg.MaxPerOwner < 0 {
		return nil, fmt.Errorf("agentsup: a watcher needs its Upstream, Drive, a positive Max (%d) and a MaxPerOwner not negative (%d)", cfg.Max, cfg.MaxPerOwner)
	}
	if cfg.MaxPerOwner == 0 {
		cfg.MaxPerOwner = max(1, cfg.Max/2)
	}
	base, stop := context.WithCancel(context.Background())
	drained, drain := context.WithCancel(context.Background())
	return &Watcher{cfg: cfg, base: base, stop: stop, drained: drained, drain: drain, watches: map[string]*watching{}}, nil
}

// Watch follows a session with the caller's credential (key; owner is the
// caller's identity, executor.CallerOf), unless it is followed already:
// its event stream, open until the session ends. The credential stays in
// memory, and is used for this session only.
func (w *Watcher) Watch(id, key, owner string) error { return w.watch(id, key, owner, true, w.follow) }

// WatchShared is Watch for a session that every caller shares (one the
// sidecar follows with its own key, whoever asked): not bounded by
// MaxPerOwner, which could not tell its callers apart.
func (w *Watcher) WatchShared(id, key, owner string) error {
	return w.watch(id, key, owner, false, w.follow)
}

// Poll follows a session by reading it, with no stream, until it is idle
// with nothing of the sidecar's left to answer (a webhook said it requires
// action: the next webhook starts another watch). Many sessions then
// hold no open stream between their blocks. Not bounded by MaxPerOwner:
// the session is the sidecar's key's.
func (w *Watcher) Poll(id, key, owner string) error { return w.watch(id, key, owner, false, w.poll) }

func (w *Watcher) watch(id, key, owner string, perOwner bool, follow func(context.Context, *session)) error {
	if err := agentsapi.CheckSession(id); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.drained.Err() != nil:
		return errors.New("agentsup: the sidecar is shutting down")
	case w.watches[id] != nil:
		return nil
	case perOwner && w.ownedLocked(owner) >= w.cfg.MaxPerOwner && !w.evictLocked(owner):
		return fmt.Errorf("%w for one caller (upstream.max_sessions_per_owner %d, none resting)", ErrTooManyWatches, w.cfg.MaxPerOwner)
	case len(w.watches) >= w.cfg.Max && !w.evictLocked(""):
		return fmt.Errorf("%w (%d, none resting)", ErrTooManyWatches, w.cfg.Max)
	}
	u := w.cfg.Upstream
	s := newSession(id, key, owner)
	u.mu.Lock()
	u.sessions[id] = s
	u.mu.Unlock()
	ctx, cancel := context.WithCancel(w.base)
	w.watches[id] = &watching{s: s, cancel: cancel}
	w.drivers.Add(1)
	w.wg.Go(func() {
		defer w.forget(id, s)
		var inner sync.WaitGroup
		inner.Go(func() {
			follow(ctx, s)
			cancel() // the session ended, or needs the sidecar no more: its drive ends too
		})
		if confirmer, ok := u.cfg.API.(agentsapi.Confirmer); ok && u.cfg.Approvals != nil {
			inner.Go(func() { w.confirm(ctx, s, confirmer) })
		}
		w.drive(ctx, s)
		w.drivers.Done()
		inner.Wait()
	})
	u.log.Info("watching session", "session", id)
	return nil
}

// Watching reports the sessions watched.
func (w *Watcher) Watching() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.watches)
}

// ownedLocked counts owner's sessions watched. w.mu is held.
func (w *Watcher) ownedLocked(owner string) int {
	n := 0
	for _, wt := range w.watches {
		if wt.s.owner == owner {
			n++
		}
	}
	return n
}

// evictLocked ends the watch of the session resting the longest (idle, or
// waiting only on the application's own tools) with nothing in flight, of
// owner's ("": of any), to free its slot; false when there is none. Its
// session is watched again when a caller reads it or posts to it through
// the sidecar, or a webhook names it. w.mu is held.
func (w *Watcher) evictLocked(owner string) bool {
	var oldest *watching
	var since time.Time
	for _, wt := range w.watches {
		if owner != "" && wt.s.owner != owner {
			continue
		}
		if t, ok := wt.s.releasable(w.cfg.Upstream.cfg.Owns); ok && (oldest == nil || t.Before(since)) {
			oldest, since = wt, t
		}
	}
	if oldest == nil {
		return false
	}
	delete(w.watches, oldest.s.id)
	oldest.cancel()
	w.cfg.Upstream.log.Info("a resting session's watch ended to free its slot", "session", oldest.s.id, "resting_since", since)
	return true
}

func (w *Watcher) forget(id string, s *session) {
	w.mu.Lock()
	// An evicted watch is no longer in the table, which may hold a newer
	// watch of the same session.
	if wt := w.watches[id]; wt != nil && wt.s == s {
		delete(w.watches, id)
		wt.cancel()
	}
	w.mu.Unlock()
	u := w.cfg.Upstream
	u.mu.Lock()
	if u.sessions[id] == s {
		delete(u.sessions, id)
	}
	u.mu.Unlock()
	u.log.Info("session no longer watched", "session", id)
}

// Close starts no more drives, waits until the drives in progress have
// ended (the executor's own drain lets each finish its batch, whose
// results are posted) or ctx has, then ends every watch and waits for
// them.
func (w *Watcher) Close(ctx context.Context) {
	w.mu.Lock()
	w.drain()
	w.mu.Unlock()
	done := make(chan struct{})
	go func() {
		w.drivers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	w.stop()
	w.wg.Wait()
	<-done
}

// Streams after a cut are reopened after a wait from reopenFirst,
// doubling to reopenMax.
const (
	reopenFirst = 500 * time.Millisecond
	reopenMax   = 10 * time.Second
)

// follow reads the session's events until it ends: it opens the stream,
// then reads the session (the stream does not replay what it missed), and
// applies each event once.
func (w *Watcher) follow(ctx context.Context, s *session) {
	u := w.cfg.Upstream
	api := u.cfg.API
	wait := reopenFirst
	for ctx.Err() == nil {
		key := s.credential(u.cfg.APIKey)
		st, err := api.Stream(ctx, key, s.id)
		if err == nil {
			var snap agentsapi.Snapshot
			if snap, err = api.Read(ctx, key, s.id); err == nil {
				s.apply(snap)
				wait = reopenFirst
				if s.ended() {
					st.Close()
					return
				}
				for ev, rerr := range st.Updates {
					if rerr != nil {
						err = rerr
						break
					}
					if s.update(ev) {
						st.Close()
						return
					}
				}
			}
			st.Close()
		}
		if tooLarge(u, s, err) {
			return
		}
		var he *agentsapi.HTTPError
		if errors.As(err, &he) && (he.Status == http.StatusNotFound || he.Status == http.StatusUnauthorized || he.Status == http.StatusForbidden) {
			u.log.Info("session gone or its credential refused; its watch ends", "session", s.id, "status", he.Status)
			s.apply(agentsapi.Snapshot{Status: agentsapi.StatusEnded, Why: he.Error()})
			return
		}
		if ctx.Err() != nil {
			return
		}
		u.log.Info("session stream cut; reopening it", "session", s.id, "wait", wait, "err", err)
		if clock.Sleep(ctx, wait) != nil {
			return
		}
		wait = min(2*wait, reopenMax)
	}
}

// tooLarge reports a read of the session past its bound (a block of more
// or larger calls than the sidecar reads, or a history page): the same
// read would fail again, so the watch ends, said at error level, rather
// than reading it on and on; a read through the sidecar watches the
// session again.
func tooLarge(u *Upstream, s *session, err error) bool {
	if !errors.Is(err, agentsapi.ErrTooLarge) {
		return false
	}
	u.log.Error("a read of the session is larger than the sidecar reads: its calls are not answered; its watch ends", "session", s.id, "err", err)
	return true
}

// pollEvery is how often a session followed without a stream is read.
const pollEvery = 500 * time.Millisecond

// poll reads the session every pollEvery until it ends, or is idle with
// no call of the sidecar's taken and not answered.
func (w *Watcher) poll(ctx context.Context, s *session) {
	u := w.cfg.Upstream
	wait := reopenFirst
	for ctx.Err() == nil {
		snap, err := u.cfg.API.Read(ctx, s.credential(u.cfg.APIKey), s.id)
		var he *agentsapi.HTTPError
		switch {
		case errors.As(err, &he) && (he.Status == http.StatusNotFound || he.Status == http.StatusUnauthorized || he.Status == http.StatusForbidden):
			s.apply(agentsapi.Snapshot{Status: agentsapi.StatusEnded, Why: he.Error()})
			return
		case tooLarge(u, s, err):
			return
		case err != nil:
			u.log.Info("reading the session failed; reading it again", "session", s.id, "wait", wait, "err", err)
			if clock.Sleep(ctx, wait) != nil {
				return
			}
			wait = min(2*wait, reopenMax)
			continue
		}
		wait = reopenFirst
		s.apply(snap)
		if s.ended() || (snap.Status == agentsapi.StatusIdle && !s.busy()) {
			return
		}
		if clock.Sleep(ctx, pollEvery) != nil {
			return
		}
	}
}

// confirm asks a person, through the approval API, for each server call
// of the session that waits for permission, and posts the decision.
func (w *Watcher) confirm(ctx context.Context, s *session, confirmer agentsapi.Confirmer) {
	u := w.cfg.Upstream
	for {
		c, ok := s.nextAsk(ctx)
		if !ok {
			return
		}
		id := actionID(s.id, "confirm/"+c.ID)
		now := time.Now()
		entry, err := u.cfg.Approvals.Open(ctx, approval.Request{ActionID: id, RunID: s.id, ToolCallID: c.ID, Tool: c.Name,
			Arguments: approval.Arguments(c.Args), RequestedAt: now, Deadline: now.Add(confirmWait), Owner: s.owner})
		verdict := entry.Verdict
		if err == nil && verdict == nil {
			var v approval.Verdict
			v, err = u.cfg.Approvals.Await(ctx, id)
			verdict = &v
		}
		if err == nil {
			err = confirmer.Confirm(ctx, s.credential(u.cfg.APIKey), s.id, c.ID, verdict.Outcome == approval.Approved, verdict.Reason)
		}
		var he *agentsapi.HTTPError
		if errors.As(err, &he) && (he.Status == http.StatusBadRequest || he.Status == http.StatusConflict) {
			// The session no longer waits for it (answered, or the turn
			// ended): nothing to ask again.
			u.log.Warn("a server call's confirmation was refused", "session", s.id, "call", tool.Excerpt(c.ID), "err", err)
			s.confirmed(c.ID)
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			u.log.Warn("confirming a server call failed; asking again", "session", s.id, "call", tool.Excerpt(c.ID), "err", err)
			if clock.Sleep(ctx, reopenFirst) != nil {
				return
			}
			continue
		}
		u.log.Info("server call confirmed", "session", s.id, "call", tool.Excerpt(c.ID), "tool", tool.Excerpt(c.Name), "outcome", verdict.Outcome)
		s.confirmed(c.ID)
	}
}

// confirmWait is how long an approval of a server call is shown as open:
// the session waits for it as long as it takes (the API sets no expiry).
const confirmWait = 24 * time.Hour

// drive drives the session's batches: a drive from each block on the
// sidecar's calls to the session's next idle.
func (w *Watcher) drive(ctx context.Context, s *session) {
	u := w.cfg.Upstream
	wait, stop := context.WithCancel(ctx)
	defer stop()
	defer context.AfterFunc(w.drained, stop)()
	// A drive that did not complete (a post past its retry budget: its
	// results are still to post) is tried again after a wait that doubles.
	pause := reopenFirst
	for s.waitWork(wait, u.cfg.Owns) {
		sum, err := w.cfg.Drive(ctx, executor.Request{RunID: s.id, CallerKey: s.key, Caller: s.owner}, nil)
		u.log.Debug("session drive ended", "session", s.id, "status", sum.Status, "calls", len(sum.Calls), "err", err)
		if sum.Status == executor.StatusCompleted {
			pause = reopenFirst
			continue
		}
		if err != nil {
			u.log.Warn("a session's drive failed; driving it again", "session", s.id, "wait", pause, "err", err)
		}
		if clock.Sleep(wait, pause) != nil {
			return
		}
		pause = min(2*pause, reopenMax)
	}
}
