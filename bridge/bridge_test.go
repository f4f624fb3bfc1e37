package bridge

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// connect starts a real NATS server on a random port and returns two
// connections: one for the sidecar, one for workers.
func connect(t *testing.T) (*nats.Conn, *nats.Conn) {
	t.Helper()
	ns, err := StartEmbedded("127.0.0.1:-1")
	if err != nil {
		t.Fatal(err)
	}
	side, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	work, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		side.Close()
		work.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	return side, work
}

func startWorker(t *testing.T, nc *nats.Conn, handlers map[string]Handler, opts ...WorkerOption) *Worker {
	t.Helper()
	w := NewWorker(nc, "t", opts...)
	for name, h := range handlers {
		w.Handle(name, h)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		w.Stop(ctx)
	})
	return w
}

func open(t *testing.T, nc *nats.Conn) *Client {
	t.Helper()
	c, err := Open(nc, "t")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

const manifest = `{"type": "tool_call_manifest", "run_id": "run_1", "action_id": "act_1", "tool_call_id": "call_1", "tool": "echo", "args": {"x": 1}}`

func req(tool string, timeout time.Duration) Request {
	return Request{Tool: tool, Subject: "t." + tool, Body: []byte(manifest), ActionID: "act_1", Attempt: 2, Timeout: timeout}
}

func TestSuccessAndHeaders(t *testing.T) {
	side, work := connect(t)
	var got *Call
	startWorker(t, work, map[string]Handler{"echo": func(ctx context.Context, c *Call) ([]byte, error) {
		got = c
		return append([]byte(`{"args": `), append(c.Args, '}')...), nil
	}})
	r := open(t, side).Dispatch(context.Background(), Request{Tool: "echo", Subject: "t.echo", Body: []byte(manifest), ActionID: "act_1", Attempt: 2, Timeout: time.Second, Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
	if r.Err != nil || string(r.Data) != `{"args": {"x": 1}}` || !r.Sent {
		t.Fatalf("reply %+v", r)
	}
	if got.ActionID != "act_1" || got.ToolCallID != "call_1" || got.RunID != "run_1" || string(got.Manifest) != manifest {
		t.Errorf("call fields %+v", got)
	}
	if got.Attempt != 2 || got.IdempotencyKey != "act_1" || got.Traceparent != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Errorf("headers %d %q %q", got.Attempt, got.IdempotencyKey, got.Traceparent)
	}
	if until := time.Until(got.Deadline); until <= 0 || until > time.Second {
		t.Errorf("deadline %v from now", until)
	}
}

func TestErrorReplies(t *testing.T) {
	side, work := connect(t)
	startWorker(t, work, map[string]Handler{
		"typed":  func(context.Context, *Call) ([]byte, error) { return nil, NewError(RateLimited, "slow down") },
		"plain":  func(context.Context, *Call) ([]byte, error) { return nil, errors.New("disk full") },
		"panics": func(context.Context, *Call) ([]byte, error) { panic("boom") },
	})
	c := open(t, side)
	cases := []struct {
		tool string
		want Error
	}{
		{"typed", Error{Type: RateLimited, Code: 429, Message: "slow down"}},
		{"plain", Error{Type: ToolFailed, Code: 422, Message: "disk full"}},
		{"panics", Error{Type: WorkerCrash, Code: 500, Message: "worker panicked: boom"}},
		{"absent", Error{Type: NotFound, Code: 404, Message: `no worker is serving tool "absent" (no responders on t.absent)`}},
	}
	for _, tc := range cases {
		r := c.Dispatch(context.Background(), req(tc.tool, time.Second))
		if r.Err == nil || *r.Err != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.tool, r.Err, tc.want)
		}
		if tc.tool == "absent" && r.Sent {
			t.Errorf("no responders must report Sent=false")
		}
	}
	if !errors.Is(error(&Error{Type: Timeout, Code: 504}), &Error{Type: Timeout}) || errors.Is(error(&Error{Type: Timeout}), &Error{Type: Cancelled}) {
		t.Error("Error.Is mismatch")
	}
}

// TestMicroStyleReply: a worker that answers with micro's headers alone
// (no Tool-Error-Type) decodes by code.
func TestMicroStyleReply(t *testing.T) {
	side, work := connect(t)
	sub, _ := work.Subscribe("t.micro", func(m *nats.Msg) {
		out := nats.NewMsg(m.Reply)
		out.Header.Set(HeaderServiceError, "bad input")
		out.Header.Set(HeaderServiceCode, "400")
		m.RespondMsg(out)
	})
	defer sub.Unsubscribe()
	work.Flush()
	r := open(t, side).Dispatch(context.Background(), req("micro", time.Second))
	if r.Err == nil || r.Err.Type != InvalidArgs || r.Err.Message != "bad input" {
		t.Fatalf("got %+v", r.Err)
	}
}

func TestTimeoutCancelsWorker(t *testing.T) {
	side, work := connect(t)
	cause := make(chan error, 1)
	startWorker(t, work, map[string]Handler{"hang": func(ctx context.Context, c *Call) ([]byte, error) {
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, ctx.Err()
	}})
	r := open(t, side).Dispatch(context.Background(), req("hang", 100*time.Millisecond))
	if r.Err == nil || r.Err.Type != Timeout || !r.Sent {
		t.Fatalf("reply %+v", r)
	}
	select {
	case err := <-cause:
		// The worker stops either on the cancel subject or on its own deadline.
		if !errors.Is(err, ErrCancelledBySidecar) && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("worker cause %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("worker never stopped")
	}
}

func TestContextCancelPublishesCancel(t *testing.T) {
	side, work := connect(t)
	started := make(chan struct{})
	cause := make(chan error, 1)
	startWorker(t, work, map[string]Handler{"hang": func(ctx context.Context, c *Call) ([]byte, error) {
		close(started)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, ctx.Err()
	}})
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() { <-started; cancel(errors.New("run cancelled in Core")) }()
	r := open(t, side).Dispatch(ctx, req("hang", 10*time.Second))
	if r.Err == nil || r.Err.Type != Cancelled || !strings.Contains(r.Err.Message, "run cancelled in Core") {
		t.Fatalf("reply %+v", r.Err)
	}
	select {
	case err := <-cause:
		if !errors.Is(err, ErrCancelledBySidecar) {
			t.Errorf("worker cause %v, want ErrCancelledBySidecar", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("worker was not cancelled")
	}
	if r := open(t, side).Dispatch(ctx, req("hang", time.Second)); r.Err == nil || r.Err.Type != Cancelled || r.Sent {
		t.Errorf("dispatch on a dead context: %+v", r)
	}
}

// TestProgressExtendsDeadline: a tool that runs twice its timeout but sends
// progress in between succeeds.
func TestProgressExtendsDeadline(t *testing.T) {
	side, work := connect(t)
	startWorker(t, work, map[string]Handler{"slow": func(ctx context.Context, c *Call) ([]byte, error) {
		for range 12 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
			if err := c.Progress(); err != nil {
				return nil, err
			}
		}
		return []byte("done"), nil
	}})
	r := open(t, side).Dispatch(context.Background(), req("slow", 300*time.Millisecond))
	if r.Err != nil || string(r.Data) != "done" || r.Progress == 0 {
		t.Fatalf("reply %+v", r)
	}
}

func TestWorkerConcurrencyLimit(t *testing.T) {
	side, work := connect(t)
	var cur, peak atomic.Int32
	startWorker(t, work, map[string]Handler{"w": func(ctx context.Context, c *Call) ([]byte, error) {
		n := cur.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
		cur.Add(-1)
		return []byte("ok"), nil
	}}, WithConcurrency(2))
	c := open(t, side)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if r := c.Dispatch(context.Background(), req("w", 5*time.Second)); r.Err != nil {
				t.Error(r.Err)
			}
		})
	}
	wg.Wait()
	if peak.Load() != 2 {
		t.Errorf("peak concurrency %d, want 2", peak.Load())
	}
}

func TestClosedClientAndBadManifest(t *testing.T) {
	side, work := connect(t)
	startWorker(t, work, map[string]Handler{"echo": func(ctx context.Context, c *Call) ([]byte, error) { return []byte("x"), nil }})
	c := open(t, side)
	r := c.Dispatch(context.Background(), Request{Tool: "echo", Subject: "t.echo", Body: []byte("not json"), Timeout: time.Second})
	if r.Err == nil || r.Err.Type != InvalidArgs {
		t.Errorf("bad manifest: %+v", r)
	}
	c.Close()
	if r := c.Dispatch(context.Background(), req("echo", time.Second)); r.Err == nil || !strings.Contains(r.Err.Message, "closed") {
		t.Errorf("closed client: %+v", r)
	}
	if tp := NewTraceparent(); len(tp) != 55 || !strings.HasPrefix(tp, "00-") {
		t.Errorf("traceparent %q", tp)
	}
	if _, err := StartEmbedded("nonsense"); err == nil {
		t.Error("bad listen accepted")
	}
}

// TestLive: a toolsidecar worker and a real nats.go micro service are both
// found through $SRV.INFO.
func TestLive(t *testing.T) {
	side, work := connect(t)
	startWorker(t, work, map[string]Handler{"echo": func(context.Context, *Call) ([]byte, error) { return nil, nil }})
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
	r := open(t, side).Dispatch(context.Background(), req("get_weather", time.Second))
	if r.Err != nil || string(r.Data) != "sunny" {
		t.Errorf("micro endpoint reply %+v", r)
	}
}
