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
	"cmp"
	"context"
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

// Tool is one compiled tool definition: every setting read, checked and
// typed once, at load and reload, so that nothing downstream reads the
// configuration.
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
	// Kind is the tool's route kind, which built Handler and dispatches
	// its calls.
	Kind Kind
	// Handler runs a call in the sidecar's process; nil for tools served
	// by NATS workers. The route kind built it when the tool was compiled,
	// so a reload that changes a tool gets a new one.
	Handler tool.Handler
	// Policies are the tool's policy settings, compiled.
	Policies Policies
	// Source says where the tool is defined: SourceConfig, SourceWorker,
	// SourceConfigAndWorker or SourceBuiltin.
	Source string
	// DeclaredBy names the workers that declare the tool in their code.
	DeclaredBy []string
	schema     *jsonschema.Schema
	settings   map[string]any // the route kind's, as configured
}

// Unsafe reports a tool that must never run twice.
func (t *Tool) Unsafe() bool { return t.SideEffects == config.Unsafe }

// Policies are a tool's policy settings; the zero value of each field
// turns its policy off.
type Policies struct {
	// Lane is the ordered lane the tool's calls run in, or nil.
	Lane *Lane
	// DedupeTTL is how long a result answers a repeated call of its run
	// (dedupe: run); 0: no dedupe.
	DedupeTTL time.Duration
	// HedgeAfter and HedgePercentile are hedge_after: a fixed delay, or a
	// percentile of the tool's latencies (0: neither).
	HedgeAfter      time.Duration
	HedgePercentile float64
	// Approval holds each call for a person's decision, or is nil.
	Approval *Approval
	// MaxCallsPerRun bounds the tool's calls in one drive; 0: no bound.
	MaxCallsPerRun int
	// Rate bounds the tool's calls per second across runs, in a bucket of
	// RateBurst (at least 1); 0: no bound.
	Rate      float64
	RateBurst int
	// ClaimCheckBytes: a successful result larger than this is stored by
	// reference and the model reads a preview; 0: never.
	ClaimCheckBytes int
}

// Lane is an ordered lane: its calls run one after another in the model's
// order.
type Lane struct {
	Name string
	// SkipRest: a failed call skips the rest of the lane.
	SkipRest bool
}

// Approval is a tool's approval: each call waits up to Timeout for a
// person's decision.
type Approval struct{ Timeout time.Duration }

// Registry maps tool names to tools. It is safe for concurrent reads.
type Registry struct {
	tools map[string]*Tool
	names []string // in configuration order, then the declared tools'
	kinds Kinds
	// What it was built from, for Redeclare.
	cfg        config.Config
	configured []config.Tool // the configuration's, imports read
	declared   []Declared
	conflicts  []*DeclarationError
}

// New compiles the tools of a configuration (its tools, and the built-in
// ones it turns on) with the route kinds of kinds, and the tools that
// workers declare in their code (declared, by name). Subjects are
// <nats.subject_prefix>.<name>. Errors name the offending key, and the
// worker for a declaration. An entry that imports its tools (an MCP server
// with import: true) is replaced by them first: that reads them from the
// server, within ctx.
func New(ctx context.Context, cfg config.Config, kinds Kinds, declared ...Declared) (*Registry, error) {
	tools, err := kinds.expand(ctx, cfg.RegisteredTools())
	if err != nil {
		return nil, err
	}
	return build(cfg, kinds, tools, declared)
}

// Redeclare builds the registry of r's configuration and route kinds (its
// imports as they were read) with the tools that workers now declare.
func (r *Registry) Redeclare(declared []Declared) (*Registry, error) {
	return build(r.cfg, r.kinds, r.configured, declared)
}

// build compiles the configured tools, each completed by its declaration
// when a worker declares it too, then the tools only workers declare.
func build(cfg config.Config, kinds Kinds, configured []config.Tool, declared []Declared) (*Registry, error) {
	r := &Registry{tools: make(map[string]*Tool, len(configured)+len(declared)), kinds: kinds, cfg: cfg, configured: configured,
		declared: declared}
	byName := make(map[string]Declared, len(declared))
	for _, d := range declared {
		byName[d.Name] = d
	}
	var errs []error
	add := func(tc config.Tool, key, source string, d *Declared) {
		if _, dup := r.tools[tc.Name]; dup {
			errs = append(errs, fmt.Errorf("%w: %s.name: duplicate tool name %q", ErrInvalidTool, key, tc.Name))
			return
		}
		t, err := r.compileTool(tc, key)
		if err != nil {
			if d != nil {
				err = &DeclarationError{Tool: tc.Name, By: d.By, Err: err}
			}
			errs = append(errs, err)
			return
		}
		t.Source = source
		if d != nil {
			t.DeclaredBy = d.By
		}
		r.tools[t.Name] = t
		r.names = append(r.names, t.Name)
	}
	for i, tc := range configured {
		key, source := fmt.Sprintf("tools[%d]", i), SourceConfig
		if tc.Route == config.BuiltinRoute {
			source = SourceBuiltin
		}
		d, isDeclared := byName[tc.Name]
		if !isDeclared {
			add(tc, key, source, nil)
			continue
		}
		delete(byName, tc.Name)
		merged, err := tc.Declare(d.Declaration)
		if err != nil {
			// The operator's entry stays in force and the declaration is
			// left out, whoever comes first: a client of the bus can
			// neither keep the sidecar from starting or reloading nor
			// replace a tool the file defines (Conflicts).
			r.conflicts = append(r.conflicts, &DeclarationError{Tool: tc.Name, Key: key, By: d.By, Err: err})
			add(tc, key, source, nil)
			continue
		}
		add(merged, key, SourceConfigAndWorker, &d)
	}
	for _, d := range declared {
		if _, left := byName[d.Name]; !left {
			continue
		}
		tc, err := config.DeclaredTool(d.Name, d.Declaration)
		if err != nil {
			errs = append(errs, &DeclarationError{Tool: d.Name, By: d.By, Err: err})
			continue
		}
		add(tc, "tool "+d.Name, SourceWorker, &d)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return r, nil
}

// compileTool compiles one tool entry; key names it in errors.
// The error names the tool as well as its key: `toolsidecar check` and a
// start that refuses the file print the same text, and a key alone
// (tools[12]) sends the reader counting entries.
func (r *Registry) compileTool(tc config.Tool, key string) (*Tool, error) {
	t, err := compile(tc, r.cfg.NATS.SubjectPrefix)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %s.parameters: %w", ErrInvalidTool, tc.Name, key, err)
	}
	if t.Policies, err = policies(tc, r.cfg.Executor); err != nil {
		return nil, fmt.Errorf("%w %q: %s.%w", ErrInvalidTool, tc.Name, key, err)
	}
	if err := t.build(r.kinds); err != nil {
		return nil, fmt.Errorf("%w %q: %s.%w", ErrInvalidTool, tc.Name, key, err)
	}
	return t, nil
}

// policies compiles a tool's policy settings. The configuration has
// checked their values; a hedge on a tool that may not be sent twice is
// dropped there too, as the file's defaults can set one for all tools.
func policies(tc config.Tool, ex config.Executor) (Policies, error) {
	p := Policies{MaxCallsPerRun: tc.MaxCallsPerRun, Rate: tc.Rate, RateBurst: max(tc.RateBurst, 1)}
	if tc.Lane != "" {
		p.Lane = &Lane{Name: tc.Lane, SkipRest: ex.Lanes[tc.Lane].OnError == config.LaneSkipRest}
	}
	if tc.Dedupe == config.DedupeRun {
		p.DedupeTTL = cmp.Or(tc.DedupeTTL, config.DefaultDedupeTTL)
	}
	if tc.Approval == config.ApprovalRequired {
		p.Approval = &Approval{Timeout: cmp.Or(tc.ApprovalTimeout, config.DefaultApprovalTimeout)}
	}
	if tc.HedgeAfter != "" && tc.SideEffects == config.ReadOnly {
		var err error
		if p.HedgeAfter, p.HedgePercentile, err = config.ParseHedge(tc.HedgeAfter); err != nil {
			return p, fmt.Errorf("hedge_after: %w", err)
		}
	}
	if tc.Route != config.BuiltinRoute {
		p.ClaimCheckBytes = ex.ClaimCheckBytes
	}
	return p, nil
}

func compile(tc config.Tool, prefix string) (*Tool, error) {
	raw, err := checkSchema(tc.Parameters)
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
	return &Tool{
		Name: tc.Name, Description: tc.Description, Parameters: raw,
		Subject: prefix + "." + tc.Name, Timeout: tc.Timeout, MaxDuration: tc.MaxDuration,
		Retries: tc.Retries, SideEffects: tc.SideEffects, Route: cmp.Or(tc.Route, Nats), schema: sch, settings: tc.Settings,
	}, nil
}

// Bounds of a tool's parameters schema, whatever its source (the
// configuration, an MCP server it imports, a worker's declaration): the
// registry compiles it, and the MCP SDK and every request to a model API
// decode it again, each walking it recursively.
const (
	// MaxSchemaBytes bounds the schema as JSON.
	MaxSchemaBytes = 256 << 10
	// MaxSchemaDepth bounds the nesting of its objects and arrays: 64
	// levels are 30 levels of nested properties, past any arguments a
	// model writes.
	MaxSchemaDepth = 64
)

// checkSchema is the one check of a tool's parameters, where the
// configuration's tools and the workers' declarations are compiled alike:
// a schema of an object, bounded (MaxSchemaBytes, MaxSchemaDepth). It
// returns the schema as JSON, "type": "object" said. The compiler then
// checks that it compiles.
func checkSchema(params map[string]any) (json.RawMessage, error) {
	params, err := objectSchema(params)
	if err != nil {
		return nil, err
	}
	if depth(params, MaxSchemaDepth+1) > MaxSchemaDepth {
		return nil, fmt.Errorf("the schema nests more than %d levels of objects and arrays", MaxSchemaDepth)
	}
	raw, err := json.Marshal(params)
	if err != nil {
		return nil, err
	}
	if len(raw) > MaxSchemaBytes {
		return nil, fmt.Errorf("the schema is %d bytes as JSON: at most %d", len(raw), MaxSchemaBytes)
	}
	return raw, nil
}

// objectSchema is a tool's parameters as the model APIs and MCP take
// them: a schema of an object, its "type" said. A schema of anything else
// is refused: an MCP client would refuse it (the SDK panics on it), and so
// would every model API.
//
// A schema that leaves "type" out (a bare $ref, say) gets "type":
// "object" rather than a refusal: the MCP SDK requires the word at the
// top (its AddTool panics on a schema without it), and the schema accepts
// no more than before, as a call's arguments must be an object anyway
// (Tool.Validate).
func objectSchema(params map[string]any) (map[string]any, error) {
	if params == nil {
		return map[string]any{"type": "object"}, nil
	}
	switch t, ok := params["type"]; {
	case !ok:
		params = maps.Clone(params)
		params["type"] = "object"
	case t != "object":
		return nil, fmt.Errorf("the schema's top must be of type \"object\" (a call's arguments are an object), not %s", tool.Excerpt(fmt.Sprint(t)))
	}
	return params, nil
}

// depth is how deeply v nests objects and arrays, counted up to limit: a
// value nested deeper is not walked further.
func depth(v any, limit int) int {
	if limit == 0 {
		return 0
	}
	d := 0
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			d = max(d, depth(e, limit-1))
		}
	case []any:
		for _, e := range v {
			d = max(d, depth(e, limit-1))
		}
	default:
		return 0
	}
	return d + 1
}

// build checks the tool's settings and has its route kind build it. Every
// settings key must name the tool's own route kind.
func (t *Tool) build(kinds Kinds) error {
	kind, ok := kinds[t.Route]
	if !ok {
		return fmt.Errorf("route: unknown route %q (known: %s)", t.Route, strings.Join(kinds.Names(), ", "))
	}
	var own map[string]any
	for _, key := range slices.Sorted(maps.Keys(t.settings)) {
		v := t.settings[key]
		if _, isKind := kinds[key]; !isKind {
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
	h, err := kind.Build(t, own)
	if err != nil {
		return err
	}
	t.Kind, t.Handler, t.settings = kind, h, own
	return nil
}

// Settings are the tool's route kind's settings, as configured (nil when
// it has none).
func (t *Tool) Settings() map[string]any { return t.settings }

// Check asks each tool's route kind, when it can, whether the tool can run
// here as configured (its program found, say): `toolsidecar check`.
func (r *Registry) Check(ctx context.Context) []error {
	var errs []error
	for i, t := range r.Tools() {
		if c, ok := t.Kind.(Checker); ok {
			if err := c.Check(ctx, t); err != nil {
				errs = append(errs, fmt.Errorf("tools[%d].%s.%w", i, t.Route, err))
			}
		}
	}
	return errs
}

// noLoader refuses every external $ref.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("$ref to %s refused: a tool schema may refer only to its own parts", url)
}

// Kinds is the set of route kinds the registry was compiled with.
func (r *Registry) Kinds() Kinds { return r.kinds }

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
		out = append(out, t.FunctionTool())
	}
	return out
}

// FunctionTool renders the tool as an entry of a tools array.
func (t *Tool) FunctionTool() tool.FunctionTool {
	return tool.FunctionTool{Type: "function", Function: tool.Function{Name: t.Name, Description: t.Description, Parameters: t.Parameters}}
}

// SourcedTools renders the tools as FunctionTools does, each with where it
// is defined.
func (r *Registry) SourcedTools() []tool.SourcedTool {
	out := make([]tool.SourcedTool, 0, len(r.names))
	for i, ft := range r.FunctionTools() {
		t := r.tools[r.names[i]]
		out = append(out, tool.SourcedTool{FunctionTool: ft, Source: t.Source, DeclaredBy: t.DeclaredBy,
			SideEffects: t.SideEffects, Timeout: t.Timeout.String(), Retries: t.Retries})
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
	p      atomic.Pointer[Registry]
	update sync.Mutex // one Update at a time: a reload and a discovery do not undo each other

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

// Update builds a registry from the one in force and puts it in force,
// one update at a time; on error the registry in force stays.
func (l *Live) Update(build func(cur *Registry) (*Registry, error)) (*Registry, error) {
	l.update.Lock()
	defer l.update.Unlock()
	r, err := build(l.Load())
	if err != nil {
		return nil, err
	}
	l.Store(r)
	return r, nil
}

// Watch calls fn with each registry put in force from now on (a reload).
func (l *Live) Watch(fn func(*Registry)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.watchers = append(l.watchers, fn)
}
