package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/ledger"
	"github.com/projectdavid/toolsidecar/testkit/approvaltest"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// server starts a JetStream server and returns a connection factory.
func server(t *testing.T) func() *nats.Conn {
	t.Helper()
	ns, err := embedded.Start(embedded.Config{Listen: "127.0.0.1:-1", StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	return func() *nats.Conn {
		nc, err := nats.Connect(ns.InProcessURL(), ns.ConnectOptions()...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}

func open(t *testing.T) (*ledger.Ledger, *nats.Conn) {
	t.Helper()
	nc := server(t)()
	l, err := ledger.Open(context.Background(), nc, ledger.Config{Prefix: "t", Instance: "pod-1"})
	if err != nil {
		t.Fatal(err)
	}
	return l, nc
}

// TestRecover: a reply captured for a recorded attempt is found by Action
// ID; progress alone is not a result; an unknown action has none; with
// await, a reply that comes late is waited for until the deadline.
func TestRecover(t *testing.T) {
	l, nc := open(t)
	ctx := context.Background()
	if _, ok, err := l.Recover(ctx, "act_unknown", true); ok || err != nil {
		t.Fatalf("unknown action: ok %v err %v", ok, err)
	}
	// Intended but never dispatched: known never sent.
	if err := l.Intend(ctx, "act_0", "run_1", "pay"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := l.Recover(ctx, "act_0", true); ok || !errors.Is(err, tool.ErrNeverSent) || errors.Is(err, tool.ErrIntentOfOldFormat) {
		t.Fatalf("intended action: ok %v err %v, want ErrNeverSent", ok, err)
	}
	// An intent of an earlier release, which did not record calls run in
	// process: never sent to a worker, but not known for such a call.
	if err := l.PutEntry(ctx, "act_old", []byte(`{"run_id":"run_1","tool":"pay","attempt":0,"reply":"","instance":"pod-0","dispatched":"0001-01-01T00:00:00Z","deadline":"0001-01-01T00:00:00Z"}`)); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := l.Recover(ctx, "act_old", true); ok || !errors.Is(err, tool.ErrNeverSent) || !errors.Is(err, tool.ErrIntentOfOldFormat) {
		t.Fatalf("an earlier release's intent: ok %v err %v, want ErrNeverSent and ErrIntentOfOldFormat", ok, err)
	}
	reply := l.Inbox() + ".tok1"
	req := tool.Request{Tool: "pay", ActionID: "act_1", Attempt: 1, Timeout: 2 * time.Second, Unsafe: true}
	if err := l.Dispatched(ctx, req, "run_1", reply); err != nil {
		t.Fatal(err)
	}
	nc.PublishMsg(wire.ProgressMsg(reply))
	nc.Flush()
	if _, ok, err := l.Recover(ctx, "act_1", false); ok || err != nil {
		t.Fatalf("after progress only: ok %v err %v, want no result", ok, err)
	}
	time.AfterFunc(300*time.Millisecond, func() { nc.Publish(reply, []byte(`"paid"`)) })
	out, ok, err := l.Recover(ctx, "act_1", true)
	if err != nil || !ok || string(out.Data) != `"paid"` || out.Err != nil {
		t.Fatalf("awaited reply: %+v ok %v err %v", out, ok, err)
	}
	// An error reply is recovered as the error it is.
	req2 := tool.Request{Tool: "pay", ActionID: "act_2", Attempt: 1, Timeout: time.Second, Unsafe: true}
	l.Dispatched(ctx, req2, "run_1", l.Inbox()+".tok2")
	nc.PublishMsg(wire.ErrorMsg(l.Inbox()+".tok2", tool.NewError(tool.ToolFailed, "card declined")))
	// Awaited: the stream stores the reply after the server has taken it,
	// so a lookup right after Flush may come too early (it did, once in a
	// full make test).
	out, ok, _ = l.Recover(ctx, "act_2", true)
	if !ok || out.Err == nil || out.Err.Type != tool.ToolFailed || out.Err.Message != "card declined" {
		t.Errorf("error reply: %+v ok %v", out, ok)
	}
	// With await and no reply, Recover gives up at the deadline.
	req3 := tool.Request{Tool: "pay", ActionID: "act_3", Attempt: 1, Timeout: 200 * time.Millisecond, Unsafe: true}
	l.Dispatched(ctx, req3, "run_1", l.Inbox()+".tok3")
	if _, ok, err := l.Recover(ctx, "act_3", true); ok || err != nil {
		t.Errorf("no reply by the deadline: ok %v err %v", ok, err)
	}
}

// TestInProcessRecover: an attempt that runs in the sidecar's process is
// recorded as one sent to a worker is, and its outcome stored as a
// worker's reply is captured. Recorded without an outcome, its effect is
// unknown (not "never sent") and nothing is waited for, since only the
// process that ran it could store one; an outcome, success or error, is
// found; an attempt that never reached its tool goes back to "never sent"
// for an unsafe tool.
func TestInProcessRecover(t *testing.T) {
	l, _ := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	running := func(action string, unsafe bool) (tool.Request, string) {
		t.Helper()
		req := tool.Request{Tool: "pay", ActionID: action, Attempt: 1, Timeout: time.Hour, Unsafe: unsafe}
		if err := l.Intend(ctx, action, "run_1", "pay"); err != nil {
			t.Fatal(err)
		}
		reply, err := l.Running(ctx, req, "run_1")
		if err != nil {
			t.Fatal(err)
		}
		if unsafe != strings.HasPrefix(reply, l.Inbox()+".") {
			t.Fatalf("reply subject %q (unsafe %v): an unsafe call's is in the sidecar's inbox %q, another has none before it ends", reply, unsafe, l.Inbox())
		}
		return req, reply
	}
	// Running, no outcome: unknown, and not awaited (an await would run
	// into ctx's deadline, an hour short of the attempt's).
	running("act_crashed", true)
	if _, ok, err := l.Recover(ctx, "act_crashed", true); ok || err != nil {
		t.Fatalf("an in-process attempt without outcome: ok %v err %v, want unknown", ok, err)
	}
	req, reply := running("act_ok", true)
	if err := l.Ran(ctx, req, "run_1", reply, tool.Outcome{Sent: true, Data: []byte(`"paid"`)}); err != nil {
		t.Fatal(err)
	}
	if out, ok, err := l.Recover(ctx, "act_ok", true); !ok || err != nil || string(out.Data) != `"paid"` {
		t.Fatalf("stored success: %+v ok %v err %v", out, ok, err)
	}
	req, reply = running("act_failed", false)
	if err := l.Ran(ctx, req, "run_1", reply, tool.Outcome{Sent: true, Err: tool.NewError(tool.ToolFailed, "card\ndeclined")}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the unacknowledged outcome to be stored", func() bool {
		out, ok, _ := l.Recover(ctx, "act_failed", false)
		return ok && out.Err != nil && out.Err.Type == tool.ToolFailed && out.Err.Message == "card declined"
	})
	// A read-only outcome is written inside its entry, in one write; one
	// too large for that goes to the reply stream.
	for action, data := range map[string]string{"act_small": `"seen"`, "act_large": `"` + strings.Repeat("x", 100<<10) + `"`} {
		req := tool.Request{Tool: "look", ActionID: action, Attempt: 1, Timeout: time.Hour}
		reply, err := l.Running(ctx, req, "run_1")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Ran(ctx, req, "run_1", reply, tool.Outcome{Sent: true, Data: []byte(data)}); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, "the outcome of "+action+" to be stored", func() bool {
			out, ok, _ := l.Recover(ctx, action, false)
			return ok && string(out.Data) == data
		})
	}
	req, reply = running("act_unsent", true)
	if err := l.Ran(ctx, req, "run_1", reply, tool.Outcome{Err: tool.NewError(tool.Cancelled, "cancelled before it ran")}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := l.Recover(ctx, "act_unsent", true); ok || !errors.Is(err, tool.ErrNeverSent) {
		t.Fatalf("an unsafe attempt that never reached its tool: ok %v err %v, want ErrNeverSent", ok, err)
	}
}

// TestReplyStreamBounded: a worker that may publish in the reply namespace
// floods it with replies to calls that do not exist, some over the message
// bound, and repeats a reply many times. The stream never holds more than
// its max_bytes, nothing over its message bound, and one message per
// subject; the reply that came last is read as usual. Before, each was
// stored for 25 hours, unbounded.
func TestReplyStreamBounded(t *testing.T) {
	nc := server(t)()
	ctx := context.Background()
	const maxBytes, maxMsg = 2 << 20, 300 << 10
	l, err := ledger.Open(ctx, nc, ledger.Config{Prefix: "t", Instance: "pod-1", MaxBytes: maxBytes, MaxReplyBytes: maxMsg})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	st, err := js.Stream(ctx, "T_REPLIES")
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	mid, big := make([]byte, 256<<10), make([]byte, 1<<20)
	var largest uint64
	for i := range 60 {
		nc.Publish(fmt.Sprintf("%s.forged%d", l.Inbox(), i), mid)
		nc.Publish(fmt.Sprintf("t.replies.other.x%d", i), big)
		nc.Publish(l.Inbox()+".repeated", []byte(`"again"`))
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Bytes > maxBytes {
			t.Fatalf("the stream holds %d bytes, over its bound of %d", info.State.Bytes, maxBytes)
		}
		largest = max(largest, info.State.Bytes)
	}
	reply := l.Inbox() + ".tok9"
	if err := l.Dispatched(ctx, tool.Request{Tool: "pay", ActionID: "act_9", Attempt: 1, Timeout: time.Minute, Unsafe: true}, "run_1", reply); err != nil {
		t.Fatal(err)
	}
	nc.Publish(reply, []byte(`"paid"`))
	nc.Flush()
	poll.Until(t, "the reply", func() bool {
		out, ok, err := l.Recover(ctx, "act_9", false)
		return ok && err == nil && string(out.Data) == `"paid"`
	})
	if m, err := st.GetLastMsgForSubject(ctx, "t.replies.other.x0"); err == nil {
		t.Errorf("a message of %d bytes, over the bound of %d, was stored", len(m.Data), maxMsg)
	}
	info, _ := st.Info(ctx, jetstream.WithSubjectFilter(l.Inbox()+".repeated"))
	if n := info.State.Subjects[l.Inbox()+".repeated"]; n > 1 {
		t.Errorf("a reply repeated 60 times is stored %d times, want once", n)
	}
	t.Logf("largest state during the flood: %d bytes; %v", largest, time.Since(began))
}

// TestDispatchedWithoutWaiting: the record of a read-only call is
// published without waiting, and is stored all the same.
func TestDispatchedWithoutWaiting(t *testing.T) {
	l, nc := open(t)
	ctx := context.Background()
	reply := l.Inbox() + ".tok4"
	if err := l.Dispatched(ctx, tool.Request{Tool: "look", ActionID: "act_4", Attempt: 1, Timeout: time.Second}, "run_1", reply); err != nil {
		t.Fatal(err)
	}
	nc.Publish(reply, []byte(`"seen"`))
	poll.Until(t, "the record and its reply", func() bool {
		out, ok, err := l.Recover(ctx, "act_4", false)
		return err == nil && ok && string(out.Data) == `"seen"`
	})
}

// TestNoJetStream: a server without JetStream is reported as such.
func TestNoJetStream(t *testing.T) {
	ns, err := embedded.Start(embedded.Config{Listen: "127.0.0.1:-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.InProcessURL(), ns.ConnectOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := ledger.Open(context.Background(), nc, ledger.Config{Prefix: "t", Instance: "i"}); !errors.Is(err, ledger.ErrNoJetStream) {
		t.Fatalf("err %v, want ErrNoJetStream", err)
	}
}

// TestRememberRecall: a remembered result is found by its key by another
// ledger on the same JetStream (a restarted or second sidecar), an unknown
// key is a miss, and a result larger than a NATS message is refused with
// an error rather than truncated.
func TestRememberRecall(t *testing.T) {
	conn := server(t)
	ctx := context.Background()
	nc := conn()
	a, err := ledger.Open(ctx, nc, ledger.Config{Prefix: "t", Instance: "pod-1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Remember(ctx, "k1", []byte(`{"content": "sunny"}`)); err != nil {
		t.Fatal(err)
	}
	b, err := ledger.Open(ctx, conn(), ledger.Config{Prefix: "t", Instance: "pod-2"})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok, err := b.Recall(ctx, "k1"); !ok || err != nil || string(v) != `{"content": "sunny"}` {
		t.Errorf("recall from another ledger: %q %v %v", v, ok, err)
	}
	if _, ok, err := b.Recall(ctx, "k2"); ok || err != nil {
		t.Errorf("unknown key: %v %v", ok, err)
	}
	if err := a.Remember(ctx, "big", make([]byte, nc.MaxPayload()+1)); err == nil {
		t.Errorf("a result over the max payload of %d bytes was accepted", nc.MaxPayload())
	}
}

// TestApprovals: the JetStream approval store keeps the rules every store
// shares (testkit/approvaltest), on a real server.
func TestApprovals(t *testing.T) {
	approvaltest.Run(t, func(t *testing.T) approval.Store {
		l, _ := open(t)
		return l.Approvals()
	})
}

// TestApprovalDecidedOnAnotherSidecar: an approval opened by one sidecar is
// listed and decided by another on the same JetStream, and the first one's
// Await returns that verdict.
func TestApprovalDecidedOnAnotherSidecar(t *testing.T) {
	ctx := context.Background()
	conn := server(t)
	a, err := ledger.Open(ctx, conn(), ledger.Config{Prefix: "t", Instance: "pod-1"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := ledger.Open(ctx, conn(), ledger.Config{Prefix: "t", Instance: "pod-2"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, err := a.Approvals().Open(ctx, approval.Request{ActionID: "act_1", Tool: "pay", RequestedAt: now, Deadline: now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	got := make(chan approval.Verdict, 1)
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() {
		v, _ := a.Approvals().Await(actx, "act_1")
		got <- v
	})
	pending, err := b.Approvals().Pending(ctx)
	if err != nil || len(pending) != 1 || pending[0].ActionID != "act_1" {
		t.Fatalf("pod-2 lists %+v %v, want act_1", pending, err)
	}
	if _, err := b.Approvals().Decide(ctx, "act_1", approval.Verdict{Outcome: approval.Approved, Approver: "ana"}); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-got:
		if v.Outcome != approval.Approved || v.Approver != "ana" {
			t.Errorf("pod-1 heard %+v", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("pod-1 never heard pod-2's decision")
	}
}
