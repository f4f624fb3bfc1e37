// Package approvaltest checks that an approval.Store keeps the rules every
// store shares: one verdict per approval, awaited until it comes, and the
// pending list without decided ones.
package approvaltest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/approval"
)

func request(id string, at time.Time) approval.Request {
	return approval.Request{ActionID: id, RunID: "run_1", ToolCallID: "call_" + id, Tool: "pay",
		Arguments: approval.Arguments([]byte(`{"amount":5}`)), RequestedAt: at, Deadline: at.Add(time.Minute), Owner: "owner-digest"}
}

// Run runs the shared rules against stores made by open, one per subtest.
func Run(t *testing.T, open func(t *testing.T) approval.Store) {
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Millisecond)

	t.Run("open twice keeps the first", func(t *testing.T) {
		s := open(t)
		first, err := s.Open(ctx, request("act_a", t0))
		if err != nil {
			t.Fatal(err)
		}
		again, err := s.Open(ctx, request("act_a", t0.Add(time.Hour)))
		if err != nil {
			t.Fatal(err)
		}
		if !again.RequestedAt.Equal(first.RequestedAt) || !again.Deadline.Equal(first.Deadline) || again.Verdict != nil {
			t.Errorf("second open returned %+v, want the first request %+v", again, first)
		}
	})

	t.Run("await returns the verdict decided meanwhile", func(t *testing.T) {
		s := open(t)
		if _, err := s.Open(ctx, request("act_b", t0)); err != nil {
			t.Fatal(err)
		}
		got := make(chan approval.Verdict, 1)
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() {
			v, err := s.Await(ctx, "act_b")
			if err != nil {
				t.Error(err)
			}
			got <- v
		})
		select {
		case v := <-got:
			t.Fatalf("await returned %+v before any decision", v)
		case <-time.After(100 * time.Millisecond):
		}
		want := approval.Verdict{Outcome: approval.Denied, Reason: "too much", Approver: "ana", AuthenticatedAs: "token", DecidedAt: t0}
		if _, err := s.Decide(ctx, "act_b", want); err != nil {
			t.Fatal(err)
		}
		if v := <-got; v.Outcome != want.Outcome || v.Reason != want.Reason || v.Approver != "ana" || !v.DecidedAt.Equal(t0) {
			t.Errorf("await got %+v, want %+v", v, want)
		}
		// Decided already: no wait, and opening again finds the verdict.
		if v, err := s.Await(ctx, "act_b"); err != nil || v.Outcome != approval.Denied {
			t.Errorf("await after the decision: %+v %v", v, err)
		}
		if e, err := s.Open(ctx, request("act_b", t0)); err != nil || e.Verdict == nil || e.Verdict.Outcome != approval.Denied {
			t.Errorf("open after the decision: %+v %v", e, err)
		}
	})

	t.Run("await ends with its context", func(t *testing.T) {
		s := open(t)
		if _, err := s.Open(ctx, request("act_c", t0)); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if v, err := s.Await(cctx, "act_c"); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("await returned %+v %v, want the context's deadline", v, err)
		}
	})

	t.Run("one decision wins", func(t *testing.T) {
		s := open(t)
		if _, err := s.Open(ctx, request("act_d", t0)); err != nil {
			t.Fatal(err)
		}
		var wins, decided atomic.Int32
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				_, err := s.Decide(ctx, "act_d", approval.Verdict{Outcome: approval.Approved, Approver: fmt.Sprint(i), DecidedAt: t0})
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, approval.ErrDecided):
					decided.Add(1)
				default:
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if wins.Load() != 1 || decided.Load() != 7 {
			t.Errorf("%d decisions won and %d got ErrDecided, want 1 and 7", wins.Load(), decided.Load())
		}
		if _, err := s.Decide(ctx, "act_unknown", approval.Verdict{Outcome: approval.Approved}); !errors.Is(err, approval.ErrNotFound) {
			t.Errorf("deciding an unknown approval: %v, want ErrNotFound", err)
		}
	})

	t.Run("pending lists the undecided, oldest first", func(t *testing.T) {
		s := open(t)
		// An empty list, not nil: the HTTP API and the live view send
		// it as [] as it is.
		if es, err := s.Pending(ctx); err != nil || es == nil || len(es) != 0 {
			t.Fatalf("pending of an empty store: %#v, %v; want an empty, non-nil list", es, err)
		}
		for i, id := range []string{"act_late", "act_early", "act_done"} {
			if _, err := s.Open(ctx, request(id, t0.Add(time.Duration(2-i)*time.Second))); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Decide(ctx, "act_done", approval.Verdict{Outcome: approval.TimedOut, DecidedAt: t0}); err != nil {
			t.Fatal(err)
		}
		es, err := s.Pending(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, e := range es {
			ids = append(ids, e.ActionID)
		}
		if fmt.Sprint(ids) != "[act_early act_late]" {
			t.Errorf("pending %v, want [act_early act_late]", ids)
		}
		if string(es[0].Arguments) != `{"amount":5}` || es[0].Tool != "pay" || es[0].ToolCallID != "call_act_early" || es[0].Owner != "owner-digest" {
			t.Errorf("pending entry %+v lost its request", es[0])
		}
	})

	t.Run("get returns the approval with its owner, decided or not", func(t *testing.T) {
		s := open(t)
		if _, err := s.Get(ctx, "act_none"); !errors.Is(err, approval.ErrNotFound) {
			t.Errorf("get of an approval never opened: %v, want ErrNotFound", err)
		}
		if _, err := s.Open(ctx, request("act_get", t0)); err != nil {
			t.Fatal(err)
		}
		if e, err := s.Get(ctx, "act_get"); err != nil || e.Owner != "owner-digest" || e.Verdict != nil {
			t.Errorf("get of a pending approval: %+v, %v; want it undecided, owned by owner-digest", e, err)
		}
		if _, err := s.Decide(ctx, "act_get", approval.Verdict{Outcome: approval.Denied, DecidedAt: t0}); err != nil {
			t.Fatal(err)
		}
		if e, err := s.Get(ctx, "act_get"); err != nil || e.Verdict == nil || e.Verdict.Outcome != approval.Denied {
			t.Errorf("get of a decided approval: %+v, %v; want its denial", e, err)
		}
	})
}
