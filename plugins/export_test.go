package plugins

import (
	"context"
	"log/slog"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// testKinds are the kinds the package's tests compile tools with.
var testKinds = Kinds(registry.Base(nil), Options{})

// TestKinds is testKinds, for the package's external tests.
var TestKinds = testKinds

// StopMCP ends the MCP sessions of the tests' kinds.
func StopMCP() { _ = testKinds.Close() }

// Local dispatches a call by tool name, through the tool's kind, as the
// executor does.
type Local struct {
	tools interface{ Load() *registry.Registry }
}

// NewLocal dispatches the tools in force in tools.
func NewLocal(tools interface{ Load() *registry.Registry }, _ *slog.Logger) *Local {
	return &Local{tools}
}

// Dispatch runs one attempt through the tool's kind.
func (l *Local) Dispatch(ctx context.Context, req tool.Request) tool.Outcome {
	def, ok := l.tools.Load().Lookup(req.Tool)
	if !ok {
		return tool.Outcome{Err: tool.NewError(tool.NotFound, "tool %q is not registered", req.Tool)}
	}
	return def.Kind.Dispatch(ctx, def, req)
}

// compileTools compiles tools with the tests' kinds.
func compileTools(tools []config.Tool, prefix string) (*registry.Registry, error) {
	cfg := config.Default()
	cfg.Tools, cfg.NATS.SubjectPrefix = tools, prefix
	return registry.New(context.Background(), cfg, testKinds)
}
