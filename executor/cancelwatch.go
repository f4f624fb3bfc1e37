package executor

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"
)

// watcher asks the upstream whether the runs whose batches are in flight were
// cancelled, for every drive at once and within one budget of requests per
// second. Where two or more runs of one caller are due, one listing of
// that caller's newest runs (GET /v1/runs) reads them all; the runs it does
// not show are read one by one. Each run is read every cancel_poll while
// the budget allows, and less often when more runs wait than the budget
// covers, so that the upstream's load does not grow with the number of waiting
// runs. A cancel that comes through the sidecar (proxy mode) needs no read
// at all: [Executor.CancelRun].
type watcher struct {
	up       Upstream
	interval time.Duration
	rps      float64

	mu   sync.Mutex
	runs map[string]*watch
	stop chan struct{} // closed when the last run leaves; nil while idle
	done chan struct{} // closed when the loop of stop has returned
}

// listings is the state of one loop's listings. A loop has its own: the
// loop of a watcher that went idle may still be ending as the next starts.
type listings struct {
	last   map[string]time.Time // caller key: its last listing
	absent bool                 // the upstream has no listing: per-run reads only
}

// watch is one run whose batch is in flight.
type watch struct {
	ctx    context.Context // the turn's: it carries the caller's key
	caller string          // that key (Upstream.Caller), looked up once
	cancel context.CancelCauseFunc
	last   time.Time // of the last read
}

// add watches runID until the returned func is called.
func (w *watcher) add(ctx context.Context, runID string, cancel context.CancelCauseFunc) (remove func()) {
	wt := &watch{ctx: ctx, caller: w.up.Caller(ctx), cancel: cancel, last: time.Now()}
	w.mu.Lock()
	w.runs[runID] = wt
	if w.stop == nil {
		stop, done := make(chan struct{}), make(chan struct{})
		w.stop, w.done = stop, done
		go func() {
			defer close(done)
			w.run(stop)
		}()
	}
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		if w.runs[runID] == wt {
			delete(w.runs, runID)
		}
		var done chan struct{}
		if len(w.runs) == 0 && w.stop != nil {
			close(w.stop)
			done, w.stop, w.done = w.done, nil, nil
		}
		w.mu.Unlock()
		if done != nil {
			// The last run out owns the loop: it waits for it (at most one
			// read in flight, bounded by checkTimeout).
			<-done
		}
	}
}

// cancelRun cancels the batch in flight of runID, if there is one here.
func (w *watcher) cancelRun(runID string) bool {
	w.mu.Lock()
	wt := w.runs[runID]
	w.mu.Unlock()
	if wt != nil {
		wt.cancel(ErrRunCancelled)
	}
	return wt != nil
}

// run reads, every tick, the runs not read for a whole interval, oldest
// first, as far as the budget's tokens go.
func (w *watcher) run(stop <-chan struct{}) {
	tick := min(w.interval/4, 100*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	burst := max(1, w.rps*w.interval.Seconds())
	tokens := burst
	ls := &listings{last: map[string]time.Time{}}
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		tokens = min(burst, tokens+w.rps*tick.Seconds())
		tokens -= float64(w.listDue(ls, int(tokens)))
		for _, runID := range w.due(int(tokens)) {
			tokens--
			w.check(runID)
		}
	}
}

// due lists up to n runs not read for an interval, the longest unread first.
func (w *watcher) due(n int) []string {
	if n < 1 {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	cutoff := time.Now().Add(-w.interval)
	var ids []string
	for id, wt := range w.runs {
		if wt.last.Before(cutoff) {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b string) int { return w.runs[a].last.Compare(w.runs[b].last) })
	return ids[:min(n, len(ids))]
}

// caller is the waiting runs of one caller (API key).
type caller struct {
	ctx          context.Context // one of its runs', for the key
	waiting, due int
}

// listDue lists the runs of each caller with two or more due, at most n
// callers, each at most once per interval, and returns the requests made.
// A listing costs one request where per-run reads cost one per run; a run
// it does not show (a caller with more runs than the upstream lists, or whose
// newer runs push it out) stays due for a per-run read.
func (w *watcher) listDue(ls *listings, n int) int {
	if ls.absent || n < 1 {
		return 0
	}
	now := time.Now()
	cutoff := now.Add(-w.interval)
	callers := map[string]*caller{}
	w.mu.Lock()
	for _, wt := range w.runs {
		if wt.ctx.Err() != nil {
			continue
		}
		c := callers[wt.caller]
		if c == nil {
			c = &caller{ctx: wt.ctx}
			callers[wt.caller] = c
		}
		c.waiting++
		if wt.last.Before(cutoff) {
			c.due++
		}
	}
	w.mu.Unlock()
	maps.DeleteFunc(ls.last, func(key string, _ time.Time) bool { return callers[key] == nil })
	made := 0
	for key, c := range callers {
		if made == n || ls.absent {
			break
		}
		if c.due < 2 || ls.last[key].After(cutoff) {
			continue
		}
		made++
		ls.last[key] = now
		ls.absent = !w.list(c)
	}
	return made
}

// list reads the newest runs of c's caller and takes each waiting run it
// shows as read. The page asks for twice the caller's waiting runs, room
// for its runs that are not waiting here. It reports false when the upstream has
// no listing (404, 405) or refuses its query (422: a Core whose bounds
// differ), so that it is not asked again in vain.
func (w *watcher) list(c *caller) bool {
	// Not the run's own context: that run may end while the listing
	// speaks for the others.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), checkTimeout)
	runs, err := w.up.RecentRuns(ctx, 2*c.waiting)
	cancel()
	if err != nil {
		return !errors.Is(err, ErrNoListing)
	}
	now := time.Now()
	var stopped []*watch
	w.mu.Lock()
	for _, r := range runs {
		if wt := w.runs[r.ID]; wt != nil {
			wt.last = now
			if r.Stopped() {
				stopped = append(stopped, wt)
			}
		}
	}
	w.mu.Unlock()
	for _, wt := range stopped {
		wt.cancel(ErrRunCancelled)
	}
	return true
}

// checkTimeout bounds one read, so that a slow upstream cannot stall the
// watcher for the other runs.
const checkTimeout = 2 * time.Second

func (w *watcher) check(runID string) {
	w.mu.Lock()
	wt := w.runs[runID]
	if wt != nil {
		wt.last = time.Now()
	}
	w.mu.Unlock()
	if wt == nil || wt.ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(wt.ctx, checkTimeout)
	run, err := w.up.Run(ctx, runID)
	cancel()
	if err == nil && run.Stopped() {
		wt.cancel(ErrRunCancelled)
	}
}

// CancelRun stops the batch in flight of a run that was cancelled through
// the sidecar (proxy mode), at once and without asking the upstream; it reports
// whether this sidecar was running one. The drive then ends cancelled.
func (e *Executor) CancelRun(runID string) bool { return e.watch.cancelRun(runID) }
