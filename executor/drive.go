package executor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// One driver per run: a second Drive of a run that is being driven attaches
// to the drive in progress. It receives the events from then on and the
// same final summary. The drive runs on a context of its own, which ends
// only when every caller attached to it has gone.

// ErrCallersGone is the cause of a drive cancelled because every caller
// attached to it went away.
var ErrCallersGone = errors.New("executor: every caller of the drive went away")

// maxDriveLog bounds the events a drive keeps for the callers that
// resume (Request.ResumeAfter): a caller further behind than that misses
// the oldest. At about a hundred bytes an event (a tool result's output is
// the summary's too), 2048 events are some 200 KiB per drive at most.
const maxDriveLog = 2048

// drive is one run being driven, shared by the callers attached to it.
type drive struct {
	id     string // names this drive in its events' IDs
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when the loop has ended; sum and err are set

	mu        sync.Mutex
	subs      map[*subscriber]struct{}
	callers   int
	lingering *time.Timer // cancels the drive that its last caller left, unless one comes back
	finished  bool
	sum       Summary
	err       error
	seq       uint64  // the last event's number
	log       []Event // the latest events, numbered seq-len(log)+1 to seq
}

// subscriber is one caller's event queue. Events are queued without
// blocking, so that a slow application socket never holds up the loop
// (or a record upstream); the caller's own goroutine delivers them.
type subscriber struct {
	mu     sync.Mutex
	queue  []Event
	wake   chan struct{} // cap 1
	closed bool          // no event follows
}

func (s *subscriber) push(e Event) {
	s.mu.Lock()
	s.queue = append(s.queue, e)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *subscriber) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// deliver hands queued events to sink until the queue is closed and empty,
// or until stop is closed; then it hands over what is still queued.
func (s *subscriber) deliver(sink Sink, stop <-chan struct{}) {
	for {
		batch, closed := s.take()
		for _, e := range batch {
			sink(e)
		}
		if closed && len(batch) == 0 {
			return
		}
		if len(batch) > 0 {
			continue
		}
		select {
		case <-s.wake:
		case <-stop:
			batch, _ := s.take()
			for _, e := range batch {
				sink(e)
			}
			return
		}
	}
}

func (s *subscriber) take() ([]Event, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	batch := s.queue
	s.queue = nil
	return batch, s.closed
}

// emit numbers an event, keeps it for the callers that resume, and
// queues it for every attached caller.
func (d *drive) emit(e Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	e.ID = d.id + "-" + strconv.FormatUint(d.seq, 10)
	if len(d.log) == maxDriveLog { // drop the oldest quarter: a copy per 512 events, not per event
		n := copy(d.log, d.log[maxDriveLog/4:])
		clear(d.log[n:])
		d.log = d.log[:n]
	}
	d.log = append(d.log, e)
	for s := range d.subs {
		s.push(e)
	}
}

// since is what a caller resuming after the event named id has not read:
// the events after it when it is this drive's, else every event held
// (the caller's last event was of an earlier drive of the run). Called
// with d.mu held.
func (d *drive) since(id string) []Event {
	if id == "" {
		return nil
	}
	first := d.seq - uint64(len(d.log)) + 1 // the number of log[0]
	if rest, ok := strings.CutPrefix(id, d.id+"-"); ok {
		if n, err := strconv.ParseUint(rest, 10, 64); err == nil && n >= first && n <= d.seq {
			return slices.Clone(d.log[n+1-first:])
		}
	}
	return slices.Clone(d.log)
}

// attach registers a caller; its leaving (ctx ending) counts down the
// callers and, when it was the last, cancels the drive after linger unless
// another caller attaches meanwhile. A caller that wants no events gets
// no subscriber (nil); one that resumes after the event resumeAfter finds
// the events it missed queued.
func (d *drive) attach(ctx context.Context, events bool, resumeAfter string, linger time.Duration) (*subscriber, func()) {
	var s *subscriber
	d.mu.Lock()
	if events {
		s = &subscriber{wake: make(chan struct{}, 1), closed: d.finished, queue: d.since(resumeAfter)} // closed: attached in the instant the drive ended
		d.subs[s] = struct{}{}
	}
	d.callers++
	if d.lingering != nil {
		d.lingering.Stop()
		d.lingering = nil
	}
	d.mu.Unlock()
	var once sync.Once
	leave := func() {
		once.Do(func() {
			cause := context.Cause(ctx)
			d.mu.Lock()
			delete(d.subs, s)
			d.callers--
			last := d.callers == 0
			if last && linger > 0 && !d.finished {
				var t *time.Timer
				t = time.AfterFunc(linger, func() {
					// Under the lock, so that a caller attaching now
					// either stops this or finds the drive cancelled.
					// (A context's cancel takes no lock of the drive's.)
					d.mu.Lock()
					defer d.mu.Unlock()
					if d.lingering == t { // no caller came back since
						d.cancel(cause)
					}
				})
				d.lingering, last = t, false
			}
			d.mu.Unlock()
			if last {
				d.cancel(cause)
			}
		})
	}
	stop := context.AfterFunc(ctx, leave)
	return s, func() { stop() }
}

// finish records the result and closes every queue.
func (d *drive) finish(sum Summary, err error) {
	d.mu.Lock()
	d.sum, d.err, d.finished = sum, err, true
	for s := range d.subs {
		s.close()
	}
	if d.lingering != nil {
		d.lingering.Stop()
		d.lingering = nil
	}
	d.mu.Unlock()
	close(d.done)
}

// join returns the drive of runID in progress, or a new one that the caller
// leads (it runs the loop).
func (e *Executor) join(ctx context.Context, runID string) (d *drive, leader bool) {
	e.drivesMu.Lock()
	defer e.drivesMu.Unlock()
	if d, ok := e.drives[runID]; ok {
		return d, false
	}
	// The drive keeps the leader's values (trace context) but not its
	// cancellation: it ends when every attached caller has gone.
	dctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	d = &drive{id: strconv.FormatUint(rand.Uint64(), 36), ctx: dctx, cancel: cancel, done: make(chan struct{}), subs: map[*subscriber]struct{}{}}
	e.drives[runID] = d
	return d, true
}

func (e *Executor) forget(runID string, d *drive) {
	e.drivesMu.Lock()
	defer e.drivesMu.Unlock()
	if e.drives[runID] == d {
		delete(e.drives, runID)
	}
}

// Drive runs the loop for one run until it stops, and returns its summary.
// The error is non-nil only when the run failed (Status "failed"); a failed
// tool is a value in Summary.Calls, a cancelled drive is Status
// "cancelled". A Drive of a run already being driven attaches to that drive
// and returns its summary; a caller that leaves (ctx ends) stops waiting,
// and the drive is cancelled when its last caller has left. No goroutine
// started by Drive outlives it. A nil sink wants no events: a leader
// without one runs the loop on its own goroutine.
func (e *Executor) Drive(ctx context.Context, req Request, sink Sink) (Summary, error) {
	quiet := sink == nil
	if sink == nil {
		sink = func(Event) {}
	}
	// Every entry point checks the ids before it calls Drive, in its own
	// error shape; this is the one check that none can skip, before a run
	// id becomes a lease key, a subject or a path.
	if err := req.Check(); err != nil {
		sum := Summary{RunID: "", Upstream: e.up.Kind(), Status: StatusFailed, Calls: []CallResult{}, Error: err.Error()}
		sink(Event{Type: EventDone, Summary: &sum})
		return sum, err
	}
	if req.CallerKey != "" {
		ctx = e.up.AsCaller(ctx, req.CallerKey)
	}
	// One span per drive request, from the ownership check on: the loop of
	// a drive this request leads runs under it.
	ctx, span := e.tracer.Start(ctx, "toolsidecar.drive", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String("toolsidecar.run_id", req.RunID)))
	defer span.End()
	// Ownership before work: the caller must be able to read the run with
	// its own identity, or nothing is dispatched (nor joined) for it.
	run, err := e.up.Run(ctx, req.RunID)
	if err != nil {
		sum := e.notBegun(ctx, req, "reading the run: "+err.Error())
		sink(Event{Type: EventDone, Summary: &sum})
		return sum, fmt.Errorf("executor: reading run %s: %w", req.RunID, err)
	}
	if run.Owner != "" && run.Owner != req.Caller {
		// Nothing of the run is told: not its state, not its events.
		sum := e.notBegun(ctx, req, ErrNotOwner.Error())
		sink(Event{Type: EventDone, Summary: &sum})
		return sum, &UpstreamError{Status: http.StatusForbidden, Err: ErrNotOwner}
	}
	if (run.ThreadID != "" && run.ThreadID != req.ThreadID) || (run.AssistantID != "" && run.AssistantID != req.AssistantID) {
		sum := e.notBegun(ctx, req, fmt.Sprintf("the run belongs to thread %s and assistant %s, not to those of the request", run.ThreadID, run.AssistantID))
		sink(Event{Type: EventDone, Summary: &sum})
		return sum, fmt.Errorf("%w: %s", ErrConflict, sum.Error)
	}
	d, leader := e.join(ctx, req.RunID)
	sub, detach := d.attach(ctx, !(leader && quiet), req.ResumeAfter, req.Linger)
	defer detach()
	sink(Event{Type: EventAccepted})
	span.SetAttributes(attribute.Bool("toolsidecar.attached", !leader))
	if leader && quiet {
		// Nothing to deliver while the loop runs, so no second goroutine:
		// at thousands of waiting runs each one is a stack.
		sum, err := e.lead(d, req, run)
		e.forget(req.RunID, d)
		d.finish(sum, err)
		d.cancel(nil)
		return sum, err
	}
	if !leader {
		e.obs.DriveAttached()
		sub.deliver(sink, ctx.Done())
		if ctx.Err() != nil { // this caller left before the end
			return Summary{RunID: req.RunID, Upstream: e.up.Kind(), Status: StatusCancelled, Calls: []CallResult{}, Error: "caller left: " + context.Cause(ctx).Error()}, nil
		}
		<-d.done
		return d.sum, d.err
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		sum, err := e.lead(d, req, run)
		e.forget(req.RunID, d)
		d.finish(sum, err)
	})
	sub.deliver(sink, d.done) // the leader stays to the end: it owns the loop
	wg.Wait()
	d.cancel(nil)
	return d.sum, d.err
}

// The ends of a drive this sidecar leads: the loop under the run's lease,
// or a drive that fails before it starts.

// lead runs the loop of a drive this sidecar leads, under the run's lease
// when there are leases. The run read before (run) serves only without
// leases.
func (e *Executor) lead(d *drive, req Request, run Run) (Summary, error) {
	if e.leases == nil {
		return e.run(d.ctx, req, run, d.emit)
	}
	if req.Fresh {
		return e.runFresh(d, req, run)
	}
	// Taking the lease, or following its holder, returns before the run is
	// driven: its frame is then not under the loop's for the run's whole
	// life, and a waiting drive's stack is small enough for the collector
	// to shrink it (measured at 10,000 runs; git history of BENCHMARKS.md).
	lease, run, end := e.takeLease(d, req)
	if lease == nil {
		return end.sum, end.err
	}
	return e.runLeased(d, req, run, lease)
}

// failedBeforeStart ends a drive that could not begin.
func (e *Executor) failedBeforeStart(d *drive, req Request, msg string, err error) *leadEnd {
	sum := e.notBegun(d.ctx, req, msg)
	d.emit(Event{Type: EventDone, Summary: &sum})
	return &leadEnd{sum, fmt.Errorf("executor: run %s: %w", req.RunID, err)}
}

// notBegun is the summary of a drive that failed before its loop began
// (the run could not be read, it belongs to another thread, its lease
// could not be taken). It is logged at WARN with its cause and counted
// as a failed run of no turn, like any failed drive.
func (e *Executor) notBegun(ctx context.Context, req Request, msg string) Summary {
	e.log.WarnContext(ctx, "drive failed before it began", "run_id", req.RunID, "err", msg)
	e.obs.RunStarted()
	e.obs.RunDone(ctx, StatusFailed, 0, 0)
	return Summary{RunID: req.RunID, Upstream: e.up.Kind(), Status: StatusFailed, Calls: []CallResult{}, Error: msg}
}

// summaryErr is the error Drive returns with a summary relayed from
// another sidecar: non-nil only for a failed run.
func summaryErr(sum Summary) error {
	if sum.Status != StatusFailed {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrUpstream, sum.Error)
}
