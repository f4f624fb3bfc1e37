package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/projectdavid/toolsidecar/discovery"
	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/wire"
	"github.com/projectdavid/toolsidecar/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConcurrencyLimit: with 2 runners, 8 calls held at a barrier never
// run more than 2 at once. The barrier opens only once all 8 requests have
// reached the worker's connection and 2 handlers run, so the test does not
// depend on how fast the machine is.
func TestConcurrencyLimit(t *testing.T) {
	side, work := natstest.Connect(t)
	var cur, peak atomic.Int32
	release := make(chan struct{})
	natstest.Worker(t, work, map[string]tool.Handler{"w": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		n := cur.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		<-release
		cur.Add(-1)
		return []byte("ok"), nil
	}}, worker.WithConcurrency(2))
	c := natstest.Client(t, side, natstest.Prefix)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if r := c.Dispatch(context.Background(), natstest.Request("w", time.Minute)); r.Err != nil {
				t.Error(r.Err)
			}
		})
	}
	poll.Until(t, "8 requests at the worker and 2 handlers running", func() bool {
		return work.Stats().InMsgs >= 8 && cur.Load() == 2
	})
	for range 8 {
		release <- struct{}{}
	}
	wg.Wait()
	if peak.Load() != 2 {
		t.Errorf("peak concurrency %d, want 2", peak.Load())
	}
}

// TestProgressExtendsDeadline: a tool that runs more than twice its
// timeout but sends progress in between succeeds.
func TestProgressExtendsDeadline(t *testing.T) {
	side, work := natstest.Connect(t)
	natstest.Worker(t, work, map[string]tool.Handler{"slow": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		for range 10 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
			if err := c.Progress(); err != nil {
				return nil, err
			}
		}
		return []byte("done"), nil
	}})
	c := natstest.Client(t, side, natstest.Prefix)
	r := c.Dispatch(context.Background(), natstest.Request("slow", 400*time.Millisecond))
	if r.Err != nil || string(r.Data) != "done" || r.Progress == 0 {
		t.Fatalf("outcome %+v", r)
	}
}

// TestStopCancelsAtDeadline: Stop waits for calls in flight, and when its
// context ends first, cancels them with its cause and still waits for the
// handlers to return.
func TestStopCancelsAtDeadline(t *testing.T) {
	side, work := natstest.Connect(t)
	w, started := hangingWorker(t, work)
	c := natstest.Client(t, side, natstest.Prefix)
	got := make(chan tool.Outcome, 1)
	go func() { got <- c.Dispatch(context.Background(), natstest.Request("hang", time.Minute)) }()
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no grace: the call in flight is cancelled at once
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.Err == nil || r.Err.Type != tool.Cancelled {
		t.Errorf("outcome of a call cut by Stop: %+v, want cancelled", r)
	}
}

// hangingWorker starts (without stopping it) a worker whose tool "hang"
// runs until its context ends; started is closed when the first call
// starts.
func hangingWorker(t *testing.T, work *nats.Conn) (*worker.Worker, <-chan struct{}) {
	t.Helper()
	started := make(chan struct{})
	w := worker.New(work, natstest.Prefix)
	w.Handle("hang", func(ctx context.Context, c *tool.Call) ([]byte, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	return w, started
}

func TestBadListen(t *testing.T) {
	if _, err := embedded.Start(embedded.Config{Listen: "nonsense"}); err == nil {
		t.Error("bad listen accepted")
	}
}

// TestLateCancelSparesNextAttempt: a cancel published for attempt 1 that
// arrives while attempt 2 of the same call runs does not stop attempt 2;
// a cancel for attempt 2 does. Cancels are delivered in order, so a cancel
// of another call, sent after, is the barrier that proves the first one
// was handled.
func TestLateCancelSparesNextAttempt(t *testing.T) {
	side, work := natstest.Connect(t)
	started := make(chan string, 4)
	causes := make(chan string, 4)
	release := make(chan struct{})
	natstest.Worker(t, work, map[string]tool.Handler{"w": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		started <- c.ActionID
		select {
		case <-release:
			return []byte("ok"), nil
		case <-ctx.Done():
			causes <- c.ActionID
			return nil, ctx.Err()
		}
	}})
	c := natstest.Client(t, side, natstest.Prefix)
	cancel := func(action, attempt string) {
		m := nats.NewMsg(wire.CancelSubject(natstest.Prefix, action))
		m.Header.Set(tool.HeaderAttempt, attempt)
		if err := side.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	dispatch := func(action string) <-chan tool.Outcome {
		got := make(chan tool.Outcome, 1)
		req := natstest.Request("w", time.Minute) // attempt 2
		req.ActionID = action
		req.Body = []byte(strings.Replace(natstest.Manifest, "act_1", action, 1))
		go func() { got <- c.Dispatch(context.Background(), req) }()
		return got
	}
	first := dispatch("act_1")
	barrier := dispatch("act_2")
	<-started
	<-started
	cancel("act_1", "1") // late: attempt 1 is long gone
	cancel("act_2", "2") // the barrier
	if a := <-causes; a != "act_2" {
		t.Fatalf("%s was cancelled first, want only act_2", a)
	}
	close(release)
	if r := <-first; r.Err != nil || string(r.Data) != "ok" {
		t.Fatalf("attempt 2 after a late cancel of attempt 1: %+v", r)
	}
	// The cancelled handler sends no reply; closing the client wakes the
	// call that still waits for one.
	c.Close()
	if r := <-barrier; r.Err == nil || r.Err.Type != tool.WorkerCrash || !strings.Contains(r.Err.Message, "closed") {
		t.Fatalf("outcome %+v, want the closed client to wake the call", r)
	}
}

// TestProgressCannotOutlastMaxDuration: a worker that sends progress for
// ever keeps restarting the timeout, but the call ends at max_duration and
// the worker is told to stop.
func TestProgressCannotOutlastMaxDuration(t *testing.T) {
	side, work := natstest.Connect(t)
	stopped := make(chan error, 1)
	natstest.Worker(t, work, map[string]tool.Handler{"chatty": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				stopped <- context.Cause(ctx)
				return nil, ctx.Err()
			case <-tick.C:
				c.Progress()
			}
		}
	}})
	c := natstest.Client(t, side, natstest.Prefix)
	req := natstest.Request("chatty", 200*time.Millisecond)
	req.MaxDuration = 700 * time.Millisecond
	start := time.Now()
	r := c.Dispatch(context.Background(), req)
	if r.Err == nil || r.Err.Type != tool.Timeout || !strings.Contains(r.Err.Message, "max_duration") || r.Progress < 3 {
		t.Fatalf("outcome %+v, want a timeout at max_duration after progress", r)
	}
	if took := time.Since(start); took < req.MaxDuration {
		t.Errorf("ended after %s, before max_duration", took)
	}
	if err := <-stopped; !errors.Is(err, worker.ErrCancelledBySidecar) {
		t.Errorf("worker stopped by %v, want the cancel subject", err)
	}
}

// TestServiceStats: the worker is a micro service. $SRV.PING finds it,
// $SRV.INFO lists each tool's endpoint in the queue group, and $SRV.STATS
// reports what each endpoint did: requests, and in its data the calls
// completed, the errors and the calls in flight.
func TestServiceStats(t *testing.T) {
	side, work := natstest.Connect(t)
	natstest.Worker(t, work, map[string]tool.Handler{
		"ok":   func(ctx context.Context, c *tool.Call) ([]byte, error) { return []byte("fine"), nil },
		"fail": func(ctx context.Context, c *tool.Call) ([]byte, error) { return nil, errors.New("boom") },
	}, worker.WithService("flights", "1.4.0"))
	c := natstest.Client(t, side, natstest.Prefix)
	for range 3 {
		if r := c.Dispatch(context.Background(), natstest.Request("ok", time.Minute)); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	for range 2 {
		if r := c.Dispatch(context.Background(), natstest.Request("fail", time.Minute)); r.Err == nil {
			t.Fatal("fail succeeded")
		}
	}

	var ping micro.Ping
	request(t, side, "$SRV.PING.flights", &ping)
	if ping.Name != "flights" || ping.Version != "1.4.0" {
		t.Errorf("ping %+v", ping)
	}
	var info micro.Info
	request(t, side, "$SRV.INFO.flights", &info)
	subjects := map[string]string{}
	for _, e := range info.Endpoints {
		subjects[e.Subject] = e.QueueGroup
	}
	for _, name := range []string{"ok", "fail"} {
		if q, ok := subjects[wire.Subject(natstest.Prefix, name)]; !ok || q != wire.QueueGroup {
			t.Errorf("info endpoints %+v: no %s in queue group %s", info.Endpoints, name, wire.QueueGroup)
		}
	}
	var stats micro.Stats
	request(t, side, "$SRV.STATS.flights", &stats)
	want := map[string]worker.StatsData{"ok": {Completed: 3, Tool: "ok"}, "fail": {Completed: 2, Errors: 2, Tool: "fail"}}
	for _, e := range stats.Endpoints {
		var d worker.StatsData
		if err := json.Unmarshal(e.Data, &d); err != nil {
			t.Fatalf("endpoint %s data %s: %v", e.Name, e.Data, err)
		}
		w := want[e.Name]
		if d.Completed != w.Completed || d.Errors != w.Errors || d.InFlight != 0 || d.Tool != w.Tool || e.NumRequests != int(w.Completed) {
			t.Errorf("endpoint %s: requests %d, data %+v; want %+v", e.Name, e.NumRequests, d, w)
		}
		delete(want, e.Name)
	}
	if len(want) > 0 {
		t.Errorf("endpoints missing from stats: %v", want)
	}
}

// TestStatsTellDescribesFromCalls: micro counts every message on a tool's
// subject in num_requests, the sidecar's describe requests as well as
// calls, so after N calls and M describes num_requests is N+M; the
// endpoint's data says which is which: completed N, describes M.
func TestStatsTellDescribesFromCalls(t *testing.T) {
	side, work := natstest.Connect(t)
	w := natstest.Worker(t, work, map[string]tool.Handler{
		"ok": func(ctx context.Context, c *tool.Call) ([]byte, error) { return []byte("fine"), nil },
	})
	const calls, describes = 3, 5
	c := natstest.Client(t, side, natstest.Prefix)
	for range calls {
		if r := c.Dispatch(context.Background(), natstest.Request("ok", time.Minute)); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	subject := wire.Subject(natstest.Prefix, "ok")
	for range describes {
		got, err := discovery.Describe(context.Background(), side, []string{subject}, 0, 5*time.Second, tool.MaxDeclarationBytes)
		if err != nil || got[0].Refusals != 1 {
			t.Fatalf("describe: %+v, %v; want the refusal of a tool served without a declaration", got, err)
		}
	}
	var stats micro.Stats
	request(t, side, "$SRV.STATS."+wire.ServiceName, &stats)
	if len(stats.Endpoints) != 1 {
		t.Fatalf("stats endpoints %+v", stats.Endpoints)
	}
	e := stats.Endpoints[0]
	var d worker.StatsData
	if err := json.Unmarshal(e.Data, &d); err != nil {
		t.Fatalf("data %s: %v", e.Data, err)
	}
	if e.NumRequests != calls+describes || d.Completed != calls || d.Describes != describes || int64(e.NumRequests)-d.Describes != calls {
		t.Errorf("num_requests %d, data %s: want %d requests, of which %d describes and %d calls completed", e.NumRequests, e.Data, calls+describes, describes, calls)
	}
	if s := w.Stats(); len(s) != 1 || s[0].Describes != describes {
		t.Errorf("Stats() %+v: want the describes counted as in $SRV.STATS", s)
	}
}

func request(t *testing.T, nc *nats.Conn, subject string, v any) {
	t.Helper()
	m, err := nc.Request(subject, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", subject, err)
	}
	if err := json.Unmarshal(m.Data, v); err != nil {
		t.Fatalf("%s: %v in %s", subject, err, m.Data)
	}
}

// TestStopRunsDelivered: with one runner busy and two more calls already
// delivered to the worker's connection, Stop still runs those two (they
// were routed here; only new calls go elsewhere) instead of answering
// "worker stopping".
func TestStopRunsDelivered(t *testing.T) {
	side, work := natstest.Connect(t)
	release := make(chan struct{})
	var ran atomic.Int32
	w := worker.New(work, natstest.Prefix, worker.WithConcurrency(1))
	w.Handle("held", func(ctx context.Context, c *tool.Call) ([]byte, error) {
		ran.Add(1)
		<-release
		return []byte("done"), nil
	})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	c := natstest.Client(t, side, natstest.Prefix)
	var wg sync.WaitGroup
	outs := make(chan tool.Outcome, 3)
	for range 3 {
		wg.Go(func() { outs <- c.Dispatch(context.Background(), natstest.Request("held", time.Minute)) })
	}
	poll.Until(t, "3 requests at the worker and 1 handler running", func() bool {
		return work.Stats().InMsgs >= 3 && ran.Load() == 1
	})
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(context.Background()) }()
	close(release)
	wg.Wait()
	close(outs)
	for r := range outs {
		if r.Err != nil || string(r.Data) != "done" {
			t.Errorf("outcome %+v, want done", r)
		}
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if ran.Load() != 3 {
		t.Errorf("%d calls ran, want 3", ran.Load())
	}
}

// TestOversizedResult: a result larger than the server's max payload
// cannot be sent; the sidecar gets a tool_error that says so instead of
// waiting out the timeout, and the calls after it are answered.
func TestOversizedResult(t *testing.T) {
	side, work := natstest.Connect(t)
	natstest.Worker(t, work, map[string]tool.Handler{
		"big":   func(ctx context.Context, c *tool.Call) ([]byte, error) { return make([]byte, work.MaxPayload()+1), nil },
		"small": func(ctx context.Context, c *tool.Call) ([]byte, error) { return []byte("ok"), nil },
	})
	c := natstest.Client(t, side, natstest.Prefix)
	r := c.Dispatch(context.Background(), natstest.Request("big", 10*time.Second))
	var te *tool.Error
	if !errors.As(r.Err, &te) || te.Type != tool.ToolFailed || !strings.Contains(te.Message, "exceeds the NATS max payload") {
		t.Fatalf("outcome %+v, want a tool_error about the max payload", r)
	}
	if r := c.Dispatch(context.Background(), natstest.Request("small", time.Minute)); r.Err != nil || string(r.Data) != "ok" {
		t.Errorf("next call: %+v, want ok", r)
	}
}

// TestRunnersStartAsNeeded: a worker allowed 64 calls at once starts no
// runner before its first call, and one per call that finds every runner
// busy: 5 calls held at once start 5, not 64. Held calls never free their
// runner, so each request after the first finds none idle.
func TestRunnersStartAsNeeded(t *testing.T) {
	side, work := natstest.Connect(t)
	var running atomic.Int32
	release := make(chan struct{})
	w := natstest.Worker(t, work, map[string]tool.Handler{"held": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		running.Add(1)
		<-release
		return []byte("ok"), nil
	}}, worker.WithConcurrency(64))
	if n := worker.Started(w); n != 0 {
		t.Fatalf("%d runners before any call, want 0", n)
	}
	c := natstest.Client(t, side, natstest.Prefix)
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			if r := c.Dispatch(context.Background(), natstest.Request("held", time.Minute)); r.Err != nil {
				t.Error(r.Err)
			}
		})
	}
	poll.Until(t, "5 handlers running", func() bool { return running.Load() == 5 })
	if n := worker.Started(w); n != 5 {
		t.Errorf("%d runners for 5 calls at once, want 5", n)
	}
	close(release)
	wg.Wait()
}

// probeEnd is when and why a held probe call's context ended.
type probeEnd struct {
	cause    error
	at       time.Time
	deadline time.Time
}

// probe sends calls to a "probe" tool served by one runner. The calls are
// plain NATS requests with the protocol's headers, so that only the
// worker's own deadline can end them: no sidecar times out and cancels.
type probe struct {
	nc    *nats.Conn
	ended chan probeEnd   // a held call's end
	kept  chan *tool.Call // a quick call's Call, kept past its return
}

func newProbe(t *testing.T) *probe {
	t.Helper()
	side, work := natstest.Connect(t)
	p := &probe{nc: side, ended: make(chan probeEnd, 1), kept: make(chan *tool.Call, 1)}
	natstest.Worker(t, work, map[string]tool.Handler{"probe": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		if string(c.Args) == `"quick"` {
			p.kept <- c
			return []byte("quick"), nil
		}
		select {
		case <-ctx.Done():
			p.ended <- probeEnd{context.Cause(ctx), time.Now(), c.Deadline}
		case <-time.After(20 * time.Second): // the test fails on this
			p.ended <- probeEnd{errors.New("never cancelled"), time.Now(), c.Deadline}
		}
		return nil, ctx.Err()
	}}, worker.WithConcurrency(1))
	return p
}

// call sends a call with the given args and deadline, and returns the
// first message on its reply subject.
func (p *probe) call(t *testing.T, args string, deadline time.Duration) *nats.Msg {
	t.Helper()
	m := nats.NewMsg(wire.Subject(natstest.Prefix, "probe"))
	m.Data = []byte(`{"run_id": "run_1", "action_id": "act_1", "tool_call_id": "call_1", "tool": "probe", "args": ` + args + `}`)
	m.Header.Set(tool.HeaderDeadline, strconv.FormatInt(time.Now().Add(deadline).UnixMilli(), 10))
	m.Header.Set(tool.HeaderAttempt, "1")
	r, err := p.nc.RequestMsg(m, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestDeadlineEarlierThanTheTimer: the runner's timer is still set for a
// call an hour out when a call with a 200 ms deadline starts on the same
// runner; that call is still cancelled at its deadline, and its reply says
// so.
func TestDeadlineEarlierThanTheTimer(t *testing.T) {
	p := newProbe(t)
	if r := p.call(t, `"quick"`, time.Hour); string(r.Data) != "quick" {
		t.Fatalf("first call: %q", r.Data)
	}
	<-p.kept
	r := p.call(t, `"hold"`, 200*time.Millisecond)
	if e := <-p.ended; !errors.Is(e.cause, context.DeadlineExceeded) {
		t.Errorf("held call ended by %v, want its deadline", e.cause)
	}
	if got := r.Header.Get(tool.HeaderErrorType); got != string(tool.Timeout) {
		t.Errorf("held call's reply has error type %q, want %s", got, tool.Timeout)
	}
}

// TestDeadlineLaterThanTheTimer: the runner's timer, set for a quick
// call's 100 ms deadline, fires while the next call (400 ms) runs; that
// call is not cancelled before its own deadline, and is at it.
func TestDeadlineLaterThanTheTimer(t *testing.T) {
	p := newProbe(t)
	if r := p.call(t, `"quick"`, 100*time.Millisecond); string(r.Data) != "quick" {
		t.Fatalf("first call: %q", r.Data)
	}
	<-p.kept
	p.call(t, `"hold"`, 400*time.Millisecond)
	e := <-p.ended
	if !errors.Is(e.cause, context.DeadlineExceeded) {
		t.Fatalf("held call ended by %v, want its deadline", e.cause)
	}
	if e.at.Before(e.deadline) {
		t.Errorf("held call cancelled at %s, before its deadline %s", e.at.Format(time.StampMicro), e.deadline.Format(time.StampMicro))
	}
}

// TestProgressAfterReturn: a handler that kept its Call and reports
// progress after returning sends nothing and cannot extend the deadline
// of the next call on its runner.
func TestProgressAfterReturn(t *testing.T) {
	p := newProbe(t)
	if r := p.call(t, `"quick"`, time.Minute); string(r.Data) != "quick" {
		t.Fatalf("first call: %q", r.Data)
	}
	stale := <-p.kept
	stop := make(chan struct{})
	var stray atomic.Int32
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
				if err := stale.Progress(); err != nil {
					stray.Add(1)
				}
			}
		}
	})
	r := p.call(t, `"hold"`, 300*time.Millisecond)
	e := <-p.ended
	close(stop)
	wg.Wait()
	if !errors.Is(e.cause, context.DeadlineExceeded) {
		t.Errorf("held call ended by %v, want its deadline", e.cause)
	}
	if wire.IsProgress(r) {
		t.Error("the held call's first reply is a progress message: the stale Progress reached it")
	}
	if stray.Load() != 0 {
		t.Errorf("a stale Progress returned an error %d times", stray.Load())
	}
}

// TestStopCancelsCallWithoutActionID: Stop's cancel reaches a call whose
// manifest names no action (a plain NATS request): cancels are looked up
// on the runners, not in a registry of action IDs.
func TestStopCancelsCallWithoutActionID(t *testing.T) {
	side, work := natstest.Connect(t)
	w, started := hangingWorker(t, work)
	go side.Request(wire.Subject(natstest.Prefix, "hang"), []byte(`{"tool": "hang", "args": {}}`), 30*time.Second)
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(ctx) }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Stop did not cancel the call without an action ID")
	}
}

// TestMultiLineErrorReachesTheSidecar: an error message with line breaks
// (a validation error lists one problem per line) arrives as one line; in
// a header value a line break would end the header block and the reply
// would not parse, leaving the sidecar to wait for its timeout.
func TestMultiLineErrorReachesTheSidecar(t *testing.T) {
	side, work := natstest.Connect(t)
	natstest.Worker(t, work, map[string]tool.Handler{
		"strict": func(ctx context.Context, c *tool.Call) ([]byte, error) {
			return nil, tool.NewError(tool.InvalidArgs, "invalid arguments:\n- at /city: missing\r\n- at /days: not an integer")
		},
	})
	c := natstest.Client(t, side, natstest.Prefix)
	r := c.Dispatch(context.Background(), natstest.Request("strict", 5*time.Second))
	var te *tool.Error
	if !errors.As(r.Err, &te) || te.Type != tool.InvalidArgs || te.Message != "invalid arguments: - at /city: missing - at /days: not an integer" {
		t.Fatalf("outcome %+v, want the invalid_args error on one line", r)
	}
}

// TestDeclareDerivesTheSchema: a tool declared with a typed argument
// struct publishes its declaration in the endpoint's metadata, with the
// schema derived from the struct, and its handler gets the decoded
// arguments.
func TestDeclareDerivesTheSchema(t *testing.T) {
	side, work := natstest.Connect(t)
	type args struct {
		City string `json:"city" jsonschema:"the city"`
		Days int    `json:"days,omitempty"`
	}
	w := worker.New(work, natstest.Prefix)
	err := worker.Declare(w, "forecast", worker.Spec{Description: "Forecast", SideEffects: tool.ReadOnly, Timeout: 2 * time.Second, Retries: 1},
		func(_ context.Context, _ *tool.Call, a args) (map[string]any, error) {
			return map[string]any{"city": a.City, "days": a.Days}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if err := worker.Declare(w, "bad name!", worker.Spec{}, func(context.Context, *tool.Call, args) (int, error) { return 0, nil }); err == nil {
		t.Error("a tool name the sidecar refuses was declared")
	}
	natstest.Serve(t, w)
	info, err := micro.ControlSubject(micro.InfoVerb, wire.ServiceName, "")
	if err != nil {
		t.Fatal(err)
	}
	m, err := side.Request(info, nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var si micro.Info
	if err := json.Unmarshal(m.Data, &si); err != nil || len(si.Endpoints) != 1 {
		t.Fatalf("info %s: %v", m.Data, err)
	}
	d, err := tool.ParseDeclaration("forecast", []byte(si.Endpoints[0].Metadata[wire.ToolMetadataKey]))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Required   []string                   `json:"required"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(d.Parameters, &schema); err != nil || len(schema.Required) != 1 || schema.Required[0] != "city" ||
		!strings.Contains(string(schema.Properties["city"]), `"the city"`) {
		t.Errorf("declared schema %s", d.Parameters)
	}
	if d.Description != "Forecast" || d.SideEffects != tool.ReadOnly || d.TimeoutOrZero() != 2*time.Second || d.Retries != 1 {
		t.Errorf("declaration %+v", d)
	}
	c := natstest.Client(t, side, natstest.Prefix)
	req := natstest.Request("forecast", 5*time.Second)
	req.Body = []byte(`{"type":"tool_call_manifest","run_id":"run_1","action_id":"act_1","tool_call_id":"call_1","tool":"forecast","args":{"city":"Oslo","days":3}}`)
	if r := c.Dispatch(context.Background(), req); r.Err != nil || string(r.Data) != `{"city":"Oslo","days":3}` {
		t.Errorf("call: %+v (%s)", r, r.Data)
	}
}
