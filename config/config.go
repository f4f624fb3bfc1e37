// Package config loads and validates the daemon's configuration: the YAML
// file, then TOOLSIDECAR_ environment variables, then --set flags. Unknown
// keys are errors that name the key. Secrets never come from the file: the
// Core API key is read from core.api_key_file or TOOLSIDECAR_CORE_API_KEY.
package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
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

// Default returns the configuration with every default filled in.
func Default() Config {
	return Config{
		Durability: Durability{Enabled: true, Replicas: 1, LeaseTTL: 10 * time.Second, MaxBytes: 1 << 30},
		Upstream: Upstream{Kind: UpstreamCore, RetryBudget: 30 * time.Second, ConnectTimeout: 5 * time.Second, StreamIdleTimeout: 2 * time.Minute, JournalTTL: 24 * time.Hour, MaxSessions: 1000,
			Confirmations: ConfirmByApplication},
		Core: Core{URL: "http://127.0.0.1:9000", Timeout: 30 * time.Second, ConnectTimeout: 5 * time.Second, StreamIdleTimeout: 280 * time.Second,
			MaxConnections: 64, IdleTimeout: 4 * time.Second},
		NATS: NATS{SubjectPrefix: "toolsidecar.tools", Embedded: Embedded{Listen: "127.0.0.1:4222", WorkerCredentials: true, Sync: SyncAlways}, ConnectRetry: 30 * time.Second,
			DiscoverInterval: 2 * time.Second, DiscoverGrace: 10 * time.Second},
		Server: Server{Listen: "127.0.0.1:8741", Proxy: true, UI: true, UIHistory: 200, ShutdownTimeout: 30 * time.Second,
			MaxBodyBytes: 1 << 20, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
			IdleTimeout: 120 * time.Second, MaxHeaderBytes: 64 << 10, MaxConnections: 1024, MaxDrives: 512, MaxStreams: 250, SSEKeepalive: 15 * time.Second, SSEResumeGrace: 10 * time.Second},
		Executor: Executor{MaxTurns: 10, MaxParallel: 16, MissingTool: MissingToolError,
			MaxArgsBytes: 256 << 10, MaxResultBytes: 1 << 20, MaxErrorBytes: 1 << 10, MaxExecProcesses: 64,
			CancelPoll: 500 * time.Millisecond, SubmitBudget: 2 * time.Minute, Lanes: map[string]Lane{},
			RunBudget: RunBudget{OnBudget: OnBudgetContinue}, MaxHedgeRatio: 0.1, ClaimCheckPreviewBytes: 1 << 10,
			CancelPollRPS: 25},
		Tracing: Tracing{ServiceName: "toolsidecar", SampleRatio: 1},
	}
}

// Validate checks values and names the offending key: each section checks
// its own, and the problems of all are returned together. Route kinds and
// schemas are checked where they are compiled (the registry).
func (c Config) Validate() error {
	var errs []error
	for _, section := range [][]error{
		c.Upstream.validate(), c.Core.validate(), c.NATS.validate(), c.Durability.validate(),
		c.Server.validate(), c.Executor.validate(c.Tools), c.Tracing.validate(), validateTools(c.Tools, c.Executor),
	} {
		errs = append(errs, section...)
	}
	return errors.Join(errs...)
}

// problems collects one section's problems, each named by its key's path.
type problems struct {
	prefix string
	list   []error
}

// add adds a problem of key ("" for the section itself).
func (p *problems) add(key, format string, args ...any) {
	path := p.prefix
	if key != "" {
		path = join(p.prefix, key)
	}
	p.list = append(p.list, &FieldError{Key: path, Msg: fmt.Sprintf(format, args...)})
}

// positive adds a problem for each duration or size that is not positive.
func (p *problems) positive(values map[string]int64, unit func(int64) string) {
	for _, key := range slices.Sorted(maps.Keys(values)) {
		if values[key] <= 0 {
			p.add(key, "must be positive, got %s", unit(values[key]))
		}
	}
}

func durationText(n int64) string { return time.Duration(n).String() }
func numberText(n int64) string   { return strconv.FormatInt(n, 10) }

// hostPort adds a problem when addr is not host:port; optional addresses
// may be empty.
func (p *problems) hostPort(key, addr string, optional bool) {
	if addr == "" && optional {
		return
	}
	if err := checkHostPort(addr); err != nil {
		p.add(key, "must be host:port (127.0.0.1:8741), got %q: %v", addr, err)
	}
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

// SidecarUser is the embedded server's user the sidecar itself connects
// as, in process; no worker may take the name.
const SidecarUser = "toolsidecar"

// WorkerUser is the embedded server's user of the issued worker
// credentials (nats.embedded.worker_credentials); the name is reserved.
const WorkerUser = "toolsidecar-worker"

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
