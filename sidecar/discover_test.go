package sidecar_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/promtest"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/wire"
	"github.com/projectdavid/toolsidecar/worker"
)

// lookupArgs are the arguments of the tool the workers of these tests
// declare in their code.
type lookupArgs struct {
	City string `json:"city" jsonschema:"the city to look up"`
	Days int    `json:"days,omitempty"`
}

// declaringWorker connects a worker that declares lookup (its handler
// given) and, when policied is set, the tool "policied" too.
func declaringWorker(t *testing.T, natsURL, password string, lookup func(context.Context, *tool.Call, lookupArgs) (map[string]any, error)) (*worker.Worker, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(natsURL, nats.UserInfo(testenv.WorkerUser, password))
	if err != nil {
		t.Fatal(err)
	}
	w := worker.New(nc, testenv.Prefix)
	if err := worker.Declare(w, "lookup", worker.Spec{Description: "Look a city up", SideEffects: tool.ReadOnly, Timeout: 3 * time.Second}, lookup); err != nil {
		t.Fatal(err)
	}
	echo := func(_ context.Context, _ *tool.Call, a lookupArgs) (string, error) { return "policied " + a.City, nil }
	if err := worker.Declare(w, "policied", worker.Spec{Description: "Declared, with the file's policies"}, echo); err != nil {
		t.Fatal(err)
	}
	// A schema the file contradicts: the file's entry stays in force.
	if err := worker.Declare(w, "pinned", worker.Spec{Description: "Contradicted"}, echo); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	natstest.Serve(t, w)
	return w, nc
}

// TestDeclaredTools: a Go worker declares lookup in its code only; the
// sidecar discovers it, lists it as the worker's, validates calls against
// the derived schema and runs them. The worker leaves while a call of it
// runs: the call gets its outcome, then the tool is gone (a call of it is
// not_found at once), and it is back when a worker returns. A tool the
// file also names keeps the file's policies; one whose schema the file
// contradicts keeps the file's entry.
func TestDeclaredTools(t *testing.T) {
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "lookup", ArgsJSON: `{"city":"Oslo"}`}, {Tool: "lookup", ArgsJSON: `{"town":"Oslo"}`}}},
		{Content: "{{results}}"},
	}}
	pinned := map[string]any{"type": "object", "properties": map[string]any{"town": map[string]any{"type": "string"}}}
	env := testenv.Start(t, sc, testenv.Options{NATS: func(n *config.NATS) { n.DiscoverInterval = 100 * time.Millisecond }},
		testenv.Tool{Config: config.Tool{Name: "policied", Retries: 1, Timeout: 7 * time.Second}},
		testenv.Tool{Config: config.Tool{Name: "pinned", Parameters: pinned}})
	if _, ok := testenv.SourcedTools(t, env.URL)["lookup"]; ok {
		t.Fatal("lookup listed before any worker declares it")
	}

	started, release := make(chan struct{}, 1), make(chan struct{})
	lookup := func(ctx context.Context, _ *tool.Call, a lookupArgs) (map[string]any, error) {
		started <- struct{}{}
		<-release
		return map[string]any{"city": a.City, "forecast": "sunny"}, nil
	}
	w, nc := declaringWorker(t, env.NATSURL, env.WorkerPassword, lookup)
	poll.Until(t, "lookup discovered", func() bool { _, ok := testenv.SourcedTools(t, env.URL)["lookup"]; return ok })
	tools := testenv.SourcedTools(t, env.URL)
	l := tools["lookup"]
	var params struct {
		Required   []string                   `json:"required"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(l.Function.Parameters, &params); err != nil || !slices.Equal(params.Required, []string{"city"}) || len(params.Properties) != 2 {
		t.Errorf("lookup's parameters %s: want city required, city and days", l.Function.Parameters)
	}
	if l.Source != "worker" || l.Function.Description != "Look a city up" || len(l.DeclaredBy) != 1 || !strings.HasPrefix(l.DeclaredBy[0], "go worker ") {
		t.Errorf("lookup listed as %+v", l)
	}
	if p := tools["policied"]; p.Source != "config+worker" || p.Function.Description != "Declared, with the file's policies" || !strings.Contains(string(p.Function.Parameters), `"city"`) {
		t.Errorf("policied listed as %+v", p)
	}
	if tl, ok := env.Sidecar.Tools().Lookup("policied"); !ok || tl.Retries != 1 || tl.Timeout != 7*time.Second {
		t.Errorf("policied: the file's retries and timeout are not in force: %+v", tl)
	}
	if p := tools["pinned"]; p.Source != "config" || !strings.Contains(string(p.Function.Parameters), `"town"`) {
		t.Errorf("pinned: the file's entry is not the one in force: %+v", p)
	}

	// The worker leaves while its call runs: drained, the call finishes.
	r := env.NewRun()
	driven := make(chan *http.Response, 1)
	go func() { resp, _ := testenv.Drive(t, env.URL, r, nil); driven <- resp }()
	<-started
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stopped <- w.Stop(ctx)
	}()
	time.Sleep(50 * time.Millisecond) // the stop is under way: no new call reaches this worker
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if resp := <-driven; resp.StatusCode != http.StatusOK {
		t.Fatalf("drive: %d", resp.StatusCode)
	}
	msgs := toolMessages(t, env, r)
	if len(msgs) != 2 || msgs[0]["forecast"] != "sunny" || !strings.Contains(stringOf(msgs[1]), "invalid_args") {
		t.Fatalf("tool messages %v: want lookup's result, then invalid_args for the argument the schema does not allow", msgs)
	}

	poll.Until(t, "lookup gone with its last worker", func() bool { _, ok := testenv.SourcedTools(t, env.URL)["lookup"]; return !ok })
	r2 := env.NewRun()
	testenv.Drive(t, env.URL, r2, nil)
	if msgs := toolMessages(t, env, r2); len(msgs) != 2 || !strings.Contains(stringOf(msgs[0]), "not_found") {
		t.Fatalf("tool messages after the worker left %v: want not_found", msgs)
	}

	release = make(chan struct{})
	close(release)
	declaringWorker(t, env.NATSURL, env.WorkerPassword, lookup)
	poll.Until(t, "lookup back with a worker", func() bool { return testenv.SourcedTools(t, env.URL)["lookup"].Source == "worker" })
}

// stringOf renders a decoded tool message for a substring check.
func stringOf(m map[string]any) string {
	b, _ := json.Marshal(m)
	return string(b)
}

// TestDeclarationContradictingConfigLeftOut: on an external bus where a
// worker already declares lookup, a file whose entry for lookup has
// another schema starts (no bus client can keep the sidecar from
// starting); the file's entry is in force, and the declaration is left
// out, counted.
func TestDeclarationContradictingConfigLeftOut(t *testing.T) {
	url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	w := worker.New(nc, testenv.Prefix)
	if err := worker.Declare(w, "lookup", worker.Spec{}, func(context.Context, *tool.Call, lookupArgs) (string, error) { return "", nil }); err != nil {
		t.Fatal(err)
	}
	natstest.Serve(t, w)
	other := map[string]any{"type": "object", "required": []any{"town"}, "properties": map[string]any{"town": map[string]any{"type": "string"}}}
	cfg, _ := testenv.Config(t, "http://127.0.0.1:1", testenv.Options{NATS: func(n *config.NATS) { n.URL = url }},
		[]testenv.Tool{{Config: config.Tool{Name: "lookup", Parameters: other}}})
	s, err := sidecar.Start(context.Background(), cfg, sidecar.WithAPIKey("k"))
	if err != nil {
		t.Fatalf("a declaration that contradicts the file kept the sidecar from starting: %v", err)
	}
	defer s.Shutdown(context.Background())
	lookup, ok := s.Tools().Lookup("lookup")
	if !ok || lookup.Source != "config" || !strings.Contains(string(lookup.Parameters), `"town"`) {
		t.Fatalf("lookup in force as %+v: want the file's entry", lookup)
	}
	if promtest.Value(t, s.Metrics(), "toolsidecar_declarations_left_out_total", "reason=refused") != 1 {
		t.Error("the contradicting declaration is not counted")
	}
}

// TestHostileDeclarationsOnALiveDaemon: a client of the bus that may
// serve every tool answers every $SRV.INFO with 1,500 declared tools, an
// answer that is not JSON, and a declaration of 100 KiB, and answers the
// describe requests of them all. The daemon stays live and ready, serves
// at most 1,000 declared tools, leaves the oversized one out, and a run of
// a configured tool completes beside them with its result.
func TestHostileDeclarationsOnALiveDaemon(t *testing.T) {
	sc := coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: "echo", ArgsJSON: `{"x": 1}`}}}, {Content: "{{results}}"}}}
	env := testenv.Start(t, sc, testenv.Options{NATS: func(n *config.NATS) { n.DiscoverInterval = 100 * time.Millisecond }},
		testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo})
	nc, err := nats.Connect(env.NATSURL, nats.UserInfo(testenv.WorkerUser, env.WorkerPassword))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	decls := map[string]string{"huge": `{"description":"` + strings.Repeat("x", 100<<10) + `"}`}
	for i := range 1500 {
		decls[fmt.Sprintf("flood%04d", i)] = `{"description":"flood","parameters":{"type":"object"}}`
	}
	flood := forgedInfo("HOSTILE", decls)
	sub, err := nc.Subscribe("$SRV.INFO", func(m *nats.Msg) {
		_ = m.Respond([]byte("{not json"))
		_ = m.Respond(flood)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	for name, decl := range decls {
		if _, err := nc.QueueSubscribe(wire.Subject(testenv.Prefix, name), wire.QueueGroup, func(m *nats.Msg) {
			if wire.IsDescribe(m) {
				_ = m.Respond([]byte(decl))
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, "the flood discovered", func() bool { return len(testenv.SourcedTools(t, env.URL)) >= 1001 })
	time.Sleep(300 * time.Millisecond) // more looks: the bound holds
	tools := testenv.SourcedTools(t, env.URL)
	if _, ok := tools["huge"]; ok || len(tools) != 1001 || tools["echo"].Source != "config" {
		t.Errorf("%d tools listed (huge listed: %v): want echo and at most 1000 declared", len(tools), ok)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(env.URL + path)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %v %v", path, resp, err)
		}
		resp.Body.Close()
	}
	r := env.NewRun()
	_, msgs := env.DriveWhole(r, 1)
	testenv.AssertOutputs(t, msgs, `"x"`)
}
