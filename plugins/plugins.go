// Package plugins holds the route kinds that run a tool without a NATS
// worker of its own: exec (a command per call) and http (a URL per call).
// Each kind registers itself in init(), so a new kind is one new file.
//
// A kind turns a tool definition into a bridge.Handler. The same handler
// serves in the sidecar's process ([Local], a dispatcher for the executor)
// and as a NATS worker (`toolsidecar worker`).
package plugins

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/registry"
)

// Kind is a route kind: how to check a tool's settings and how to build
// its handler.
type Kind struct {
	// Check validates the tool's settings; errors start with the key
	// under the tool ("exec.command: ...").
	Check func(config.Tool) error
	// New builds the handler. It does no I/O.
	New func(*registry.Tool) (bridge.Handler, error)
}

var (
	kindsMu sync.RWMutex
	kinds   = map[string]Kind{}
)

// Register adds a route kind, also to the registry's known routes. It
// panics on a duplicate or incomplete kind: a programming error.
func Register(name string, k Kind) {
	if k.Check == nil || k.New == nil {
		panic("plugins: kind " + name + " without Check or New")
	}
	kindsMu.Lock()
	defer kindsMu.Unlock()
	if _, dup := kinds[name]; dup {
		panic("plugins: kind " + name + " registered twice")
	}
	kinds[name] = k
	registry.RegisterRoute(name, k.Check)
}

// Kinds lists the registered kind names.
func Kinds() []string {
	kindsMu.RLock()
	defer kindsMu.RUnlock()
	out := make([]string, 0, len(kinds))
	for n := range kinds {
		out = append(out, n)
	}
	return out
}

// Handler builds the handler of a tool whose route is a plugin kind.
func Handler(t *registry.Tool) (bridge.Handler, error) {
	kindsMu.RLock()
	k, ok := kinds[t.Route]
	kindsMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("plugins: tool %q: route %q is not a plugin kind", t.Name, t.Route)
	}
	return k.New(t)
}

// decodeSettings reads a tool's settings map into v, strictly: an unknown
// key is an error that names it.
func decodeSettings(key string, m map[string]any, v any) error {
	raw, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	return nil
}

// Local runs plugin-kind tools in the sidecar's process. It satisfies the
// executor's Dispatcher. Handlers are built once per compiled tool, so a
// reload that changes a tool gets a new handler.
type Local struct {
	tools interface{ Load() *registry.Registry }
	log   *slog.Logger

	mu       sync.Mutex
	handlers map[*registry.Tool]bridge.Handler
}

// NewLocal serves the tools in force in tools.
func NewLocal(tools interface{ Load() *registry.Registry }, log *slog.Logger) *Local {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Local{tools: tools, log: log, handlers: map[*registry.Tool]bridge.Handler{}}
}

func (l *Local) handler(t *registry.Tool) (bridge.Handler, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.handlers[t]; ok {
		return h, nil
	}
	h, err := Handler(t)
	if err != nil {
		return nil, err
	}
	if len(l.handlers) > 1024 { // reloads replace tools; forget the old ones
		clear(l.handlers)
	}
	l.handlers[t] = h
	return h, nil
}

// Dispatch runs one attempt in process, under the attempt's timeout.
func (l *Local) Dispatch(ctx context.Context, req bridge.Request) bridge.Reply {
	tool, ok := l.tools.Load().Lookup(req.Tool)
	if !ok {
		return bridge.Reply{Err: bridge.NewError(bridge.NotFound, "tool %q is not registered", req.Tool)}
	}
	h, err := l.handler(tool)
	if err != nil {
		return bridge.Reply{Err: bridge.NewError(bridge.ToolFailed, "%v", err)}
	}
	call, err := bridge.ParseCall(req.Tool, req.Body)
	if err != nil {
		return bridge.Reply{Err: bridge.AsError(err)}
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	call.Attempt, call.IdempotencyKey, call.Traceparent = req.Attempt, req.ActionID, req.Traceparent
	call.Deadline = time.Now().Add(timeout)
	cctx, cancel := context.WithDeadline(ctx, call.Deadline)
	defer cancel()
	data, err := bridge.Invoke(cctx, h, call, l.log)
	if err != nil {
		return bridge.Reply{Sent: true, Err: bridge.AsError(err)}
	}
	return bridge.Reply{Sent: true, Data: data}
}
