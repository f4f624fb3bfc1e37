package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/tool"
)

// Kind is a route kind: how the calls of the tools of one route run. The
// registry asks it to build each of its tools as the tool is compiled, and
// the executor asks it to dispatch each attempt of their calls. A kind may
// also have the optional hooks [Checker], [Importer] and [Closer], found by
// type assertion.
type Kind interface {
	// Build decodes and checks a tool's settings (the value under the
	// kind's name in the tool's configuration, nil when it has none) and
	// returns the handler that runs its calls in the sidecar's process,
	// or nil when they leave it (nats). No network I/O; errors start with
	// the setting's key ("exec.command: ...").
	Build(def *Tool, settings map[string]any) (tool.Handler, error)
	// Dispatch runs one attempt of a call of def and returns its outcome;
	// a failed call is a value in the outcome.
	Dispatch(ctx context.Context, def *Tool, req tool.Request) tool.Outcome
}

// Checker is a kind that can tell whether a compiled tool can run here
// (its program is found, say): `toolsidecar check` asks it.
type Checker interface {
	Check(ctx context.Context, def *Tool) error
}

// Importer is a kind that reads the tools one configured entry stands for
// from where they live (an MCP server's tools/list), when the entry's
// settings say "import: true". It returns each tool's configuration, with
// the entry's route and settings for the call. Unlike Build it does I/O,
// bounded by ctx.
type Importer interface {
	Import(ctx context.Context, entry config.Tool, settings map[string]any) ([]config.Tool, error)
}

// Closer is a kind that holds something to release when the process is
// done with its tools (an MCP server's session).
type Closer interface {
	Close() error
}

// Dispatcher runs one attempt of a call somewhere else than the sidecar's
// process: the NATS client.
type Dispatcher interface {
	Dispatch(ctx context.Context, req tool.Request) tool.Outcome
}

// Kinds is a set of route kinds by name: a value, passed to [New].
type Kinds map[string]Kind

// Nats is the route kind of tools served by workers on NATS.
const Nats = "nats"

// Builtin is the route kind of the sidecar's own tools (read_tool_result):
// the executor answers their calls itself.
const Builtin = config.BuiltinRoute

// ReadToolResult is the built-in tool that reads a page of a result stored
// by claim-check.
const ReadToolResult = config.ReadToolResult

// Base is the set every sidecar has: nats, whose calls d sends (nil: a
// registry that only builds tools, such as `toolsidecar check`'s), and
// builtin. Add the other kinds with [Kinds.With].
func Base(d Dispatcher) Kinds {
	return Kinds{Nats: remote{d}, Builtin: builtin{}}
}

// With is ks and the kinds of more; a name in both is a programming error.
func (ks Kinds) With(more Kinds) Kinds {
	out := maps.Clone(ks)
	for name, k := range more {
		if _, dup := out[name]; dup || name == "" || k == nil {
			panic(fmt.Sprintf("registry: route kind %q given twice, empty or nil", name))
		}
		out[name] = k
	}
	return out
}

// Names lists the kinds, sorted.
func (ks Kinds) Names() []string { return slices.Sorted(maps.Keys(ks)) }

// Close releases what each kind holds.
func (ks Kinds) Close() error {
	var errs []error
	for _, name := range ks.Names() {
		if c, ok := ks[name].(Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// remote is the nats kind: no settings, no handler, calls sent by d.
type remote struct{ d Dispatcher }

func (remote) Build(_ *Tool, settings map[string]any) (tool.Handler, error) {
	if settings != nil {
		return nil, fmt.Errorf("%s: route nats takes no settings", Nats)
	}
	return nil, nil
}

func (r remote) Dispatch(ctx context.Context, _ *Tool, req tool.Request) tool.Outcome {
	if r.d == nil {
		return tool.Outcome{Err: tool.NewError(tool.NotFound, "tool %q: this process sends no call to NATS", req.Tool)}
	}
	return r.d.Dispatch(ctx, req)
}

// builtin is the kind of the sidecar's own tools, which the executor
// answers before a kind is asked.
type builtin struct{}

func (builtin) Build(_ *Tool, settings map[string]any) (tool.Handler, error) {
	if settings != nil {
		return nil, fmt.Errorf("%s: route builtin takes no settings", Builtin)
	}
	return nil, nil
}

func (builtin) Dispatch(_ context.Context, _ *Tool, req tool.Request) tool.Outcome {
	return tool.Outcome{Err: tool.NewError(tool.NotFound, "no built-in tool %q", req.Tool)}
}

// DecodeSettings reads a kind's settings into v, strictly: an unknown key
// is an error that names it. key prefixes the error.
func DecodeSettings(key string, settings map[string]any, v any) error {
	raw, err := json.Marshal(settings)
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

// expand replaces each entry that imports its tools by those tools.
// Each import is bounded by ctx.
func (ks Kinds) expand(ctx context.Context, tools []config.Tool) ([]config.Tool, error) {
	var out []config.Tool
	var errs []error
	for i, tc := range tools {
		settings, _ := tc.Settings[tc.Route].(map[string]any)
		im, ok := ks[tc.Route].(Importer)
		if imp, _ := settings["import"].(bool); !ok || !imp {
			out = append(out, tc)
			continue
		}
		got, err := im.Import(ctx, tc, settings)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: tools[%d].%s: importing the tools: %w", ErrInvalidTool, i, tc.Route, err))
			continue
		}
		out = append(out, got...)
	}
	return out, errors.Join(errs...)
}
