package executor

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/tool"
)

// lane is an ordered lane of one batch: the calls whose tools name it run
// one after another, in the order the model made them.
type lane struct {
	name     string
	skipRest bool
	last     chan struct{}          // closed when the lane's last call so far has its outcome; nil before the first
	failed   atomic.Pointer[string] // under skip_rest: why the rest does not run
}

// join puts c at the end of the lane: it will wait for the call before it.
// Called by the stream's reader, one manifest at a time.
func (ln *lane) join(c *call) {
	c.ln, c.laneBefore = ln, ln.last
	ln.last = c.ran
}

// lane returns the batch's lane of that name, opening it on first use.
func (br *batchRun) lane(name string) *lane {
	ln := br.lanes[name]
	if ln == nil {
		ln = &lane{name: name, skipRest: br.e.cfg.Lanes[name].OnError == config.LaneSkipRest}
		br.lanes[name] = ln
	}
	return ln
}

// inLane is the lane policy: a call of a lane starts once the call before
// it in the lane has its outcome, and under skip_rest a failure skips the
// rest of the lane. A call of no lane passes straight on.
func (e *Executor) inLane(next dispatchFunc) dispatchFunc {
	return func(ctx context.Context, c *call, o *outcome) tool.Outcome {
		ln := c.ln
		if ln == nil {
			return next(ctx, c, o)
		}
		if c.laneBefore != nil {
			select {
			case <-c.laneBefore:
			case <-ctx.Done():
				return tool.Outcome{Err: tool.NewError(tool.Cancelled, "call cancelled while it waited for its lane %q: %v", ln.name, context.Cause(ctx))}
			}
		}
		if why := ln.failed.Load(); why != nil {
			return tool.Outcome{Err: tool.NewError(tool.Skipped, "not run: %s", *why)}
		}
		reply := next(ctx, c, o)
		if ln.skipRest && (reply.Err != nil || len(reply.Data) > e.cfg.MaxResultBytes) {
			errType := tool.ToolFailed
			if reply.Err != nil {
				errType = reply.Err.Type
			}
			why := fmt.Sprintf("call %s (%s) earlier in lane %q failed with %s, and the lane skips the rest", c.m.ToolCallID, c.m.Tool, ln.name, errType)
			ln.failed.CompareAndSwap(nil, &why)
		}
		return reply
	}
}
