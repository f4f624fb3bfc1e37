package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/internal/clock"
	"github.com/projectdavid/toolsidecar/tool"
)

// ApprovalResult is how a call's approval ended, in its CallResult.
type ApprovalResult struct {
	approval.Verdict
	// WaitedMS is the time from the request to the verdict, as this drive
	// saw it.
	WaitedMS int64 `json:"waited_ms"`
}

// approved is the approval policy: a call of a tool with approval:
// required waits, without a slot of its batch, for a person's decision
// (or its deadline), while its siblings run; a denial or a timeout is its
// outcome, and it is not dispatched. The request and the verdict live in
// the approval store, so that a restarted sidecar finds both: a call
// decided while no sidecar listened runs, or is denied, on the next
// drive.
func (e *Executor) approved(next dispatchFunc) dispatchFunc {
	return func(ctx context.Context, c *call, o *outcome) tool.Outcome {
		if c.def.Config.Approval != config.ApprovalRequired {
			return next(ctx, c, o)
		}
		v, left, err := e.awaitApproval(ctx, c)
		if left {
			o.deferred = true
			return tool.Outcome{Err: tool.NewError(tool.Interrupted, "left for the next drive: the sidecar stopped while the call waited for approval")}
		}
		if err != nil {
			return tool.Outcome{Err: err}
		}
		o.res.Approval = v
		if v.Outcome != approval.Approved {
			return tool.Outcome{Err: denial(v.Verdict, approvalTimeout(c))}
		}
		return next(ctx, c, o)
	}
}

// awaitApproval opens the call's approval (or finds the one a previous
// drive opened), says so on the drive's stream, and waits for its verdict;
// left says the sidecar stops and the approval is kept for the next drive.
func (e *Executor) awaitApproval(ctx context.Context, c *call) (res *ApprovalResult, left bool, _ *tool.Error) {
	now := time.Now().UTC()
	ent, err := e.approvals.Open(ctx, approval.Request{ActionID: c.m.ActionID, RunID: c.m.RunID, ToolCallID: c.m.ToolCallID,
		Tool: c.m.Tool, Arguments: approval.Arguments(c.m.Args), RequestedAt: now, Deadline: now.Add(approvalTimeout(c))})
	if err != nil {
		// Not run without a recorded approval.
		return nil, false, tool.NewError(tool.Denied, "not run: the call's approval could not be recorded: %v", err)
	}
	log := callLog(c.b.log, c.m)
	v := ent.Verdict
	if v == nil {
		log.Info("call waits for approval", "deadline", ent.Deadline)
		c.b.emit(Event{Type: EventApprovalRequired, Turn: c.b.n, Call: c.ref(), Approval: &ent})
		e.obs.ApprovalWaiting(1)
		v, err = e.waitVerdict(ctx, ent, approval.Outlives(e.approvals) && !c.b.noNextDrive)
		e.obs.ApprovalWaiting(-1)
		if errors.Is(err, errLeftForNextDrive) {
			log.Info("the sidecar stops: the call is left, waiting for approval, for the next drive of the run")
			return nil, true, nil
		}
		if err != nil {
			return nil, false, tool.NewError(tool.Cancelled, "call cancelled while it waited for approval: %v", err)
		}
	}
	e.obs.ApprovalDecided(v.Outcome, v.DecidedAt.Sub(ent.RequestedAt))
	res = &ApprovalResult{Verdict: *v, WaitedMS: max(0, v.DecidedAt.Sub(ent.RequestedAt).Milliseconds())}
	log.Info("call's approval decided", "outcome", v.Outcome, "approver", v.Approver, "authenticated_as", v.AuthenticatedAs,
		"reason", v.Reason, "waited_ms", res.WaitedMS)
	c.b.emit(Event{Type: EventApprovalDecided, Turn: c.b.n, Call: c.ref(), Approval: &approval.Entry{Request: ent.Request, Verdict: v}})
	return res, false, nil
}

// errLeftForNextDrive: the sidecar stops while the call waits for an
// approval that a durable store keeps.
var errLeftForNextDrive = fmt.Errorf("approval kept for the next drive: %w", ErrLeftForNextDrive)

// waitVerdict waits for the approval's verdict until its deadline, then
// decides it timed out; a person's decision that lands in the same
// instant wins (Decide refuses the second verdict). A call cancelled
// while it waits withdraws its approval: its Action ends cancelled, and
// nobody needs to decide. When the sidecar stops (Drain) and the call is
// leavable (its store outlives the process, and a next drive of its run
// will find it), the wait ends with errLeftForNextDrive and the approval
// stays pending.
func (e *Executor) waitVerdict(ctx context.Context, ent approval.Entry, leavable bool) (*approval.Verdict, error) {
	wctx, cancel := context.WithDeadline(ctx, ent.Deadline)
	defer cancel()
	if leavable {
		dctx, dcancel := context.WithCancelCause(wctx)
		defer dcancel(nil)
		stop := context.AfterFunc(e.drained, func() { dcancel(errLeftForNextDrive) })
		defer stop()
		wctx = dctx
	}
	for {
		v, err := e.approvals.Await(wctx, ent.ActionID)
		if err == nil {
			return &v, nil
		}
		if wctx.Err() != nil {
			break
		}
		// The store failed (JetStream unreachable, say): the approval is
		// still pending there, so wait on.
		e.log.Warn("waiting for an approval failed; trying again", "action_id", ent.ActionID, "err", err)
		if clock.Sleep(wctx, time.Second) != nil {
			break
		}
	}
	if errors.Is(context.Cause(wctx), errLeftForNextDrive) && ctx.Err() == nil || errors.Is(context.Cause(ctx), tool.ErrLeft) {
		return nil, errLeftForNextDrive // abandoned: as a crash, nobody decides
	}
	outcome := approval.TimedOut
	if ctx.Err() != nil {
		outcome = approval.Withdrawn
	}
	dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.SubmitBudget)
	defer dcancel()
	got, derr := e.approvals.Decide(dctx, ent.ActionID, approval.Verdict{Outcome: outcome, DecidedAt: time.Now().UTC()})
	switch {
	case ctx.Err() != nil:
		return nil, context.Cause(ctx)
	case derr != nil && !errors.Is(derr, approval.ErrDecided):
		return nil, derr
	}
	return got.Verdict, nil
}

// approvalTimeout is how long the call may wait for its approval.
func approvalTimeout(c *call) time.Duration {
	if d := c.def.Config.ApprovalTimeout; d > 0 {
		return d
	}
	return config.DefaultApprovalTimeout
}

// denial is the error outcome the model reads for a call that was not
// approved.
func denial(v approval.Verdict, timeout time.Duration) *tool.Error {
	switch v.Outcome {
	case approval.TimedOut:
		return tool.NewError(tool.Denied, "not run: nobody approved the call within %s", timeout)
	case approval.Withdrawn: // an earlier drive of the run was cancelled while the call waited
		return tool.NewError(tool.Cancelled, "not run: its approval was withdrawn when an earlier drive of the run was cancelled; call the tool again to ask anew")
	}
	msg := "not run: a person denied the call"
	if v.Reason != "" {
		msg += ": " + v.Reason
	}
	return tool.NewError(tool.Denied, "%s", msg)
}
