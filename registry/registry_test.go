package registry

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/tool"
)

func flights() config.Tool {
	return config.Tool{Name: "get_flight_times", Description: "d", Timeout: time.Second, Route: "nats", SideEffects: config.ReadOnly,
		Parameters: map[string]any{
			"type": "object", "required": []any{"departure", "arrival"},
			"properties": map[string]any{
				"departure":  map[string]any{"type": "string", "pattern": "^[A-Z]{3}$"},
				"arrival":    map[string]any{"type": "string", "pattern": "^[A-Z]{3}$"},
				"passengers": map[string]any{"type": "integer", "minimum": 1},
			},
		}}
}

func TestValidate(t *testing.T) {
	r, err := compileTools([]config.Tool{flights()}, "p")
	if err != nil {
		t.Fatal(err)
	}
	tool, ok := r.Lookup("get_flight_times")
	if !ok || tool.Subject != "p.get_flight_times" {
		t.Fatalf("lookup %+v", tool)
	}
	if err := tool.Validate(json.RawMessage(`{"departure": "LAX", "arrival": "JFK"}`)); err != nil {
		t.Fatalf("valid args rejected: %v", err)
	}
	cases := []struct {
		args string
		want []string
	}{
		{`{"departure": "LAX"}`, []string{"at /: missing property 'arrival'"}},
		{`{"departure": "lax", "arrival": "JFK", "passengers": 0}`, []string{"at /departure:", "does not match pattern", "at /passengers:", "minimum"}},
		{`"LAX to JFK"`, []string{"at /: arguments must be a JSON object"}},
		{`{"departure": `, []string{"not valid JSON"}},
		{``, []string{"must be a JSON object"}},
	}
	for _, tc := range cases {
		err := tool.Validate(json.RawMessage(tc.args))
		var ae *ArgsError
		if !errors.As(err, &ae) || !errors.Is(err, ErrInvalidArgs) {
			t.Errorf("%s: err %v, want *ArgsError", tc.args, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", tc.args, err.Error(), w)
			}
		}
		if !strings.HasPrefix(err.Error(), `invalid arguments for tool "get_flight_times":`) {
			t.Errorf("message %q does not name the tool", err.Error())
		}
	}
}

func TestNewErrors(t *testing.T) {
	bad := flights()
	bad.Name = "bad"
	bad.Parameters = map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"type": "strng"}}}
	cases := []struct {
		tools []config.Tool
		want  string
	}{
		{[]config.Tool{flights(), flights()}, `tools[1].name: duplicate tool name "get_flight_times"`},
		{[]config.Tool{{Name: "x", Route: "carrier-pigeon"}}, `tools[0].route: unknown route "carrier-pigeon"`},
		{[]config.Tool{flights(), bad}, "tools[1].parameters"},
	}
	for _, tc := range cases {
		_, err := compileTools(tc.tools, "p")
		if !errors.Is(err, ErrInvalidTool) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err %v, want %q", err, tc.want)
		}
	}
}

// TestSchemaOfAnObject: a tool's parameters describe an object, as every
// model API and MCP take a call's arguments. A schema of anything else
// (a string, an array) is refused where config and declarations are
// compiled alike, a declared one as a DeclarationError naming its worker;
// a schema that leaves "type" out is an object's. Before, a declared
// {"type": "string"} made the MCP server panic, and the sidecar exit.
func TestSchemaOfAnObject(t *testing.T) {
	for _, params := range []map[string]any{{"type": "string"}, {"type": "array", "items": map[string]any{"type": "string"}}, {"type": []any{"object", "null"}}} {
		tc := flights()
		tc.Parameters = params
		if _, err := compileTools([]config.Tool{tc}, "p"); !errors.Is(err, ErrInvalidTool) || !strings.Contains(err.Error(), `type "object"`) {
			t.Errorf("parameters %v: %v, want refused", params, err)
		}
	}
	by := []string{"worker W"}
	_, err := New(context.Background(), config.Config{NATS: config.NATS{SubjectPrefix: "p"}}, Base(nil),
		Declared{Name: "odd", Declaration: tool.Declaration{Parameters: json.RawMessage(`{"type": "string"}`)}, By: by})
	var de *DeclarationError
	if !errors.As(err, &de) || de.Tool != "odd" {
		t.Errorf("a declared string schema: %v, want a DeclarationError of tool odd", err)
	}
	tc := flights()
	tc.Parameters = map[string]any{"properties": map[string]any{"city": map[string]any{"type": "string"}}}
	reg, err := compileTools([]config.Tool{tc}, "p")
	if err != nil {
		t.Fatal(err)
	}
	if def, _ := reg.Lookup(tc.Name); !strings.Contains(string(def.Parameters), `"type":"object"`) {
		t.Errorf("a schema without type became %s", def.Parameters)
	}
}

// TestSchemaBounded: a schema nested past MaxSchemaDepth or larger than
// MaxSchemaBytes is refused as the other bad schemas are, from the
// configuration and from a worker's declaration alike; the error names
// the tool and its key.
func TestSchemaBounded(t *testing.T) {
	deep := map[string]any{"type": "object"}
	for range MaxSchemaDepth / 2 {
		deep = map[string]any{"type": "object", "properties": map[string]any{"a": deep}}
	}
	wide := map[string]any{"type": "object", "description": strings.Repeat("x", MaxSchemaBytes)}
	for name, params := range map[string]map[string]any{"deep": deep, "wide": wide} {
		tc := flights()
		tc.Parameters = params
		_, err := compileTools([]config.Tool{{Name: "ok"}, tc}, "p")
		if !errors.Is(err, ErrInvalidTool) || !strings.Contains(err.Error(), `invalid tool "get_flight_times": tools[1].parameters: the schema `) {
			t.Errorf("%s: %v, want refused, naming the tool and its key", name, err)
		}
		raw, _ := json.Marshal(params)
		_, err = New(context.Background(), config.Config{NATS: config.NATS{SubjectPrefix: "p"}}, Base(nil),
			Declared{Name: "odd", Declaration: tool.Declaration{Parameters: raw}, By: []string{"worker W"}})
		if de := DeclarationErrors(err); len(de) != 1 || de[0].Tool != "odd" {
			t.Errorf("%s, declared: %v, want a DeclarationError of tool odd", name, err)
		}
	}
	shallow := flights()
	shallow.Parameters = deep["properties"].(map[string]any)["a"].(map[string]any)
	if _, err := compileTools([]config.Tool{shallow}, "p"); err != nil {
		t.Errorf("a schema of %d levels: %v", MaxSchemaDepth-2, err)
	}
}

// TestScreen: a consumer's list leaves out the tools it cannot take, and
// logs and counts each once while it stays as it is, however often the
// list is built; a tool redeclared otherwise, or bad again after it was
// good, is reported again.
func TestScreen(t *testing.T) {
	var logs strings.Builder
	counter := LeftOutMetric(prometheus.NewRegistry())
	s := NewScreen("mcp", counter, slog.New(slog.NewTextHandler(&logs, nil)))
	good, bad := &Tool{Name: "good"}, &Tool{Name: "bad", Parameters: json.RawMessage(`{"type":"object"}`)}
	refuse := func(t *Tool) error {
		if t.Name == "bad" {
			return errors.New("refused")
		}
		return nil
	}
	count := func() float64 { return testutil.ToFloat64(counter.WithLabelValues("mcp")) }
	for range 3 {
		if kept := s.Keep([]*Tool{bad, good}, refuse); len(kept) != 1 || kept[0] != good {
			t.Fatalf("kept %v, want good only", kept)
		}
	}
	if n := strings.Count(logs.String(), "a tool is left out"); n != 1 || count() != 1 {
		t.Fatalf("logged %d times, counted %v; want once:\n%s", n, count(), logs.String())
	}
	changed := &Tool{Name: "bad", Parameters: json.RawMessage(`{"type":"object","required":["x"]}`)}
	s.Keep([]*Tool{changed, good}, refuse)
	s.Keep([]*Tool{good}, refuse)
	s.Keep([]*Tool{changed, good}, refuse)
	if count() != 3 {
		t.Errorf("counted %v, want 3: a changed tool and one bad again are reported again", count())
	}

	r, err := compileTools([]config.Tool{flights(), {Name: "ping"}}, "p")
	if err != nil {
		t.Fatal(err)
	}
	r.tools["ping"].Parameters = json.RawMessage(`{"type":"string"}`) // as no compiled tool is
	model := NewScreen("model", counter, nil)
	for range 2 {
		if ft := model.FunctionTools(r); len(ft) != 1 || ft[0].Function.Name != "get_flight_times" {
			t.Fatalf("the model's tools: %+v", ft)
		}
	}
	if n := testutil.ToFloat64(counter.WithLabelValues("model")); n != 1 {
		t.Errorf("the model's screen counted %v, want 1", n)
	}
}

func TestCheckFunction(t *testing.T) {
	for params, want := range map[string]string{
		`{"type":"object"}`:    "",
		`{"type":"string"}`:    `not "string"`,
		`{"properties":{}}`:    `must say "type": "object"`,
		`["type","object"]`:    "not a JSON object",
		`null`:                 "not a JSON object",
		`{"type":"object","x"`: "not a JSON object",
	} {
		err := CheckFunction(tool.FunctionTool{Function: tool.Function{Name: "t", Parameters: json.RawMessage(params)}})
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: %v, want %q", params, err, want)
		}
	}
	if err := CheckFunction(tool.FunctionTool{Function: tool.Function{Name: "a b", Parameters: json.RawMessage(`{"type":"object"}`)}}); err == nil {
		t.Error("a name with a space passed")
	}
}

func TestListsAndLive(t *testing.T) {
	noParams := config.Tool{Name: "ping", Route: "nats"}
	r, err := compileTools([]config.Tool{flights(), noParams}, "p")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.Names(), ","); got != "get_flight_times,ping" {
		t.Errorf("names %s", got)
	}
	ft := r.FunctionTools()
	if len(ft) != 2 || ft[0].Type != "function" || ft[0].Function.Name != "get_flight_times" || !strings.Contains(string(ft[0].Function.Parameters), `"required":["departure","arrival"]`) {
		t.Errorf("function tools %+v", ft)
	}
	if string(ft[1].Function.Parameters) != `{"type":"object"}` {
		t.Errorf("default schema %s", ft[1].Function.Parameters)
	}
	if _, ok := r.Lookup("nope"); ok {
		t.Error("unknown tool found")
	}
	l := NewLive(r)
	r2, _ := compileTools([]config.Tool{noParams}, "p")
	l.Store(r2)
	if len(l.Load().Names()) != 1 {
		t.Error("Live did not swap")
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// replyKind is a route kind whose settings name the reply its tools give.
type replyKind struct{ name string }

func (k replyKind) Build(_ *Tool, settings map[string]any) (tool.Handler, error) {
	var s struct {
		Reply string `json:"reply"`
	}
	if err := DecodeSettings(k.name, settings, &s); err != nil {
		return nil, err
	}
	if s.Reply == "" {
		return nil, errors.New(k.name + ".reply: must be set")
	}
	return func(context.Context, *tool.Call) ([]byte, error) { return []byte(s.Reply), nil }, nil
}

func (replyKind) Dispatch(context.Context, *Tool, tool.Request) tool.Outcome { return tool.Outcome{} }

// compileTools compiles tools with the base kinds and more.
func compileTools(tools []config.Tool, prefix string, more ...Kind) (*Registry, error) {
	cfg := config.Default()
	cfg.Tools, cfg.NATS.SubjectPrefix = tools, prefix
	kinds := Base(nil)
	for _, k := range more {
		kinds = kinds.With(Kinds{k.(replyKind).name: k})
	}
	return New(context.Background(), cfg, kinds)
}

// TestKinds: a kind decodes its own settings, found under its name; a key
// that names no kind, settings of another kind, and settings for nats are
// errors that name the key; a kind given twice panics; kinds are values,
// so a registry knows only those it was given.
func TestKinds(t *testing.T) {
	const kind = "reply"
	k := replyKind{kind}
	r, err := compileTools([]config.Tool{{Name: "x", Route: kind, Settings: map[string]any{kind: map[string]any{"reply": "hi"}}}}, "p", k)
	if err != nil {
		t.Fatal(err)
	}
	def, _ := r.Lookup("x")
	if out, err := def.Handler(context.Background(), &tool.Call{}); err != nil || string(out) != "hi" || def.Kind != Kind(k) {
		t.Errorf("handler built by the kind: %q %v, kind %v", out, err, def.Kind)
	}
	if n, _ := compileTools([]config.Tool{{Name: "n"}}, "p"); n.Tools()[0].Handler != nil || n.Tools()[0].Route != Nats {
		t.Error("a tool without a route is a nats tool with no handler")
	}
	if _, err := compileTools([]config.Tool{{Name: "x", Route: kind, Settings: map[string]any{kind: map[string]any{"reply": "hi"}}}}, "p"); err == nil ||
		!strings.Contains(err.Error(), `unknown route "reply"`) {
		t.Errorf("a kind the registry was not given: %v", err)
	}
	for _, tc := range []struct {
		def  config.Tool
		want string
	}{
		{config.Tool{Name: "x", Route: kind}, "tools[0]." + kind + ".reply: must be set"},
		{config.Tool{Name: "x", Route: kind, Settings: map[string]any{kind: map[string]any{"reply": "hi", "extra": 1}}}, `unknown field "extra"`},
		{config.Tool{Name: "x", Route: kind, Settings: map[string]any{"timeuot": "1s"}}, "tools[0].timeuot: unknown key"},
		{config.Tool{Name: "x", Route: Nats, Settings: map[string]any{kind: map[string]any{"reply": "hi"}}}, "tools[0]." + kind + ": settings of route " + kind + ", but the tool's route is nats"},
		{config.Tool{Name: "x", Route: kind, Settings: map[string]any{kind: "hi"}}, "tools[0]." + kind + ": must be a mapping"},
		{config.Tool{Name: "x", Route: "smoke"}, `tools[0].route: unknown route "smoke"`},
	} {
		if _, err := compileTools([]config.Tool{tc.def}, "p", k); !errors.Is(err, ErrInvalidTool) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.def, err, tc.want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("duplicate kind did not panic")
		}
	}()
	Base(nil).With(Kinds{Nats: k})
}

// TestExternalRefRefused: a tool schema may refer to its own parts only;
// a $ref to a file or URL is not read when the configuration is loaded.
func TestExternalRefRefused(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret.json")
	os.WriteFile(secret, []byte(`{"type": "string"}`), 0o600)
	for _, ref := range []string{"file://" + secret, "http://127.0.0.1:1/schema.json"} {
		_, err := compileTools([]config.Tool{{Name: "a", Parameters: map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"$ref": ref}}}}}, "p")
		if !errors.Is(err, ErrInvalidTool) || !strings.Contains(err.Error(), "refused") {
			t.Errorf("$ref %s: %v, want it refused", ref, err)
		}
	}
	local := map[string]any{"type": "object", "$defs": map[string]any{"s": map[string]any{"type": "string"}},
		"properties": map[string]any{"x": map[string]any{"$ref": "#/$defs/s"}}}
	if _, err := compileTools([]config.Tool{{Name: "a", Parameters: local}}, "p"); err != nil {
		t.Errorf("a $ref to the schema's own part: %v", err)
	}
}
