package config

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/projectdavid/toolsidecar/tool"
)

func TestShippedConfig(t *testing.T) {
	cfg, err := load(mustRead(t, "../config.yaml"), "../config.yaml", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	def := Default()
	if cfg.Core != def.Core || !reflect.DeepEqual(cfg.Executor, def.Executor) || !reflect.DeepEqual(cfg.Server, def.Server) || cfg.Tracing != def.Tracing {
		t.Errorf("config.yaml claims to show the defaults but differs:\n%+v\n%+v", cfg, def)
	}
	if len(cfg.Tools) != 4 || cfg.Tools[0].Name != "get_flight_times" || cfg.Tools[0].Retries != 2 || cfg.Tools[0].SideEffects != ReadOnly {
		t.Errorf("tools %+v", cfg.Tools)
	}
	if cfg.Tools[1].Route != "nats" || cfg.Tools[1].Timeout != 10*time.Second {
		t.Errorf("defaults not applied to book_flight: %+v", cfg.Tools[1])
	}
	if h := cfg.Tools[2]; h.Name != "hold_room" || h.Approval != ApprovalRequired || h.ApprovalTimeout != DefaultApprovalTimeout || h.OnTimeout != OnTimeoutDeny {
		t.Errorf("hold_room's approval: %+v", h)
	}
}

func TestGoodConfig(t *testing.T) {
	cfg, err := load(mustRead(t, "testdata/good.yaml"), "testdata/good.yaml", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Core.URL != "http://core:9000" || cfg.Core.Timeout != 5*time.Second || cfg.Core.StreamIdleTimeout != 280*time.Second || cfg.Core.IdleTimeout != 4*time.Second {
		t.Errorf("core %+v", cfg.Core)
	}
	if cfg.Executor.MaxParallel != 4 || cfg.Executor.MaxTurns != 10 || cfg.Executor.MissingTool != MissingToolFailRun {
		t.Errorf("executor %+v", cfg.Executor)
	}
	a, b := cfg.Tools[0], cfg.Tools[1]
	if a.Timeout != 30*time.Second || a.SideEffects != Unsafe || a.Route != "nats" || a.Parameters["type"] != "object" {
		t.Errorf("tool a %+v", a)
	}
	if b.Timeout != time.Second || b.Retries != 3 || b.SideEffects != Idempotent {
		t.Errorf("tool b %+v", b)
	}
}

func TestInvalidConfigs(t *testing.T) {
	cases := map[string]string{
		"invalid-secret-in-yaml.yaml":   "api_key",
		"invalid-duplicate-tool.yaml":   `tools[1].name: duplicate tool name "a"`,
		"invalid-unknown-tool-key.yaml": "side_effect",
		"invalid-missing-tool.yaml":     "executor.missing_tool",
		"invalid-tool-name.yaml":        "tools[0].name",
		"invalid-side-effects.yaml":     "tools[0].side_effects",
		"invalid-max-turns.yaml":        "executor.max_turns",
		"invalid-yaml.yaml":             "invalid-yaml.yaml",
		"invalid-sample-ratio.yaml":     "tracing.sample_ratio",
		"invalid-sync.yaml":             "nats.embedded.sync",
	}
	files, _ := filepath.Glob("testdata/invalid-*.yaml")
	if len(files) != len(cases) {
		t.Fatalf("%d invalid fixtures, %d cases", len(files), len(cases))
	}
	for name, want := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := load(mustRead(t, filepath.Join("testdata", name)), name, nil, nil)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
				t.Fatalf("err = %v, want ErrInvalid naming %q", err, want)
			}
		})
	}
}

func TestPrecedence(t *testing.T) {
	env := []string{"TOOLSIDECAR_CORE_URL=http://env:1", "TOOLSIDECAR_EXECUTOR_MAX_TURNS=3", "TOOLSIDECAR_CORE_STREAM_IDLE_TIMEOUT=9s", "TOOLSIDECAR_LOG_LEVEL=debug", "HOME=/root"}
	cfg, err := load(mustRead(t, "testdata/good.yaml"), "testdata/good.yaml", env, []string{"core.url=http://flag:2", "nats.url=nats://n:4222"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Core.URL != "http://flag:2" || cfg.Executor.MaxTurns != 3 || cfg.Core.StreamIdleTimeout != 9*time.Second || cfg.NATS.URL != "nats://n:4222" {
		t.Errorf("precedence: %+v %+v %+v", cfg.Core, cfg.Executor, cfg.NATS)
	}
	if cfg.Core.Timeout != 5*time.Second {
		t.Errorf("file value lost: %v", cfg.Core.Timeout)
	}
	if _, err := load(nil, "", nil, []string{"core.nope=1"}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "core.nope") {
		t.Errorf("unknown flag key: %v", err)
	}
	if _, err := load(nil, "", []string{"TOOLSIDECAR_EXECUTOR_MAX_TURNS=many"}, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad env value accepted: %v", err)
	}
}

// TestProblemsBlameTheirSource: a bad value from the environment or a
// --set is blamed on that variable or flag, not on the file's nearest
// line, and a value that does not decode is said in the reader's terms
// (what the key takes, and the value), wherever it comes from.
func TestProblemsBlameTheirSource(t *testing.T) {
	file := []byte("core:\n  url: \"http://core:9000\"\nserver:\n  ui: maybe\n")
	env := []string{"TOOLSIDECAR_SERVER_LISTEN=garbage", "TOOLSIDECAR_EXECUTOR_MAX_TURNS=1.5"}
	sets := []string{"core.timeout=soon", "server.max_drives=99999999999999999999", "executor.max_parallel=many"}
	_, err := load(file, "app.yaml", env, sets)
	var p *Problems
	if !errors.As(err, &p) {
		t.Fatalf("err %v, want *Problems", err)
	}
	want := []string{
		`line 4: server.ui: must be true or false, got "maybe"`,
		`TOOLSIDECAR_SERVER_LISTEN: must be host:port (127.0.0.1:8741), got "garbage"`,
		`TOOLSIDECAR_EXECUTOR_MAX_TURNS: must be a whole number, got "1.5"`,
		`--set core.timeout: must be a duration like 30s, 500ms or 2m, got "soon"`,
		`--set server.max_drives: is out of range, got "99999999999999999999"`,
		`--set executor.max_parallel: must be a whole number, got "many"`,
	}
	got := err.Error()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("problems lack %q:\n%s", w, got)
		}
	}
	for _, leak := range []string{"strconv", "line 2", "line 1:", "cannot parse"} {
		if strings.Contains(got, leak) {
			t.Errorf("problems say %q:\n%s", leak, got)
		}
	}
	if len(p.List) != len(want) {
		t.Errorf("%d problems, want %d:\n%s", len(p.List), len(want), got)
	}
}

// TestUITraceURL: the live view's trace link is an http(s) URL with
// {trace_id} in it.
func TestUITraceURL(t *testing.T) {
	if _, err := load(nil, "", nil, []string{"server.ui_trace_url=https://grafana.example/explore?traceId={trace_id}"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"ftp://grafana.example/{trace_id}", "https://grafana.example/explore", "{trace_id}"} {
		_, err := load(nil, "", nil, []string{"server.ui_trace_url=" + bad})
		if err == nil || !strings.Contains(err.Error(), "--set server.ui_trace_url: must be an http(s) URL with {trace_id} in it") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TestUnknownEnv: a TOOLSIDECAR_ variable that is no setting is an error,
// each one named, with the closest setting suggested.
func TestUnknownEnv(t *testing.T) {
	_, err := load(nil, "", []string{"TOOLSIDECAR_CORE_TIMOUT=5s", "TOOLSIDECAR_FROBNICATE=1", "TOOLSIDECAR_CORE_API_KEY=k"}, nil)
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("err %v, want ErrInvalid", err)
	}
	for _, want := range []string{"TOOLSIDECAR_CORE_TIMOUT is not a setting (did you mean TOOLSIDECAR_CORE_TIMEOUT?)", "TOOLSIDECAR_FROBNICATE is not a setting"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "API_KEY") {
		t.Errorf("the Core key variable is a known one: %v", err)
	}
}

func TestAPIKey(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "key")
	os.WriteFile(p, []byte("s3cret\n"), 0o600)
	c := Default()
	c.Core.APIKeyFile = p
	if k, err := c.APIKey(); err != nil || k != "s3cret" {
		t.Fatalf("key %q %v", k, err)
	}
	t.Setenv(APIKeyEnv, "from-env")
	c.Core.APIKeyFile = ""
	if k, _ := c.APIKey(); k != "from-env" {
		t.Fatalf("env key %q", k)
	}
	c.Core.APIKeyFile = filepath.Join(dir, "missing")
	if _, err := c.APIKey(); err == nil {
		t.Fatal("missing key file accepted")
	}
	// The key is never a config key, so it cannot leak through the file.
	cfg, err := load(nil, "", []string{APIKeyEnv + "=x"}, nil)
	if err != nil || cfg.Core.APIKeyFile != "" {
		t.Fatalf("%+v %v", cfg.Core, err)
	}
}

// The OpenAI-compatible upstream's key comes from its file, else from
// TOOLSIDECAR_UPSTREAM_API_KEY, which is no configuration key.
func TestUpstreamAPIKey(t *testing.T) {
	p := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(p, []byte("sk-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := Default()
	c.Upstream.APIKeyFile = p
	if k, err := c.UpstreamAPIKey(); err != nil || k != "sk-file" {
		t.Fatalf("key %q %v", k, err)
	}
	t.Setenv(UpstreamAPIKeyEnv, "sk-env")
	c.Upstream.APIKeyFile = ""
	if k, _ := c.UpstreamAPIKey(); k != "sk-env" {
		t.Fatalf("env key %q", k)
	}
	cfg, err := load(nil, "", []string{UpstreamAPIKeyEnv + "=x"}, nil)
	if err != nil || cfg.Upstream.APIKeyFile != "" {
		t.Fatalf("%+v %v", cfg.Upstream, err)
	}
}

func TestParseEmbedded(t *testing.T) {
	data, _ := os.ReadFile("../config.yaml")
	cfg, err := Parse(data)
	if err != nil || len(cfg.Tools) != 4 {
		t.Fatalf("%+v %v", cfg.Tools, err)
	}
	if _, err := Parse([]byte("nats: {urll: x}")); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "urll") {
		t.Fatalf("unknown nested key: %v", err)
	}
}

// TestBoundsAndUnits: a duration without a unit, a negative or zero
// duration or size, a bad Core URL, NATS credentials of two kinds and
// embedded worker users that cannot log in are errors that name the key;
// an endless file is refused without reading it all.
func TestBoundsAndUnits(t *testing.T) {
	for yaml, want := range map[string]string{
		"core: {timeout: 30}\n":                                                  "has no unit",
		"tools: [{name: a, timeout: 30}]\n":                                      "has no unit",
		"core: {timeout: -1s}\n":                                                 "core.timeout: must be positive",
		"core: {idle_timeout: 0s}\n":                                             "core.idle_timeout: must be positive",
		"server: {max_body_bytes: -5}\n":                                         "server.max_body_bytes: must be positive",
		"server: {max_drives: 0}\n":                                              "server.max_drives: must be positive",
		"executor: {submit_budget: 0s}\n":                                        "executor.submit_budget: must be positive",
		"tools: [{name: a, max_duration: -1s}]\n":                                "tools[0].max_duration: must not be negative",
		"core: {url: notaurl}\n":                                                 "core.url: must be an http(s) URL",
		"upstream: {kind: gemini}\n":                                             "upstream.kind: must be core, openai, anthropic, responses, openai-agents or anthropic-agents",
		"upstream: {kind: anthropic}\n":                                          "upstream.url: must be the http(s) URL of the API as its client takes it",
		"upstream: {kind: openai}\n":                                             "upstream.url: must be the http(s) URL",
		"upstream: {retry_budget: 0s}\n":                                         "upstream.retry_budget: must be positive",
		"upstream: {kind: openai-agents}\n":                                      "upstream.url: must be the http(s) URL of the API with its version",
		"upstream: {kind: anthropic-agents, url: 'http://a', max_sessions: 0}\n": "upstream.max_sessions: must be positive",
		"upstream: {webhook_secret_file: /s}\n":                                  "upstream.webhook_secret_file: is for kinds openai-agents and anthropic-agents",
		"nats: {token_file: /t, creds_file: /c}\n":                               "set one of creds_file",
		"nats: {user: u}\n":                                                      "user and password_file go together",
		"nats: {embedded: {workers: [{name: w}]}}\n":                             "set exactly one of password_file and nkey",
		"nats: {embedded: {workers: [{name: toolsidecar, password_file: /p, tools: [a]}]}}\n":        `not "toolsidecar"`,
		"nats: {embedded: {workers: [{name: toolsidecar-worker, password_file: /p, tools: [a]}]}}\n": `or "toolsidecar-worker"`,
		"nats: {embedded: {workers: [{name: w, password_file: /p}]}}\n":                              "list the tools",
	} {
		if _, err := Parse([]byte(yaml)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", yaml, err, want)
		}
	}
	t.Setenv("TOOLSIDECAR_CORE_TIMEOUT", "5")
	if _, err := Load("", nil); err == nil || !strings.Contains(err.Error(), "has no unit") {
		t.Errorf("a bare number from the environment: %v", err)
	}
	t.Setenv("TOOLSIDECAR_CORE_TIMEOUT", "5s")
	if _, err := Load("/dev/zero", nil); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("/dev/zero: %v, want a size error", err)
	}
	if got := RedactURL("nats://u:secret@a:4222,nats://b:4222"); strings.Contains(got, "secret") || !strings.Contains(got, "u:xxxxx@a") {
		t.Errorf("RedactURL: %s", got)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestAllProblemsAtOnce: every problem of a file is reported in one error,
// in line order, each with its line and key, misspelt keys with the key
// meant, and no second complaint about a value that could not be decoded.
func TestAllProblemsAtOnce(t *testing.T) {
	_, err := load(mustRead(t, "testdata/many-problems.yaml"), "many-problems.yaml", nil, nil)
	var p *Problems
	if !errors.As(err, &p) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("err %v, want *Problems", err)
	}
	want := []string{
		`line 2: core.url: must be an http(s) URL, got "notaurl"`,
		`line 3: core.timout: unknown key (did you mean core.timeout?)`,
		`line 4: core.timeout: duration 30 has no unit`,
		`line 6: server.listen: must be host:port`,
		`line 8: executor.max_turns: must be at least 1, got 0`,
		`line 9: executor.max_paralel: unknown key (did you mean executor.max_parallel?)`,
		`line 12: tools[0].timeuot: unknown key (did you mean timeout?)`,
		`line 13: tools[1].name: "bad name" must be 1-64 letters`,
		`line 14: tools[1].side_effects: must be read_only, idempotent or unsafe, got "maybe"`,
	}
	if len(p.List) != len(want) {
		t.Fatalf("%d problems, want %d:\n%v", len(p.List), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(p.List[i].Error(), w) {
			t.Errorf("problem %d: %q, want it to start %q", i, p.List[i], w)
		}
	}
	if !strings.HasPrefix(err.Error(), "config: invalid: many-problems.yaml has 9 problems\n  line 2: ") {
		t.Errorf("message %q", err)
	}
}

// TestLaneProblems: a lane policy that no tool uses is reported with the
// lane it probably meant, and an unknown on_error is refused.
func TestLaneProblems(t *testing.T) {
	yaml := `
executor:
  lanes:
    filez: { on_error: skip_rest }
    files: { on_error: stop }
tools:
  - { name: create_file, lane: files }
  - { name: write_file, lane: files }
`
	_, err := load([]byte(yaml), "lanes.yaml", nil, nil)
	for _, want := range []string{`executor.lanes.filez: no tool names this lane (did you mean files?)`,
		`executor.lanes.files.on_error: must be continue or skip_rest, got "stop"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}

// TestFeatureProblems: dedupe and hedging are for read_only tools only,
// hedge_after is a duration or a percentile, the hedge ratio, the budget
// policy and the claim-check size are checked, and the built-in tool's
// name is reserved.
func TestFeatureProblems(t *testing.T) {
	yaml := `
executor:
  max_hedge_ratio: 2
  run_budget: { on_budget: halt, max_calls: -1 }
  claim_check_bytes: 2000000
tools:
  - { name: book, side_effects: unsafe, dedupe: run, hedge_after: 1s }
  - { name: look, side_effects: read_only, dedupe: always, hedge_after: p20 }
  - { name: seek, side_effects: read_only, hedge_after: soon, max_calls_per_run: -2 }
  - { name: read_tool_result, side_effects: read_only }
`
	_, err := load([]byte(yaml), "features.yaml", nil, nil)
	for _, want := range []string{
		`executor.max_hedge_ratio: must be between 0 and 1, got 2`,
		`executor.run_budget: limits must not be negative`,
		`executor.run_budget.on_budget: must be continue or stop, got "halt"`,
		`tools[0].dedupe: only a read_only tool may answer a repeated call`,
		`tools[0].hedge_after: only a read_only tool may be sent twice at once`,
		`tools[1].dedupe: must be run or empty, got "always"`,
		`tools[1].hedge_after: "p20": a percentile is p50 to p99.9`,
		`tools[2].hedge_after: "soon": want a positive duration`,
		`tools[2]: max_calls_per_run, rate and rate_burst must not be negative`,
		`executor.claim_check_bytes: must be between 1 and executor.max_result_bytes (1048576), got 2000000`,
		`tools[3].name: read_tool_result is the built-in tool that claim-check adds`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// TestConfigIsTheCeilingOfADeclaration: a worker's declaration fills in
// what a tools entry leaves to its defaults, and never overrides what it
// gives, retries: 0 included.
func TestConfigIsTheCeilingOfADeclaration(t *testing.T) {
	cfg, err := Parse([]byte(`
tools:
  - name: pinned
    retries: 0
    side_effects: unsafe
    timeout: 2s
  - name: open
`))
	if err != nil {
		t.Fatal(err)
	}
	d := tool.Declaration{SideEffects: tool.ReadOnly, Retries: 3, Timeout: "1h"}
	pinned, err := cfg.Tools[0].Declare(d)
	if err != nil || pinned.Retries != 0 || pinned.SideEffects != Unsafe || pinned.Timeout != 2*time.Second {
		t.Errorf("pinned declared as %+v (%v): want the entry's retries 0, unsafe, 2s", pinned, err)
	}
	open, err := cfg.Tools[1].Declare(d)
	if err != nil || open.Retries != 3 || open.SideEffects != ReadOnly || open.Timeout != time.Hour {
		t.Errorf("open declared as %+v (%v): want the declaration's retries, side effects and timeout", open, err)
	}
	if cfg.Tools[1].Retries != 0 || cfg.Tools[1].SideEffects != Unsafe {
		t.Errorf("before a declaration, open is %+v: want unsafe, no retries", cfg.Tools[1])
	}
}

// TestShippedConfigShowsEveryKey: config.yaml, which says it shows every
// key, shows every key of the schema (itself the Config type's): in its
// YAML, or, for keys one writes only in some setups (lanes, embedded
// worker users), in a commented example such as "# lanes: {...}".
func TestShippedConfigShowsEveryKey(t *testing.T) {
	data := mustRead(t, "../config.yaml")
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	shown := map[string]bool{}
	yamlKeys(&doc, "", shown)
	commented := map[string]bool{} // keys of the commented examples, by name
	for _, line := range strings.Split(string(data), "\n") {
		_, text, ok := strings.Cut(line, "#")
		var frag yaml.Node
		if !ok || yaml.Unmarshal([]byte(strings.TrimSpace(text)), &frag) != nil {
			continue
		}
		names := map[string]bool{}
		yamlKeys(&frag, "", names)
		for k := range names {
			commented[k[strings.LastIndexAny(k, ".]")+1:]] = true
		}
	}
	schema, err := json.Marshal(JSONSchema())
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(schema, &s); err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, key := range schemaKeys(s) {
		if !shown[key] && !commented[key[strings.LastIndexAny(key, ".]")+1:]] {
			missing = append(missing, key)
		}
	}
	if len(missing) > 0 {
		t.Errorf("config.yaml does not show %v: add each with its default (or a commented example)", missing)
	}
}

// yamlKeys adds the dotted path of every mapping key under n to keys
// (a sequence's items under "key[]").
func yamlKeys(n *yaml.Node, prefix string, keys map[string]bool) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			yamlKeys(c, prefix, keys)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			if prefix != "" {
				key = prefix + "." + key
			}
			keys[key] = true
			yamlKeys(n.Content[i+1], key, keys)
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			yamlKeys(c, prefix+"[]", keys)
		}
	}
}
