package toolsidecar_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/projectdavid/toolsidecar"

// rules are the dependency arrows the architecture forbids. Each is checked
// on the transitive imports, so a forbidden package cannot slip in through
// a helper; a failure prints the chain of imports that reaches it.
var rules = []struct {
	pkg    string
	forbid []string // import-path prefixes
	why    string
	allow  []string // packages under a forbidden prefix that are allowed: leaves, or every package under a prefix ending in /
}{
	{"executor", []string{"github.com/nats-io/"}, "the loop speaks tool.Request and tool.Outcome, not NATS", nil},
	{"executor", []string{module + "/core/"}, "the loop speaks its Upstream port; Core is one adapter of it (coreup)", nil},
	{"executor", []string{module + "/config"}, "the executor reads no configuration: its Config is data, the tools' settings are the registry's compiled ones", []string{module + "/registry"}},
	{"registry", []string{module + "/core/"}, "tool definitions know no upstream", nil},
	{"openaiup", []string{module + "/core/", module + "/coreup/"}, "the OpenAI-compatible upstream is an adapter of the executor's port, beside Core's", nil},
	{"modelapi", []string{module + "/"}, "the model APIs' wire knows no run and no adapter: openaiup imports it, as coreup imports core", []string{module + "/tool", module + "/executor", module + "/internal/"}},
	{"runstore", []string{module + "/"}, "the run store knows no model API and no loop: the ledger, which holds its durable journal, imports it", []string{module + "/internal/sizedcache"}},
	{"ledger", []string{module + "/openaiup", module + "/executor"}, "the ledger keeps records for the loop and the model-API runs, and knows neither", nil},
	{"sim/openaisim", []string{module + "/"}, "the simulator shares no code with the adapter it checks", []string{module + "/sim/internal/"}},
	{"sim/anthropicsim", []string{module + "/"}, "the simulator shares no code with the adapter it checks", []string{module + "/sim/internal/"}},
	{"sim/responsesim", []string{module + "/"}, "the simulator shares no code with the adapter it checks", []string{module + "/sim/internal/"}},
	{"sim/agentssim", []string{module + "/"}, "the simulator shares no code with the adapter it checks", []string{module + "/sim/internal/"}},
	{"sim/managedsim", []string{module + "/"}, "the simulator shares no code with the adapter it checks", []string{module + "/sim/internal/"}},
	{"agentsapi", []string{module + "/"}, "the hosted APIs' wire knows no run and no adapter: agentsup imports it", []string{module + "/tool", module + "/internal/"}},
	{"agentsup", []string{module + "/core/", module + "/coreup/", module + "/openaiup/"}, "the hosted sessions' adapter is one of the executor's port, beside Core's and the model APIs'", nil},
	{"sim/internal/chunk", []string{module + "/"}, "a leaf the simulators share", nil},
	{"sim/internal/simbase", []string{module + "/"}, "a leaf the simulators share", nil},
	{"server", []string{module + "/core/"}, "the HTTP API is the sidecar's; Core's own API (proxy mode) is coreup's", nil},
	{"plugins", []string{"github.com/nats-io/"}, "in-process routes need no bus", nil},
	{"registry", []string{"github.com/nats-io/"}, "tool definitions know no transport", nil},
	{"tool", []string{module + "/", "github.com/nats-io/"}, "the call vocabulary is a leaf", nil},
	{"batch", []string{module + "/"}, "batch joins functions and knows no project package", nil},
	{"internal/clock", []string{module + "/"}, "a leaf, which core may use", nil},
	{"internal/frames", []string{module + "/"}, "a leaf, which core may use", nil},
	{"internal/retry", []string{module + "/"}, "a leaf, which core may use", nil},
	{"core", []string{module + "/"}, "the Core client knows no loop", []string{module + "/tool", module + "/internal/clock", module + "/internal/frames", module + "/internal/retry"}},
	{"worker", []string{"github.com/nats-io/nats-server/", "github.com/prometheus/client_golang/"}, "a Go worker stays small", nil},
	{"internal/logging", []string{module + "/"}, "the runtime's internal packages are leaves that any layer may use", nil},
	{"internal/memlimit", []string{module + "/"}, "the runtime's internal packages are leaves that any layer may use", nil},
	{"internal/version", []string{module + "/"}, "the runtime's internal packages are leaves that any layer may use", nil},
	{"cmd/toolsidecar", []string{"net/http/httptest", module + "/testkit/"}, "the production binary links no test server and no test helper", nil},
}

// TestImportRules also holds the rules no single root states: nothing but
// tests and the test helpers themselves imports testkit, and nothing but
// the command imports its demo.
var only = []struct {
	prefix  string
	allowed []string // importers, by prefix
	why     string
}{
	{module + "/testkit", []string{module + "/testkit/"}, "test helpers are linked by tests only"},
	{module + "/cmd/toolsidecar/internal/demo", []string{module + "/cmd/toolsidecar"}, "the demo belongs to the command that runs it"},
}

func TestImportRules(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}|{{join .Imports \",\"}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		pkg, deps, _ := strings.Cut(strings.TrimSpace(line), "|")
		if deps != "" {
			imports[pkg] = strings.Split(deps, ",")
		} else {
			imports[pkg] = nil
		}
	}
	for pkg, deps := range imports {
		for _, o := range only {
			if strings.HasPrefix(pkg, o.prefix) || slices.ContainsFunc(o.allowed, func(a string) bool { return strings.HasPrefix(pkg, a) }) {
				continue
			}
			for _, d := range deps {
				if strings.HasPrefix(d, o.prefix) {
					t.Errorf("%s imports %s (%s)", pkg, d, o.why)
				}
			}
		}
	}
	for _, r := range rules {
		root := module + "/" + r.pkg
		if _, ok := imports[root]; !ok {
			t.Errorf("package %s not found", root)
			continue
		}
		if chain := reach(imports, root, r.forbid, r.allow); chain != nil {
			t.Errorf("%s must not depend on %v (%s), but: %s", r.pkg, r.forbid, r.why, strings.Join(chain, " -> "))
		}
	}
}

// reach returns a chain of imports from root to a package matching one of
// the prefixes, or nil.
func reach(imports map[string][]string, root string, prefixes, allowed []string) []string {
	parent := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, d := range imports[p] {
			if _, seen := parent[d]; seen {
				continue
			}
			parent[d] = p
			if slices.ContainsFunc(allowed, func(a string) bool { return d == a || strings.HasSuffix(a, "/") && strings.HasPrefix(d, a) }) {
				continue // an allowed leaf, whose own imports the rule of its package checks
			}
			if slices.ContainsFunc(prefixes, func(pre string) bool { return strings.HasPrefix(d, pre) || d == strings.TrimSuffix(pre, "/") }) {
				var chain []string
				for n := d; n != ""; n = parent[n] {
					chain = append([]string{n}, chain...)
				}
				return chain
			}
			queue = append(queue, d)
		}
	}
	return nil
}
