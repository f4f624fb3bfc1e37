package plugins_test

import (
	"context"
	"testing"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// The smallest route kind, as docs/tools.md shows it: in a
// file of its own, it is a value that builds a handler from its settings
// and dispatches its calls; a sidecar given it (sidecar.WithKinds) serves
// its tools. Nothing else is touched: config checks, the registry, the
// executor and `toolsidecar worker` all find it.
// "static" answers every call with the text of its settings.
type staticKind struct{}

func (staticKind) Build(_ *registry.Tool, settings map[string]any) (tool.Handler, error) {
	var s struct {
		Text string `json:"text"`
	}
	if err := registry.DecodeSettings("static", settings, &s); err != nil {
		return nil, err
	}
	return func(context.Context, *tool.Call) ([]byte, error) { return []byte(s.Text), nil }, nil
}

func (staticKind) Dispatch(ctx context.Context, def *registry.Tool, req tool.Request) tool.Outcome {
	call, err := tool.ParseCall(req.Tool, req.Body)
	if err != nil {
		return tool.Outcome{Err: tool.AsError(err)}
	}
	req.Sent()
	return tool.OutcomeOf(def.Handler(ctx, call))
}

// TestNewKindEndToEnd: a tool of the new kind, declared in YAML, runs in a
// whole sidecar and its text is the submitted tool output.
func TestNewKindEndToEnd(t *testing.T) {
	cfg, err := config.Parse([]byte("tools:\n  - name: motd\n    route: static\n    static: {text: \"closed on Sundays\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	sc := coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: "motd", ArgsJSON: `{}`}}}, {Content: "{{results}}"}}}
	env := testenv.Start(t, sc, testenv.Options{Sidecar: []sidecar.Option{sidecar.WithKinds(registry.Kinds{"static": staticKind{}})}}, testenv.Tool{Config: cfg.Tools[0]})
	run := env.NewRun()
	if _, msgs := env.DriveWhole(run, 1); msgs[0].Content != "closed on Sundays" {
		t.Errorf("tool output %q", msgs[0].Content)
	}
	if _, err := config.Parse([]byte("tools:\n  - name: motd\n    route: static\n    static: {txt: x}\n")); err != nil {
		t.Fatal(err) // config knows no kinds: the registry checks settings
	}
	bad := config.Default()
	bad.Tools = []config.Tool{{Name: "motd", Route: "static", Settings: map[string]any{"static": map[string]any{"txt": "x"}}}}
	if _, err := registry.New(context.Background(), bad, registry.Base(nil).With(registry.Kinds{"static": staticKind{}})); err == nil {
		t.Error("a misspelt setting of the new kind was accepted")
	}
}
