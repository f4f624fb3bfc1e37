package executor

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/tool"
)

// keptStore is a store in memory that says it outlives the process, as
// the ledger's does.
type keptStore struct{ *approval.Memory }

func (keptStore) Durable() bool { return true }

// brokenStore is an approval store that cannot record anything.
type brokenStore struct{ approval.Store }

func (brokenStore) Open(context.Context, approval.Request) (approval.Entry, error) {
	return approval.Entry{}, errors.New("JetStream unreachable")
}

// TestApprovalPolicy: the approval policy alone. A tool without approval
// passes straight on; an approved call is dispatched with the verdict in
// its result; a call cancelled while it waits is not dispatched and
// withdraws its approval, and a later drive that finds it withdrawn does
// not run it either; when the sidecar stops, a call waiting on a store
// that outlives it is left for the next drive, its approval pending (an
// MCP client's call, which has no next drive, is not); a store that
// cannot record the approval denies the call rather than run it
// unapproved.
func TestApprovalPolicy(t *testing.T) {
	store := approval.NewMemory()
	e := policyExecutor(Config{SubmitBudget: time.Second})
	e.approvals = store
	p := &approvals{e}
	var events []Event
	b := newTestBatch()
	b.emit = func(ev Event) { events = append(events, ev) }
	gated := &registry.Tool{Name: "pay", Policies: registry.Policies{Approval: &registry.Approval{Timeout: time.Minute}}}
	ok := &answering{reply: tool.Outcome{Data: []byte("paid")}}

	if free := b.policyCall(0, &registry.Tool{Name: "look"}); p.concerns(free) {
		t.Fatal("the approval policy concerns a tool without approval")
	}

	c := b.policyCall(1, gated)
	done := make(chan answer, 1)
	go func() { done <- p.intercept(context.Background(), c, ok.next) }()
	poll.Until(t, "the approval to be pending", func() bool { p, _ := store.Pending(context.Background()); return len(p) == 1 })
	if _, err := store.Decide(context.Background(), c.ActionID, approval.Verdict{Outcome: approval.Approved, Approver: "ana", DecidedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if got := <-done; got.Err != nil || ok.calls != 1 || c.Res.Approval == nil || c.Res.Approval.Approver != "ana" {
		t.Fatalf("an approved call: %+v after %d dispatches, approval %+v", got.Err, ok.calls, c.Res.Approval)
	}
	if len(events) != 2 || events[0].Type != EventApprovalRequired || events[1].Type != EventApprovalDecided {
		t.Errorf("events %+v", events)
	}

	w := b.policyCall(2, gated)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- p.intercept(ctx, w, ok.next) }()
	poll.Until(t, "the second approval to be pending", func() bool { p, _ := store.Pending(context.Background()); return len(p) == 1 })
	cancel()
	if got := <-done; got.Err == nil || got.Err.Type != tool.Cancelled || ok.calls != 1 {
		t.Fatalf("a call cancelled while waiting: %+v after %d dispatches", got.Err, ok.calls)
	}
	if e, _ := store.Open(context.Background(), approval.Request{ActionID: w.ActionID}); e.Verdict == nil || e.Verdict.Outcome != approval.Withdrawn {
		t.Errorf("the cancelled call's approval is %+v, want withdrawn", e.Verdict)
	}
	got := p.intercept(context.Background(), w, ok.next)
	if got.Err == nil || got.Err.Type != tool.Cancelled || !strings.Contains(got.Err.Message, "withdrawn") || ok.calls != 1 {
		t.Errorf("a call whose approval was withdrawn, driven again: %+v after %d dispatches", got.Err, ok.calls)
	}

	// The sidecar stops while a call waits on a store that outlives it:
	// the call is left for the next drive, its approval still pending.
	kept := keptStore{approval.NewMemory()}
	e.approvals = kept
	e.drained, e.drain = context.WithCancel(context.Background())
	d := b.policyCall(4, gated)
	go func() { done <- p.intercept(context.Background(), d, ok.next) }()
	poll.Until(t, "the kept approval to be pending", func() bool { p, _ := kept.Pending(context.Background()); return len(p) == 1 })
	e.Drain()
	if got := <-done; got.Err == nil || got.Err.Type != tool.Interrupted || !got.left || ok.calls != 1 {
		t.Errorf("a call waiting as the sidecar stops: %+v, left %v, after %d dispatches", got.Err, got.left, ok.calls)
	}
	if p, _ := kept.Pending(context.Background()); len(p) != 1 || p[0].ActionID != d.ActionID {
		t.Errorf("after the stop the store holds %+v pending, want the call's approval", p)
	}

	// An MCP client's call has no next drive: after the stop it still
	// waits, and its caller's leaving withdraws it.
	mcp := newTestBatch()
	mcp.leavable = false
	m := mcp.policyCall(5, gated)
	mctx, mcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	got = p.intercept(mctx, m, ok.next)
	mcancel()
	if got.Err == nil || got.Err.Type != tool.Cancelled || got.left {
		t.Errorf("an MCP client's call after the stop: %+v, left %v; want it cancelled with its caller", got.Err, got.left)
	}

	e.approvals = brokenStore{}
	if got := p.intercept(context.Background(), b.policyCall(3, gated), ok.next); got.Err == nil || got.Err.Type != tool.Denied || ok.calls != 1 {
		t.Errorf("a call whose approval could not be recorded: %+v after %d dispatches, want denied", got.Err, ok.calls)
	}
}
