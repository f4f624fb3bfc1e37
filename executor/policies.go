package executor

import (
	"context"

	"github.com/projectdavid/toolsidecar/config"
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
//
// A call goes through the policies that apply to it only: a chain is made
// for each set of them. Each policy still checks for itself. A call waits
// for its worker at the bottom of the chain, so the frames of the policies
// it skips are not on its goroutine's stack while it waits, and the
// collector, whose goal grows with the stacks in use, lets the heap grow
// less (BENCHMARKS.md, "Load").
func (e *Executor) policies(dispatch dispatchFunc) *chains {
	all := []struct {
		wrap    policy
		applies func(c *call) bool
	}{
		{e.inLane, func(c *call) bool { return c.ln != nil }},
		{checked, func(c *call) bool { return c.pre != nil }},
		{e.approved, func(c *call) bool { return c.def != nil && c.def.Config.Approval == config.ApprovalRequired }},
		{e.dedupe, func(c *call) bool { return c.def != nil && c.def.Config.Dedupe == config.DedupeRun }},
		{e.spendBudget, func(c *call) bool { return c.b.req.budget != nil }},
		{e.claimChecked, func(c *call) bool { return e.cfg.ClaimCheckBytes > 0 }},
	}
	ch := &chains{by: make([]dispatchFunc, 1<<len(all))}
	for set := range ch.by {
		d := dispatch
		for i := len(all) - 1; i >= 0; i-- {
			if set&(1<<i) != 0 {
				d = all[i].wrap(d)
			}
		}
		ch.by[set] = d
	}
	for _, p := range all {
		ch.applies = append(ch.applies, p.applies)
	}
	return ch
}

// chains holds the dispatch through each set of policies.
type chains struct {
	applies []func(c *call) bool
	by      []dispatchFunc // indexed by the set: bit i for policy i
}

// of is the dispatch through the policies that apply to c.
func (ch *chains) of(c *call) dispatchFunc {
	set := 0
	for i, applies := range ch.applies {
		if applies(c) {
			set |= 1 << i
		}
	}
	return ch.by[set]
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
