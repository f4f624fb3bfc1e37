package openaiup

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"golang.org/x/sync/errgroup"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/modelapi"
	"github.com/projectdavid/toolsidecar/runstore"
)

// A run of an OpenAI-compatible application is journaled (package
// runstore) so that the application's retry resumes it rather than
// starting another: each delivered turn (its assistant message as the
// upstream will see it replayed, its text and usage), each call's output
// once known, the start of each unsafe call before it is sent, and the
// run's end. Durable mode keeps the journal in JetStream (package ledger),
// where it outlives the sidecar; otherwise it is in memory, where it
// serves a retry that comes while the first request still runs, and a
// finished run's key.
//
// The writes are ordered so that a crash anywhere resumes correctly:
//   - a turn is journaled when its finish chunk came, while its calls
//     run; its unsafe calls (handed over at the finish chunk) start, the
//     next turn is asked and the answer ends only once the write is over:
//     a resumed run never asks a delivered turn again, and an unsafe call
//     is never part of a turn the journal does not hold;
//   - an unsafe call's start is journaled before it is sent (as Core's
//     Action goes processing): one without it was never sent, and runs;
//     one with it is recovered from the ledger's captured reply, or gets
//     the interrupted outcome;
//   - a turn's outputs ride with the next turn's record, or are written
//     as one record when the run ends without one: a delivered turn that
//     is not the last always has them. A resumed run whose last turn lacks
//     some finds the workers' replies in the ledger, where each was
//     captured as it came, and runs again only a call whose reply was lost
//     (never an unsafe one: it gets the interrupted outcome);
//   - the end comes last: a run with one answers from the journal. A run
//     without the application's key then leaves its request's index, so
//     that the next identical request reads no ended run there.

// turnRecord is a delivered turn as the run holds it: the store's record,
// with the usage and the application's calls, which the store keeps as
// the JSON written here, decoded. Its Usage and AppCalls are these, not
// the record's.
type turnRecord struct {
	runstore.Turn
	Usage    modelapi.Usage
	AppCalls []modelapi.ToolCall
}

// stored is the turn as the store keeps it.
func (t turnRecord) stored() runstore.Turn {
	st := t.Turn
	st.Usage, _ = json.Marshal(t.Usage)
	st.AppCalls = nil
	if len(t.AppCalls) > 0 {
		st.AppCalls, _ = json.Marshal(t.AppCalls)
	}
	return st
}

// turnOf is a turn the store kept.
func turnOf(st runstore.Turn) (turnRecord, error) {
	t := turnRecord{Turn: st}
	if len(st.Usage) > 0 {
		if err := json.Unmarshal(st.Usage, &t.Usage); err != nil {
			return t, fmt.Errorf("openaiup: the turn's usage: %w", err)
		}
	}
	if len(st.AppCalls) > 0 {
		if err := json.Unmarshal(st.AppCalls, &t.AppCalls); err != nil {
			return t, fmt.Errorf("openaiup: the turn's application calls: %w", err)
		}
	}
	return t, nil
}

// turnsOf are the turns of a journaled run.
func turnsOf(jr *runstore.Run) ([]turnRecord, error) {
	turns := make([]turnRecord, len(jr.Turns))
	for i, st := range jr.Turns {
		var err error
		if turns[i], err = turnOf(st); err != nil {
			return nil, fmt.Errorf("turn %d: %w", i+1, err)
		}
	}
	return turns, nil
}

// journaledOf is a call as the journal keeps it.
func journaledOf(messageID string, c *executor.ToolCall) runstore.Call {
	return runstore.Call{MessageID: messageID, ActionID: c.ActionID, ToolCallID: c.ToolCallID, Tool: c.Tool, Args: c.Args, Problem: c.Problem}
}

// executorCall is a journaled call as the executor runs it.
func executorCall(runID string, c runstore.Call) *executor.ToolCall {
	return &executor.ToolCall{RunID: runID, ActionID: c.ActionID, ToolCallID: c.ToolCallID, Tool: c.Tool, Args: c.Args, Problem: c.Problem}
}

// turnOutputs are the outputs of turn n, by action id.
type turnOutputs struct {
	n    int
	outs map[string]string
}

// unjournaled are the outputs of the pending turn that the journal lacks,
// or nil. r.mu is held.
func (r *run) unjournaled() *turnOutputs {
	p := r.pending
	if p == nil || len(p.outputs) == p.outputsJournaled {
		return nil
	}
	to := &turnOutputs{n: r.turn, outs: make(map[string]string, len(p.outputs))}
	for id, out := range p.outputs {
		to.outs[p.actions[id]] = out
	}
	p.outputsJournaled = len(p.outputs)
	return to
}

// journalOutputs writes, each as a record of its turn, the outputs that
// wait to ride with the next turn's record and those of the pending turn:
// for a run that ends, or whose turn failed, with no next turn to carry
// them.
func (u *Upstream) journalOutputs(ctx context.Context, r *run) error {
	if u.store == nil {
		return nil
	}
	r.mu.Lock()
	todo := []*turnOutputs{r.prev, r.unjournaled()}
	r.prev = nil
	r.mu.Unlock()
	ctx, cancel := runstore.Bound(ctx)
	defer cancel()
	for _, to := range todo {
		if to == nil {
			continue
		}
		if err := u.store.WriteOutputs(ctx, r.id, to.n, to.outs); err != nil {
			return fmt.Errorf("openaiup: journaling the outputs of turn %d: %w", to.n, err)
		}
	}
	return nil
}

// keepOutputs journals the outputs no turn record will carry, saying so
// when it cannot: the retry then finds the replies in the ledger.
func (u *Upstream) keepOutputs(ctx context.Context, r *run) {
	if err := u.journalOutputs(ctx, r); err != nil {
		u.log.Warn("journaling the last outputs", "run_id", r.id, "err", err)
	}
}

// reload reads the run again from the journal: its delivered turns (the
// conversation after the request's messages, the text, the usage), and
// the last turn's calls with the outputs and starts journaled for them.
// A run the journal does not hold is left as it is.
func (u *Upstream) reload(ctx context.Context, r *run) error {
	if u.store == nil {
		return nil
	}
	ctx, cancel := runstore.Bound(ctx)
	jr, err := u.store.Read(ctx, r.id)
	cancel()
	if err != nil || jr == nil {
		return err
	}
	turns, err := turnsOf(jr)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.local {
		return nil // this process began driving it meanwhile
	}
	r.reset(jr)
	for i, t := range turns {
		last := i == len(turns)-1
		if t.Failed != "" && last {
			// The upstream failed this turn: a retry asks for it again,
			// and the calls it had handed over keep their outputs.
			r.turn--
			r.carried = carriedOf(r.id, t.Handed, jr.Outputs)
			break
		}
		r.apply(t)
		r.shown.WriteString(t.Content)
		if r.status != executor.RunActive {
			break
		}
		p, err := u.replayed(r.id, t, jr)
		if err != nil {
			return fmt.Errorf("turn %d's assistant message: %w", i+1, err)
		}
		if !last { // its calls all had their outputs before the next turn was asked
			msgs, err := p.messages(u.api, true)
			if err != nil {
				return fmt.Errorf("turn %d: %w", i+1, err)
			}
			r.messages = append(r.messages, msgs...)
			continue
		}
		r.pending = p
		r.result.AppCalls = t.AppCalls
		if len(t.AppCalls) > 0 && len(p.calls) == 0 {
			r.result.Parked, _ = p.messages(u.api, false)
			r.status = executor.RunCompleted
		}
	}
	if jr.End != nil && r.status == executor.RunActive {
		r.status = executor.RunCompleted // it ended on the turn limit
	}
	r.wakeUp()
	return nil
}

// reset empties the run for its journal's turns: the request's messages,
// no turn read, no text. r.mu is held.
func (r *run) reset(jr *runstore.Run) {
	r.headed, r.created = true, jr.Header.Created
	r.messages, r.turn, r.pending, r.result, r.status = slices.Clone(r.base), len(jr.Turns), nil, modelapi.Result{}, executor.RunActive
	r.began = len(jr.Turns) > 0
	r.shown.Reset()
	r.carried, r.failed = nil, ""
}

// replayed is a delivered turn of a journaled run, read whole, with its
// calls and the outputs and starts journaled for them.
func (u *Upstream) replayed(runID string, t turnRecord, jr *runstore.Run) (*pendingTurn, error) {
	p := newPendingTurn()
	p.read, p.journaled = true, true
	p.assistant = t.Assistant
	var err error
	if p.order, err = u.api.CallsOf(t.Assistant); err != nil {
		return nil, err
	}
	for _, c := range t.Calls {
		p.calls = append(p.calls, executorCall(runID, c))
		p.idOf[c.MessageID], p.handed[c.ToolCallID] = c.ToolCallID, true
		if out, ok := jr.Outputs[c.ActionID]; ok {
			p.outputs[c.ToolCallID], p.actions[c.ToolCallID] = out, c.ActionID
			p.outputsJournaled++
		}
		p.started[c.ToolCallID] = jr.Started[c.ActionID]
	}
	return p, nil
}

// carriedOf are the calls a failed turn had handed over that have their
// outputs.
func carriedOf(runID string, handed []runstore.Call, outputs map[string]string) []carriedCall {
	var carried []carriedCall
	for _, c := range handed {
		if out, ok := outputs[c.ActionID]; ok {
			carried = append(carried, carriedCall{executorCall(runID, c), out})
		}
	}
	return carried
}

// journalTurn writes a delivered turn, after the run's header the first
// time (and, for a run without the application's key, its place in the
// index of its request). A run without the application's key whose first
// turn ends it is not journaled: no retry would read it.
func (u *Upstream) journalTurn(ctx context.Context, req executor.Request, r *run, n int, rec turnRecord) error {
	if u.store == nil {
		return nil
	}
	r.mu.Lock()
	headed, key, created, prev := r.headed, r.key, r.created, r.prev
	r.mu.Unlock()
	if !headed && !key.explicit && n == 1 && len(rec.Calls)+len(rec.AppCalls)+len(rec.Handed) == 0 {
		return nil
	}
	if prev != nil && prev.n == n-1 {
		rec.Previous = prev.outs
	}
	ctx, cancel := runstore.Bound(ctx)
	defer cancel()
	if !headed {
		// A fresh run's lease is taken while its first turn streams:
		// once the index names the run, other sidecars find it driven.
		if err := req.Leased(ctx); err != nil {
			return err
		}
	}
	// The records are written at once: none is read without the others
	// being useful (a header without the turn asks for the turn again; a
	// turn without its header is not found), and the turn's unsafe calls
	// wait for all of them.
	g, ctx := errgroup.WithContext(ctx)
	if !headed {
		g.Go(func() error {
			return u.store.WriteHeader(ctx, r.id, runstore.Header{Request: key.digest, Created: created})
		})
		if !key.explicit {
			g.Go(func() error { return u.store.Index(ctx, key.digest, r.id) })
		}
	}
	g.Go(func() error { return u.store.WriteTurn(ctx, r.id, n, rec.stored()) })
	if err := g.Wait(); err != nil {
		return err
	}
	r.mu.Lock()
	r.headed = true
	if r.prev == prev && rec.Previous != nil {
		r.prev = nil
	}
	r.mu.Unlock()
	return nil
}

// journalEnd writes how a journaled run ended.
func (u *Upstream) journalEnd(ctx context.Context, r *run, sum executor.Summary) {
	r.mu.Lock()
	local := r.local
	r.mu.Unlock()
	if local {
		u.settle(ctx, r) // the turns' records before the end (done by End for a run with a key)
	}
	r.mu.Lock()
	write := r.headed && !r.ended // requests attached to one run end it once
	r.ended = true
	r.mu.Unlock()
	if u.store == nil || !write {
		return
	}
	ctx, cancel := runstore.Bound(ctx)
	defer cancel()
	data, _ := json.Marshal(sum)
	if err := u.store.WriteEnd(ctx, r.id, runstore.End{Summary: data}); err != nil {
		u.log.Warn("journaling the run's end", "run_id", r.id, "err", err)
		return
	}
	if !r.key.explicit {
		if err := u.store.Unindex(ctx, r.key.digest, r.id); err != nil {
			u.log.Warn("removing an ended run from its request's index", "run_id", r.id, "err", err)
		}
	}
}
