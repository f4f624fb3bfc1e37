package executor

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/config"
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
	e := policyExecutor(config.Executor{SubmitBudget: time.Second})
	e.approvals = store
	var events []Event
	br := &batchRun{e: e, log: slog.New(slog.DiscardHandler), lanes: map[string]*lane{}, n: 1, emit: func(ev Event) { events = append(events, ev) }}
	gated := &registry.Tool{Name: "pay", Config: config.Tool{Approval: config.ApprovalRequired, ApprovalTimeout: time.Minute}}
	ok := &answering{reply: tool.Outcome{Data: []byte("paid")}}

	free := policyCall(e, br, 0, &registry.Tool{Name: "look"})
	if got := e.approved(ok.next)(context.Background(), free, newOutcome(1, free.m)); got.Err != nil || ok.calls != 1 {
		t.Fatalf("an ungated call: %+v after %d dispatches", got.Err, ok.calls)
	}

	c := policyCall(e, br, 1, gated)
	o := newOutcome(1, c.m)
	done := make(chan tool.Outcome, 1)
	go func() { done <- e.approved(ok.next)(context.Background(), c, o) }()
	poll.Until(t, "the approval to be pending", func() bool { p, _ := store.Pending(context.Background()); return len(p) == 1 })
	if _, err := store.Decide(context.Background(), c.m.ActionID, approval.Verdict{Outcome: approval.Approved, Approver: "ana", DecidedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if got := <-done; got.Err != nil || ok.calls != 2 || o.res.Approval == nil || o.res.Approval.Approver != "ana" {
		t.Fatalf("an approved call: %+v after %d dispatches, approval %+v", got.Err, ok.calls, o.res.Approval)
	}
	if len(events) != 2 || events[0].Type != EventApprovalRequired || events[1].Type != EventApprovalDecided {
		t.Errorf("events %+v", events)
	}

	w := policyCall(e, br, 2, gated)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- e.approved(ok.next)(ctx, w, newOutcome(1, w.m)) }()
	poll.Until(t, "the second approval to be pending", func() bool { p, _ := store.Pending(context.Background()); return len(p) == 1 })
	cancel()
	if got := <-done; got.Err == nil || got.Err.Type != tool.Cancelled || ok.calls != 2 {
		t.Fatalf("a call cancelled while waiting: %+v after %d dispatches", got.Err, ok.calls)
	}
	if e, _ := store.Open(context.Background(), approval.Request{ActionID: w.m.ActionID}); e.Verdict == nil || e.Verdict.Outcome != approval.Withdrawn {
		t.Errorf("the cancelled call's approval is %+v, want withdrawn", e.Verdict)
	}
	got := e.approved(ok.next)(context.Background(), w, newOutcome(1, w.m))
	if got.Err == nil || got.Err.Type != tool.Cancelled || !strings.Contains(got.Err.Message, "withdrawn") || ok.calls != 2 {
		t.Errorf("a call whose approval was withdrawn, driven again: %+v after %d dispatches", got.Err, ok.calls)
	}

	// The sidecar stops while a call waits on a store that outlives it:
	// the call is left for the next drive, its approval still pending.
	kept := keptStore{approval.NewMemory()}
	e.approvals = kept
	e.drained, e.drain = context.WithCancel(context.Background())
	d := policyCall(e, br, 4, gated)
	do := newOutcome(1, d.m)
	go func() { done <- e.approved(ok.next)(context.Background(), d, do) }()
	poll.Until(t, "the kept approval to be pending", func() bool { p, _ := kept.Pending(context.Background()); return len(p) == 1 })
	e.Drain()
	if got := <-done; got.Err == nil || got.Err.Type != tool.Interrupted || !do.deferred || ok.calls != 2 {
		t.Errorf("a call waiting as the sidecar stops: %+v, deferred %v, after %d dispatches", got.Err, do.deferred, ok.calls)
	}
	if p, _ := kept.Pending(context.Background()); len(p) != 1 || p[0].ActionID != d.m.ActionID {
		t.Errorf("after the stop the store holds %+v pending, want the call's approval", p)
	}

	// An MCP client's call has no next drive: after the stop it still
	// waits, and its caller's leaving withdraws it.
	mbr := &batchRun{e: e, log: br.log, lanes: map[string]*lane{}, n: 1, emit: func(Event) {}, rec: unrecorded{}, noNextDrive: true}
	m := policyCall(e, mbr, 5, gated)
	mo := newOutcome(1, m.m)
	mctx, mcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	got = e.approved(ok.next)(mctx, m, mo)
	mcancel()
	if got.Err == nil || got.Err.Type != tool.Cancelled || mo.deferred {
		t.Errorf("an MCP client's call after the stop: %+v, deferred %v; want it cancelled with its caller", got.Err, mo.deferred)
	}

	e.approvals = brokenStore{}
	b := policyCall(e, br, 3, gated)
	if got := e.approved(ok.next)(context.Background(), b, newOutcome(1, b.m)); got.Err == nil || got.Err.Type != tool.Denied || ok.calls != 2 {
		t.Errorf("a call whose approval could not be recorded: %+v after %d dispatches, want denied", got.Err, ok.calls)
	}
}
