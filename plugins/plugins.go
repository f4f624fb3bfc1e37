// Package plugins holds the route kinds that run a tool without a NATS
// worker of its own, exec (a command per call) and http (a URL per call),
// all of them dispatched in process. Each kind is one
// file; [Kinds] adds them to a set of kinds, which the registry is given:
// it builds a tool's handler when it compiles the tool. The same handler serves
// in the sidecar's process and as a NATS worker (`toolsidecar worker`).
package plugins

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// Options configure this package's route kinds.
type Options struct {
	// MaxExecProcesses bounds the exec-route processes running at once,
	// across all tools and runs. default: 64
	MaxExecProcesses int
	// Logger hears a panic of a handler. default: discard
	Logger *slog.Logger
}

// Kinds is base with this package's route kinds: exec, http and mcp.
// Each is a value of its own: the exec kind holds its bound on processes,
// the mcp kind its sessions, which its Close ends.
func Kinds(base registry.Kinds, o Options) registry.Kinds {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	run := inProcess{log}
	return base.With(registry.Kinds{
		"exec": &execKind{inProcess: run, processes: newSemaphore(cmp.Or(o.MaxExecProcesses, 64))},
		"http": httpKind{run},
		"mcp":  &mcpKind{inProcess: run, pool: &mcpPool{byKey: map[string]*mcpServer{}}},
	})
}

// inProcess dispatches the calls of a kind whose tools run in the
// sidecar's process: each attempt runs the tool's handler, under the
// attempt's timeout.
type inProcess struct{ log *slog.Logger }

// Dispatch runs one attempt in process, under the attempt's timeout.
func (l inProcess) Dispatch(ctx context.Context, def *registry.Tool, req tool.Request) tool.Outcome {
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
