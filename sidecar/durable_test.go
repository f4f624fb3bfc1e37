package sidecar_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
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
	"github.com/projectdavid/toolsidecar/testkit/workerproc"
	"github.com/projectdavid/toolsidecar/tool"
)

// TestNATSOutageMidBatch: the NATS server (an external one, with
// JetStream on a kept store) stops for 1 s, then for 5 s, while an unsafe
// tool runs, and comes back on the same address. The worker's reply,
// buffered through the outage, reaches the sidecar: the tool ran once, its
// real result is the output, and the run completes. Each outage repeats
// testenv.SoakReps() times.
func TestNATSOutageMidBatch(t *testing.T) {
	for _, outage := range []time.Duration{time.Second, 5 * time.Second} {
		t.Run(outage.String(), func(t *testing.T) {
			for i := range testenv.SoakReps() {
				resume := natsOutage(t, outage)
				t.Logf("FAULT nats_restart_%s rep=%d resume_ms=%d", outage, i, resume.Milliseconds())
				if t.Failed() {
					return
				}
			}
		})
	}
}

// natsOutage runs one outage and returns the time from the server's
// return to the run's completion.
func natsOutage(t *testing.T, outage time.Duration) time.Duration {
	store := t.TempDir()
	addr := testenv.FreeAddr(t)
	start := func() *embedded.Server {
		ns, err := embedded.Start(embedded.Config{Listen: addr, StoreDir: store, AllowAnonymous: true})
		if err != nil {
			t.Fatal(err)
		}
		return ns
	}
	ns := start()
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "pay", ArgsJSON: `{}`}}},
		{Content: "{{results}}"}}}
	sim, srv := coresim.NewServer(coresim.Config{APIKey: testenv.APIKey, Scenario: sc})
	defer srv.Close()
	cfg, _ := testenv.Config(t, srv.URL, testenv.Options{}, []testenv.Tool{
		{Config: config.Tool{Name: "pay", SideEffects: config.Unsafe, Timeout: 30 * time.Second}}})
	cfg.NATS.URL = "nats://" + addr
	s := startOn(t, cfg)

	var pays atomic.Int32
	started := make(chan struct{})
	proceed := make(chan struct{})
	release := sync.OnceFunc(func() { close(proceed) })
	defer release()
	wnc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer wnc.Close()
	natstest.WorkerOn(t, wnc, testenv.Prefix, map[string]tool.Handler{
		"pay": func(ctx context.Context, c *tool.Call) ([]byte, error) {
			if pays.Add(1) == 1 {
				close(started)
			}
			<-proceed // finishes while NATS is down
			return []byte(`"paid"`), nil
		},
	})
	cc, _ := core.New(core.Config{URL: srv.URL, APIKey: testenv.APIKey})
	r := testenv.SetUpRun(t, cc, nil)
	got := make(chan executor.Summary, 1)
	go func() { sum, _ := s.Drive(context.Background(), testenv.Request(r), nil); got <- sum }()
	<-started
	ns.Shutdown()
	// The reply is written while the server is down, once the worker's
	// client knows it (it then buffers; a write into a socket that died
	// unnoticed is lost, see RELIABILITY.md).
	poll.Until(t, "the worker to notice the outage", func() bool { return wnc.Status() == nats.RECONNECTING })
	release()
	time.Sleep(outage)
	ns = start()
	back := time.Now()
	defer ns.Shutdown()
	sum := <-got
	resume := time.Since(back)
	if sum.Status != executor.StatusCompleted {
		t.Fatalf("summary %+v", sum)
	}
	if pays.Load() != 1 {
		t.Errorf("the unsafe tool ran %d times, want 1", pays.Load())
	}
	testenv.AssertWholeBatches(t, sim, r, 1)
	if msgs := sim.ToolMessages(r.ThreadID); msgs[0].Content != `"paid"` {
		t.Errorf("tool message %q, want pay's real result", msgs[0].Content)
	}
	return resume
}

// TestWorkerSIGKILL: the worker process running both calls of a batch is
// killed with SIGKILL mid-call, and a second worker process serves from
// then on. The read-only call times out and runs again on the second
// worker (retries: 1); the unsafe call is not run again and gets a timeout
// outcome saying so. One output per call, every Action finalised.
func TestWorkerSIGKILL(t *testing.T) {
	for i := range testenv.SoakReps() {
		start := time.Now()
		workerSIGKILL(t)
		t.Logf("FAULT worker_sigkill rep=%d run_ms=%d", i, time.Since(start).Milliseconds())
		if t.Failed() {
			return
		}
	}
}

func workerSIGKILL(t *testing.T) {
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "look", ArgsJSON: `{}`}, {Tool: "pay", ArgsJSON: `{}`}}},
		{Content: "{{results}}"}}}
	env := testenv.Start(t, sc, testenv.Options{},
		testenv.Tool{Config: config.Tool{Name: "look", SideEffects: config.ReadOnly, Timeout: time.Second, Retries: 1}},
		testenv.Tool{Config: config.Tool{Name: "pay", SideEffects: config.Unsafe, Timeout: time.Second}})
	execLog := t.TempDir() + "/exec.log"
	wcfg := workerproc.Config{URLs: env.NATSURL, Prefix: testenv.Prefix, User: testenv.WorkerUser, Password: env.WorkerPassword,
		Delay: time.Minute, ExecLog: execLog}
	first := workerproc.Start(t, wcfg)
	testenv.WaitLive(t, env.URL, "look", "pay")
	r := env.NewRun()
	got := make(chan executor.Summary, 1)
	go func() { sum, _ := env.Sidecar.Drive(context.Background(), testenv.Request(r), nil); got <- sum }()
	poll.Until(t, "both calls to run on the first worker", func() bool { _, n := workerproc.Executions(t, execLog); return n == 2 })
	first.Kill(t)
	wcfg.Delay = 50 * time.Millisecond
	workerproc.Start(t, wcfg)
	sum := <-got
	if sum.Status != executor.StatusCompleted {
		t.Fatalf("summary %+v", sum)
	}
	byCall, _ := workerproc.Executions(t, execLog)
	acts := env.AssertWholeBatches(r, 2)
	if n := byCall["pay "+acts[1].ID]; n != 1 {
		t.Errorf("the unsafe call ran %d times, want 1", n)
	}
	if n := byCall["look "+acts[0].ID]; n != 2 {
		t.Errorf("the read-only call ran %d times, want 2 (the retry on the second worker)", n)
	}
	msgs := env.Sim.ToolMessages(r.ThreadID)
	if msgs[0].Content != `"look done"` || !strings.Contains(msgs[1].Content, `"error_type":"timeout"`) {
		t.Errorf("outputs %q and %q; want look's real result and pay's timeout", msgs[0].Content, msgs[1].Content)
	}
}

// TestDurableModeReported: /readyz and toolsidecar_durable say whether
// durable mode is on, and why not: on with the embedded server, off with
// an external NATS that has no JetStream (the sidecar still runs).
func TestDurableModeReported(t *testing.T) {
	readyz := func(url string) map[string]any {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		return out
	}
	gauge := func(s *sidecar.Sidecar) float64 {
		v, n := metric(t, s, "toolsidecar_durable")
		if n != 1 {
			t.Fatalf("%d toolsidecar_durable series, want 1", n)
		}
		return v
	}
	on := testenv.New(t, oneCall("echo"))
	if got := readyz(on.URL); got["durable"] != true || gauge(on.Sidecar) != 1 {
		t.Errorf("embedded: readyz %v, gauge %v; want durable", got, gauge(on.Sidecar))
	}
	_, srv := coresim.NewServer(coresim.Config{APIKey: testenv.APIKey, Scenario: oneCall("echo")})
	defer srv.Close()
	cfg, _ := testenv.Config(t, srv.URL, testenv.Options{}, nil)
	cfg.NATS.URL = natstest.Start(t) // no JetStream
	s := startOn(t, cfg)
	if got := readyz("http://" + s.Addr()); got["durable"] != false || got["durable_off"] != "the NATS server has no JetStream" || gauge(s) != 0 {
		t.Errorf("no JetStream: readyz %v, gauge %v", got, gauge(s))
	}
}
