package executor

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/coresim"
	"github.com/projectdavid/toolsidecar/internal/testenv"
	"github.com/projectdavid/toolsidecar/registry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// harness is a whole sidecar on real parts (testenv) plus an executor.
type harness struct {
	t    testing.TB
	env  *testenv.Env
	sim  *coresim.Sim
	core *core.Client
	exec *Executor
	req  Request
	run  testenv.Run
	mu   sync.Mutex
	// events are the drive's events; onEvent, when set, sees each as it
	// happens.
	events  []Event
	onEvent func(Event)
}

// tool is a local shorthand for testenv.Tool, written unkeyed in tables.
type tool struct {
	cfg     config.Tool
	handler bridge.Handler
}

func newHarness(t testing.TB, sc coresim.Scenario, ecfg config.Executor, tools ...tool) *harness {
	t.Helper()
	envTools := make([]testenv.Tool, len(tools))
	for i, tl := range tools {
		envTools[i] = testenv.Tool{Config: tl.cfg, Handler: tl.handler}
	}
	env := testenv.New(t, sc, envTools...)
	if ecfg.CancelPoll == 0 {
		ecfg.CancelPoll = 20 * time.Millisecond
	}
	h := &harness{t: t, env: env, sim: env.Sim, core: env.Core}
	h.exec = New(ecfg, env.Core, registry.NewLive(env.Registry), env.Client)
	h.req = h.setupRun()
	return h
}

func (h *harness) setupRun() Request {
	h.run = h.env.NewRun()
	r := h.run
	return Request{RunID: r.RunID, ThreadID: r.ThreadID, AssistantID: r.AssistantID, MessageID: r.MessageID, Model: r.Model}
}

func (h *harness) drive(ctx context.Context) (Summary, error) {
	return h.exec.Drive(ctx, h.req, func(e Event) {
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
