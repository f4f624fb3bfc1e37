// Package mcpserve serves the sidecar's registered tools as a Model
// Context Protocol server over streamable HTTP (/mcp, with server.mcp):
// an MCP client's tools/call runs through the executor's dispatch, its
// policies, metrics and tracing, as a model's call does. No upstream
// records these calls: they have no Core Action and no conversation.
package mcpserve

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/internal/version"
	"github.com/projectdavid/toolsidecar/registry"
)

// Caller runs one call that no upstream records; *executor.Executor's Call
// is one.
type Caller func(ctx context.Context, tool string, args json.RawMessage) executor.CallResult

// Handler is the MCP server of the registry in force: a reload adds and
// removes its tools (clients are told, tools/list_changed).
type Handler struct {
	http.Handler
	srv    *mcp.Server
	call   Caller
	screen *registry.Screen

	mu    sync.Mutex
	names []string // the tools served now
}

// New serves the tools of live, calling them with call. A tool the MCP
// SDK refuses is left out, through screen (nil: left out silently), and
// the others are served.
func New(live *registry.Live, call Caller, screen *registry.Screen) *Handler {
	if screen == nil {
		screen = registry.NewScreen("mcp", nil, nil)
	}
	h := &Handler{srv: mcp.NewServer(&mcp.Implementation{Name: "toolsidecar", Version: version.Get().Version}, nil), call: call, screen: screen}
	h.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return h.srv }, &mcp.StreamableHTTPOptions{Stateless: true})
	h.set(live.Load())
	live.Watch(h.set)
	return h
}

// set serves the tools of reg that the SDK takes, and only those. It runs
// at start and on every reload and discovery: a tool that cannot be
// served must not stop it.
func (h *Handler) set(reg *registry.Registry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	// read_tool_result pages a run's results: no MCP client has a run.
	offered := slices.DeleteFunc(reg.Tools(), func(t *registry.Tool) bool { return t.Route == registry.Builtin })
	served := h.screen.Keep(offered, h.add)
	names := make([]string, len(served))
	for i, t := range served {
		names[i] = t.Name
	}
	// A tool gone, or now refused (the SDK kept its earlier version), is
	// removed.
	var gone []string
	for _, n := range h.names {
		if !slices.Contains(names, n) {
			gone = append(gone, n)
		}
	}
	if len(gone) > 0 {
		h.srv.RemoveTools(gone...)
	}
	h.names = names
}

// add serves t, or says why the SDK does not take it.
func (h *Handler) add(t *registry.Tool) (err error) {
	if err := registry.CheckFunction(t.FunctionTool()); err != nil {
		return err
	}
	// The SDK panics on a tool it refuses (an x-mcp-header annotation on a
	// property that is not a string, an integer or a boolean, say): checks
	// of its own, which grow with the protocol, and which the registry
	// does not repeat for every consumer. It panics before it changes
	// anything, so its server stays as it was.
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the MCP SDK refuses the tool: %v", p)
		}
	}()
	h.srv.AddTool(&mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: json.RawMessage(t.Parameters),
		Annotations: annotations(t.SideEffects)}, h.tool(t.Name))
	return nil
}

// annotations tell the client what the tool's class says.
func annotations(sideEffects string) *mcp.ToolAnnotations {
	no := false
	switch sideEffects {
	case config.ReadOnly:
		return &mcp.ToolAnnotations{ReadOnlyHint: true}
	case config.Idempotent:
		return &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: &no}
	}
	return &mcp.ToolAnnotations{}
}

func (h *Handler) tool(name string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		args := req.Params.Arguments
		if len(args) == 0 {
			args = json.RawMessage("{}")
		}
		res := h.call(ctx, name, args)
		r := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: res.Output}}}
		r.IsError = !res.OK
		return r, nil
	}
}
