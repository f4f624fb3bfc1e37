package executor

import (
	"context"
	"log/slog"
	"sync"

	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// A policy is one rule over calls, in one file of its own: which calls it
// concerns, and one or more hooks, each optional and found by type
// assertion, as a Caddy module's are:
//
//   - [admitter]: as the call arrives, in the model's order, before it
//     waits for anything; it may refuse the call;
//   - [interceptor]: around the call's dispatch; it may answer the call
//     without a worker, change the reply on its way back, or leave the
//     call for the next drive (answer.left);
//   - [driveKeeper]: across a drive; it may end the drive after a batch,
//     and report to the drive's summary.
//
// A policy sees a call as a [callIn], never the executor's own call.
// Adding a policy is a file with its type and hooks, a line in
// [Executor.policySet], its compiled settings in registry.Policies, and
// their validate in config.
type policy interface {
	// concerns reports whether the policy applies to the call: a call
	// goes through the policies that concern it only.
	concerns(in *callIn) bool
}

// admitter is a policy that decides on a call as it arrives.
type admitter interface {
	policy
	// admit runs in the model's order, once per call read from a turn;
	// an error refuses the call, which is then answered with it.
	admit(in *callIn) *tool.Error
}

// interceptor is a policy around dispatch. next is the rest of the chain,
// down to the worker.
type interceptor interface {
	policy
	intercept(ctx context.Context, in *callIn, next step) answer
}

// driveKeeper is a policy with a say over a whole drive.
type driveKeeper interface {
	policy
	// stops reports, after a batch, why the drive must end instead of
	// asking for another turn: its status and reason ("" to go on).
	stops(d *scope) (status, why string)
	// report adds the policy's account of the drive to its summary.
	report(d *scope, sum *Summary)
}

// step is a call's way from one policy to its worker.
type step func(ctx context.Context, in *callIn) answer

// answer is what the dispatch, or a policy in its place, gives back: the
// reply, and what the call leaves.
type answer struct {
	tool.Outcome
	// left: the call records nothing and stays open for the next drive
	// of its run (it waited for a person as the sidecar stopped).
	left bool
}

// callIn is what a policy sees of a call.
type callIn struct {
	*ToolCall
	// Tool is the compiled tool, nil for an unknown one; its settings
	// are in Tool.Policies.
	Tool *registry.Tool
	// Check is why the call failed its check or was refused, or nil.
	Check *tool.Error
	// Found: a reconciliation found the call open upstream; it was not
	// read from a turn, and the order it was made in is not known here.
	Found bool
	Turn  int
	// Drive and Batch hold the policies' state for the drive and the
	// batch the call is in.
	Drive, Batch *scope
	// Res is where a policy notes what it did (deduped, approved, ...).
	Res *CallResult
	// Log is the batch's logger; callLog adds the call's ids.
	Log  *slog.Logger
	Emit Sink
	// Leavable: a later drive of the run will find the call, so it may be
	// left open for it (false for an MCP client's call).
	Leavable bool
	// Caller is the drive's (Request.Caller): the owner of the approvals
	// the call opens.
	Caller string

	owner *call // for dispatch, at the bottom of the chain; no policy uses it
}

// ref names the call in the events before its outcome.
func (in *callIn) ref() *CallResult {
	return &CallResult{Turn: in.Turn, ToolCallID: shown(in.ToolCallID, tool.MaxCallIDBytes), ActionID: shown(in.ActionID, tool.MaxIDBytes),
		Tool: shown(in.ToolCall.Tool, tool.MaxCallIDBytes), Lane: in.Res.Lane}
}

// scope holds each policy's state for a drive or a batch, made on first
// use.
type scope struct {
	mu   sync.Mutex
	vals map[policy]any
}

func (s *scope) get(p policy, open func() any) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vals[p]
	if !ok {
		if s.vals == nil {
			s.vals = map[policy]any{}
		}
		v = open()
		s.vals[p] = v
	}
	return v
}

// policySet is the executor's policies, outermost first:
//
//   - lane (lane.go): calls of one lane run one after another, and under
//     skip_rest a failure skips the rest;
//   - checked: a call that failed its check is answered with that failure
//     (inside its lane, so in its lane's order);
//   - approval (approval.go): a call waits for a person's decision;
//   - dedupe (dedupe.go): a repeated call is answered from an earlier one;
//   - budget (budget.go): calls are admitted against the run's and the
//     tool's budgets, and their spending counted;
//   - claim-check (claimcheck.go): a large result is stored, and the model
//     reads a preview and a handle.
//
// Hedging is a policy of one attempt, not of the call (hedge.go).
func (e *Executor) policySet() []policy {
	return []policy{&lanes{maxResult: e.cfg.MaxResultBytes}, checked{}, &approvals{e}, &dedupe{e}, &budgets{e: e}, &claimChecks{e}}
}

// chains are the dispatch through each set of interceptors, composed once
// (a bit per interceptor). A call goes through those that concern it
// only: it waits for its worker at the bottom of its chain, so the frames
// of the policies it skips are not on its goroutine's stack while it
// waits, and the collector, whose goal grows with the stacks in use, lets
// the heap grow less (BENCHMARKS.md, "Load").
type chains struct {
	all       []policy
	admitters []admitter
	keepers   []driveKeeper
	around    []interceptor
	by        []step // indexed by the set of interceptors
}

func newChains(all []policy, bottom step) *chains {
	ch := &chains{all: all}
	for _, p := range all {
		if a, ok := p.(admitter); ok {
			ch.admitters = append(ch.admitters, a)
		}
		if k, ok := p.(driveKeeper); ok {
			ch.keepers = append(ch.keepers, k)
		}
		if i, ok := p.(interceptor); ok {
			ch.around = append(ch.around, i)
		}
	}
	ch.by = make([]step, 1<<len(ch.around))
	for set := range ch.by {
		s := bottom
		for i := len(ch.around) - 1; i >= 0; i-- {
			if set&(1<<i) != 0 {
				s = wrap(ch.around[i], s)
			}
		}
		ch.by[set] = s
	}
	return ch
}

func wrap(p interceptor, next step) step {
	return func(ctx context.Context, in *callIn) answer { return p.intercept(ctx, in, next) }
}

// admit runs the admitters that concern the call, in order; the first
// refusal is the call's.
func (ch *chains) admit(in *callIn) {
	for _, a := range ch.admitters {
		if a.concerns(in) {
			if err := a.admit(in); err != nil && in.Check == nil {
				in.Check = err
			}
		}
	}
}

// of is the dispatch through the interceptors that concern the call.
func (ch *chains) of(in *callIn) step {
	set := 0
	for i, p := range ch.around {
		if p.concerns(in) {
			set |= 1 << i
		}
	}
	return ch.by[set]
}

// stops asks each drive keeper whether the drive must end.
func (ch *chains) stops(d *scope) (status, why string) {
	for _, k := range ch.keepers {
		if status, why = k.stops(d); status != "" {
			return status, why
		}
	}
	return "", ""
}

// report has each drive keeper report to the summary.
func (ch *chains) report(d *scope, sum *Summary) {
	for _, k := range ch.keepers {
		k.report(d, sum)
	}
}

// checked answers a call that failed its check (an unknown tool, invalid
// arguments, a budget's refusal) with that failure, without sending it.
type checked struct{}

func (checked) concerns(in *callIn) bool { return in.Check != nil }

func (checked) intercept(ctx context.Context, in *callIn, next step) answer {
	if in.Check != nil {
		return answer{Outcome: tool.Outcome{Err: in.Check}}
	}
	return next(ctx, in)
}
