package executor

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/coresim"
	"github.com/projectdavid/toolsidecar/registry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// harness is a whole sidecar on real parts: an embedded NATS server, the
// Core simulator on a loopback HTTP server, Go workers, and an executor.
type harness struct {
	t      *testing.T
	sim    *coresim.Sim
	core   *core.Client
	worker *bridge.Worker
	exec   *Executor
	req    Request
	events []Event
	mu     sync.Mutex
	// onEvent, when set, sees each event as it happens.
	onEvent func(Event)
}

type tool struct {
	cfg     config.Tool
	handler bridge.Handler // nil: no worker serves it
}

func schema(required ...string) map[string]any {
	props := map[string]any{}
	for _, r := range required {
		props[r] = map[string]any{"type": "string"}
	}
	req := make([]any, len(required))
	for i, r := range required {
		req[i] = r
	}
	return map[string]any{"type": "object", "required": req, "properties": props}
}

func newHarness(t *testing.T, sc coresim.Scenario, ecfg config.Executor, tools ...tool) *harness {
	t.Helper()
	ns, err := bridge.StartEmbedded("127.0.0.1:-1")
	if err != nil {
		t.Fatal(err)
	}
	sideNC, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	workNC, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	sim, srv := coresim.NewServer(coresim.Config{APIKey: "key", Scenario: sc})
	cc, err := core.New(core.Config{URL: srv.URL, APIKey: "key", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var cfgs []config.Tool
	w := bridge.NewWorker(workNC, "test")
	for _, tl := range tools {
		c := tl.cfg
		if c.Route == "" {
			c.Route = "nats"
		}
		if c.SideEffects == "" {
			c.SideEffects = config.ReadOnly
		}
		if c.Timeout == 0 {
			c.Timeout = 5 * time.Second
		}
		cfgs = append(cfgs, c)
		if tl.handler != nil {
			w.Handle(c.Name, tl.handler)
		}
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	reg, err := registry.New(cfgs, "test")
	if err != nil {
		t.Fatal(err)
	}
	client, err := bridge.Open(sideNC, "test")
	if err != nil {
		t.Fatal(err)
	}
	if ecfg.CancelPoll == 0 {
		ecfg.CancelPoll = 20 * time.Millisecond
	}
	h := &harness{t: t, sim: sim, core: cc, worker: w}
	h.exec = New(ecfg, cc, registry.NewLive(reg), client)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		w.Stop(ctx)
		client.Close()
		sideNC.Close()
		workNC.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
		srv.Close()
	})
	h.req = h.setupRun()
	return h
}

func (h *harness) setupRun() Request {
	t := h.t
	ctx := context.Background()
	a, err := h.core.CreateAssistant(ctx, core.AssistantCreate{Name: "a", Model: "vllm/test"})
	if err != nil {
		t.Fatal(err)
	}
	th, _ := h.core.CreateThread(ctx)
	msg, _ := h.core.CreateMessage(ctx, th.ID, a.ID, "hello")
	run, err := h.core.CreateRun(ctx, core.RunCreate{AssistantID: a.ID, ThreadID: th.ID})
	if err != nil {
		t.Fatal(err)
	}
	return Request{RunID: run.ID, ThreadID: th.ID, AssistantID: a.ID, MessageID: msg.ID, Model: "vllm/test"}
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

// assertWholeBatches checks the contract for every batch of the run: one
// tool message per call, in call order, with the right ids, every Action
// finalised, and the contract log empty.
func (h *harness) assertWholeBatches(wantCalls int) []core.Action {
	t := h.t
	t.Helper()
	if v := h.sim.Violations(); len(v) != 0 {
		t.Errorf("contract violations: %v", v)
	}
	acts := h.sim.Actions(h.req.RunID)
	msgs := h.sim.ToolMessages(h.req.ThreadID)
	if len(acts) != wantCalls || len(msgs) != wantCalls {
		t.Fatalf("%d actions and %d tool messages, want %d of each", len(acts), len(msgs), wantCalls)
	}
	for i, a := range acts {
		if msgs[i].ToolCallID != a.ToolCallID || msgs[i].ToolID != a.ID {
			t.Errorf("tool message %d has (tool_call_id %s, tool_id %s), want (%s, %s)", i, msgs[i].ToolCallID, msgs[i].ToolID, a.ToolCallID, a.ID)
		}
		switch a.Status {
		case core.ActionCompleted, core.ActionFailed, core.ActionCancelled:
		default:
			t.Errorf("action %s (%s) left %s", a.ID, a.ToolName, a.Status)
		}
	}
	return acts
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

func echo(ctx context.Context, c *bridge.Call) ([]byte, error) {
	return []byte(`{"echo": ` + string(c.Args) + `}`), nil
}

func hang(ctx context.Context, c *bridge.Call) ([]byte, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

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
