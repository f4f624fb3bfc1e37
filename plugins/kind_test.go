package plugins_test

import (
	"context"
	"testing"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/coresim"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// The smallest route kind, as docs/tools.md shows it: in a
// file of its own under plugins/, it registers itself in init and builds a
// handler from its settings. Nothing else is touched: config checks, the
// registry, the executor's routes and `toolsidecar worker` all find it.
// "static" answers every call with the text of its settings.

func init() { registry.RegisterKind("static", newStatic) }

func newStatic(_ *registry.Tool, settings map[string]any) (tool.Handler, error) {
	var s struct {
		Text string `json:"text"`
	}
	if err := registry.DecodeSettings("static", settings, &s); err != nil {
		return nil, err
	}
	return func(context.Context, *tool.Call) ([]byte, error) { return []byte(s.Text), nil }, nil
}

// TestNewKindEndToEnd: a tool of the new kind, declared in YAML, runs in a
// whole sidecar and its text is the submitted tool output.
func TestNewKindEndToEnd(t *testing.T) {
	cfg, err := config.Parse([]byte("tools:\n  - name: motd\n    route: static\n    static: {text: \"closed on Sundays\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	sc := coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: "motd", ArgsJSON: `{}`}}}, {Content: "{{results}}"}}}
	env := testenv.New(t, sc, testenv.Tool{Config: cfg.Tools[0]})
	run := env.NewRun()
	if _, msgs := env.DriveWhole(run, 1); msgs[0].Content != "closed on Sundays" {
		t.Errorf("tool output %q", msgs[0].Content)
	}
	if _, err := config.Parse([]byte("tools:\n  - name: motd\n    route: static\n    static: {txt: x}\n")); err != nil {
		t.Fatal(err) // config knows no kinds: the registry checks settings
	}
	if _, err := registry.New([]config.Tool{{Name: "motd", Route: "static", Settings: map[string]any{"static": map[string]any{"txt": "x"}}}}, "p"); err == nil {
		t.Error("a misspelt setting of the new kind was accepted")
	}
}
