// Package config loads and validates the daemon's configuration: the YAML
// file, then TOOLSIDECAR_ environment variables, then --set flags. Unknown
// keys are errors that name the key. Secrets never come from the file: the
// Core API key is read from core.api_key_file or TOOLSIDECAR_CORE_API_KEY.
package config

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/file"
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
	Core     Core     `koanf:"core"`
	NATS     NATS     `koanf:"nats"`
	Server   Server   `koanf:"server"`
	Executor Executor `koanf:"executor"`
	Tracing  Tracing  `koanf:"tracing"`
	Tools    []Tool   `koanf:"tools"`
}

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
	// URL of Core, without /v1. default: http://127.0.0.1:9000
	URL string `koanf:"url"`
	// APIKeyFile holds the X-API-Key. Optional: TOOLSIDECAR_CORE_API_KEY
	// is read when it is empty.
	APIKeyFile string `koanf:"api_key_file"`
	// Timeout bounds each non-streaming call. default: 30s
	Timeout time.Duration `koanf:"timeout"`
	// StreamIdleTimeout bounds the silence between frames. default: 280s
	StreamIdleTimeout time.Duration `koanf:"stream_idle_timeout"`
}

// NATS is the worker bus.
type NATS struct {
	// URL of a NATS server or cluster; empty starts the embedded server.
	URL string `koanf:"url"`
	// SubjectPrefix: a tool is served on <prefix>.<name>.
	// default: toolsidecar.tools
	SubjectPrefix string `koanf:"subject_prefix"`
	// CredsFile is a NATS credentials file. Optional.
	CredsFile string   `koanf:"creds_file"`
	TLS       TLS      `koanf:"tls"`
	Embedded  Embedded `koanf:"embedded"`
}

// TLS configures TLS to an external NATS. All optional.
type TLS struct {
	CAFile   string `koanf:"ca_file"`
	CertFile string `koanf:"cert_file"`
	KeyFile  string `koanf:"key_file"`
}

// Embedded configures the in-process NATS server.
type Embedded struct {
	// Listen is where workers connect. default: 127.0.0.1:4222
	Listen string `koanf:"listen"`
}

// Server is the application-facing HTTP server.
type Server struct {
	// Listen address. default: 127.0.0.1:8080 (loopback)
	Listen string `koanf:"listen"`
	// Proxy answers Core's own API on /v1/... default: true
	Proxy bool `koanf:"proxy"`
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
	// CancelPoll is how often Core is asked whether the run was cancelled
	// while a batch runs. default: 500ms
	CancelPoll time.Duration `koanf:"cancel_poll"`
	// SubmitBudget bounds how long one outcome's writes to Core (its tool
	// message, its Action's status) are retried through Core faults before
	// the drive ends interrupted, keeping the outcome for the next drive.
	// default: 2m
	SubmitBudget time.Duration `koanf:"submit_budget"`
}

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
	// Timeout per attempt. default: 30s
	Timeout time.Duration `koanf:"timeout"`
	// Retries after a timeout, no responders, or a retryable worker error.
	// default: 0
	Retries int `koanf:"retries"`
	// SideEffects: read_only, idempotent or unsafe (never retried once
	// sent). default: unsafe
	SideEffects string `koanf:"side_effects"`
	// Route: nats (default), or another registered route kind.
	Route string `koanf:"route"`
	// Settings holds every other key of the tool: the settings of its route
	// kind, under the kind's name (exec: {...}). Any other key is an error
	// here; the registry hands the settings to the kind, which decodes and
	// checks them.
	Settings map[string]any `koanf:",remain"`
}

// Default returns the configuration with every default filled in.
func Default() Config {
	return Config{
		Core: Core{URL: "http://127.0.0.1:9000", Timeout: 30 * time.Second, StreamIdleTimeout: 280 * time.Second},
		NATS: NATS{SubjectPrefix: "toolsidecar.tools", Embedded: Embedded{Listen: "127.0.0.1:4222"}},
		Server: Server{Listen: "127.0.0.1:8080", Proxy: true, ShutdownTimeout: 30 * time.Second,
			MaxBodyBytes: 1 << 20},
		Executor: Executor{MaxTurns: 10, MaxParallel: 16, MissingTool: MissingToolError,
			MaxArgsBytes: 256 << 10, MaxResultBytes: 1 << 20, CancelPoll: 500 * time.Millisecond,
			SubmitBudget: 2 * time.Minute},
		Tracing: Tracing{ServiceName: "toolsidecar", SampleRatio: 1},
	}
}

// applyDefaults fills a tool's zero fields.
func (t *Tool) applyDefaults() {
	if t.Timeout == 0 {
		t.Timeout = tool.DefaultTimeout
	}
	if t.SideEffects == "" {
		t.SideEffects = Unsafe
	}
	if t.Route == "" {
		t.Route = "nats"
	}
}

// Load reads path (may be empty: defaults only), then the environment, then
// the key=value overrides, and validates the result.
func Load(path string, overrides []string) (Config, error) {
	var src koanf.Provider
	if path != "" {
		src = file.Provider(path)
	}
	return load(src, path, os.Environ(), overrides)
}

// Parse reads a configuration from YAML bytes, with no environment or
// overrides: for embedded configurations and tests.
func Parse(data []byte) (Config, error) {
	return load(rawbytes.Provider(data), "config", nil, nil)
}

func load(src koanf.Provider, name string, environ, overrides []string) (Config, error) {
	k := koanf.New(".")
	if err := k.Load(structs.Provider(Default(), "koanf"), nil); err != nil {
		return Config{}, fmt.Errorf("config: defaults: %w", err)
	}
	known := k.Keys()
	if src != nil {
		if err := k.Load(src, yaml.Parser()); err != nil {
			return Config{}, fmt.Errorf("%w: %s: %w", ErrInvalid, name, err)
		}
	}
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix) || name == APIKeyEnv {
			continue
		}
		for _, key := range known {
			if envName(key) == name {
				k.Set(key, val)
			}
		}
	}
	for _, o := range overrides {
		key, val, ok := strings.Cut(o, "=")
		if !ok || !slices.Contains(known, key) {
			return Config{}, fmt.Errorf("%w: --set %q: not a known key=value", ErrInvalid, o)
		}
		k.Set(key, val)
	}
	var cfg Config
	err := k.UnmarshalWithConf("", &cfg, koanf.UnmarshalConf{DecoderConfig: &mapstructure.DecoderConfig{
		DecodeHook:       mapstructure.StringToTimeDurationHookFunc(),
		ErrorUnused:      true,
		WeaklyTypedInput: true,
		TagName:          "koanf",
	}})
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	for i := range cfg.Tools {
		cfg.Tools[i].applyDefaults()
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
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
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalid, key, fmt.Sprintf(format, args...)))
	}
	if c.Core.URL == "" {
		bad("core.url", "must be set")
	}
	if c.Executor.MaxTurns < 1 {
		bad("executor.max_turns", "must be at least 1, got %d", c.Executor.MaxTurns)
	}
	if c.Executor.MaxParallel < 1 {
		bad("executor.max_parallel", "must be at least 1, got %d", c.Executor.MaxParallel)
	}
	if c.Executor.MissingTool != MissingToolError && c.Executor.MissingTool != MissingToolFailRun {
		bad("executor.missing_tool", "must be error or fail_run, got %q", c.Executor.MissingTool)
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
		for _, k := range slices.Sorted(maps.Keys(t.Settings)) {
			if k != t.Route {
				bad(key+"."+k, "unknown key (a tool's own settings go under its route's name, here %q)", t.Route)
			}
		}
	}
	return errors.Join(errs...)
}

// ReadSecret reads a secret file, trimming the trailing newline.
func ReadSecret(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("config: reading secret: %w", err)
	}
	return strings.TrimRight(string(data), "\r\n"), nil
}

// APIKey returns the Core API key: from core.api_key_file, else from
// TOOLSIDECAR_CORE_API_KEY, else "".
func (c Config) APIKey() (string, error) {
	if c.Core.APIKeyFile != "" {
		return ReadSecret(c.Core.APIKeyFile)
	}
	return os.Getenv(APIKeyEnv), nil
}
