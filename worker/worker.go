// Package worker is the Go library for tool workers: it serves handlers as
// the endpoints of a NATS micro service (queue group "toolsidecar"; $SRV.PING,
// $SRV.INFO and $SRV.STATS answered by nats.go/micro), turns errors and
// panics into micro-style error replies, sends progress, and cancels a
// handler's context on the cancel subject. It links neither the NATS server
// nor Prometheus, so a worker binary stays small.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/projectdavid/toolsidecar/internal/version"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/wire"
)

// Option configures a [Worker].
type Option func(*Worker)

// WithConcurrency bounds the handlers running at once across tools.
// default: 64
func WithConcurrency(n int) Option {
	return func(w *Worker) {
		if n > 0 {
			w.limit = n
		}
	}
}

// WithLogger sets the worker's logger. default: discard
func WithLogger(l *slog.Logger) Option {
	return func(w *Worker) {
		if l != nil {
			w.log = l
		}
	}
}

// WithQueueGroup overrides the queue group (default "toolsidecar"), for
// tests that need two independent workers.
func WithQueueGroup(q string) Option { return func(w *Worker) { w.queue = q } }

// WithService names the micro service that $SRV.INFO and $SRV.STATS report
// (name: letters, digits, '-' and '_'; version: SemVer).
// default: wire.ServiceName ("toolsidecar-worker", shared by the Go, Node and
// Python libraries) and the toolsidecar module's version
func WithService(name, version string) Option {
	return func(w *Worker) { w.name, w.version = name, version }
}

// Worker serves handlers over NATS.
type Worker struct {
	nc       *nats.Conn
	prefix   string
	queue    string
	limit    int
	log      *slog.Logger
	handlers map[string]tool.Handler
	declared map[string]string // a declared tool's declaration, as JSON (see Declare)
	name     string
	version  string

	jobs     chan job      // unbuffered: a call waits for a free runner
	stop     chan struct{} // closed by Stop once the endpoints drained
	stopOnce sync.Once
	runners  sync.WaitGroup

	spawnMu  sync.Mutex
	started  int       // runners started, at most limit
	all      []*runner // the started runners, for cancels (see cancelWhere)
	quiesced bool      // no runner starts any more: runners.Wait has begun

	svc     micro.Service
	cancel  *nats.Subscription
	ownSubs int // subscriptions the service holds on nc (see Stop)
	stats   map[string]*endpointStats

	// The runners' replies, sent by one publisher (see publishLoop).
	outMu     sync.Mutex
	out       []reply
	wake      chan struct{} // buffered 1: the publisher has replies to send
	quit      chan struct{} // closed once the runners have returned
	quitOnce  sync.Once
	publisher sync.WaitGroup
}

// reply is one call's answer on its way to the publisher.
type reply struct {
	to, subject string // the reply subject, the request's subject (for the log)
	data        []byte
	err         error
}

// ErrCancelledBySidecar is the cause of a handler context cancelled through
// the cancel subject.
var ErrCancelledBySidecar = errors.New("worker: cancelled by the sidecar")

// New builds a worker; register handlers, then Start. No I/O.
func New(nc *nats.Conn, subjectPrefix string, opts ...Option) *Worker {
	w := &Worker{nc: nc, prefix: subjectPrefix, queue: wire.QueueGroup, limit: 64,
		log: slog.New(slog.DiscardHandler), handlers: map[string]tool.Handler{}, declared: map[string]string{},
		name: wire.ServiceName, version: moduleVersion(), stats: map[string]*endpointStats{}}
	for _, o := range opts {
		o(w)
	}
	w.jobs, w.stop = make(chan job), make(chan struct{})
	w.wake, w.quit = make(chan struct{}, 1), make(chan struct{})
	return w
}

// Handle registers the handler of a tool. It must be called before Start.
func (w *Worker) Handle(name string, h tool.Handler) {
	w.handlers[name] = h
	w.stats[name] = &endpointStats{}
}

type job struct {
	name string
	h    tool.Handler
	st   *endpointStats
	req  micro.Request
}

// endpointStats are the figures of one tool that micro's own cannot give:
// micro times its handler, which here only hands the call to a runner.
// They are the "data" of the endpoint in $SRV.STATS.
type endpointStats struct {
	InFlight    atomic.Int64
	Completed   atomic.Int64
	Errors      atomic.Int64
	HandlerTime atomic.Int64 // nanoseconds, summed
	// Describes counts the sidecar's describe requests, which micro counts
	// in the endpoint's num_requests as it does calls: every message on
	// the tool's subject reaches micro's handler, and micro has no way to
	// leave one out. The calls are num_requests less these.
	Describes atomic.Int64
}

// StatsData is the "data" object of an endpoint in $SRV.STATS.
type StatsData struct {
	InFlight             int64  `json:"in_flight"`
	Completed            int64  `json:"completed"`
	Errors               int64  `json:"errors"`
	AverageHandlerTimeNs int64  `json:"average_handler_time_ns"`
	Describes            int64  `json:"describes"`
	Runners              int    `json:"runners"`
	Tool                 string `json:"tool"`
}

func (w *Worker) statsData(e *micro.Endpoint) any {
	st := w.stats[e.Name]
	if st == nil {
		return nil
	}
	return st.data(e.Name, w.limit)
}

func (st *endpointStats) data(name string, runners int) StatsData {
	d := StatsData{InFlight: st.InFlight.Load(), Completed: st.Completed.Load(), Errors: st.Errors.Load(),
		Describes: st.Describes.Load(), Runners: runners, Tool: name}
	if d.Completed > 0 {
		d.AverageHandlerTimeNs = st.HandlerTime.Load() / d.Completed
	}
	return d
}

// Stats reports each tool's figures, as $SRV.STATS does, for a process
// that exports them otherwise (Prometheus in `toolsidecar worker`).
func (w *Worker) Stats() []StatsData {
	out := make([]StatsData, 0, len(w.stats))
	for name, st := range w.stats {
		out = append(out, st.data(name, w.limit))
	}
	return out
}

// Start starts the reply publisher, subscribes the cancel subject, then
// adds the micro service with one endpoint per registered tool. Runners
// start with the calls that need them (see startRunner).
func (w *Worker) Start() error {
	w.publisher.Go(w.publishLoop)
	var err error
	if w.cancel, err = w.nc.Subscribe(wire.CancelWildcard(w.prefix), w.onCancel); err != nil {
		w.abort()
		return fmt.Errorf("worker: subscribing cancel: %w", err)
	}
	before := w.nc.NumSubscriptions()
	w.svc, err = micro.AddService(w.nc, micro.Config{Name: w.name, Version: w.version,
		Description: "toolsidecar tool worker", QueueGroup: w.queue, StatsHandler: w.statsData,
		Metadata: map[string]string{"language": "go", "library_version": moduleVersion()}})
	if err != nil {
		w.abort()
		return fmt.Errorf("worker: %w", err)
	}
	for name, h := range w.handlers {
		opts := []micro.EndpointOpt{micro.WithEndpointSubject(wire.Subject(w.prefix, name))}
		if d, ok := w.declared[name]; ok {
			opts = append(opts, micro.WithEndpointMetadata(map[string]string{wire.ToolMetadataKey: d}))
		}
		if err := w.svc.AddEndpoint(name, w.serve(name, h, w.stats[name]), opts...); err != nil {
			w.abort()
			return fmt.Errorf("worker: adding endpoint %s: %w", name, err)
		}
	}
	w.ownSubs = w.nc.NumSubscriptions() - before
	return w.nc.Flush()
}

// abort undoes a failed Start.
func (w *Worker) abort() {
	if w.svc != nil {
		_ = w.svc.Stop()
	}
	if w.cancel != nil {
		_ = w.cancel.Unsubscribe()
	}
	w.stopOnce.Do(func() { close(w.stop) })
	w.quiesce()
}

// quiesce waits for the runners to return, then for the publisher to send
// their last replies.
func (w *Worker) quiesce() {
	w.spawnMu.Lock()
	w.quiesced = true
	w.spawnMu.Unlock()
	w.runners.Wait()
	w.quitOnce.Do(func() { close(w.quit) })
	w.publisher.Wait()
}

// Stop drains the endpoints (no new calls), waits for the calls in flight
// to finish, and, when ctx ends first, cancels them and waits for their
// handlers to return.
func (w *Worker) Stop(ctx context.Context) error {
	if w.svc == nil {
		return nil // never started
	}
	// The service stops by itself when the connection closes; then there
	// is nothing to drain.
	if !w.svc.Stopped() {
		before := w.nc.NumSubscriptions()
		_ = w.svc.Stop()
		// micro's Stop only starts the endpoints' drain. A call already
		// delivered must still reach a runner, so wait until the service's
		// subscriptions are gone (counted at Start: micro does not expose
		// them). An application that subscribes on the same connection
		// meanwhile only makes this wait until ctx ends.
		for w.nc.NumSubscriptions() > before-w.ownSubs && ctx.Err() == nil && w.nc.IsConnected() {
			time.Sleep(5 * time.Millisecond)
		}
	}
	w.stopOnce.Do(func() { close(w.stop) })
	done := make(chan struct{})
	go func() { w.quiesce(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		w.cancelWhere(func(string, int) bool { return true }, context.Cause(ctx))
		<-done
	}
	// Cancels keep reaching the calls in flight until the last returns.
	_ = w.cancel.Unsubscribe()
	return nil
}

// startRunner starts a runner with j as its first call, unless limit
// runners run already or the worker is stopping; it says whether it did.
//
// Runners are long-lived, not a goroutine per call: their stacks stay
// grown, which matters on the hot path (JSON decoding). They are started
// as calls need them, not all at Start: a worker whose limit is far above
// the calls it sees at once keeps only as many runners as it used. Fewer
// runners are fewer stacks for each collection to scan, and a call more
// often meets a runner whose stack and caches are warm (BENCHMARKS.md).
func (w *Worker) startRunner(j job) bool {
	w.spawnMu.Lock()
	defer w.spawnMu.Unlock()
	if w.quiesced || w.started >= w.limit {
		return false
	}
	w.started++
	r := &runner{w: w}
	r.timer = time.AfterFunc(time.Hour, r.expire)
	r.timer.Stop()
	w.all = append(w.all, r)
	w.runners.Go(func() { r.loop(j) })
	return true
}

// loop runs first, then calls until the worker stops.
func (r *runner) loop(first job) {
	defer r.timer.Stop()
	r.run(first)
	for {
		select {
		case j := <-r.w.jobs:
			r.run(j)
		case <-r.w.stop:
			return
		}
	}
}

// runner is what one runner goroutine keeps from call to call: the
// deadline timer and the state that progress and the timer read, so that
// a call allocates neither a timer nor closures over them. seq tells a
// Progress after its call returned that its call is over.
//
// The timer is not set for each call. It stays set at armed, and a call
// whose deadline is later leaves it be: when it fires, it cancels the
// running call if that call's deadline has passed and is set again for the
// deadline otherwise. Deadlines of successive calls mostly increase, so
// most calls touch no timer at all.
type runner struct {
	w     *Worker
	timer *time.Timer // runs expire

	mu      sync.Mutex
	seq     uint64
	cancel  context.CancelCauseFunc // the running call's; nil between calls
	action  string                  // its action ID and attempt, which cancels name
	attempt int
	to      string        // its reply subject
	budget  time.Duration // send to deadline; progress restarts it (0: no deadline)
	due     time.Time     // the running call's deadline
	armed   time.Time     // when the timer fires; zero: not set
}

// expire is the timer: the running call's deadline may have passed.
func (r *runner) expire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed = time.Time{}
	if r.cancel == nil || r.budget == 0 {
		return
	}
	if left := time.Until(r.due); left > 0 {
		r.armLocked(left)
		return
	}
	r.cancel(context.DeadlineExceeded)
}

// armLocked makes sure the timer fires by d from now. The caller holds r.mu.
func (r *runner) armLocked(d time.Duration) {
	at := time.Now().Add(d)
	if r.armed.IsZero() || at.Before(r.armed) {
		r.armed = at
		r.timer.Reset(d)
	}
}

// progress sends call seq's progress message and, as progress restarts
// the sidecar's timeout, restarts the deadline. After the call returned it
// does nothing.
func (r *runner) progress(seq uint64) error {
	r.mu.Lock()
	to, current := r.to, r.seq == seq
	r.mu.Unlock()
	if !current {
		return nil
	}
	if err := r.w.nc.PublishMsg(wire.ProgressMsg(to)); err != nil {
		return fmt.Errorf("worker: progress: %w", err)
	}
	r.mu.Lock()
	if r.seq == seq && r.budget > 0 {
		r.due = time.Now().Add(r.budget) // later: a timer set earlier sets itself again
	}
	r.mu.Unlock()
	return nil
}

// begin makes r's state the call's, with its deadline when it has one.
func (r *runner) begin(cancel context.CancelCauseFunc, call *tool.Call, to string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	r.cancel, r.action, r.attempt, r.to, r.budget = cancel, call.ActionID, call.Attempt, to, 0
	deadline := call.Deadline
	if !deadline.IsZero() {
		// A deadline already passed is a budget of 1ns: the call is
		// cancelled at once, as an AfterFunc of a negative duration would.
		r.budget = max(time.Until(deadline), 1)
		r.due = time.Now().Add(r.budget)
		r.armLocked(r.budget)
	}
	return r.seq
}

// end clears the call's state: a Progress or a firing finds none.
func (r *runner) end() {
	r.mu.Lock()
	r.seq++
	r.cancel, r.action, r.attempt, r.to, r.budget = nil, "", 0, "", 0
	r.mu.Unlock()
}

// onCancel stops the calls of an action. With a Tool-Attempt header it
// stops only that attempt: a late cancel of attempt 1 leaves attempt 2 be.
func (w *Worker) onCancel(m *nats.Msg) {
	id := m.Subject[len(wire.CancelSubject(w.prefix, "")):]
	attempt, err := strconv.Atoi(m.Header.Get(tool.HeaderAttempt))
	anyAttempt := err != nil // rare: a cancel that names no attempt
	w.cancelWhere(func(action string, a int) bool { return action == id && (anyAttempt || a == attempt) }, ErrCancelledBySidecar)
}

// cancelWhere cancels, with cause, the running calls whose action and
// attempt match. Each runner holds its running call's: a call registers
// nowhere else, and a cancel, which is rare, looks at every runner.
func (w *Worker) cancelWhere(match func(action string, attempt int) bool, cause error) {
	w.spawnMu.Lock()
	all := w.all
	w.spawnMu.Unlock()
	for _, r := range all {
		r.mu.Lock()
		if r.cancel != nil && match(r.action, r.attempt) {
			r.cancel(cause)
		}
		r.mu.Unlock()
	}
}

// serve hands each request to an idle runner, or to a new one below the
// limit; it blocks while limit runners are busy, which holds back this
// endpoint only. Replies go to the reply subject directly, not through
// micro's Request, which is not safe to answer from another goroutine than
// its handler's.
func (w *Worker) serve(name string, h tool.Handler, st *endpointStats) micro.HandlerFunc {
	return func(r micro.Request) {
		if r.Headers().Get(tool.HeaderDescribe) != "" {
			st.Describes.Add(1)
			w.describe(name, r)
			return
		}
		j := job{name, h, st, r}
		select {
		case w.jobs <- j:
			return
		default:
		}
		if w.startRunner(j) {
			return
		}
		select {
		case w.jobs <- j:
		case <-w.stop:
			// Sent from here: the publisher may already have returned.
			w.publish(reply{r.Reply(), r.Subject(), nil, tool.NewError(tool.WorkerCrash, "worker stopping")})
		}
	}
}

// describe answers the sidecar's request for a tool's declaration, from
// the handler's goroutine (micro's Request is safe to answer there). The
// sidecar serves a declaration only from such an answer: NATS delivers
// it only to workers that may serve the tool.
func (w *Worker) describe(name string, r micro.Request) {
	who := micro.WithHeaders(micro.Headers{tool.HeaderWorker: {"go " + w.svc.Info().ID}})
	d, ok := w.declared[name]
	var err error
	if ok {
		err = r.Respond([]byte(d), who)
	} else {
		err = r.Error("404", "tool "+name+" is served without a declaration", nil, who)
	}
	if err != nil {
		w.log.Warn("answering the sidecar's describe", "tool", name, "err", err)
	}
}

func (r *runner) run(j job) {
	j.st.InFlight.Add(1)
	start := time.Now()
	out, err := r.call(j)
	j.st.HandlerTime.Add(int64(time.Since(start)))
	j.st.InFlight.Add(-1)
	j.st.Completed.Add(1)
	if err != nil {
		j.st.Errors.Add(1)
	}
	// After the stats: whoever has the reply reads them with the call counted.
	r.w.respond(out)
}

// call runs one call; it returns the reply (none when the sidecar stopped
// waiting) and the call's error, if any.
func (r *runner) call(j job) (reply, error) {
	w := r.w
	m := j.req
	hdr := m.Headers()
	to := m.Reply()
	call, err := tool.ParseCall(j.name, m.Data())
	if err != nil {
		return reply{to, m.Subject(), nil, err}, err
	}
	call.Attempt, _ = strconv.Atoi(hdr.Get(tool.HeaderAttempt))
	call.IdempotencyKey = hdr.Get(tool.HeaderIdempotencyKey)
	call.Traceparent = hdr.Get(tool.HeaderTraceparent)
	if ms, err := strconv.ParseInt(hdr.Get(tool.HeaderDeadline), 10, 64); err == nil {
		call.Deadline = time.UnixMilli(ms)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	seq := r.begin(cancel, call, to)
	defer r.end()
	if to != "" {
		call.SetProgress(func() error { return r.progress(seq) })
	}
	data, err := tool.Invoke(ctx, j.h, call, w.log)
	if errors.Is(context.Cause(ctx), ErrCancelledBySidecar) {
		return reply{}, ErrCancelledBySidecar // the sidecar stopped waiting; nobody reads a reply
	}
	return reply{to, m.Subject(), data, err}, err
}

// respond hands a runner's reply to the publisher.
func (w *Worker) respond(r reply) {
	if r.to == "" {
		return
	}
	w.outMu.Lock()
	w.out = append(w.out, r)
	first := len(w.out) == 1
	w.outMu.Unlock()
	if first {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// publishLoop sends the runners' replies in batches. A runner that
// published its own reply woke nats.go's flusher, which ran as soon as the
// runner went back to wait: one write syscall per reply, against about
// twenty replies per write for a responder that answers on its
// subscription's goroutine (BENCHMARKS.md). Here the runners that are ready to run go
// first, their replies queue up, and the flusher, woken by the first of
// them, writes the whole batch at once.
func (w *Worker) publishLoop() {
	var batch []reply
	for quit := false; !quit; {
		select {
		case <-w.wake:
			runtime.Gosched() // let the runners that are ready add theirs
		case <-w.quit: // the runners have returned: send their last replies
			quit = true
		}
		batch = w.publishAll(batch)
	}
}

// publishAll sends the queued replies and returns the emptied slice, to be
// swapped in next time.
func (w *Worker) publishAll(spare []reply) []reply {
	w.outMu.Lock()
	batch := w.out
	w.out = spare[:0]
	w.outMu.Unlock()
	for i, r := range batch {
		w.publish(r)
		batch[i] = reply{} // keep no result alive
	}
	return batch
}

// publish sends a reply: a success without headers, an error in the
// micro-style error headers.
func (w *Worker) publish(r reply) {
	if r.to == "" {
		return
	}
	var perr error
	if r.err == nil {
		perr = w.nc.Publish(r.to, r.data)
	} else {
		perr = w.nc.PublishMsg(wire.ErrorMsg(r.to, tool.AsError(r.err)))
	}
	if perr != nil {
		w.log.Error("reply failed", "subject", r.subject, "err", perr)
		if errors.Is(perr, nats.ErrMaxPayload) {
			_ = w.nc.PublishMsg(wire.ErrorMsg(r.to, tool.NewError(tool.ToolFailed, "result of %d bytes exceeds the NATS max payload", len(r.data))))
		}
	}
}

// moduleVersion is the toolsidecar module's version as micro wants it
// (SemVer without the "v"), or 0.0.0 in a source build.
func moduleVersion() string {
	if v := strings.TrimPrefix(version.Module("github.com/projectdavid/toolsidecar"), "v"); v != "" && v != "(devel)" {
		return v
	}
	return "0.0.0"
}
