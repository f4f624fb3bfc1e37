package executor

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// reconcile finishes, before any turn, the calls Core has open for the
// run: Actions pending or processing that a previous drive, or a sidecar
// that died, left without a recorded outcome. They are joined as a batch,
// in call order, through the same steps as a turn's calls.
func (e *Executor) reconcile(ctx context.Context, req Request, emit Sink, log *slog.Logger) turnResult {
	var tr turnResult
	tctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	br := e.newBatch(tctx, req, 0, emit, log)
	br.addOpen(ctx)
	if br.b.Len() > 0 {
		log.Info("reconciled open calls with Core", "calls", br.b.Len())
	}
	br.wait(ctx, &tr, cancel)
	return tr
}

// addOpen adds the run's open Actions that the batch has not seen, in the
// order Core created them. For each: an output already in the thread is
// not posted again (its Action is only finalised); an outcome this sidecar
// kept is submitted; otherwise the call runs again when its tool may be
// repeated, and an unsafe call that may have run gets an "interrupted"
// outcome instead (call.outcome).
func (br *batchRun) addOpen(ctx context.Context) {
	e := br.e
	open, err := e.openCalls(ctx, br.req.RunID)
	if err != nil {
		br.log.Error("listing the run's open Actions", "err", err)
		return
	}
	var recorded map[string]bool
	for _, a := range open {
		if br.seen[a.ID] {
			continue
		}
		br.seen[a.ID] = true
		if recorded == nil {
			recorded = e.recordedOutputs(ctx, br.req.ThreadID)
		}
		m := &core.Manifest{Type: string(core.KindManifest), RunID: br.req.RunID, ActionID: a.ID, ToolCallID: a.ToolCallID, Tool: a.ToolName, Args: argsOrEmpty(a.FunctionArgs)}
		m.Raw, _ = json.Marshal(m) // the manifest as Core would have framed it
		c := &call{e: e, b: br, m: m, open: a.Status, kept: e.takeKept(m.ActionID), recorded: recorded[m.ToolCallID]}
		switch {
		case c.kept != nil:
			br.log.Info("submitting a kept outcome", "action_id", m.ActionID, "tool_call_id", m.ToolCallID)
			c.kept.res.Turn = br.n
			c.kept.recorded = c.kept.recorded || c.recorded
		case c.recorded:
			br.log.Info("output already in Core; finalising the Action", "action_id", m.ActionID, "tool_call_id", m.ToolCallID)
		default:
			br.log.Info("finishing an open call", "action_id", m.ActionID, "tool_call_id", m.ToolCallID, "status", a.Status)
			c.def, c.pre = e.precheck(br.reg, m)
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
func (e *Executor) recovered(ctx context.Context, br *batchRun, m *core.Manifest, def *registry.Tool) (o *outcome, neverSent bool) {
	if e.recoverer == nil {
		return nil, false
	}
	await := def != nil && def.SideEffects == config.Unsafe
	reply, ok, err := e.recoverer.Recover(ctx, m.ActionID, await)
	if errors.Is(err, tool.ErrNeverSent) {
		br.log.Info("the call was never sent: running it", "action_id", m.ActionID, "tool_call_id", m.ToolCallID)
		return nil, true
	}
	if err != nil {
		br.log.Warn("reading the ledger", "action_id", m.ActionID, "err", err)
	}
	if !ok {
		return nil, false
	}
	br.log.Info("the call's reply outlived its sidecar: submitting it", "action_id", m.ActionID, "tool_call_id", m.ToolCallID)
	e.obs.CallRecovered()
	o = newOutcome(br.n, m)
	o.res.Attempts = 1
	e.settle(o, reply)
	return o, false
}

// openCalls lists the run's Actions that are pending or processing, in the
// order Core created them: by triggered_at, which Core stamps as it reads
// each call from the model's stream. Actions whose stamps are equal or
// unreadable keep the order of Core's listings.
func (e *Executor) openCalls(ctx context.Context, runID string) ([]core.Action, error) {
	var open []core.Action
	for _, status := range []string{core.ActionPending, core.ActionProcessing} {
		as, err := e.core.ActionsByStatus(ctx, runID, status)
		if err != nil {
			return nil, err
		}
		for _, a := range as {
			if a.Status == "" {
				a.Status = status
			}
			open = append(open, a)
		}
	}
	slices.SortStableFunc(open, func(a, b core.Action) int { return core.CompareTriggered(a, b) })
	return open, nil
}

// recordedOutputs lists the tool_call_ids whose tool message is in the
// thread. On error it says none are: the write itself reads again before
// posting, so nothing is posted twice.
func (e *Executor) recordedOutputs(ctx context.Context, threadID string) map[string]bool {
	out := map[string]bool{}
	msgs, err := e.core.ListMessages(ctx, threadID, 100)
	if err != nil {
		e.log.Warn("listing the thread's tool messages", "thread_id", threadID, "err", err)
		return out
	}
	for _, m := range msgs {
		if m.Role == "tool" && m.ToolCallID != "" {
			out[m.ToolCallID] = true
		}
	}
	return out
}

func argsOrEmpty(a json.RawMessage) json.RawMessage {
	if len(a) == 0 || string(a) == "null" {
		return json.RawMessage("{}")
	}
	return a
}
