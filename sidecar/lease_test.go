package sidecar_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// startOn runs a sidecar of cfg (on an external NATS server when
// cfg.NATS.URL is set) until the test ends. Its log is printed if the test
// fails.
func startOn(t *testing.T, cfg config.Config) *sidecar.Sidecar {
	t.Helper()
	logs := &testenv.LogBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log of sidecar %s:\n%s", cfg.InstanceID, logs.String())
		}
	})
	s, err := sidecar.Start(context.Background(), cfg, sidecar.WithAPIKey(testenv.APIKey), sidecar.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// TestTwoSidecarsOneDriver: two sidecars share a NATS server with
// JetStream. A run driven by sidecar A is driven again through sidecar B
// (an application retrying against another replica): B follows A's drive
// (its events and its summary) instead of driving the run a second time,
// so the unsafe tool runs once and Core sees one completions request per
// turn.
func TestTwoSidecarsOneDriver(t *testing.T) {
	ns, err := embedded.Start(embedded.Config{Listen: "127.0.0.1:-1", StoreDir: t.TempDir(), AllowAnonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "pay", ArgsJSON: `{}`}}},
		{Content: "done: {{results}}"}}}
	sim, srv := coresim.NewServer(coresim.Config{APIKey: testenv.APIKey, Scenario: sc})
	defer srv.Close()
	side := func(instance string) *sidecar.Sidecar {
		cfg, _ := testenv.Config(t, srv.URL, testenv.Options{}, []testenv.Tool{
			{Config: config.Tool{Name: "pay", SideEffects: config.Unsafe, Timeout: 10 * time.Second}}})
		cfg.NATS.URL, cfg.InstanceID = ns.ClientURL(), instance
		return startOn(t, cfg)
	}
	a, b := side("sc-a"), side("sc-b")
	var pays atomic.Int32
	proceed := make(chan struct{})
	release := sync.OnceFunc(func() { close(proceed) })
	defer release() // a failing test must not leave the tool blocked
	wnc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer wnc.Close()
	natstest.WorkerOn(t, wnc, testenv.Prefix, map[string]tool.Handler{
		"pay": func(ctx context.Context, c *tool.Call) ([]byte, error) {
			pays.Add(1)
			<-proceed
			return []byte(`"paid"`), nil
		},
	})
	cc, _ := core.New(core.Config{URL: srv.URL, APIKey: testenv.APIKey})
	r := testenv.SetUpRun(t, cc, nil)
	gotA := make(chan executor.Summary, 1)
	go func() { sum, _ := a.Drive(context.Background(), testenv.Request(r), nil); gotA <- sum }()
	poll.Until(t, "the tool to start", func() bool { return pays.Load() == 1 })

	var events []executor.Event
	gotB := make(chan executor.Summary, 1)
	go func() {
		sum, _ := b.Drive(context.Background(), testenv.Request(r), func(e executor.Event) { events = append(events, e) })
		gotB <- sum
	}()
	poll.Until(t, "B to follow A's drive", func() bool { n, _ := metric(t, b, "toolsidecar_drives_attached_total"); return n == 1 })
	release()
	sumA, sumB := <-gotA, <-gotB
	if sumA.Status != executor.StatusCompleted || sumB.Status != sumA.Status || sumB.Content != sumA.Content || len(sumB.Calls) != 1 {
		t.Fatalf("A's summary %+v, B's %+v; want B to report A's drive", sumA, sumB)
	}
	if pays.Load() != 1 {
		t.Errorf("the unsafe tool ran %d times, want 1", pays.Load())
	}
	var results, turns int
	for _, e := range events {
		switch e.Type {
		case executor.EventToolResult:
			results++
		case executor.EventTurn:
			turns++
		}
	}
	if results != 1 || turns != 1 || events[len(events)-1].Type != executor.EventDone {
		t.Errorf("B relayed %d tool results, %d turns, last %q; want A's result, its second turn, done", results, turns, events[len(events)-1].Type)
	}
	if n := sim.CountRequests("POST", "/v1/completions"); n != 2 {
		t.Errorf("%d completions requests, want 2 (one per turn)", n)
	}
	if v := sim.Violations(); len(v) != 0 {
		t.Errorf("violations %v", v)
	}
}
