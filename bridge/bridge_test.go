package bridge_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/promtest"
	"github.com/projectdavid/toolsidecar/testkit/workerproc"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/wire"
	"github.com/projectdavid/toolsidecar/worker"
)

func TestMain(m *testing.M) {
	workerproc.MaybeRun() // when started as the worker process of a benchmark
	goleak.VerifyTestMain(m)
}

func open(t testing.TB, nc *nats.Conn) *bridge.Client {
	t.Helper()
	c, err := bridge.Open(nc, natstest.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestSuccessAndHeaders(t *testing.T) {
	side, work := natstest.Connect(t)
	var got *tool.Call
	natstest.Worker(t, work, map[string]tool.Handler{"echo": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		got = c
		return append([]byte(`{"args": `), append(c.Args, '}')...), nil
	}})
	r := natstest.Request("echo", time.Second)
	r.Traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	out := open(t, side).Dispatch(context.Background(), r)
	if out.Err != nil || string(out.Data) != `{"args": {"x": 1}}` || !out.Sent {
		t.Fatalf("outcome %+v", out)
	}
	if got.ActionID != "act_1" || got.ToolCallID != "call_1" || got.RunID != "run_1" || string(got.Manifest) != natstest.Manifest {
		t.Errorf("call fields %+v", got)
	}
	if got.Attempt != 2 || got.IdempotencyKey != "act_1" || got.Traceparent != r.Traceparent {
		t.Errorf("headers %d %q %q", got.Attempt, got.IdempotencyKey, got.Traceparent)
	}
	if until := time.Until(got.Deadline); until <= 0 || until > time.Second {
		t.Errorf("deadline %v from now", until)
	}
}

func TestErrorReplies(t *testing.T) {
	side, work := natstest.Connect(t)
	natstest.Worker(t, work, map[string]tool.Handler{
		"typed": func(context.Context, *tool.Call) ([]byte, error) {
			return nil, tool.NewError(tool.RateLimited, "slow down")
		},
		"plain":  func(context.Context, *tool.Call) ([]byte, error) { return nil, errors.New("disk full") },
		"panics": func(context.Context, *tool.Call) ([]byte, error) { panic("boom") },
	})
	c := open(t, side)
	cases := []struct {
		tool string
		want tool.Error
	}{
		{"typed", tool.Error{Type: tool.RateLimited, Code: 429, Message: "slow down"}},
		{"plain", tool.Error{Type: tool.ToolFailed, Code: 422, Message: "disk full"}},
		{"panics", tool.Error{Type: tool.WorkerCrash, Code: 500, Message: "worker panicked: boom"}},
		{"absent", tool.Error{Type: tool.NotFound, Code: 404, Message: `no worker is serving tool "absent" (no responders on t.absent)`}},
	}
	for _, tc := range cases {
		r := c.Dispatch(context.Background(), natstest.Request(tc.tool, time.Second))
		if r.Err == nil || *r.Err != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.tool, r.Err, tc.want)
		}
		if tc.tool == "absent" && r.Sent {
			t.Errorf("no responders must report Sent=false")
		}
	}
	if !errors.Is(error(&tool.Error{Type: tool.Timeout, Code: 504}), &tool.Error{Type: tool.Timeout}) || errors.Is(error(&tool.Error{Type: tool.Timeout}), &tool.Error{Type: tool.Cancelled}) {
		t.Error("Error.Is mismatch")
	}
}

// TestMicroStyleReply: a worker that answers with micro's headers alone
// (no Tool-Error-Type) decodes by code.
func TestMicroStyleReply(t *testing.T) {
	side, work := natstest.Connect(t)
	sub, _ := work.Subscribe("t.micro", func(m *nats.Msg) {
		out := nats.NewMsg(m.Reply)
		out.Header.Set(tool.HeaderServiceError, "bad input")
		out.Header.Set(tool.HeaderServiceCode, "400")
		m.RespondMsg(out)
	})
	defer sub.Unsubscribe()
	work.Flush()
	r := open(t, side).Dispatch(context.Background(), natstest.Request("micro", time.Second))
	if r.Err == nil || r.Err.Type != tool.InvalidArgs || r.Err.Message != "bad input" {
		t.Fatalf("got %+v", r.Err)
	}
}

// TestTimeoutCancelsWorker: the sidecar gives up at the timeout, says so
// on the cancel subject, and the handler's context ends.
func TestTimeoutCancelsWorker(t *testing.T) {
	side, work := natstest.Connect(t)
	cause := make(chan error, 1)
	natstest.Worker(t, work, map[string]tool.Handler{"hang": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, ctx.Err()
	}})
	r := open(t, side).Dispatch(context.Background(), natstest.Request("hang", 100*time.Millisecond))
	if r.Err == nil || r.Err.Type != tool.Timeout || !r.Sent {
		t.Fatalf("outcome %+v", r)
	}
	// The worker stops either on the cancel subject or on its own deadline.
	if err := <-cause; !errors.Is(err, worker.ErrCancelledBySidecar) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("worker cause %v", err)
	}
}

func TestContextCancelPublishesCancel(t *testing.T) {
	side, work := natstest.Connect(t)
	started := make(chan struct{})
	cause := make(chan error, 1)
	natstest.Worker(t, work, map[string]tool.Handler{"hang": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		close(started)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, ctx.Err()
	}})
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() { <-started; cancel(errors.New("run cancelled in Core")) }()
	r := open(t, side).Dispatch(ctx, natstest.Request("hang", time.Minute))
	if r.Err == nil || r.Err.Type != tool.Cancelled || !strings.Contains(r.Err.Message, "run cancelled in Core") {
		t.Fatalf("outcome %+v", r.Err)
	}
	// The handler can only end through the cancel subject: its deadline
	// is a minute away.
	if err := <-cause; !errors.Is(err, worker.ErrCancelledBySidecar) {
		t.Errorf("worker cause %v, want ErrCancelledBySidecar", err)
	}
	if r := open(t, side).Dispatch(ctx, natstest.Request("hang", time.Second)); r.Err == nil || r.Err.Type != tool.Cancelled || r.Sent {
		t.Errorf("dispatch on a dead context: %+v", r)
	}
}

func TestClosedClientAndBadManifest(t *testing.T) {
	side, work := natstest.Connect(t)
	natstest.Worker(t, work, map[string]tool.Handler{"echo": func(ctx context.Context, c *tool.Call) ([]byte, error) { return []byte("x"), nil }})
	c := open(t, side)
	r := c.Dispatch(context.Background(), tool.Request{Tool: "echo", Body: []byte("not json"), Timeout: time.Second})
	if r.Err == nil || r.Err.Type != tool.InvalidArgs {
		t.Errorf("bad manifest: %+v", r)
	}
	c.Close()
	if r := c.Dispatch(context.Background(), natstest.Request("echo", time.Second)); r.Err == nil || !strings.Contains(r.Err.Message, "closed") {
		t.Errorf("closed client: %+v", r)
	}
	if tp := bridge.NewTraceparent(); len(tp) != 55 || !strings.HasPrefix(tp, "00-") {
		t.Errorf("traceparent %q", tp)
	}
}

// TestLive: a toolsidecar worker and a real nats.go micro service are both
// found through $SRV.INFO.
func TestLive(t *testing.T) {
	side, work := natstest.Connect(t)
	natstest.Worker(t, work, map[string]tool.Handler{"echo": func(context.Context, *tool.Call) ([]byte, error) { return nil, nil }})
	svc, err := micro.AddService(work, micro.Config{Name: "weather", Version: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	svc.AddEndpoint("get_weather", micro.HandlerFunc(func(r micro.Request) { r.Respond([]byte("sunny")) }), micro.WithEndpointSubject("t.get_weather"))
	other, _ := micro.AddService(work, micro.Config{Name: "other", Version: "1.0.0"})
	defer other.Stop()
	other.AddEndpoint("x", micro.HandlerFunc(func(r micro.Request) {}), micro.WithEndpointSubject("elsewhere.x"))
	work.Flush()
	live, err := open(t, side).Live(context.Background(), 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if !live["echo"] || !live["get_weather"] || len(live) != 2 {
		t.Errorf("live %v, want echo and get_weather only", live)
	}
	// A micro endpoint is served like any worker.
	r := open(t, side).Dispatch(context.Background(), natstest.Request("get_weather", time.Second))
	if r.Err != nil || string(r.Data) != "sunny" {
		t.Errorf("micro endpoint outcome %+v", r)
	}
}

// TestRepliesUnguessable: on a bus where a worker may publish anywhere, a
// worker that sees its own request's reply subject still cannot guess
// another call's: the forged replies of every counter-like token never
// become the outcome of the concurrent call.
func TestRepliesUnguessable(t *testing.T) {
	side, work := natstest.Connect(t)
	release := make(chan struct{})
	natstest.Worker(t, work, map[string]tool.Handler{"b": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		select {
		case <-release:
			return []byte("honest"), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}})
	forged := make(chan struct{})
	sub, err := work.Subscribe("t.a", func(m *nats.Msg) {
		inbox := m.Reply[:strings.LastIndexByte(m.Reply, '.')]
		for i := range 256 {
			for _, tok := range []string{strconv.Itoa(i), strconv.FormatInt(int64(i), 36), fmt.Sprintf("%x", i)} {
				work.Publish(inbox+"."+tok, []byte("forged"))
			}
		}
		m.Respond([]byte("a"))
		work.Flush()
		close(forged)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	work.Flush()
	c := open(t, side)
	got := make(chan tool.Outcome, 1)
	go func() { got <- c.Dispatch(context.Background(), natstest.Request("b", 10*time.Second)) }()
	if r := c.Dispatch(context.Background(), natstest.Request("a", 10*time.Second)); string(r.Data) != "a" {
		t.Fatalf("a: %+v", r)
	}
	<-forged
	side.Flush() // the forgeries have reached the client
	close(release)
	if r := <-got; r.Err != nil || string(r.Data) != "honest" {
		t.Fatalf("b's outcome %q %+v, want the honest reply", r.Data, r.Err)
	}
}

// TestGeneratedTraceparentUnsampled: a call without a trace of its own gets
// a fresh traceparent that says it is not sampled, since nobody records it;
// a call's own traceparent travels unchanged (TestSuccessAndHeaders).
func TestGeneratedTraceparentUnsampled(t *testing.T) {
	side, work := natstest.Connect(t)
	got := make(chan string, 2)
	natstest.Worker(t, work, map[string]tool.Handler{"echo": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		got <- c.Traceparent
		return nil, nil
	}})
	c := open(t, side)
	for range 2 {
		if r := c.Dispatch(context.Background(), natstest.Request("echo", time.Second)); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	first, second := <-got, <-got
	for _, tp := range []string{first, second} {
		if len(tp) != 55 || !strings.HasPrefix(tp, "00-") || !strings.HasSuffix(tp, "-00") {
			t.Errorf("generated traceparent %q: want version 00, flags 00", tp)
		}
	}
	if first == second {
		t.Errorf("two calls share the trace %q", first)
	}
	if tp := bridge.NewTraceparent(); !strings.HasSuffix(tp, "-01") {
		t.Errorf("NewTraceparent %q: want flags 01", tp)
	}
}

// TestLateReplyNeverReachesNextCall: a call that gave up releases its wait
// for reuse; the worker's late answer to it must be dropped, not taken as
// the outcome of the call that waits next.
func TestLateReplyNeverReachesNextCall(t *testing.T) {
	side, work := natstest.Connect(t)
	natstest.Worker(t, work, map[string]tool.Handler{
		"late": func(ctx context.Context, c *tool.Call) ([]byte, error) {
			time.Sleep(300 * time.Millisecond) // ignores the cancel on purpose
			return []byte("late"), nil
		},
		"slow": func(ctx context.Context, c *tool.Call) ([]byte, error) {
			time.Sleep(600 * time.Millisecond)
			return []byte("slow"), nil
		},
	})
	c := open(t, side)
	for i := range 3 {
		// Calls of their own, so that the late call's cancel cannot stop
		// the next one.
		late, slow := natstest.Request("late", 50*time.Millisecond), natstest.Request("slow", 5*time.Second)
		late.ActionID, slow.ActionID = fmt.Sprint("late_", i), fmt.Sprint("slow_", i)
		if r := c.Dispatch(context.Background(), late); r.Err == nil || r.Err.Type != tool.Timeout {
			t.Fatalf("round %d: late call %+v, want a timeout", i, r)
		}
		// The late reply lands while this call waits, on the wait the
		// first call gave back.
		if r := c.Dispatch(context.Background(), slow); r.Err != nil || string(r.Data) != "slow" {
			t.Fatalf("round %d: next call got %+v, want its own reply", i, r)
		}
	}
}

// TestReplyDuringSlowOnSent: the OnSent hook (the sidecar telling Core the
// call started) may outlast the tool's timeout; a reply that arrived
// meanwhile is the outcome, not a timeout.
func TestReplyDuringSlowOnSent(t *testing.T) {
	side, work := natstest.Connect(t)
	natstest.Worker(t, work, map[string]tool.Handler{"echo": func(ctx context.Context, c *tool.Call) ([]byte, error) { return []byte("fast"), nil }})
	c := open(t, side)
	for i := range 8 {
		r := natstest.Request("echo", 20*time.Millisecond)
		r.ActionID = fmt.Sprint("act_", i)
		r.OnSent = func() { time.Sleep(60 * time.Millisecond) }
		if out := c.Dispatch(context.Background(), r); out.Err != nil || string(out.Data) != "fast" {
			t.Fatalf("dispatch %d: %+v, want the reply that came during OnSent", i, out)
		}
	}
}

// TestConcurrentCallsEachGetTheirOutcome: 50 calls wait for their workers
// at once, and each gets its own outcome, exactly once.
func TestConcurrentCallsEachGetTheirOutcome(t *testing.T) {
	side, work := natstest.Connect(t)
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free()
	var arrived atomic.Int32
	natstest.Worker(t, work, map[string]tool.Handler{"hold": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		arrived.Add(1)
		<-release
		return c.Args, nil
	}})
	c := open(t, side)
	const n = 50
	var mu sync.Mutex
	got := map[int][]string{}
	var wg sync.WaitGroup
	for i := range n {
		r := natstest.Request("hold", 10*time.Second)
		r.ActionID, r.Body = fmt.Sprint("act_", i), fmt.Appendf(nil, `{"tool_call_id":"c%d","action_id":"act_%d","tool":"hold","args":{"i":%d}}`, i, i, i)
		wg.Go(func() {
			o := c.Dispatch(context.Background(), r)
			mu.Lock()
			got[i] = append(got[i], string(o.Data)+errText(o))
			mu.Unlock()
		})
	}
	poll.Until(t, "every call to reach its worker", func() bool { return arrived.Load() == n })
	free()
	wg.Wait()
	for i := range n {
		if want := fmt.Sprintf(`{"i":%d}`, i); len(got[i]) != 1 || got[i][0] != want {
			t.Errorf("call %d: outcomes %q, want exactly [%s]", i, got[i], want)
		}
	}
}

func errText(o tool.Outcome) string {
	if o.Err == nil {
		return ""
	}
	return " error: " + o.Err.Message
}

// TestLateCallbacksIgnored: a waiter is reused once its call ends, and the
// timer or context callback of the earlier call may fire late; neither
// may end the call that waits now.
func TestLateCallbacksIgnored(t *testing.T) {
	side, work := natstest.Connect(t)
	natstest.Worker(t, work, map[string]tool.Handler{"slow": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		time.Sleep(200 * time.Millisecond)
		return []byte("slow"), nil
	}})
	c := open(t, side)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan tool.Outcome, 1)
	go func() { out <- c.Dispatch(ctx, natstest.Request("slow", 5*time.Second)) }()
	poll.Until(t, "the call to wait for its worker", func() bool { return c.Waiting() == 1 })
	if n := c.FireStale(); n != 1 {
		t.Fatalf("%d calls waiting, want 1", n)
	}
	if o := <-out; o.Err != nil || string(o.Data) != "slow" {
		t.Fatalf("outcome %+v, want the worker's reply", o)
	}
}

// TestCloseEndsWaitingCalls: Close ends every call waiting for its worker,
// once, with a crash outcome that names it.
func TestCloseEndsWaitingCalls(t *testing.T) {
	side, work := natstest.Connect(t)
	release := make(chan struct{})
	defer close(release)
	natstest.Worker(t, work, map[string]tool.Handler{"hold": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		<-release
		return []byte("late"), nil
	}})
	c, err := bridge.Open(side, natstest.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan tool.Outcome, 2)
	for range 2 {
		go func() { out <- c.Dispatch(context.Background(), natstest.Request("hold", 10*time.Second)) }()
	}
	poll.Until(t, "both calls to wait for their worker", func() bool { return c.Waiting() == 2 })
	c.Close()
	for range 2 {
		if o := <-out; o.Err == nil || o.Err.Type != tool.WorkerCrash || !strings.Contains(o.Err.Message, "closed") {
			t.Errorf("outcome after Close: %+v", o)
		}
	}
}

// TestProgressFlood: a worker floods a call with 20,000 progress messages,
// then answers. The call gets the worker's answer; its followers are told
// of progress 10 times at once, then at most once per 100 ms, and every progress
// message is counted, shown or dropped
// (toolsidecar_nats_progress_dropped_total). Before, each one reset the timer
// and was shown: 1.6 M in 6 s took 1.8 of 2 cores.
func TestProgressFlood(t *testing.T) {
	side, work := natstest.Connect(t)
	const flood = 20000
	sub, err := work.QueueSubscribe(natstest.Prefix+".flood", "toolsidecar", func(m *nats.Msg) {
		for range flood {
			_ = work.PublishMsg(wire.ProgressMsg(m.Reply))
		}
		_ = m.Respond([]byte(`"done"`))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := work.Flush(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	c, err := bridge.Open(side, natstest.Prefix, bridge.WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var shown atomic.Int64
	r := natstest.Request("flood", 30*time.Second)
	r.OnProgress = func() { shown.Add(1) }
	start := time.Now()
	out := c.Dispatch(context.Background(), r)
	took := time.Since(start)
	if out.Err != nil || string(out.Data) != `"done"` || out.Progress != flood {
		t.Fatalf("outcome %+v: want the worker's answer after %d progress messages", out, flood)
	}
	if most := 11 + int64(took/(100*time.Millisecond)); shown.Load() > most {
		t.Errorf("progress shown %d times in %v: want at most %d", shown.Load(), took, most)
	}
	if dropped := promtest.Value(t, reg, "toolsidecar_nats_progress_dropped_total"); int64(dropped)+shown.Load() != flood {
		t.Errorf("%v progress messages dropped and %d shown: want %d in all", dropped, shown.Load(), flood)
	}
}
