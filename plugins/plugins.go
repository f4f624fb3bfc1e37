// Package plugins holds the route kinds that run a tool without a NATS
// worker of its own, exec (a command per call) and http (a URL per call),
// and [Local], the in-process transport that runs them. Each kind is one
// file that registers itself with the registry in init(); the registry
// builds a tool's handler when it compiles the tool. The same handler serves
// in the sidecar's process and as a NATS worker (`toolsidecar worker`).
package plugins

import (
	"context"
	"log/slog"
	"time"

	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// Local runs tools that have an in-process handler, in the sidecar's
// process. It satisfies the executor's Dispatcher.
type Local struct {
	tools interface{ Load() *registry.Registry }
	log   *slog.Logger
}

// NewLocal serves the tools in force in tools.
func NewLocal(tools interface{ Load() *registry.Registry }, log *slog.Logger) *Local {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Local{tools: tools, log: log}
}

// Dispatch runs one attempt in process, under the attempt's timeout.
func (l *Local) Dispatch(ctx context.Context, req tool.Request) tool.Outcome {
	def, ok := l.tools.Load().Lookup(req.Tool)
	if !ok {
		return tool.Outcome{Err: tool.NewError(tool.NotFound, "tool %q is not registered", req.Tool)}
	}
	if def.Handler == nil {
		return tool.Outcome{Err: tool.NewError(tool.NotFound, "tool %q has route %q, which does not run in process", req.Tool, def.Route)}
	}
	call, err := tool.ParseCall(req.Tool, req.Body)
	if err != nil {
		return tool.Outcome{Err: tool.AsError(err)}
	}
	call.Attempt, call.IdempotencyKey, call.Traceparent = req.Attempt, req.ActionID, req.Traceparent
	// Nothing runs beside the hook in process: the tool's time starts
	// after it.
	req.Sent()
	// The timeout bounds the call; a handler that hears progress from its
	// tool (an MCP server's notifications) restarts it, as a NATS
	// worker's progress does, never past max_duration.
	timeout, hard := req.TimeoutOrDefault(), req.MaxDurationOrDefault()
	started := time.Now()
	call.Deadline = started.Add(timeout)
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	limit := time.AfterFunc(timeout, func() { cancel(context.DeadlineExceeded) })
	defer limit.Stop()
	call.SetProgress(func() error {
		if left := hard - time.Since(started); left > 0 {
			limit.Reset(min(timeout, left))
		}
		return nil
	})
	return tool.OutcomeOf(tool.Invoke(cctx, def.Handler, call, l.log))
}
