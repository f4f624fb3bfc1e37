// Package testenv starts the real parts a sidecar test needs: an embedded
// NATS server on a random port, the Core simulator on a loopback HTTP
// server, Go workers, a compiled registry and the bridge client. Everything
// is torn down by t.Cleanup. It is for tests only.
package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/coresim"
	"github.com/projectdavid/toolsidecar/registry"
)

// Prefix is the subject prefix of test tools.
const Prefix = "test"

// APIKey is the simulator's key.
const APIKey = "key"

// Tool is a tool definition and the Go worker handler serving it; a nil
// handler means no worker serves the tool.
type Tool struct {
	Config  config.Tool
	Handler bridge.Handler
}

// Env is a running set of real parts.
type Env struct {
	Sim      *coresim.Sim
	SimURL   string
	Core     *core.Client
	NATS     *server.Server
	Worker   *bridge.Worker
	Client   *bridge.Client
	Registry *registry.Registry
	t        testing.TB
}

// New starts the parts with the given script and tools. Tool defaults:
// route nats, read_only, a 5s timeout.
func New(t testing.TB, sc coresim.Scenario, tools ...Tool) *Env {
	t.Helper()
	ns, err := bridge.StartEmbedded("127.0.0.1:-1")
	if err != nil {
		t.Fatal(err)
	}
	sideNC := connect(t, ns)
	workNC := connect(t, ns)
	sim, srv := coresim.NewServer(coresim.Config{APIKey: APIKey, Scenario: sc})
	cc, err := core.New(core.Config{URL: srv.URL, APIKey: APIKey, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var cfgs []config.Tool
	w := bridge.NewWorker(workNC, Prefix)
	for _, tl := range tools {
		c := tl.Config
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
		if tl.Handler != nil {
			w.Handle(c.Name, tl.Handler)
		}
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	reg, err := registry.New(cfgs, Prefix)
	if err != nil {
		t.Fatal(err)
	}
	client, err := bridge.Open(sideNC, Prefix)
	if err != nil {
		t.Fatal(err)
	}
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
	return &Env{Sim: sim, SimURL: srv.URL, Core: cc, NATS: ns, Worker: w, Client: client, Registry: reg, t: t}
}

func connect(t testing.TB, ns *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	return nc
}

// Run is a run set up the way an application sets one up.
type Run struct {
	RunID, ThreadID, AssistantID, MessageID, Model string
}

// NewRun creates an assistant, a thread, a user message and a run.
func (e *Env) NewRun() Run {
	t := e.t
	t.Helper()
	ctx := context.Background()
	a, err := e.Core.CreateAssistant(ctx, core.AssistantCreate{Name: "a", Model: "vllm/test", Tools: e.Registry.FunctionTools()})
	if err != nil {
		t.Fatal(err)
	}
	th, err := e.Core.CreateThread(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := e.Core.CreateMessage(ctx, th.ID, a.ID, "hello")
	if err != nil {
		t.Fatal(err)
	}
	run, err := e.Core.CreateRun(ctx, core.RunCreate{AssistantID: a.ID, ThreadID: th.ID})
	if err != nil {
		t.Fatal(err)
	}
	return Run{RunID: run.ID, ThreadID: th.ID, AssistantID: a.ID, MessageID: msg.ID, Model: "vllm/test"}
}

// AssertWholeBatches checks the contract for every batch of a run: one
// tool message per call, in call order, with the right ids, every Action
// finalised, and an empty contract log. It returns the Actions.
func (e *Env) AssertWholeBatches(r Run, wantCalls int) []core.Action {
	t := e.t
	t.Helper()
	if v := e.Sim.Violations(); len(v) != 0 {
		t.Errorf("contract violations: %v", v)
	}
	acts := e.Sim.Actions(r.RunID)
	msgs := e.Sim.ToolMessages(r.ThreadID)
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

// Echo answers {"echo": <args>}.
func Echo(ctx context.Context, c *bridge.Call) ([]byte, error) {
	return []byte(`{"echo": ` + string(c.Args) + `}`), nil
}

// Hang waits for cancellation or its deadline.
func Hang(ctx context.Context, c *bridge.Call) ([]byte, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
