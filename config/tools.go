package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/projectdavid/toolsidecar/tool"
)

// ParseHedge reads tools[].hedge_after: a positive duration, or a
// percentile "pNN" (50 to 99.9) of the tool's recent latencies.
func ParseHedge(s string) (after time.Duration, percentile float64, err error) {
	if p, ok := strings.CutPrefix(s, "p"); ok {
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || v < 50 || v > 99.9 {
			return 0, 0, fmt.Errorf("%q: a percentile is p50 to p99.9", s)
		}
		return 0, v, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, 0, fmt.Errorf("%q: want a positive duration (250ms) or a percentile (p95)", s)
	}
	return d, 0, nil
}

// ReadToolResult is the built-in tool that reads a page of a result stored
// by claim-check; it is registered when executor.claim_check_bytes is set.
const ReadToolResult = "read_tool_result"

// BuiltinRoute is the route of the sidecar's own tools.
const BuiltinRoute = "builtin"

// RegisteredTools is the configured tools plus the built-in tools the
// configuration turns on: what the registry serves and lists.
func (c Config) RegisteredTools() []Tool {
	if c.Executor.ClaimCheckBytes <= 0 {
		return c.Tools
	}
	return append(slices.Clip(c.Tools), Tool{
		Name: ReadToolResult,
		Description: "Read a page of a large tool result that was stored by reference: pass the handle given in that result's " +
			"claim_check, a byte offset (0 is the start; next_offset continues) and a length.",
		Parameters: map[string]any{"type": "object", "required": []any{"handle"}, "additionalProperties": false,
			"properties": map[string]any{
				"handle": map[string]any{"type": "string", "minLength": 1, "maxLength": 128},
				"offset": map[string]any{"type": "integer", "minimum": 0},
				"length": map[string]any{"type": "integer", "minimum": 1, "maximum": c.Executor.ClaimCheckBytes},
			}},
		Timeout: 10 * time.Second, MaxDuration: 10 * time.Second, SideEffects: ReadOnly, Route: BuiltinRoute,
	})
}

// DedupeRun answers a repeated call of a run from its earlier result.
const DedupeRun = "run"

// Approval settings of a tool.
const (
	// ApprovalRequired: a call of the tool waits for a person's decision
	// (POST /v1/approvals/{action_id}) before it is dispatched.
	ApprovalRequired = "required"
	// OnTimeoutDeny: an approval not decided in time is a denial.
	OnTimeoutDeny = "deny"
)

// DefaultApprovalTimeout is how long a call waits for its approval when
// the tool does not say.
const DefaultApprovalTimeout = 10 * time.Minute

// MaxApprovalTimeout is the longest a call may wait for its approval: the
// durable ledger keeps approvals a little longer.
const MaxApprovalTimeout = 24 * time.Hour

// DefaultDedupeTTL is how long a result answers repeats when the tool
// does not say.
const DefaultDedupeTTL = 10 * time.Minute

// MaxDedupeTTL is the longest a result may answer repeats: the durable
// ledger's retention.
const MaxDedupeTTL = 24 * time.Hour

// Side-effect classes, as a worker declares them too.
const (
	ReadOnly   = tool.ReadOnly
	Idempotent = tool.Idempotent
	Unsafe     = tool.Unsafe
)

// Tool declares one tool.
type Tool struct {
	Name        string `koanf:"name"`
	Description string `koanf:"description"`
	// Parameters is the arguments' JSON Schema: an object's ("type":
	// "object"; a schema that leaves "type" out gets it), at most 256 KiB
	// as JSON and 64 levels of objects and arrays deep, "$ref" only to its
	// own parts. A worker's declared schema is held to the same. default:
	// any object
	Parameters map[string]any `koanf:"parameters"`
	// Timeout per attempt; each progress message restarts it. default: 30s
	Timeout time.Duration `koanf:"timeout"`
	// MaxDuration bounds an attempt whatever progress it reports.
	// default: 10m
	MaxDuration time.Duration `koanf:"max_duration"`
	// Retries after a timeout, no responders, or a retryable worker error.
	// default: 0
	Retries int `koanf:"retries"`
	// SideEffects: read_only, idempotent or unsafe (never retried once
	// sent). default: unsafe
	SideEffects string `koanf:"side_effects"`
	// Route: nats (default), or another registered route kind.
	Route string `koanf:"route"`
	// Lane names an ordered lane: the calls of one batch whose tools share
	// a lane run one after another in the model's call order (a
	// create_file before its write_file), while every other call still
	// runs in parallel. executor.lanes sets the lane's policy.
	// default: "" (none)
	Lane string `koanf:"lane"`
	// MaxCallsPerRun bounds this tool's calls in one drive of a run.
	// default: 0 (no bound)
	MaxCallsPerRun int `koanf:"max_calls_per_run"`
	// Rate bounds this tool's calls per second across all the sidecar's
	// runs (a token bucket of RateBurst); a call over it is not
	// dispatched. default: 0 (no bound)
	Rate float64 `koanf:"rate"`
	// RateBurst is the bucket's size. default: 1 when Rate is set
	RateBurst int `koanf:"rate_burst"`
	// Dedupe: "run" answers a call that repeats an earlier call of the
	// same run (same tool, same arguments as canonical JSON) with that
	// call's result, without dispatching; read_only tools only.
	// default: "" (off)
	Dedupe string `koanf:"dedupe"`
	// DedupeTTL is how long a result may answer a repeat. default: 10m
	DedupeTTL time.Duration `koanf:"dedupe_ttl"`
	// HedgeAfter, for a read_only tool: an attempt still unanswered after
	// this long is sent a second time (to any worker of the queue group);
	// the first reply wins and the other is cancelled. A duration ("250ms")
	// or a percentile of the tool's own recent latencies ("p95").
	// default: "" (no hedging)
	HedgeAfter string `koanf:"hedge_after"`
	// Approval: "required" holds each call of the tool until a person
	// approves or denies it (GET /v1/approvals, POST
	// /v1/approvals/{action_id}, or the live view), while the other calls
	// of its batch run; a denial is the call's error outcome (denied).
	// default: "" (none)
	Approval string `koanf:"approval"`
	// ApprovalTimeout is how long a call waits for its approval.
	// default: 10m when approval is required
	ApprovalTimeout time.Duration `koanf:"approval_timeout"`
	// OnTimeout is what an approval that timed out means: deny (the only
	// choice: a call nobody approved does not run). default: deny
	OnTimeout string `koanf:"on_timeout"`
	// Settings holds every other key of the tool: the settings of its route
	// kind, under the kind's name (exec: {...}). Any other key is an error
	// here; the registry hands the settings to the kind, which decodes and
	// checks them.
	Settings map[string]any `koanf:",remain"`

	// defaulted lists the keys the file left out and applyDefaults
	// filled: a worker's declaration of the tool sets those.
	defaulted []string
}

// Defaulted reports a key (timeout, side_effects) that the configuration
// left out and a default filled.
func (t Tool) Defaulted(key string) bool { return slices.Contains(t.defaulted, key) }

// applyDefaults fills a tool's zero fields.
func (t *Tool) applyDefaults() {
	if t.Timeout == 0 {
		t.Timeout = tool.DefaultTimeout
		t.defaulted = append(t.defaulted, "timeout")
	}
	if t.MaxDuration == 0 {
		t.MaxDuration = tool.DefaultMaxDuration
	}
	if t.SideEffects == "" {
		t.SideEffects = Unsafe
		t.defaulted = append(t.defaulted, "side_effects")
	}
	if t.Retries == 0 && !slices.Contains(t.defaulted, "retries") {
		t.defaulted = append(t.defaulted, "retries") // Load takes it back when the file says retries: 0
	}
	if t.Route == "" {
		t.Route = "nats"
	}
	if t.Dedupe != "" && t.DedupeTTL == 0 {
		t.DedupeTTL = DefaultDedupeTTL
	}
	if t.Approval != "" && t.ApprovalTimeout == 0 {
		t.ApprovalTimeout = DefaultApprovalTimeout
	}
	if t.Approval != "" && t.OnTimeout == "" {
		t.OnTimeout = OnTimeoutDeny
	}
}

// toolKeys are the keys a tool takes, for suggestions.
func toolKeys() []string {
	t := reflect.TypeFor[Tool]()
	var keys []string
	for i := range t.NumField() {
		if tag := strings.Split(t.Field(i).Tag.Get("koanf"), ",")[0]; tag != "" && tag != "-" {
			keys = append(keys, tag)
		}
	}
	return keys
}

// validateTools checks every tool: its name (unique, and not a built-in
// tool the executor's settings turn on) and its settings.
func validateTools(tools []Tool, ex Executor) []error {
	var errs []error
	seen := map[string]int{}
	for i, t := range tools {
		p := problems{prefix: fmt.Sprintf("tools[%d]", i)}
		if !tool.ValidName(t.Name) {
			p.add("name", "%q must be 1-64 letters, digits, _ or -", t.Name)
		} else if j, dup := seen[t.Name]; dup {
			p.add("name", "duplicate tool name %q (also tools[%d])", t.Name, j)
		}
		seen[t.Name] = i
		if ex.ClaimCheckBytes != 0 && t.Name == ReadToolResult {
			p.add("name", "%s is the built-in tool that claim-check adds", ReadToolResult)
		}
		t.validate(&p)
		errs = append(errs, p.list...)
	}
	return errs
}

// validate checks one tool's settings: its class, bounds and policies.
func (t Tool) validate(p *problems) {
	if !slices.Contains([]string{ReadOnly, Idempotent, Unsafe}, t.SideEffects) {
		p.add("side_effects", "must be read_only, idempotent or unsafe, got %q", t.SideEffects)
	}
	for key, n := range map[string]int64{"retries": int64(t.Retries), "timeout": int64(t.Timeout), "max_duration": int64(t.MaxDuration)} {
		if n < 0 {
			p.add(key, "must not be negative")
		}
	}
	if t.MaxCallsPerRun < 0 || t.Rate < 0 || t.RateBurst < 0 {
		p.add("", "max_calls_per_run, rate and rate_burst must not be negative")
	}
	t.validatePolicies(p)
	for _, k := range slices.Sorted(maps.Keys(t.Settings)) {
		if k == t.Route {
			continue
		}
		if hint := didYouMean(k, toolKeys()); hint != "" {
			p.add(k, "unknown key%s", hint)
			continue
		}
		p.add(k, "unknown key (a tool's own settings go under its route's name, here %q)", t.Route)
	}
}

// validatePolicies checks a tool's dedupe, hedge, approval and lane.
func (t Tool) validatePolicies(p *problems) {
	switch {
	case t.Dedupe != "" && t.Dedupe != DedupeRun:
		p.add("dedupe", "must be run or empty, got %q", t.Dedupe)
	case t.Dedupe != "" && t.SideEffects != ReadOnly:
		p.add("dedupe", "only a read_only tool may answer a repeated call from an earlier result (side_effects is %s)", t.SideEffects)
	}
	if t.DedupeTTL < 0 || t.DedupeTTL > MaxDedupeTTL {
		p.add("dedupe_ttl", "must be between 0 and %s", MaxDedupeTTL)
	}
	if t.HedgeAfter != "" {
		if _, _, err := ParseHedge(t.HedgeAfter); err != nil {
			p.add("hedge_after", "%v", err)
		} else if t.SideEffects != ReadOnly {
			p.add("hedge_after", "only a read_only tool may be sent twice at once (side_effects is %s)", t.SideEffects)
		}
	}
	if t.Approval != "" && t.Approval != ApprovalRequired {
		p.add("approval", "must be required or empty, got %q", t.Approval)
	}
	if t.ApprovalTimeout < 0 || t.ApprovalTimeout > MaxApprovalTimeout {
		p.add("approval_timeout", "must be between 0 and %s", MaxApprovalTimeout)
	}
	if t.OnTimeout != "" && t.OnTimeout != OnTimeoutDeny {
		p.add("on_timeout", "must be deny (a call nobody approved does not run), got %q", t.OnTimeout)
	}
	if t.Lane != "" && !tool.ValidName(t.Lane) {
		p.add("lane", "%q must be 1-64 letters, digits, _ or -", t.Lane)
	}
}

// DeclaredTool is the tools entry that a worker's declaration of a tool
// stands for, with the defaults of an entry.
func DeclaredTool(name string, d tool.Declaration) (Tool, error) {
	t := Tool{Name: name, Route: "nats"}
	t.applyDefaults()
	return t.Declare(d)
}

// Declare completes a configured tool with what a worker declares of it:
// the description and parameters the entry leaves out, and the timeout,
// side effects and retries it leaves to their defaults. The entry's own
// settings stay in force (the configuration is the ceiling: a retries: 0
// it gives is not raised); parameters that both give must be the same
// schema.
func (t Tool) Declare(d tool.Declaration) (Tool, error) {
	if t.Route != "nats" {
		return t, fmt.Errorf("route is %s, but a worker on NATS declares the tool", t.Route)
	}
	if len(d.Parameters) > 0 {
		var declared map[string]any
		if err := json.Unmarshal(d.Parameters, &declared); err != nil {
			return t, fmt.Errorf("parameters: %w", err)
		}
		own, _ := json.Marshal(t.Parameters)
		if t.Parameters == nil {
			t.Parameters = declared
		} else if !tool.SameJSON(own, d.Parameters) {
			return t, fmt.Errorf("parameters: the configuration's schema %s differs from the declared %s", clip(own), clip(d.Parameters))
		}
	}
	if t.Description == "" {
		t.Description = d.Description
	}
	if d.SideEffects != "" && (t.SideEffects == "" || t.Defaulted("side_effects")) {
		t.SideEffects = d.SideEffects
	}
	if d.Timeout != "" && (t.Timeout == 0 || t.Defaulted("timeout")) {
		t.Timeout = d.TimeoutOrZero()
	}
	if d.Retries != 0 && t.Retries == 0 && t.Defaulted("retries") {
		t.Retries = d.Retries
	}
	t.defaulted = slices.DeleteFunc(slices.Clone(t.defaulted), func(k string) bool {
		return k == "side_effects" && d.SideEffects != "" || k == "timeout" && d.Timeout != "" || k == "retries" && d.Retries != 0
	})
	return t, nil
}

// clip renders a schema for an error message, cut to a readable length.
func clip(raw []byte) string {
	if len(raw) > 160 {
		return string(raw[:160]) + "…"
	}
	return string(raw)
}
