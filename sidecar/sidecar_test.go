package sidecar_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/promtest"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/testkit/workerproc"
	"github.com/projectdavid/toolsidecar/tool"
)

func TestMain(m *testing.M) {
	workerproc.MaybeRun() // when started as a worker process of a fault test
	goleak.VerifyTestMain(m)
}

func oneCall(name string) coresim.Scenario {
	return coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: name, ArgsJSON: `{"q": "x"}`}}}, {Content: "{{results}}"}}}
}

func driveHTTP(t *testing.T, env *testenv.Env, r testenv.Run) (int, executor.Summary) {
	t.Helper()
	resp, sum := testenv.Drive(t, env.URL, r, nil)
	return resp.StatusCode, sum
}

// TestLifecycle: the assembled sidecar serves a drive over HTTP on the
// embedded NATS; Shutdown stops the listener and the embedded server, is
// safe to repeat, and leaves no goroutine behind (goleak in TestMain).
func TestLifecycle(t *testing.T) {
	env := testenv.New(t, oneCall("echo"), testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo})
	r := env.NewRun()
	code, sum := driveHTTP(t, env, r)
	if code != 200 || sum.Status != executor.StatusCompleted || len(sum.Calls) != 1 || !sum.Calls[0].OK {
		t.Fatalf("%d %+v", code, sum)
	}
	env.AssertWholeBatches(r, 1)
	if err := env.Sidecar.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := env.Sidecar.Shutdown(context.Background()); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
	if _, err := http.Get(env.URL + "/healthz"); err == nil {
		t.Error("the API still answers after Shutdown")
	}
	if nc, err := nats.Connect(env.NATSURL, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Error("the embedded NATS server still accepts connections after Shutdown")
	}
}

// TestNewFailsCleanly: when the API's port is taken, New says which key
// failed and stops the embedded server it had started.
func TestNewFailsCleanly(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	natsPort, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	natsAddr := natsPort.Addr().String()
	natsPort.Close()
	cfg, _ := testenv.Config(t, "http://127.0.0.1:1", testenv.Options{}, nil)
	cfg.Server.Listen = taken.Addr().String()
	cfg.NATS.Embedded.Listen = natsAddr
	if _, err := sidecar.Start(context.Background(), cfg, sidecar.WithAPIKey("k")); err == nil || !strings.Contains(err.Error(), "server.listen") {
		t.Fatalf("err %v, want one naming server.listen", err)
	}
	if c, err := net.Dial("tcp", natsAddr); err == nil {
		c.Close()
		t.Error("the embedded NATS server outlived the failed New")
	}
}

// TestShutdownDeadlineLeavesDrives: a drive whose call outlives the
// shutdown deadline is left as a crash would leave it: it ends
// "interrupted", its Action stays processing, no tool output is written
// for it and no further turn is requested; the next drive of the run
// finishes the call (TestSIGTERMPastShutdownTimeout).
func TestShutdownDeadlineLeavesDrives(t *testing.T) {
	started := make(chan struct{})
	env := testenv.New(t, oneCall("hang"), testenv.Tool{Config: config.Tool{Name: "hang", Timeout: time.Minute},
		Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) { close(started); return testenv.Hang(ctx, c) }})
	r := env.NewRun()
	type result struct {
		code int
		sum  executor.Summary
	}
	got := make(chan result, 1)
	go func() { code, sum := driveHTTP(t, env, r); got <- result{code, sum} }()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := env.Sidecar.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-got
	if res.sum.Status != executor.StatusInterrupted || !strings.Contains(res.sum.Error, "left for the next drive") {
		t.Errorf("summary %+v, want interrupted, the call left for the next drive", res.sum)
	}
	acts := env.Sim.Actions(r.RunID)
	if len(acts) != 1 || acts[0].Status != core.ActionProcessing {
		t.Errorf("actions %+v, want one, processing", acts)
	}
	if msgs := env.Sim.ToolMessages(r.ThreadID); len(msgs) != 0 {
		t.Errorf("tool messages %+v, want none", msgs)
	}
	if n := env.Sim.CountRequests("POST", "/v1/completions"); n != 1 {
		t.Errorf("%d completions requests, want 1", n)
	}
}

// TestReload: Reload puts the file's tools in force; a bad file leaves the
// tools in force alone.
func TestReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("nats: {subject_prefix: test}\ntools:\n  - {name: a}\n  - {name: b}\n")
	env := testenv.Start(t, coresim.Scenario{}, testenv.Options{Sidecar: []sidecar.Option{sidecar.WithReload(path, nil)}},
		testenv.Tool{Config: config.Tool{Name: "a"}})
	if err := env.Sidecar.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := env.Sidecar.Tools().Names(); len(got) != 2 {
		t.Fatalf("tools after reload %v", got)
	}
	// The tool the reload added has its series from then on, at zero.
	if _, n := metric(t, env.Sidecar, "toolsidecar_calls_total", "tool=b"); n != 1 {
		t.Errorf("%d toolsidecar_calls_total series for the reloaded tool b, want 1", n)
	}
	write("tools:\n  - {name: a}\n  - {name: a}\n")
	if err := env.Sidecar.Reload(context.Background()); err == nil {
		t.Error("a bad file was accepted")
	}
	if got := env.Sidecar.Tools().Names(); len(got) != 2 {
		t.Errorf("a bad file replaced the tools: %v", got)
	}
}

// TestServeWorkers: `toolsidecar worker` serves an exec tool on the bus,
// where a sidecar's client reaches it; a configuration with nothing to
// serve is refused.
func TestServeWorkers(t *testing.T) {
	url := natstest.Start(t)
	cfg := config.Default()
	cfg.NATS.URL = url
	cfg.NATS.SubjectPrefix = "w"
	if err := sidecar.ServeWorkers(context.Background(), cfg, nil); !errors.Is(err, sidecar.ErrNothingToServe) {
		t.Errorf("empty configuration: %v", err)
	}
	cfg.Tools = []config.Tool{{Name: "shout", Route: "exec", Timeout: 5 * time.Second,
		Settings: map[string]any{"exec": map[string]any{"command": []any{"/bin/sh", "-c", "tr a-z A-Z"}}}}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sidecar.ServeWorkers(ctx, cfg, nil) }()
	c := natstest.Client(t, natstest.Dial(t, url), "w")
	poll.Until(t, "the worker to serve shout", func() bool { live, _ := c.Live(context.Background(), 50*time.Millisecond); return live["shout"] })
	out := c.Dispatch(context.Background(), tool.Request{Tool: "shout", Body: []byte(`{"args": {"q": "hi"}}`), Timeout: 5 * time.Second})
	if out.Err != nil || string(out.Data) != `{"ARGS": {"Q": "HI"}}` {
		t.Errorf("outcome %q %v", out.Data, out.Err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("worker stop: %v", err)
	}
}

// TestMetricsAtStart: before any call, /metrics has every registered
// tool's series at zero, latency buckets with round bounds that reach past
// the longest tool's timeout, the build's info and the NATS connection.
func TestMetricsAtStart(t *testing.T) {
	env := testenv.New(t, oneCall("echo"),
		testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo},
		testenv.Tool{Config: config.Tool{Name: "slow", Timeout: 400 * time.Second}})
	resp, err := http.Get(env.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	body := string(b)
	for _, want := range []string{
		`toolsidecar_calls_total{outcome="ok",tool="echo"} 0`,
		`toolsidecar_calls_total{outcome="ok",tool="slow"} 0`,
		`toolsidecar_call_duration_seconds_bucket{tool="slow",le="0.25"} 0`,
		`toolsidecar_call_duration_seconds_bucket{tool="slow",le="300"} 0`,
		`toolsidecar_call_duration_seconds_bucket{tool="slow",le="400"} 0`,
		`toolsidecar_calls_deduped_total{tool="slow"} 0`,
		`toolsidecar_hedges_total{tool="slow",winner="hedge"} 0`,
		`toolsidecar_hedges_total{tool="slow",winner="primary"} 0`,
		`toolsidecar_runs_total{status="completed"} 0`,
		`toolsidecar_nats_connected 1`,
		`toolsidecar_build_info{goversion="` + runtime.Version() + `"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, `le="0.0390625"`) {
		t.Error("exponential buckets with odd bounds are still there")
	}
}

// TestNATSStartsLate: an external NATS that comes up a little after the
// sidecar (a rollout) is waited for, each failed attempt logged; one that
// never comes is a start-up error naming its address once connect_retry
// has passed.
func TestNATSStartsLate(t *testing.T) {
	addr := testenv.FreeAddr(t)
	_, srv := coresim.NewServer(coresim.Config{APIKey: testenv.APIKey, Scenario: oneCall("echo")})
	defer srv.Close()
	cfg, _ := testenv.Config(t, srv.URL, testenv.Options{}, nil)
	cfg.NATS.URL, cfg.NATS.ConnectRetry = "nats://"+addr, 300*time.Millisecond
	if _, err := sidecar.Start(context.Background(), cfg, sidecar.WithAPIKey(testenv.APIKey)); err == nil || !strings.Contains(err.Error(), "failed to start") || !strings.Contains(err.Error(), addr) {
		t.Fatalf("no NATS at all: %v, want a start-up error naming %s", err, addr)
	}
	api := testenv.FreeAddr(t)
	cfg.Server.Listen = api
	up := make(chan *embedded.Server, 1)
	probed := make(chan struct{})
	go func() { // while the sidecar waits, its probes say why it is not ready
		defer close(probed)
		poll.Until(t, "/readyz to say why the sidecar is not ready", func() bool {
			resp, err := http.Get("http://" + api + "/readyz")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode == 503 && strings.Contains(string(b), "starting: connecting to NATS at nats://"+addr)
		})
	}()
	time.AfterFunc(1500*time.Millisecond, func() {
		ns, err := embedded.Start(embedded.Config{Listen: addr, StoreDir: t.TempDir(), AllowAnonymous: true})
		if err != nil {
			t.Error(err)
		}
		up <- ns
	})
	defer func() { (<-up).Shutdown() }()
	cfg.NATS.ConnectRetry = 30 * time.Second
	logs := &testenv.LogBuffer{}
	s, err := sidecar.Start(context.Background(), cfg, sidecar.WithAPIKey(testenv.APIKey), sidecar.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatalf("NATS up after 1.5 s: %v", err)
	}
	defer s.Shutdown(context.Background())
	<-probed
	if !strings.Contains(logs.String(), "NATS unreachable; retrying") {
		t.Errorf("the retries were not logged:\n%s", logs)
	}
}

// TestEmbeddedPortTaken: an embedded NATS port in use is a start-up error
// at once, naming the address and the key that sets it.
func TestEmbeddedPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, srv := coresim.NewServer(coresim.Config{APIKey: testenv.APIKey, Scenario: oneCall("echo")})
	defer srv.Close()
	cfg, _ := testenv.Config(t, srv.URL, testenv.Options{}, nil)
	cfg.NATS.Embedded.Listen = ln.Addr().String()
	_, err = sidecar.Start(context.Background(), cfg, sidecar.WithAPIKey(testenv.APIKey))
	var se *sidecar.StartError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "cannot listen on "+ln.Addr().String()+" (nats.embedded.listen)") {
		t.Fatalf("err %v, want a StartError naming %s and nats.embedded.listen", err, ln.Addr())
	}
}

// metric reads a metric of the sidecar's registry: the sum of its series
// whose labels include each "name=value" given, and how many matched.
func metric(t *testing.T, s *sidecar.Sidecar, name string, labels ...string) (sum float64, series int) {
	t.Helper()
	return promtest.Sum(t, s.Metrics(), name, labels...)
}

// TestWorkerOps: `toolsidecar worker` with server.ops_listen answers the
// probes (ready once NATS is connected) and exports, per tool, the calls in
// flight (what a worker HPA scales on), completed and failed.
func TestWorkerOps(t *testing.T) {
	url := natstest.Start(t)
	release := make(chan struct{})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		io.WriteString(w, `{"ok": true}`)
	}))
	defer api.Close()
	cfg := config.Default()
	cfg.NATS.URL = url
	cfg.NATS.SubjectPrefix = "w"
	cfg.Server.OpsListen = testenv.FreeAddr(t)
	cfg.Tools = []config.Tool{{Name: "held", Route: "http", Timeout: 30 * time.Second,
		Settings: map[string]any{"http": map[string]any{"url": api.URL}}}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sidecar.ServeWorkers(ctx, cfg, nil) }()
	ops := "http://" + cfg.Server.OpsListen
	get := func(path string) (int, string) {
		resp, err := http.Get(ops + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	poll.Until(t, "the worker's /readyz to answer 200", func() bool { code, _ := get("/readyz"); return code == 200 })

	c := natstest.Client(t, natstest.Dial(t, url), "w")
	outs := make(chan tool.Outcome, 2)
	for range 2 {
		go func() {
			outs <- c.Dispatch(context.Background(), tool.Request{Tool: "held", Body: []byte(`{"args": {}}`), Timeout: 30 * time.Second})
		}()
	}
	poll.Until(t, "2 calls in flight on /metrics", func() bool {
		_, body := get("/metrics")
		return strings.Contains(body, `toolsidecar_worker_calls_in_flight{tool="held"} 2`)
	})
	close(release)
	for range 2 {
		if out := <-outs; out.Err != nil {
			t.Errorf("outcome %v", out.Err)
		}
	}
	// A runner counts its call done just after it has replied, so the
	// figures may trail the outcomes by a moment.
	var body string
	wants := []string{`toolsidecar_worker_calls_in_flight{tool="held"} 0`, `toolsidecar_worker_calls_total{tool="held"} 2`,
		`toolsidecar_worker_call_errors_total{tool="held"} 0`, `toolsidecar_worker_runners 64`, `toolsidecar_nats_reconnects_total 0`}
	poll.Until(t, "both calls counted done on /metrics", func() bool {
		_, body = get("/metrics")
		return strings.Contains(body, wants[1])
	})
	for _, want := range wants {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("worker stop: %v", err)
	}
	if code, _ := get("/healthz"); code != 0 {
		t.Errorf("ops listener still answers after the worker stopped: %d", code)
	}
}

// TestReadinessWithoutCore: Core down does not make the sidecar NotReady
// (that would take every application pod out of its Service at once),
// unless core.readiness_check asks for it.
func TestReadinessWithoutCore(t *testing.T) {
	down := "http://" + testenv.FreeAddr(t) // nothing listens there
	for _, check := range []bool{false, true} {
		cfg, _ := testenv.Config(t, down, testenv.Options{}, nil)
		cfg.Core.ReadinessCheck = check
		s := startOn(t, cfg)
		resp, err := http.Get("http://" + s.Addr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := map[bool]int{false: 200, true: 503}[check]
		if resp.StatusCode != want || (check && !strings.Contains(string(b), "core unreachable")) {
			t.Errorf("readiness_check %v: /readyz %d %s, want %d", check, resp.StatusCode, b, want)
		}
	}
}

// TestTelemetryErrorsLogged: an error of the OpenTelemetry SDK (an export
// that failed) is a structured record of the sidecar's log, not a plain
// line on stderr among the JSON records.
func TestTelemetryErrorsLogged(t *testing.T) {
	var logs testenv.LogBuffer
	testenv.Start(t, oneCall("echo"), testenv.Options{Sidecar: []sidecar.Option{sidecar.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil)))}},
		testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo})
	otel.Handle(errors.New("traces export: connection refused"))
	type record struct {
		Level     string `json:"level"`
		Component string `json:"component"`
		Err       string `json:"err"`
	}
	var rec record
	for line := range strings.Lines(logs.String()) {
		var r record
		if json.Unmarshal([]byte(line), &r) == nil && r.Component == "telemetry" {
			rec = r
		}
	}
	if rec.Level != "WARN" || !strings.Contains(rec.Err, "connection refused") {
		t.Errorf("telemetry record %+v, want a WARN record with the SDK's error", rec)
	}
}
