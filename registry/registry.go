// Package registry holds the tools a sidecar serves: their definitions from
// the configuration, compiled JSON Schemas, NATS subjects, timeouts, retry
// and side-effect policy. Argument validation errors are written for the
// model to read: one line per problem, with the JSON path and the reason.
//
// A Registry is immutable once built; a reload builds a new one and swaps
// it in a [Live], so a bad file never replaces a good registry.
package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/tool"
)

// Errors a caller decides on.
var (
	// ErrUnknownTool: no tool of that name is registered.
	ErrUnknownTool = errors.New("registry: unknown tool")
	// ErrInvalidArgs: arguments do not satisfy the tool's schema.
	ErrInvalidArgs = errors.New("registry: invalid arguments")
	// ErrInvalidTool: a tool definition cannot be compiled.
	ErrInvalidTool = errors.New("registry: invalid tool")
)

// Tool is one compiled tool definition.
type Tool struct {
	Name        string
	Description string
	// Parameters is the JSON Schema as JSON.
	Parameters  json.RawMessage
	Subject     string
	Timeout     time.Duration
	MaxDuration time.Duration
	Retries     int
	SideEffects string
	Route       string
	// HedgeAfter and HedgePercentile are tools[].hedge_after read once:
	// a fixed delay, or a percentile of the tool's latencies (0: neither).
	HedgeAfter      time.Duration
	HedgePercentile float64
	// Handler runs a call in the sidecar's process; nil for tools served
	// by NATS workers. The route kind built it when the tool was compiled,
	// so a reload that changes a tool gets a new one.
	Handler tool.Handler
	// Config is the tool's configuration as loaded.
	Config config.Tool
	schema *jsonschema.Schema
}

// Registry maps tool names to tools. It is safe for concurrent reads.
type Registry struct {
	tools map[string]*Tool
	names []string // in configuration order
}

// New compiles the tools of a configuration. Subjects are
// <subjectPrefix>.<name>. Errors name the offending key. An entry that
// imports its tools (an MCP server with import: true) is replaced by them
// first: that reads them from the server.
func New(tools []config.Tool, subjectPrefix string) (*Registry, error) {
	tools, err := expand(tools)
	if err != nil {
		return nil, err
	}
	r := &Registry{tools: make(map[string]*Tool, len(tools))}
	var errs []error
	for i, tc := range tools {
		key := fmt.Sprintf("tools[%d]", i)
		if _, dup := r.tools[tc.Name]; dup {
			errs = append(errs, fmt.Errorf("%w: %s.name: duplicate tool name %q", ErrInvalidTool, key, tc.Name))
			continue
		}
		t, err := compile(tc, subjectPrefix)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %s.parameters: %w", ErrInvalidTool, key, err))
			continue
		}
		if tc.HedgeAfter != "" && tc.SideEffects == config.ReadOnly {
			if t.HedgeAfter, t.HedgePercentile, err = config.ParseHedge(tc.HedgeAfter); err != nil {
				errs = append(errs, fmt.Errorf("%w: %s.hedge_after: %w", ErrInvalidTool, key, err))
				continue
			}
		}
		if err := t.build(); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s.%w", ErrInvalidTool, key, err))
			continue
		}
		r.tools[t.Name] = t
		r.names = append(r.names, t.Name)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return r, nil
}

func compile(tc config.Tool, prefix string) (*Tool, error) {
	params := tc.Parameters
	if params == nil {
		params = map[string]any{"type": "object"}
	}
	raw, err := json.Marshal(params)
	if err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	// A schema may refer to its own parts only: no file or URL is read
	// when the configuration is loaded.
	c.UseLoader(noLoader{})
	url := "toolsidecar:///" + tc.Name + ".json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, err
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, err
	}
	route := tc.Route
	if route == "" {
		route = Nats
	}
	return &Tool{
		Name: tc.Name, Description: tc.Description, Parameters: raw,
		Subject: prefix + "." + tc.Name, Timeout: tc.Timeout, MaxDuration: tc.MaxDuration, Retries: tc.Retries,
		SideEffects: tc.SideEffects, Route: route, Config: tc, schema: sch,
	}, nil
}

// build checks the tool's settings and has its route kind build it. Every
// settings key must name the tool's own route kind.
func (t *Tool) build() error {
	kind, ok := lookupKind(t.Route)
	if !ok {
		return fmt.Errorf("route: unknown route %q (known: %s)", t.Route, strings.Join(Kinds(), ", "))
	}
	var own map[string]any
	for _, key := range slices.Sorted(maps.Keys(t.Config.Settings)) {
		v := t.Config.Settings[key]
		if _, isKind := lookupKind(key); !isKind {
			return fmt.Errorf("%s: unknown key", key)
		}
		if key != t.Route {
			return fmt.Errorf("%s: settings of route %s, but the tool's route is %s", key, key, t.Route)
		}
		m, isMap := v.(map[string]any)
		if !isMap && v != nil {
			return fmt.Errorf("%s: must be a mapping, got %T", key, v)
		}
		own = m
	}
	h, err := kind(t, own)
	if err != nil {
		return err
	}
	t.Handler = h
	return nil
}

// noLoader refuses every external $ref.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("$ref to %s refused: a tool schema may refer only to its own parts", url)
}

// Lookup returns the named tool.
func (r *Registry) Lookup(name string) (*Tool, bool) {
	t, ok := r.tools[name]
	return t, ok
}

// Names lists the tools in configuration order.
func (r *Registry) Names() []string { return slices.Clone(r.names) }

// Tools lists the tools in configuration order.
func (r *Registry) Tools() []*Tool {
	out := make([]*Tool, len(r.names))
	for i, n := range r.names {
		out[i] = r.tools[n]
	}
	return out
}

// FunctionTools renders the tools as a tools array (Core's assistant's,
// and OpenAI's).
func (r *Registry) FunctionTools() []tool.FunctionTool {
	out := make([]tool.FunctionTool, 0, len(r.names))
	for _, t := range r.Tools() {
		out = append(out, tool.FunctionTool{Type: "function", Function: tool.Function{Name: t.Name, Description: t.Description, Parameters: t.Parameters}})
	}
	return out
}

// ArgsError lists every problem found in a call's arguments.
type ArgsError struct {
	Tool     string
	Problems []Problem
}

// Problem is one failed constraint: the JSON pointer into the arguments and
// the reason.
type Problem struct {
	Path   string
	Reason string
}

func (e *ArgsError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "invalid arguments for tool %q:", e.Tool)
	for _, p := range e.Problems {
		fmt.Fprintf(&b, "\n- at %s: %s", p.Path, p.Reason)
	}
	return b.String()
}

// Is lets errors.Is match ErrInvalidArgs.
func (e *ArgsError) Is(target error) bool { return target == ErrInvalidArgs }

var printer = message.NewPrinter(language.English)

// Validate checks arguments against the tool's schema. Arguments must be a
// JSON object; Core coerces non-JSON text to {"raw": text}.
func (t *Tool) Validate(args json.RawMessage) error {
	trimmed := bytes.TrimSpace(args)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return &ArgsError{Tool: t.Name, Problems: []Problem{{Path: "/", Reason: "arguments must be a JSON object"}}}
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(trimmed))
	if err != nil {
		return &ArgsError{Tool: t.Name, Problems: []Problem{{Path: "/", Reason: "arguments are not valid JSON: " + err.Error()}}}
	}
	err = t.schema.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return &ArgsError{Tool: t.Name, Problems: []Problem{{Path: "/", Reason: err.Error()}}}
	}
	ae := &ArgsError{Tool: t.Name}
	collect(ve, &ae.Problems)
	return ae
}

// collect keeps the leaves of the cause tree: they name the failed
// constraints; inner nodes only say "validation failed".
func collect(ve *jsonschema.ValidationError, out *[]Problem) {
	if len(ve.Causes) == 0 {
		*out = append(*out, Problem{Path: "/" + strings.Join(ve.InstanceLocation, "/"), Reason: ve.ErrorKind.LocalizedString(printer)})
		return
	}
	for _, c := range ve.Causes {
		collect(c, out)
	}
}

// Live holds the registry in force; a reload swaps it atomically.
type Live struct {
	p atomic.Pointer[Registry]

	mu       sync.Mutex
	watchers []func(*Registry)
}

// NewLive holds r.
func NewLive(r *Registry) *Live {
	l := &Live{}
	l.p.Store(r)
	return l
}

// Load returns the registry in force.
func (l *Live) Load() *Registry { return l.p.Load() }

// Store puts r in force, then tells the watchers.
func (l *Live) Store(r *Registry) {
	l.p.Store(r)
	l.mu.Lock()
	watchers := l.watchers
	l.mu.Unlock()
	for _, fn := range watchers {
		fn(r)
	}
}

// Watch calls fn with each registry put in force from now on (a reload).
func (l *Live) Watch(fn func(*Registry)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.watchers = append(l.watchers, fn)
}
