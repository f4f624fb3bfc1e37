package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/tool"
)

// Kind is a route kind: it decodes and checks a tool's settings and builds
// what runs the tool's calls. settings is the value under the kind's name in
// the tool's configuration (nil when the tool has none). A kind that runs
// calls in the sidecar's process returns their handler; the "nats" kind,
// whose calls go to workers on the bus, returns nil. Build does no network
// I/O; errors start with the setting's key ("exec.command: ...").
type Kind func(def *Tool, settings map[string]any) (tool.Handler, error)

// Nats is the route kind of tools served by workers on NATS.
const Nats = "nats"

// Builtin is the route kind of the sidecar's own tools (read_tool_result):
// the executor answers their calls itself.
const Builtin = config.BuiltinRoute

var (
	kindsMu sync.RWMutex
	kinds   = map[string]Kind{Nats: buildNats, Builtin: buildBuiltin}
)

func buildBuiltin(def *Tool, settings map[string]any) (tool.Handler, error) {
	if settings != nil {
		return nil, fmt.Errorf("%s: route builtin takes no settings", Builtin)
	}
	return nil, nil
}

func buildNats(def *Tool, settings map[string]any) (tool.Handler, error) {
	if settings != nil {
		return nil, fmt.Errorf("%s: route nats takes no settings", Nats)
	}
	return nil, nil
}

// RegisterKind adds a route kind; a package that provides one calls it from
// init. It panics on an empty, duplicate or nil kind: a programming error.
func RegisterKind(name string, k Kind) {
	kindsMu.Lock()
	defer kindsMu.Unlock()
	if _, dup := kinds[name]; name == "" || dup || k == nil {
		panic(fmt.Sprintf("registry: route kind %q registered twice, empty or nil", name))
	}
	kinds[name] = k
}

// Kinds lists the registered route kinds, sorted.
func Kinds() []string {
	kindsMu.RLock()
	defer kindsMu.RUnlock()
	out := make([]string, 0, len(kinds))
	for n := range kinds {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func lookupKind(name string) (Kind, bool) {
	kindsMu.RLock()
	defer kindsMu.RUnlock()
	k, ok := kinds[name]
	return k, ok
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

// Importer reads the tools that one configured entry stands for from
// where they live (an MCP server's tools/list): the entry's route kind
// registers it. It returns each tool's configuration, with the entry's
// route and settings for the call. Unlike building a handler it does I/O,
// bounded by ctx.
type Importer func(ctx context.Context, entry config.Tool, settings map[string]any) ([]config.Tool, error)

var importers = map[string]Importer{}

// RegisterImporter lets a route kind expand an entry into the tools it
// imports, when the entry's settings say "import: true". It panics on a
// duplicate or nil importer.
func RegisterImporter(kind string, im Importer) {
	kindsMu.Lock()
	defer kindsMu.Unlock()
	if _, dup := importers[kind]; dup || im == nil {
		panic(fmt.Sprintf("registry: importer of %q registered twice or nil", kind))
	}
	importers[kind] = im
}

// importTimeout bounds the reading of one entry's tools.
const importTimeout = 30 * time.Second

// expand replaces each entry that imports its tools by those tools.
func expand(tools []config.Tool) ([]config.Tool, error) {
	var out []config.Tool
	var errs []error
	for i, tc := range tools {
		settings, _ := tc.Settings[tc.Route].(map[string]any)
		kindsMu.RLock()
		im, ok := importers[tc.Route]
		kindsMu.RUnlock()
		if imp, _ := settings["import"].(bool); !ok || !imp {
			out = append(out, tc)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), importTimeout)
		got, err := im(ctx, tc, settings)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: tools[%d].%s: importing the tools: %w", ErrInvalidTool, i, tc.Route, err))
			continue
		}
		out = append(out, got...)
	}
	return out, errors.Join(errs...)
}
