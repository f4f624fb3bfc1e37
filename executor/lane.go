package executor

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/projectdavid/toolsidecar/tool"
)

// lanes is the lane policy: the calls of one batch whose tools name the
// same lane run one after another, in the order the model made them, and
// under skip_rest a failure skips the rest of the lane. Calls a
// reconciliation found run without lanes: the order they were made in is
// not known.
type lanes struct{ maxResult int }

// lane is one ordered lane of a batch.
type lane struct {
	name     string
	skipRest bool
	failed   atomic.Pointer[string] // under skip_rest: why the rest does not run

	mu      sync.Mutex
	last    <-chan struct{}       // closed when the lane's last call so far has its outcome; nil before the first
	tickets map[string]laneTicket // by Action
}

// laneTicket is a call's place in its lane.
type laneTicket struct {
	before <-chan struct{} // closed when the call before it has its outcome; nil for the first
	done   chan struct{}   // closed when this call has its outcome
}

// batchLanes are a batch's lanes, opened on first use.
type batchLanes struct {
	mu sync.Mutex
	by map[string]*lane
}

func (p *lanes) concerns(in *callIn) bool {
	return in.Tool != nil && in.Tool.Policies.Lane != nil && !in.Found
}

// lane returns the call's lane in its batch.
func (p *lanes) lane(in *callIn) *lane {
	bl := in.Batch.get(p, func() any { return &batchLanes{by: map[string]*lane{}} }).(*batchLanes)
	cfg := in.Tool.Policies.Lane
	bl.mu.Lock()
	defer bl.mu.Unlock()
	ln := bl.by[cfg.Name]
	if ln == nil {
		ln = &lane{name: cfg.Name, skipRest: cfg.SkipRest, tickets: map[string]laneTicket{}}
		bl.by[cfg.Name] = ln
	}
	return ln
}

// admit puts the call at the end of its lane: it will wait for the call
// before it.
func (p *lanes) admit(in *callIn) *tool.Error {
	ln := p.lane(in)
	ln.mu.Lock()
	defer ln.mu.Unlock()
	t := laneTicket{before: ln.last, done: make(chan struct{})}
	ln.tickets[in.ActionID], ln.last = t, t.done
	in.Res.Lane = ln.name
	return nil
}

// intercept starts the call once the call before it in its lane has its
// outcome, and records a failure that skips the rest.
func (p *lanes) intercept(ctx context.Context, in *callIn, next step) answer {
	ln := p.lane(in)
	ln.mu.Lock()
	t, ok := ln.tickets[in.ActionID]
	delete(ln.tickets, in.ActionID)
	ln.mu.Unlock()
	if !ok {
		return next(ctx, in) // not admitted to the lane
	}
	defer close(t.done)
	if t.before != nil {
		select {
		case <-t.before:
		case <-ctx.Done():
			return answer{Outcome: tool.Outcome{Err: tool.NewError(tool.Cancelled, "call cancelled while it waited for its lane %q: %v", ln.name, context.Cause(ctx))}}
		}
	}
	if why := ln.failed.Load(); why != nil {
		return answer{Outcome: tool.Outcome{Err: tool.NewError(tool.Skipped, "not run: %s", *why)}}
	}
	a := next(ctx, in)
	if ln.skipRest && (a.Err != nil || len(a.Data) > p.maxResult) {
		errType := tool.ToolFailed
		if a.Err != nil {
			errType = a.Err.Type
		}
		why := fmt.Sprintf("call %s (%s) earlier in lane %q failed with %s, and the lane skips the rest", in.ToolCallID, in.ToolCall.Tool, ln.name, errType)
		ln.failed.CompareAndSwap(nil, &why)
	}
	return a
}
