package executor_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/matrix"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

func TestMain(m *testing.M) {
	matrix.Main()        // a tool of route exec or mcp, which a sidecar started
	testenv.MaybeServe() // a benchmark's Core in a process of its own
	goleak.VerifyTestMain(m)
}

// harness is a whole sidecar on real parts (testenv), driven in process.
type harness struct {
	t    testing.TB
	env  *testenv.Env
	sim  *coresim.Sim
	core *core.Client
	exec *sidecar.Sidecar
	req  executor.Request
	run  testenv.Run
	mu   sync.Mutex
	// events are the drive's events; onEvent, when set, sees each as it
	// happens.
	events  []executor.Event
	onEvent func(executor.Event)
}

// spec is a local shorthand for testenv.Tool, written unkeyed in tables.
type spec struct {
	cfg     config.Tool
	handler tool.Handler
}

func newHarness(t testing.TB, sc coresim.Scenario, ecfg config.Executor, tools ...spec) *harness {
	t.Helper()
	return newHarnessWith(t, sc, testenv.Options{Executor: ecfg}, tools...)
}

func newHarnessWith(t testing.TB, sc coresim.Scenario, opts testenv.Options, tools ...spec) *harness {
	t.Helper()
	envTools := make([]testenv.Tool, len(tools))
	for i, tl := range tools {
		envTools[i] = testenv.Tool{Config: tl.cfg, Handler: tl.handler}
	}
	env := testenv.Start(t, sc, opts, envTools...)
	h := &harness{t: t, env: env, sim: env.Sim, core: env.Core, exec: env.Sidecar}
	h.req = h.setupRun()
	return h
}

func (h *harness) setupRun() executor.Request {
	h.run = h.env.NewRun()
	return testenv.Request(h.run)
}

func (h *harness) drive(ctx context.Context) (executor.Summary, error) {
	return h.exec.Drive(ctx, h.req, func(e executor.Event) {
		h.mu.Lock()
		h.events = append(h.events, e)
		h.mu.Unlock()
		if h.onEvent != nil {
			h.onEvent(e)
		}
	})
}

func (h *harness) assertWholeBatches(wantCalls int) []core.Action {
	h.t.Helper()
	return h.env.AssertWholeBatches(h.run, wantCalls)
}

// errorOf decodes a tool message written for a failed call.
func errorOf(t *testing.T, content string) (typ, msg string) {
	t.Helper()
	var e struct {
		Error     string `json:"error"`
		ErrorType string `json:"error_type"`
	}
	if err := json.Unmarshal([]byte(content), &e); err != nil || e.ErrorType == "" {
		return "", ""
	}
	return e.ErrorType, e.Error
}

var (
	echo = testenv.Echo
	hang = testenv.Hang
)

func calls(specs ...string) []coresim.Call {
	out := make([]coresim.Call, len(specs))
	for i, s := range specs {
		name, args, _ := strings.Cut(s, " ")
		if args == "" {
			args = `{"q": "x"}`
		}
		out[i] = coresim.Call{Tool: name, ArgsJSON: args}
	}
	return out
}

func twoTurns(batch ...coresim.Call) coresim.Scenario {
	return coresim.Scenario{Turns: []coresim.Turn{{Calls: batch}, {Content: "final: {{results}}"}}}
}

// schema is an object schema whose listed properties are required strings.
func schema(required ...string) map[string]any {
	props := map[string]any{}
	req := make([]any, len(required))
	for i, r := range required {
		props[r] = map[string]any{"type": "string"}
		req[i] = r
	}
	return map[string]any{"type": "object", "required": req, "properties": props}
}
