package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/projectdavid/toolsidecar/approval"
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

// approvals is the approval policy: a call of a tool with approval:
// required waits, without a slot of its batch, for a person's decision
// (or its deadline), while its siblings run; a denial or a timeout is its
// outcome, and it is not dispatched. The request and the verdict live in
// the approval store, so that a restarted sidecar finds both: a call
// decided while no sidecar listened runs, or is denied, on the next
// drive. A call still waiting as the sidecar stops is left, open, for the
// next drive.
type approvals struct{ e *Executor }

func (p *approvals) concerns(in *callIn) bool {
	return in.Tool != nil && in.Tool.Policies.Approval != nil
}

func (p *approvals) intercept(ctx context.Context, in *callIn, next step) answer {
	v, left, err := p.e.awaitApproval(ctx, in)
	if left {
		return answer{Outcome: tool.Outcome{Err: tool.NewError(tool.Interrupted, "left for the next drive: the sidecar stopped while the call waited for approval")}, left: true}
	}
	if err != nil {
		return answer{Outcome: tool.Outcome{Err: err}}
	}
	in.Res.Approval = v
	if v.Outcome != approval.Approved {
		return answer{Outcome: tool.Outcome{Err: denial(v.Verdict, in.Tool.Policies.Approval.Timeout)}}
	}
	return next(ctx, in)
}

// awaitApproval opens the call's approval (or finds the one a previous
// drive opened), says so on the drive's stream, and waits for its verdict;
// left says the sidecar stops and the approval is kept for the next drive.
func (e *Executor) awaitApproval(ctx context.Context, in *callIn) (res *ApprovalResult, left bool, _ *tool.Error) {
	now := time.Now().UTC()
	ent, err := e.approvals.Open(ctx, approval.Request{ActionID: in.ActionID, RunID: in.RunID, ToolCallID: in.ToolCallID,
		Tool: in.ToolCall.Tool, Arguments: approval.Arguments(in.Args), RequestedAt: now, Deadline: now.Add(in.Tool.Policies.Approval.Timeout),
		Owner: in.Caller})
	if err != nil {
		// Not run without a recorded approval.
		return nil, false, tool.NewError(tool.Denied, "not run: the call's approval could not be recorded: %v", err)
	}
	log := callLog(in.Log, in.ToolCall)
	v := ent.Verdict
	if v == nil {
		log.Info("call waits for approval", "deadline", ent.Deadline)
		in.Emit(Event{Type: EventApprovalRequired, Turn: in.Turn, Call: in.ref(), Approval: &ent})
		e.obs.ApprovalWaiting(1)
		v, err = e.waitVerdict(ctx, ent, approval.Outlives(e.approvals) && in.Leavable)
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
	in.Emit(Event{Type: EventApprovalDecided, Turn: in.Turn, Call: in.ref(), Approval: &approval.Entry{Request: ent.Request, Verdict: v}})
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
