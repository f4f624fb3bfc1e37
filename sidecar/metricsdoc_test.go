package sidecar_test

import (
	"os"
	"strings"
	"testing"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// TestEveryMetricDocumented: every metric a real sidecar registers, read
// from its registry after a run, is named in docs/operations.md's
// Observability section (`name` or `name{labels}`, without the
// toolsidecar_ prefix), beside the Go and process collectors it names as
// such.
func TestEveryMetricDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, obs, _ := strings.Cut(string(doc), "## Observability")
	obs, _, _ = strings.Cut(obs, "\n## ")
	env := testenv.New(t, coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: "echo", ArgsJSON: `{}`}}}, {Content: "done"}}},
		testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo})
	env.DriveWhole(env.NewRun(), 1)
	fams, err := env.Sidecar.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		name, ours := strings.CutPrefix(f.GetName(), "toolsidecar_")
		if !ours {
			if !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") {
				t.Errorf("metric %s is neither the sidecar's (toolsidecar_) nor the Go or process collectors'", name)
			}
			continue
		}
		if !strings.Contains(obs, "`"+name+"`") && !strings.Contains(obs, "`"+name+"{") {
			t.Errorf("docs/operations.md's Observability section does not name toolsidecar_%s (%s)", name, f.GetHelp())
		}
	}
}
