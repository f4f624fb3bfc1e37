// Package mcpserve serves the sidecar's registered tools as a Model
// Context Protocol server over streamable HTTP (/mcp, with server.mcp):
// an MCP client's tools/call runs through the executor's dispatch, its
// policies, metrics and tracing, as a model's call does. No upstream
// records these calls: they have no Core Action and no conversation.
package mcpserve

import (
	"context"
	"encoding/json"
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
	srv  *mcp.Server
	call Caller

	mu    sync.Mutex
	names []string // the tools served now
}

// New serves the tools of live, calling them with call.
func New(live *registry.Live, call Caller) *Handler {
	h := &Handler{srv: mcp.NewServer(&mcp.Implementation{Name: "toolsidecar", Version: version.Get().Version}, nil), call: call}
	h.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return h.srv }, &mcp.StreamableHTTPOptions{Stateless: true})
	h.set(live.Load())
	live.Watch(h.set)
	return h
}

// set serves the tools of reg, and only those.
func (h *Handler) set(reg *registry.Registry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	names := reg.Names()
	var gone []string
	for _, n := range h.names {
		if !slices.Contains(names, n) {
			gone = append(gone, n)
		}
	}
	if len(gone) > 0 {
		h.srv.RemoveTools(gone...)
	}
	for _, t := range reg.Tools() {
		if t.Route == registry.Builtin {
			continue // read_tool_result pages a run's results: no MCP client has a run
		}
		h.srv.AddTool(&mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: json.RawMessage(t.Parameters),
			Annotations: annotations(t.SideEffects)}, h.tool(t.Name))
	}
	h.names = names
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
