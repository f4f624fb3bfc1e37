package executor

import (
	"context"
	"errors"
	"log/slog"

	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// reconcile finishes, before any turn, the calls the upstream has open
// for the run: Actions pending or processing that a previous drive, or a sidecar
// that died, left without a recorded outcome. They are joined as a batch,
// in call order, through the same steps as a turn's calls.
func (e *Executor) reconcile(ctx context.Context, req Request, emit Sink, log *slog.Logger) turnResult {
	var tr turnResult
	tctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	br := e.newBatch(tctx, req, 0, emit, log)
	br.addOpen(ctx)
	if br.b.Len() > 0 {
		log.Info("reconciled open calls with the upstream", "calls", br.b.Len())
	}
	br.wait(ctx, &tr, cancel)
	return tr
}

// addOpen adds the run's open calls that the batch has not seen, in the
// order the model made them. For each: an output already recorded is not
// recorded again (only the final status is written); an outcome this
// sidecar kept is submitted; otherwise the call runs again when its tool
// may be repeated, and an unsafe call that may have run gets an
// "interrupted" outcome instead (call.outcome).
func (br *batchRun) addOpen(ctx context.Context) {
	e := br.e
	open, err := e.up.OpenCalls(ctx, br.req)
	if err != nil {
		br.log.Error("listing the run's open calls", "err", err)
		return
	}
	for _, oc := range open {
		m := oc.Call
		if br.seen[m.ActionID] {
			continue
		}
		br.seen[m.ActionID] = true
		c := &call{e: e, b: br, m: m, in: callIn{Found: true}, started: oc.Started}
		switch kept := e.takeKept(m.ActionID); {
		case kept != nil:
			callLog(br.log, m).Info("submitting a kept outcome")
			kept.res.Turn = br.n
			if oc.Recorded {
				kept.leaves = outputRecorded
			}
			c.known = kept
		case oc.Recorded:
			callLog(br.log, m).Info("output already recorded; finalising the call")
			c.known = e.alreadyRecorded(br.n, m)
		default:
			callLog(br.log, m).Info("finishing an open call", "started", oc.Started)
		}
		br.start(c)
	}
}

// recovered is the outcome from the reply that the durable ledger kept for
// a call that was running when its sidecar went away, or nil. An unsafe
// call cannot run again, so its reply is awaited until its deadline.
// neverSent: the ledger knows that no attempt left (the sidecar died
// between marking the Action processing and sending the request), so
// running the call now is its first run.
func (e *Executor) recovered(ctx context.Context, br *batchRun, m *ToolCall, def *registry.Tool) (o *outcome, neverSent bool) {
	if e.recoverer == nil {
		return nil, false
	}
	await := def != nil && def.Unsafe()
	reply, ok, err := e.recoverer.Recover(ctx, m.ActionID, await)
	if errors.Is(err, tool.ErrIntentOfOldFormat) && def != nil && def.Handler != nil {
		// Marked by a sidecar of an earlier release, which ran such a
		// call without recording it: whether it ran is not known.
		callLog(br.log, m).Warn("the call's intent was recorded by an earlier release, which did not record calls run in process: its effect is unknown")
		return nil, false
	}
	if errors.Is(err, tool.ErrNeverSent) {
		callLog(br.log, m).Info("the call was never sent: running it")
		return nil, true
	}
	if err != nil {
		callLog(br.log, m).Warn("reading the ledger", "err", err)
	}
	if !ok {
		return nil, false
	}
	callLog(br.log, m).Info("the call's reply outlived its sidecar: submitting it")
	e.obs.CallRecovered()
	o = newOutcome(br.n, m)
	o.res.Attempts = 1
	e.settle(o, reply)
	return o, false
}
