package ledger_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/internal/testkit/approvaltest"
	"github.com/projectdavid/toolsidecar/internal/testkit/poll"
	"github.com/projectdavid/toolsidecar/ledger"
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
	t.Cleanup(l.Close)
	return l, nc
}

// replySubject is a reply subject as the bridge makes it: a random nonce
// sealed by the ledger.
func replySubject(l *ledger.Ledger) string {
	var tok [20]byte
	_, _ = rand.Read(tok[:])
	l.Seal(tok[:])
	return l.Inbox() + "." + base64.RawURLEncoding.EncodeToString(tok[:])
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
	if _, ok, err := l.Recover(ctx, "act_0", true); ok || !errors.Is(err, tool.ErrNeverSent) {
		t.Fatalf("intended action: ok %v err %v, want ErrNeverSent", ok, err)
	}
	reply := replySubject(l)
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
	reply2 := replySubject(l)
	l.Dispatched(ctx, req2, "run_1", reply2)
	nc.PublishMsg(wire.ErrorMsg(reply2, tool.NewError(tool.ToolFailed, "card declined")))
	// Awaited: the stream stores the reply after the server has taken it,
	// so a lookup right after Flush may come too early (it did, once in a
	// full make test).
	out, ok, _ = l.Recover(ctx, "act_2", true)
	if !ok || out.Err == nil || out.Err.Type != tool.ToolFailed || out.Err.Message != "card declined" {
		t.Errorf("error reply: %+v ok %v", out, ok)
	}
	// With await and no reply, Recover gives up at the deadline.
	req3 := tool.Request{Tool: "pay", ActionID: "act_3", Attempt: 1, Timeout: 200 * time.Millisecond, Unsafe: true}
	l.Dispatched(ctx, req3, "run_1", replySubject(l))
	if _, ok, err := l.Recover(ctx, "act_3", true); ok || err != nil {
		t.Errorf("no reply by the deadline: ok %v err %v", ok, err)
	}
}

// TestForgedRepliesDeleted: a worker that may publish in the reply
// namespace floods it with replies to calls no sidecar made, to subjects
// of every shape, and repeats a genuine reply many times. The forged ones
// are deleted as they arrive, the genuine reply is kept once, and the
// stream holds nothing more. Before, each was stored for 25 hours.
func TestForgedRepliesDeleted(t *testing.T) {
	l, nc := open(t)
	ctx := context.Background()
	genuine := replySubject(l)
	if err := l.Dispatched(ctx, tool.Request{Tool: "pay", ActionID: "act_9", Attempt: 1, Timeout: time.Minute, Unsafe: true}, "run_1", genuine); err != nil {
		t.Fatal(err)
	}
	var tok [20]byte
	blob := make([]byte, 64<<10)
	for i := range 200 {
		_, _ = rand.Read(tok[:])
		for _, s := range []string{l.Inbox() + "." + base64.RawURLEncoding.EncodeToString(tok[:]), "t.replies.other-pod.x", "t.replies.a.b.c", l.Inbox() + ".short"} {
			if err := nc.Publish(s, blob); err != nil {
				t.Fatal(err)
			}
		}
		if i%50 == 0 {
			nc.Publish(genuine, []byte(`"paid"`))
		}
	}
	nc.Flush()
	js, _ := jetstream.New(nc)
	st, err := js.Stream(ctx, "T_REPLIES")
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the forged replies to be deleted", func() bool {
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 1
	})
	out, ok, err := l.Recover(ctx, "act_9", false)
	if !ok || err != nil || string(out.Data) != `"paid"` {
		t.Errorf("the genuine reply: %q %v %v", out.Data, ok, err)
	}
}

// TestDispatchedWithoutWaiting: the record of a read-only call is
// published without waiting, and is stored all the same.
func TestDispatchedWithoutWaiting(t *testing.T) {
	l, nc := open(t)
	ctx := context.Background()
	reply := replySubject(l)
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
	t.Cleanup(a.Close)
	if err := a.Remember(ctx, "k1", []byte(`{"content": "sunny"}`)); err != nil {
		t.Fatal(err)
	}
	b, err := ledger.Open(ctx, conn(), ledger.Config{Prefix: "t", Instance: "pod-2"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
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
// shares (internal/testkit/approvaltest), on a real server.
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
	t.Cleanup(a.Close)
	b, err := ledger.Open(ctx, conn(), ledger.Config{Prefix: "t", Instance: "pod-2"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
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
