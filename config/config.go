// Package config loads and validates the daemon's configuration: the YAML
// file, then TOOLSIDECAR_ environment variables, then --set flags. Unknown
// keys are errors that name the key. Secrets never come from the file: the
// Core API key is read from core.api_key_file or TOOLSIDECAR_CORE_API_KEY.
package config

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/rawbytes"
	"github.com/knadh/koanf/providers/structs"
	"github.com/knadh/koanf/v2"

	"github.com/projectdavid/toolsidecar/tool"
)

// ErrInvalid wraps every configuration error.
var ErrInvalid = errors.New("config: invalid")

// EnvPrefix prefixes the environment variables that override keys:
// core.stream_idle_timeout is TOOLSIDECAR_CORE_STREAM_IDLE_TIMEOUT.
const EnvPrefix = "TOOLSIDECAR_"

// APIKeyEnv holds the Core API key when no core.api_key_file is set.
const APIKeyEnv = "TOOLSIDECAR_CORE_API_KEY"

// Config is the whole configuration file.
type Config struct {
	// InstanceID names this sidecar, stable across its restarts (the pod's
	// name): its replies and ledger entries carry it. default: the hostname
	InstanceID string     `koanf:"instance_id"`
	Durability Durability `koanf:"durability"`
	Upstream   Upstream   `koanf:"upstream"`
	Core       Core       `koanf:"core"`
	NATS       NATS       `koanf:"nats"`
	Server     Server     `koanf:"server"`
	Executor   Executor   `koanf:"executor"`
	Tracing    Tracing    `koanf:"tracing"`
	Tools      []Tool     `koanf:"tools"`
}

// Durability configures durable mode: an outcome ledger and captured
// replies on JetStream, so that a restarted sidecar submits the results
// that arrived while it was away.
type Durability struct {
	// Enabled turns durable mode on where the NATS server has JetStream
	// (the embedded one does). default: true
	Enabled bool `koanf:"enabled"`
	// Replicas of the ledger and the reply stream on a cluster. default: 1
	Replicas int `koanf:"replicas"`
	// LeaseTTL is how long a sidecar's run leases outlive the last renewal
	// of its lease key (renewed every third of it): the longest a drive
	// request that reaches another sidecar waits, after the first one
	// died, before that sidecar resumes the run. Sidecars sharing a NATS
	// cluster must use one value. default: 10s
	LeaseTTL time.Duration `koanf:"lease_ttl"`
	// MaxBytes bounds each JetStream stream and bucket the sidecar creates
	// (outcomes, worker replies, dedupe and claim-checked results,
	// approvals). The reply stream, which workers publish to, keeps one
	// message per subject, each at most executor.max_result_bytes and
	// 64 KiB, and drops its oldest past the bound. default: 1 GiB
	MaxBytes int64 `koanf:"max_bytes"`
}

// Upstream says where the model is.
type Upstream struct {
	// Kind is core (Project David Core, configured under core) or openai
	// (an OpenAI-compatible Chat Completions server: OpenAI, vLLM, Ollama,
	// llama.cpp, LiteLLM), which applications reach at the sidecar's POST
	// /v1/chat/completions. default: core
	Kind string `koanf:"kind"`
	// URL of the OpenAI-compatible API with its version, for kind openai
	// (https://api.openai.com/v1, http://127.0.0.1:11434/v1).
	URL string `koanf:"url"`
	// APIKeyFile holds the key sent upstream as a bearer token, for kind
	// openai. Optional: TOOLSIDECAR_UPSTREAM_API_KEY is read when it is
	// empty. Without server.auth_token_file, a caller's own bearer key is
	// sent instead.
	APIKeyFile string `koanf:"api_key_file"`
	// RetryBudget bounds the retries of one turn's request (429 after its
	// Retry-After, 5xx, a failed connection, a stream cut before its
	// finish chunk). default: 30s
	RetryBudget time.Duration `koanf:"retry_budget"`
}

// Upstream kinds.
const (
	UpstreamCore   = "core"
	UpstreamOpenAI = "openai"
)

// UpstreamAPIKeyEnv holds the upstream's key when no
// upstream.api_key_file is set.
const UpstreamAPIKeyEnv = EnvPrefix + "UPSTREAM_API_KEY"

// Tracing configures OpenTelemetry tracing, off unless an endpoint is set.
type Tracing struct {
	// OTLPEndpoint is an OTLP/HTTP collector, host:port. Empty: no tracing.
	OTLPEndpoint string `koanf:"otlp_endpoint"`
	// Insecure sends to the collector over plain HTTP. default: false
	Insecure bool `koanf:"insecure"`
	// ServiceName is the service.name resource. default: toolsidecar
	ServiceName string `koanf:"service_name"`
	// SampleRatio of new traces (a caller's sampled trace is always
	// followed). default: 1
	SampleRatio float64 `koanf:"sample_ratio"`
}

// Core is the upstream Core API.
type Core struct {
	// TLS to Core: a CA bundle for a private CA, and a client certificate
	// when Core asks for one. All optional.
	TLS TLS `koanf:"tls"`
	// URL of Core, without /v1. default: http://127.0.0.1:9000
	URL string `koanf:"url"`
	// APIKeyFile holds the X-API-Key. Optional: TOOLSIDECAR_CORE_API_KEY
	// is read when it is empty.
	APIKeyFile string `koanf:"api_key_file"`
	// Timeout bounds each non-streaming call, its retries and its wait
	// for a connection included. The writes that make a call's outcome
	// count (its processing mark, tool output and final status) wait for
	// Core's answer up to executor.submit_budget instead: one given up on
	// could still be applied by Core after the call's next write.
	// default: 30s
	Timeout time.Duration `koanf:"timeout"`
	// StreamIdleTimeout bounds the silence between frames. default: 280s
	StreamIdleTimeout time.Duration `koanf:"stream_idle_timeout"`
	// ReadinessCheck makes /readyz also require Core to answer. Off by
	// default: a Core outage is not the sidecar's, and would mark every
	// application pod NotReady at once. default: false
	ReadinessCheck bool `koanf:"readiness_check"`
	// MaxConnections bounds the connections, and so the requests at once,
	// of every call to Core but the completions streams (one connection
	// each); more wait in a queue (toolsidecar_core_requests_queued).
	// default: 64
	MaxConnections int `koanf:"max_connections"`
	// IdleTimeout is how long a connection to Core is kept idle. Keep it
	// below Core's keep-alive timeout (uvicorn's: 5 s), so that the
	// sidecar, not Core, closes an idle connection: a POST that meets
	// Core's close on its way out is not sent again. default: 4s
	IdleTimeout time.Duration `koanf:"idle_timeout"`
}

// NATS is the worker bus.
type NATS struct {
	// URL of a NATS server or cluster; empty starts the embedded server.
	URL string `koanf:"url"`
	// SubjectPrefix: a tool is served on <prefix>.<name>.
	// default: toolsidecar.tools
	SubjectPrefix string `koanf:"subject_prefix"`
	// Credentials for an external NATS, each from a file; at most one
	// kind. CredsFile is a JWT credentials file; User goes with
	// PasswordFile; TokenFile holds a token; NKeySeedFile an nkey seed.
	CredsFile    string   `koanf:"creds_file"`
	User         string   `koanf:"user"`
	PasswordFile string   `koanf:"password_file"`
	TokenFile    string   `koanf:"token_file"`
	NKeySeedFile string   `koanf:"nkey_seed_file"`
	TLS          TLS      `koanf:"tls"`
	Embedded     Embedded `koanf:"embedded"`
	// ConnectRetry is how long the first connection to an external NATS
	// is retried, each failure logged, before the sidecar gives up.
	// default: 30s
	ConnectRetry time.Duration `koanf:"connect_retry"`
}

// TLS configures the client side of a TLS connection. All optional.
type TLS struct {
	CAFile   string `koanf:"ca_file"`
	CertFile string `koanf:"cert_file"`
	KeyFile  string `koanf:"key_file"`
}

// Embedded configures the in-process NATS server. Authentication is on:
// the sidecar connects in process, workers connect as the users listed
// in Workers, and anonymous clients are refused unless AllowAnonymous.
type Embedded struct {
	// Listen is where workers connect. default: 127.0.0.1:4222
	Listen string `koanf:"listen"`
	// StoreDir holds JetStream's files (the ledger, the captured replies):
	// keep it across restarts. default: <temp dir>/toolsidecar-nats-<port>
	StoreDir string `koanf:"store_dir"`
	// Workers are the users workers connect as.
	Workers []Worker `koanf:"workers"`
	// AllowAnonymous lets clients without credentials in, with every
	// permission. default: false (a warning is logged when true)
	AllowAnonymous bool `koanf:"allow_anonymous"`
	// TLS serves the listener over TLS: CertFile and KeyFile, and CAFile
	// to require client certificates signed by it. Optional.
	TLS TLS `koanf:"tls"`
}

// Worker is a user of the embedded server: a worker process that may
// serve the listed tools (subscribe to their subjects, the cancel subject
// and discovery) and publish nothing but replies to the requests it got.
type Worker struct {
	Name string `koanf:"name"`
	// PasswordFile holds the worker's password; or NKey is its public
	// nkey (U...), whose seed only the worker has.
	PasswordFile string `koanf:"password_file"`
	NKey         string `koanf:"nkey"`
	// Tools the worker may serve; "*" for every tool under the prefix.
	Tools []string `koanf:"tools"`
}

// Server is the application-facing HTTP server.
type Server struct {
	// Listen address. default: 127.0.0.1:8080 (loopback)
	Listen string `koanf:"listen"`
	// OpsListen, when set, serves /healthz, /readyz and /metrics, without
	// the API token, on a listener of their own (probes and scraping).
	// default: "" (off)
	OpsListen string `koanf:"ops_listen"`
	// Pprof serves Go's profiles under /debug/pprof/ on the ops listener
	// (never on the API's), for an operator chasing CPU or memory.
	// default: false
	Pprof bool `koanf:"pprof"`
	// ReadHeaderTimeout, ReadTimeout and IdleTimeout bound a connection
	// that stalls or idles. defaults: 10s, 30s, 120s
	ReadHeaderTimeout time.Duration `koanf:"read_header_timeout"`
	ReadTimeout       time.Duration `koanf:"read_timeout"`
	IdleTimeout       time.Duration `koanf:"idle_timeout"`
	// MaxHeaderBytes bounds request headers. default: 64 KiB
	MaxHeaderBytes int `koanf:"max_header_bytes"`
	// MaxConnections bounds open connections; MaxDrives bounds drives in
	// progress (more are answered 429 with Retry-After). defaults: 1024, 512
	MaxConnections int `koanf:"max_connections"`
	MaxDrives      int `koanf:"max_drives"`
	// HTTP2Cleartext also serves HTTP/2 without TLS (h2c, prior knowledge)
	// on the API's listener, so that a client can carry many drives on
	// one connection, at most MaxStreams at once. default: false
	HTTP2Cleartext bool `koanf:"http2_cleartext"`
	// MaxStreams bounds the requests at once on one HTTP/2 connection.
	// default: 250
	MaxStreams int `koanf:"max_streams"`
	// SSEKeepalive is how often an SSE drive that has nothing to say sends
	// a comment, so that proxies and clients do not time it out. default:
	// 15s
	SSEKeepalive time.Duration `koanf:"sse_keepalive"`
	// Proxy answers Core's own API on /v1/... default: true
	Proxy bool `koanf:"proxy"`
	// MCP serves the registered tools as an MCP server (streamable HTTP,
	// stateless) on /mcp, behind the API token. Its calls run through the
	// same dispatch and policies as a model's, and have no Core Action.
	// default: false
	MCP bool `koanf:"mcp"`
	// UI serves the live view of runs, batches and approvals on /ui. The
	// page carries no data; what it shows comes from /ui/events and
	// /v1/approvals, behind the API token. default: true
	UI bool `koanf:"ui"`
	// AllowedHosts are the host names, beside localhost and IP addresses,
	// that requests may name in their Host header: a page that rebinds its
	// own DNS name to the sidecar's address is refused, token or not.
	// "*" allows every name. default: [] (loopback names and addresses)
	AllowedHosts []string `koanf:"allowed_hosts"`
	// UIHistory is how many finished runs the live view keeps.
	// default: 200
	UIHistory int `koanf:"ui_history"`
	// AuthTokenFile holds a bearer token required on every route but
	// health. Optional.
	AuthTokenFile string `koanf:"auth_token_file"`
	// ShutdownTimeout bounds the drain of in-flight batches. default: 30s
	ShutdownTimeout time.Duration `koanf:"shutdown_timeout"`
	// MaxBodyBytes bounds request bodies. default: 1 MiB
	MaxBodyBytes int64 `koanf:"max_body_bytes"`
}

// Missing-tool policies.
const (
	MissingToolError   = "error"
	MissingToolFailRun = "fail_run"
)

// Executor tunes the continuation loop.
type Executor struct {
	// MaxTurns bounds completions requests per drive. default: 10
	MaxTurns int `koanf:"max_turns"`
	// MaxParallel bounds calls in flight per batch. default: 16
	MaxParallel int `koanf:"max_parallel"`
	// MissingTool: error (an error outcome listing the tools) or fail_run.
	// default: error
	MissingTool string `koanf:"missing_tool"`
	// MaxArgsBytes bounds a manifest's arguments. default: 256 KiB
	MaxArgsBytes int `koanf:"max_args_bytes"`
	// MaxResultBytes bounds a tool's result. default: 1 MiB
	MaxResultBytes int `koanf:"max_result_bytes"`
	// MaxErrorBytes bounds the error text of a failed call that the model
	// reads. default: 1 KiB
	MaxErrorBytes int `koanf:"max_error_bytes"`
	// MaxExecProcesses bounds the exec-route processes running at once,
	// across all runs. default: 64
	MaxExecProcesses int `koanf:"max_exec_processes"`
	// CancelPoll is how often Core is asked whether a run was cancelled
	// while its batch runs. default: 500ms
	CancelPoll time.Duration `koanf:"cancel_poll"`
	// CancelPollRPS bounds those requests, for all runs together, per
	// second: one listing of a caller's newest runs (up to 100) where two
	// or more of its runs wait, else one read per run. With more runs
	// waiting than it covers, each is read less often than cancel_poll. A
	// cancel sent through the sidecar (proxy mode) is seen at once,
	// without reads. default: 25
	CancelPollRPS float64 `koanf:"cancel_poll_rps"`
	// SubmitBudget bounds how long one outcome's writes to Core (its tool
	// message, its Action's status) are retried through Core faults before
	// the drive ends interrupted, keeping the outcome for the next drive.
	// default: 2m
	SubmitBudget time.Duration `koanf:"submit_budget"`
	// Lanes sets the policy of each lane a tool names (tools[].lane). A
	// lane no entry names has on_error: continue. default: none
	Lanes map[string]Lane `koanf:"lanes"`
	// RunBudget bounds what one drive of a run may spend on tools.
	// default: no bound
	RunBudget RunBudget `koanf:"run_budget"`
	// ClaimCheckBytes: a successful result larger than this is stored by
	// reference (a JetStream object store in durable mode, else memory);
	// the model gets a preview, the size and a handle, and reads further
	// pages with the built-in tool read_tool_result. default: 0 (off)
	ClaimCheckBytes int `koanf:"claim_check_bytes"`
	// ClaimCheckPreviewBytes is the size of the preview. default: 1 KiB
	ClaimCheckPreviewBytes int `koanf:"claim_check_preview_bytes"`
	// MaxHedgeRatio caps hedged requests (tools[].hedge_after) at this
	// fraction of the calls of hedging tools, across all runs, so that a
	// slow pool is not doubled in load. default: 0.1
	MaxHedgeRatio float64 `koanf:"max_hedge_ratio"`
}

// RunBudget bounds one drive of a run. Zero fields do not bound. A call
// past a budget is not dispatched: its outcome is a budget_exceeded error
// telling the model which budget and what is left.
type RunBudget struct {
	// MaxCalls bounds the tool calls of the drive.
	MaxCalls int `koanf:"max_calls"`
	// MaxToolTime bounds the time the drive's calls take, summed.
	MaxToolTime time.Duration `koanf:"max_tool_time"`
	// MaxResultBytes bounds the bytes the drive's calls return, summed.
	MaxResultBytes int64 `koanf:"max_result_bytes"`
	// OnBudget: continue (the model reads the budget_exceeded outcomes and
	// the run goes on) or stop (once a call was refused, the drive ends
	// after its batch, with status budget_exceeded, instead of asking for
	// another turn). The tools' own budgets obey it too. default: continue
	OnBudget string `koanf:"on_budget"`
}

// Budget policies.
const (
	OnBudgetContinue = "continue"
	OnBudgetStop     = "stop"
)

// Lane is the policy of an ordered lane.
type Lane struct {
	// OnError: continue (a failed call does not stop the next) or
	// skip_rest (the calls after a failed one get an error outcome saying
	// why, and do not run). default: continue
	OnError string `koanf:"on_error"`
}

// Lane error policies.
const (
	LaneContinue = "continue"
	LaneSkipRest = "skip_rest"
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

// Side-effect classes.
const (
	ReadOnly   = "read_only"
	Idempotent = "idempotent"
	Unsafe     = "unsafe"
)

// Tool declares one tool.
type Tool struct {
	Name        string         `koanf:"name"`
	Description string         `koanf:"description"`
	Parameters  map[string]any `koanf:"parameters"`
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
}

// Default returns the configuration with every default filled in.
func Default() Config {
	return Config{
		Durability: Durability{Enabled: true, Replicas: 1, LeaseTTL: 10 * time.Second, MaxBytes: 1 << 30},
		Upstream:   Upstream{Kind: UpstreamCore, RetryBudget: 30 * time.Second},
		Core: Core{URL: "http://127.0.0.1:9000", Timeout: 30 * time.Second, StreamIdleTimeout: 280 * time.Second,
			MaxConnections: 64, IdleTimeout: 4 * time.Second},
		NATS: NATS{SubjectPrefix: "toolsidecar.tools", Embedded: Embedded{Listen: "127.0.0.1:4222"}, ConnectRetry: 30 * time.Second},
		Server: Server{Listen: "127.0.0.1:8080", Proxy: true, UI: true, UIHistory: 200, ShutdownTimeout: 30 * time.Second,
			MaxBodyBytes: 1 << 20, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
			IdleTimeout: 120 * time.Second, MaxHeaderBytes: 64 << 10, MaxConnections: 1024, MaxDrives: 512, MaxStreams: 250, SSEKeepalive: 15 * time.Second},
		Executor: Executor{MaxTurns: 10, MaxParallel: 16, MissingTool: MissingToolError,
			MaxArgsBytes: 256 << 10, MaxResultBytes: 1 << 20, MaxErrorBytes: 1 << 10, MaxExecProcesses: 64,
			CancelPoll: 500 * time.Millisecond, SubmitBudget: 2 * time.Minute, Lanes: map[string]Lane{},
			RunBudget: RunBudget{OnBudget: OnBudgetContinue}, MaxHedgeRatio: 0.1, ClaimCheckPreviewBytes: 1 << 10,
			CancelPollRPS: 25},
		Tracing: Tracing{ServiceName: "toolsidecar", SampleRatio: 1},
	}
}

// applyDefaults fills a tool's zero fields.
func (t *Tool) applyDefaults() {
	if t.Timeout == 0 {
		t.Timeout = tool.DefaultTimeout
	}
	if t.MaxDuration == 0 {
		t.MaxDuration = tool.DefaultMaxDuration
	}
	if t.SideEffects == "" {
		t.SideEffects = Unsafe
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

// Load reads path (may be empty: defaults only), then the environment, then
// the key=value overrides, and validates the result.
func Load(path string, overrides []string) (Config, error) {
	cfg, _, err := loadPath(path, overrides)
	return cfg, err
}

// loadPath reads path (if any) and loads it with the environment.
func loadPath(path string, overrides []string) (Config, *layers, error) {
	var data []byte
	if path != "" {
		var err error
		if data, err = readBounded(path, MaxFileBytes); err != nil {
			return Config{}, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	return loadLayers(data, path, os.Environ(), overrides)
}

// MaxFileBytes bounds a configuration file: `--config /dev/zero` is an
// error, not an out-of-memory crash.
const MaxFileBytes = 1 << 20

// maxSecretBytes bounds a secret file.
const maxSecretBytes = 64 << 10

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return data, nil
}

// Parse reads a configuration from YAML bytes, with no environment or
// overrides: for embedded configurations and tests.
func Parse(data []byte) (Config, error) {
	return load(data, "config", nil, nil)
}

// load merges the defaults, the file (data, when not nil), the environment
// and the overrides, and reports every problem at once (*Problems), each
// with its key and, for the file's keys, its line.
func load(data []byte, name string, environ, overrides []string) (Config, error) {
	cfg, _, err := loadLayers(data, name, environ, overrides)
	return cfg, err
}

// layers is the merged configuration and where each key's value came
// from: "file", "env" or "flag" (absent: the default).
type layers struct {
	k      *koanf.Koanf
	source map[string]string
}

// loadLayers is load, with the merged layers for `toolsidecar config`.
func loadLayers(data []byte, name string, environ, overrides []string) (Config, *layers, error) {
	if name == "" {
		name = "the configuration"
	}
	k := koanf.New(".")
	if err := k.Load(structs.Provider(Default(), "koanf"), nil); err != nil {
		return Config{}, nil, fmt.Errorf("config: defaults: %w", err)
	}
	known := k.Keys()
	ls := &layers{k: k, source: map[string]string{}}
	var errs []error
	var pos *lines
	if data != nil {
		var err error
		if pos, err = scanYAML(data); err != nil {
			return Config{}, nil, &Problems{Source: name, List: []error{err}}
		}
		errs = append(errs, pos.unknown...)
		fk := koanf.New(".")
		if err := fk.Load(rawbytes.Provider(data), yaml.Parser()); err != nil {
			return Config{}, nil, &Problems{Source: name, List: []error{err}}
		}
		for _, key := range fk.Keys() {
			ls.source[key] = "file"
		}
		if err := k.Merge(fk); err != nil {
			return Config{}, nil, &Problems{Source: name, List: []error{err}}
		}
	}
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix) || slices.Contains(otherEnv, name) {
			continue
		}
		i := slices.IndexFunc(known, func(key string) bool { return envName(key) == name })
		if i < 0 {
			names := make([]string, 0, len(known)+len(otherEnv))
			for _, key := range known {
				names = append(names, envName(key))
			}
			errs = append(errs, fmt.Errorf("environment variable %s is not a setting%s", name, didYouMean(name, append(names, otherEnv...))))
			continue
		}
		k.Set(known[i], val)
		ls.source[known[i]] = "env"
	}
	for _, o := range overrides {
		key, val, ok := strings.Cut(o, "=")
		if !ok || !slices.Contains(known, key) {
			errs = append(errs, fmt.Errorf("--set %q: not a known key=value%s", o, didYouMean(key, known)))
			continue
		}
		k.Set(key, val)
		ls.source[key] = "flag"
	}
	var cfg Config
	// Unknown keys of the file were found by scanYAML, with their lines;
	// those of the environment and flags just above.
	err := k.UnmarshalWithConf("", &cfg, koanf.UnmarshalConf{DecoderConfig: &mapstructure.DecoderConfig{
		DecodeHook:       mapstructure.ComposeDecodeHookFunc(durationWithUnit, mapstructure.StringToTimeDurationHookFunc()),
		ErrorUnused:      data == nil,
		WeaklyTypedInput: true,
		TagName:          "koanf",
	}})
	if err != nil {
		errs = append(errs, decodeErrors(err)...)
	}
	for i := range cfg.Tools {
		cfg.Tools[i].applyDefaults()
	}
	if err := cfg.Validate(); err != nil {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = append(errs, j.Unwrap()...)
		} else {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return Config{}, nil, &Problems{Source: name, List: tidy(pos.locate(errs))}
	}
	return cfg, ls, nil
}

// decodeErrors splits the decoder's one error into one per key.
func decodeErrors(err error) []error {
	var out []error
	for line := range strings.Lines(err.Error()) {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "* "))
		if line == "" || strings.HasPrefix(line, "decoding failed") {
			continue
		}
		out = append(out, errors.New(line))
	}
	if len(out) == 0 {
		out = append(out, err)
	}
	return out
}

// durationWithUnit refuses a bare number where a duration goes: YAML's
// "timeout: 30" would otherwise mean 30 nanoseconds.
func durationWithUnit(from, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeFor[time.Duration]() || from == to {
		return data, nil // a default, already a duration
	}
	switch from.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return nil, fmt.Errorf("duration %v has no unit: write it like 30s, 500ms or 2m", data)
	case reflect.String:
		if _, err := strconv.ParseFloat(data.(string), 64); err == nil {
			return nil, fmt.Errorf("duration %q has no unit: write it like 30s, 500ms or 2m", data)
		}
	}
	return data, nil
}

// checkHostPort accepts host:port with a numeric port (0 to 65535; -1
// for the embedded server's random port).
func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < -1 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
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

// otherEnv are the TOOLSIDECAR_ variables that are not configuration keys:
// the Core and upstream keys, the log flags' defaults, and the subject
// prefix that the example workers read.
var otherEnv = []string{APIKeyEnv, UpstreamAPIKeyEnv, "TOOLSIDECAR_LOG_LEVEL", "TOOLSIDECAR_LOG_FORMAT", "TOOLSIDECAR_PREFIX"}

// didYouMean suggests the closest of names to s, when one is close.
func didYouMean(s string, names []string) string {
	if best := closest(s, names); best != "" {
		return fmt.Sprintf(" (did you mean %s?)", best)
	}
	return ""
}

// closest is the name nearest to s by edit distance (case aside), or ""
// when none is within about a third of s.
func closest(s string, names []string) string {
	best, bestD := "", len(s)/3+2
	for _, n := range names {
		if d := editDistance(strings.ToLower(s), strings.ToLower(n)); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

func envName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

var toolName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Validate checks values and names the offending key. Route kinds and
// schemas are checked where they are compiled (the registry).
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &FieldError{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	switch c.Upstream.Kind {
	case UpstreamCore:
	case UpstreamOpenAI:
		if u, err := url.Parse(c.Upstream.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("upstream.url", "must be the http(s) URL of the API with its version (https://api.openai.com/v1), got %q", RedactURL(c.Upstream.URL))
		}
	default:
		bad("upstream.kind", "must be core or openai, got %q", c.Upstream.Kind)
	}
	if u, err := url.Parse(c.Core.URL); c.Core.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("core.url", "must be an http(s) URL, got %q", RedactURL(c.Core.URL))
	}
	for key, addr := range map[string]string{"server.listen": c.Server.Listen, "server.ops_listen": c.Server.OpsListen,
		"nats.embedded.listen": c.NATS.Embedded.Listen, "tracing.otlp_endpoint": c.Tracing.OTLPEndpoint} {
		if addr == "" && key != "server.listen" && key != "nats.embedded.listen" {
			continue // optional
		}
		if err := checkHostPort(addr); err != nil {
			bad(key, "must be host:port (127.0.0.1:8080), got %q: %v", addr, err)
		}
	}
	for _, u := range strings.Split(c.NATS.URL, ",") {
		if c.NATS.URL == "" {
			break
		}
		if p, err := url.Parse(strings.TrimSpace(u)); err != nil || p.Host == "" || !slices.Contains([]string{"nats", "tls", "ws", "wss"}, p.Scheme) {
			bad("nats.url", "must be nats://, tls://, ws:// or wss:// URLs, separated by commas, got %q", RedactURL(u))
		}
	}
	for key, d := range map[string]time.Duration{
		"upstream.retry_budget": c.Upstream.RetryBudget, "core.timeout": c.Core.Timeout, "core.stream_idle_timeout": c.Core.StreamIdleTimeout, "core.idle_timeout": c.Core.IdleTimeout,
		"server.shutdown_timeout": c.Server.ShutdownTimeout, "executor.cancel_poll": c.Executor.CancelPoll,
		"executor.submit_budget": c.Executor.SubmitBudget, "server.sse_keepalive": c.Server.SSEKeepalive,
		"nats.connect_retry": c.NATS.ConnectRetry,
	} {
		if d <= 0 {
			bad(key, "must be positive, got %s", d)
		}
	}
	if c.Durability.LeaseTTL < time.Second {
		bad("durability.lease_ttl", "must be at least 1s, got %s", c.Durability.LeaseTTL)
	}
	if c.Durability.Replicas < 1 || c.Durability.Replicas > 5 {
		bad("durability.replicas", "must be 1 to 5, got %d", c.Durability.Replicas)
	}
	for key, n := range map[string]int64{
		"server.read_header_timeout": int64(c.Server.ReadHeaderTimeout), "server.read_timeout": int64(c.Server.ReadTimeout),
		"server.idle_timeout": int64(c.Server.IdleTimeout), "server.max_header_bytes": int64(c.Server.MaxHeaderBytes),
		"server.max_connections": int64(c.Server.MaxConnections), "server.max_drives": int64(c.Server.MaxDrives), "server.max_streams": int64(c.Server.MaxStreams),
		"server.ui_history":     int64(c.Server.UIHistory),
		"core.max_connections":  int64(c.Core.MaxConnections),
		"server.max_body_bytes": c.Server.MaxBodyBytes, "executor.max_args_bytes": int64(c.Executor.MaxArgsBytes),
		"executor.max_result_bytes": int64(c.Executor.MaxResultBytes), "executor.max_error_bytes": int64(c.Executor.MaxErrorBytes),
		"executor.max_exec_processes": int64(c.Executor.MaxExecProcesses), "durability.max_bytes": c.Durability.MaxBytes,
	} {
		if n <= 0 {
			bad(key, "must be positive, got %d", n)
		}
	}
	errs = append(errs, c.NATS.validate()...)
	if c.Executor.MaxTurns < 1 {
		bad("executor.max_turns", "must be at least 1, got %d", c.Executor.MaxTurns)
	}
	if c.Executor.MaxParallel < 1 {
		bad("executor.max_parallel", "must be at least 1, got %d", c.Executor.MaxParallel)
	}
	if c.Executor.MissingTool != MissingToolError && c.Executor.MissingTool != MissingToolFailRun {
		bad("executor.missing_tool", "must be error or fail_run, got %q", c.Executor.MissingTool)
	}
	if cc := c.Executor.ClaimCheckBytes; cc != 0 {
		switch {
		case cc < 0 || cc >= c.Executor.MaxResultBytes:
			bad("executor.claim_check_bytes", "must be between 1 and executor.max_result_bytes (%d), got %d", c.Executor.MaxResultBytes, cc)
		case c.Executor.ClaimCheckPreviewBytes < 1 || c.Executor.ClaimCheckPreviewBytes >= cc:
			bad("executor.claim_check_preview_bytes", "must be between 1 and claim_check_bytes (%d), got %d", cc, c.Executor.ClaimCheckPreviewBytes)
		}
		for i, t := range c.Tools {
			if t.Name == ReadToolResult {
				bad(fmt.Sprintf("tools[%d].name", i), "%s is the built-in tool that claim-check adds", ReadToolResult)
			}
		}
	}
	if c.Executor.CancelPollRPS < 0 {
		bad("executor.cancel_poll_rps", "must not be negative")
	}
	if c.Server.Pprof && c.Server.OpsListen == "" {
		bad("server.pprof", "needs server.ops_listen: profiles are served there only")
	}
	if r := c.Executor.MaxHedgeRatio; r < 0 || r > 1 {
		bad("executor.max_hedge_ratio", "must be between 0 and 1, got %v", r)
	}
	if b := c.Executor.RunBudget; b.MaxCalls < 0 || b.MaxToolTime < 0 || b.MaxResultBytes < 0 {
		bad("executor.run_budget", "limits must not be negative")
	}
	if p := c.Executor.RunBudget.OnBudget; p != "" && p != OnBudgetContinue && p != OnBudgetStop {
		bad("executor.run_budget.on_budget", "must be continue or stop, got %q", p)
	}
	lanes := map[string]bool{}
	for _, t := range c.Tools {
		lanes[t.Lane] = t.Lane != ""
	}
	for _, name := range slices.Sorted(maps.Keys(c.Executor.Lanes)) {
		key := "executor.lanes." + name
		if !lanes[name] {
			bad(key, "no tool names this lane%s", didYouMean(name, slices.Collect(maps.Keys(lanes))))
		}
		if p := c.Executor.Lanes[name].OnError; p != "" && p != LaneContinue && p != LaneSkipRest {
			bad(key+".on_error", "must be continue or skip_rest, got %q", p)
		}
	}
	if c.Tracing.SampleRatio < 0 || c.Tracing.SampleRatio > 1 {
		bad("tracing.sample_ratio", "must be between 0 and 1, got %v", c.Tracing.SampleRatio)
	}
	if c.NATS.SubjectPrefix == "" || strings.ContainsAny(c.NATS.SubjectPrefix, " *>") {
		bad("nats.subject_prefix", "must be a literal subject, got %q", c.NATS.SubjectPrefix)
	}
	seen := map[string]int{}
	for i, t := range c.Tools {
		key := fmt.Sprintf("tools[%d]", i)
		if !toolName.MatchString(t.Name) {
			bad(key+".name", "%q must be 1-64 letters, digits, _ or -", t.Name)
		} else if j, dup := seen[t.Name]; dup {
			bad(key+".name", "duplicate tool name %q (also tools[%d])", t.Name, j)
		}
		seen[t.Name] = i
		if !slices.Contains([]string{ReadOnly, Idempotent, Unsafe}, t.SideEffects) {
			bad(key+".side_effects", "must be read_only, idempotent or unsafe, got %q", t.SideEffects)
		}
		if t.Retries < 0 {
			bad(key+".retries", "must not be negative")
		}
		if t.Timeout < 0 {
			bad(key+".timeout", "must not be negative")
		}
		if t.MaxDuration < 0 {
			bad(key+".max_duration", "must not be negative")
		}
		if t.MaxCallsPerRun < 0 || t.Rate < 0 || t.RateBurst < 0 {
			bad(key, "max_calls_per_run, rate and rate_burst must not be negative")
		}
		switch {
		case t.Dedupe != "" && t.Dedupe != DedupeRun:
			bad(key+".dedupe", "must be run or empty, got %q", t.Dedupe)
		case t.Dedupe != "" && t.SideEffects != ReadOnly:
			bad(key+".dedupe", "only a read_only tool may answer a repeated call from an earlier result (side_effects is %s)", t.SideEffects)
		}
		if t.DedupeTTL < 0 || t.DedupeTTL > MaxDedupeTTL {
			bad(key+".dedupe_ttl", "must be between 0 and %s", MaxDedupeTTL)
		}
		if t.HedgeAfter != "" {
			if _, _, err := ParseHedge(t.HedgeAfter); err != nil {
				bad(key+".hedge_after", "%v", err)
			} else if t.SideEffects != ReadOnly {
				bad(key+".hedge_after", "only a read_only tool may be sent twice at once (side_effects is %s)", t.SideEffects)
			}
		}
		if t.Approval != "" && t.Approval != ApprovalRequired {
			bad(key+".approval", "must be required or empty, got %q", t.Approval)
		}
		if t.ApprovalTimeout < 0 || t.ApprovalTimeout > MaxApprovalTimeout {
			bad(key+".approval_timeout", "must be between 0 and %s", MaxApprovalTimeout)
		}
		if t.OnTimeout != "" && t.OnTimeout != OnTimeoutDeny {
			bad(key+".on_timeout", "must be deny (a call nobody approved does not run), got %q", t.OnTimeout)
		}
		if t.Lane != "" && !toolName.MatchString(t.Lane) {
			bad(key+".lane", "%q must be 1-64 letters, digits, _ or -", t.Lane)
		}
		for _, k := range slices.Sorted(maps.Keys(t.Settings)) {
			if k != t.Route {
				if hint := didYouMean(k, toolKeys()); hint != "" {
					bad(key+"."+k, "unknown key%s", hint)
					continue
				}
				bad(key+"."+k, "unknown key (a tool's own settings go under its route's name, here %q)", t.Route)
			}
		}
	}
	return errors.Join(errs...)
}

// validate checks the NATS credentials: one kind at most for an external
// server, and embedded worker users that can log in.
func (n NATS) validate() []error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &FieldError{Key: "nats." + key, Msg: fmt.Sprintf(format, args...)})
	}
	kinds := 0
	for _, set := range []bool{n.CredsFile != "", n.User != "" || n.PasswordFile != "", n.TokenFile != "", n.NKeySeedFile != ""} {
		if set {
			kinds++
		}
	}
	if kinds > 1 {
		bad("creds_file", "set one of creds_file, user with password_file, token_file and nkey_seed_file")
	}
	if (n.User == "") != (n.PasswordFile == "") {
		bad("user", "user and password_file go together")
	}
	if (n.Embedded.TLS.CertFile == "") != (n.Embedded.TLS.KeyFile == "") {
		bad("embedded.tls", "cert_file and key_file go together")
	}
	names := map[string]bool{}
	for i, w := range n.Embedded.Workers {
		key := fmt.Sprintf("embedded.workers[%d]", i)
		switch {
		case w.Name == "" || w.Name == SidecarUser:
			bad(key+".name", "must be set and not %q", SidecarUser)
		case names[w.Name]:
			bad(key+".name", "duplicate user %q", w.Name)
		}
		names[w.Name] = true
		if (w.PasswordFile == "") == (w.NKey == "") {
			bad(key, "set exactly one of password_file and nkey")
		}
		if w.NKey != "" && !strings.HasPrefix(w.NKey, "U") {
			bad(key+".nkey", "must be a public user nkey (U...)")
		}
		if len(w.Tools) == 0 {
			bad(key+".tools", "list the tools the worker may serve (or \"*\")")
		}
	}
	return errs
}

// SidecarUser is the embedded server's user the sidecar itself connects
// as, in process; no worker may take the name.
const SidecarUser = "toolsidecar"

// ReadSecret reads the secret file that key names, trimming the trailing
// newline. An empty or blank file is an error: it would otherwise turn a
// protection off without a word.
func ReadSecret(key, path string) (string, error) {
	data, err := readBounded(path, maxSecretBytes)
	if err != nil {
		return "", fmt.Errorf("config: %s: %w", key, err)
	}
	s := strings.TrimRight(string(data), "\r\n")
	if strings.TrimSpace(s) == "" {
		return "", fmt.Errorf("config: %s: %s is empty", key, path)
	}
	return s, nil
}

// APIKey returns the Core API key: from core.api_key_file, else from
// TOOLSIDECAR_CORE_API_KEY, else "".
func (c Config) APIKey() (string, error) {
	if c.Core.APIKeyFile != "" {
		return ReadSecret("core.api_key_file", c.Core.APIKeyFile)
	}
	return os.Getenv(APIKeyEnv), nil
}

// UpstreamAPIKey returns the OpenAI-compatible upstream's key: from
// upstream.api_key_file, else from TOOLSIDECAR_UPSTREAM_API_KEY, else "".
func (c Config) UpstreamAPIKey() (string, error) {
	if c.Upstream.APIKeyFile != "" {
		return ReadSecret("upstream.api_key_file", c.Upstream.APIKeyFile)
	}
	return os.Getenv(UpstreamAPIKeyEnv), nil
}

// RedactURL hides the userinfo of every URL in a comma-separated list, for
// logs and messages; text that is not a URL is returned as it is.
func RedactURL(list string) string {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}

// Changed lists the keys (dotted, as in the file) whose values differ
// between a and b, tools aside: what a reload cannot apply, since only
// tools are reloaded.
func Changed(a, b Config) []string {
	var keys []string
	var walk func(prefix string, x, y reflect.Value)
	walk = func(prefix string, x, y reflect.Value) {
		if x.Kind() != reflect.Struct {
			if !reflect.DeepEqual(x.Interface(), y.Interface()) {
				keys = append(keys, prefix)
			}
			return
		}
		for i := range x.NumField() {
			tag := x.Type().Field(i).Tag.Get("koanf")
			if tag == "" || tag == "tools" && prefix == "" {
				continue
			}
			key := tag
			if prefix != "" {
				key = prefix + "." + tag
			}
			walk(key, x.Field(i), y.Field(i))
		}
	}
	walk("", reflect.ValueOf(a), reflect.ValueOf(b))
	return keys
}

// FileRef is a file the configuration names: a secret, a certificate.
type FileRef struct{ Key, Path string }

// Files lists every file the configuration names (keys ending in _file),
// for `toolsidecar check`.
func (c Config) Files() []FileRef {
	var refs []FileRef
	var walk func(prefix string, v reflect.Value)
	walk = func(prefix string, v reflect.Value) {
		switch v.Kind() {
		case reflect.Struct:
			for i := range v.NumField() {
				tag := strings.Split(v.Type().Field(i).Tag.Get("koanf"), ",")[0]
				if tag == "" || tag == "-" {
					continue
				}
				f := v.Field(i)
				if f.Kind() == reflect.String && strings.HasSuffix(tag, "_file") && f.String() != "" {
					refs = append(refs, FileRef{Key: join(prefix, tag), Path: f.String()})
					continue
				}
				walk(join(prefix, tag), f)
			}
		case reflect.Slice:
			for i := range v.Len() {
				walk(fmt.Sprintf("%s[%d]", prefix, i), v.Index(i))
			}
		}
	}
	walk("", reflect.ValueOf(c))
	return refs
}

// Setting is one effective value and where it came from.
type Setting struct {
	Key, Value string
	Source     string // default, file, env or flag
}

// Explain loads the configuration as Load does and lists every key with
// its effective value and its source, URLs redacted (the configuration
// holds no secret itself: those are files, or the Core key's variable,
// which is not listed). The tools are one line: `toolsidecar check` shows
// them.
func Explain(path string, overrides []string) ([]Setting, error) {
	_, ls, err := loadPath(path, overrides)
	if err != nil {
		return nil, err
	}
	k, source := ls.k, ls.source
	var out []Setting
	for _, key := range k.Keys() {
		if key == "tools" || strings.HasPrefix(key, "tools.") {
			continue
		}
		src := source[key]
		if src == "" {
			src = "default"
		}
		val := fmt.Sprint(k.Get(key))
		if strings.Contains(val, "://") {
			val = RedactURL(val)
		}
		out = append(out, Setting{Key: key, Value: val, Source: src})
	}
	tsrc := "default"
	if k.Exists("tools") && source["tools"] != "" {
		tsrc = source["tools"]
	}
	out = append(out, Setting{Key: "tools", Value: fmt.Sprintf("%d tools (toolsidecar check lists them)", len(k.Slices("tools"))), Source: tsrc})
	return out, nil
}
