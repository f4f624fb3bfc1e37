package executor

import (
	"context"

	"github.com/projectdavid/toolsidecar/tool"
)

// dispatchFunc takes a call from its policies to its worker's reply. o is
// the outcome being built: a policy notes in o.res what it did (deduped,
// hedged, claim-checked).
type dispatchFunc func(ctx context.Context, c *call, o *outcome) tool.Outcome

// policy wraps a dispatchFunc. It may answer the call without calling next,
// and may change the reply on its way back. Each lives in a file of its
// own and is tested alone.
type policy func(next dispatchFunc) dispatchFunc

// policies wraps dispatch in the executor's policies, outermost first:
//
//   - lane (lane.go): wait for the previous call of the call's ordered
//     lane; skip the call when its lane skips the rest after a failure;
//   - checked: a call that failed its check is answered with that failure;
//   - approved (approval.go): a call of a tool with approval: required
//     waits for a person's decision; a denial is its outcome;
//   - dedupe (dedupe.go): answer from an earlier identical call of the run;
//   - budget (budget.go): count the call's time and result against the
//     run's budget (admission was decided as the manifest arrived);
//   - claim-check (claimcheck.go): store a large result and hand the model
//     a preview and a handle.
//
// Hedging is a policy of one attempt, not of the call (hedge.go).
func (e *Executor) policies(dispatch dispatchFunc) dispatchFunc {
	chain := []policy{e.inLane, checked, e.approved, e.dedupe, e.spendBudget, e.claimChecked}
	d := dispatch
	for i := len(chain) - 1; i >= 0; i-- {
		d = chain[i](d)
	}
	return d
}

// checked answers a call that failed its check (an unknown tool, invalid
// arguments, a budget's refusal) with that failure, without sending it.
func checked(next dispatchFunc) dispatchFunc {
	return func(ctx context.Context, c *call, o *outcome) tool.Outcome {
		if c.pre != nil {
			return tool.Outcome{Err: c.pre}
		}
		return next(ctx, c, o)
	}
}
