// Package testenv starts a whole sidecar for a test, assembled by package
// sidecar exactly as `toolsidecar run` assembles it: the embedded NATS server
// on a random port, the Core simulator on a loopback HTTP server, the HTTP
// API on a free port, and Go workers on their own NATS connection.
// Everything is torn down by t.Cleanup. It is for tests only.
package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/syncbuf"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

// Prefix is the subject prefix of test tools.
const Prefix = "test"

// APIKey is the simulator's key.
const APIKey = "key"

// WorkerUser is the embedded server's user that test workers connect as;
// it may serve every tool. Its password is [Env.WorkerPassword].
const WorkerUser = "test-worker"

// Tool is a tool definition and the Go worker handler serving it; a nil
// handler means no worker serves the tool.
type Tool struct {
	Config  config.Tool
	Handler tool.Handler
}

// Options change the sidecar's configuration from the test defaults.
type Options struct {
	// Executor changes the executor section: each field it sets replaces
	// the default; CancelPoll, when not set, is 20ms, so that
	// cancellation tests are quick.
	Executor config.Executor
	// Token, when set, is required on the API (server.auth_token_file).
	Token string
	// Operator, when set, is the operator's token
	// (server.operator_token_file): the live view shows it every run.
	Operator string
	// MaxBodyBytes sets server.max_body_bytes.
	MaxBodyBytes int64
	// CoreTimeout sets core.timeout (one request to Core); default 5s.
	CoreTimeout time.Duration
	// PerKeyUsers runs the simulator with one user per API key, and the
	// sidecar without a key of its own: every Core request must carry the
	// caller's key.
	PerKeyUsers bool
	// Workers are more users of the embedded server, beside WorkerUser.
	Workers []config.Worker
	// Server and NATS change those sections after the test defaults.
	Server func(*config.Server)
	NATS   func(*config.NATS)
	// Sidecar options are passed to sidecar.Start.
	Sidecar []sidecar.Option
	// Sim, when set, edits the simulator's configuration.
	Sim func(*coresim.Config)
	// Config, when set, edits the whole configuration last.
	Config func(*config.Config)
	// ServeCore, when set, serves the simulator instead of a plain
	// loopback server (over TLS, say). It returns Core's URL, the
	// application's client for set-up, and what stops the server.
	ServeCore func(*coresim.Sim) (url string, app *core.Client, stop func())
}

// CoreApart serves the simulator to the sidecar on a server of its own,
// changed by tweak before it starts (a keep-alive, TLS), and to the
// application's set-up calls on another, so that only the sidecar meets
// what the test does to its server. It is an [Options.ServeCore].
func CoreApart(t testing.TB, tweak func(*httptest.Server)) func(*coresim.Sim) (string, *core.Client, func()) {
	return func(sim *coresim.Sim) (string, *core.Client, func()) {
		srv := httptest.NewUnstartedServer(sim)
		if tweak != nil {
			tweak(srv)
		}
		srv.Start()
		setup := httptest.NewServer(sim)
		app, err := core.New(core.Config{URL: setup.URL, APIKey: APIKey})
		if err != nil {
			t.Fatal(err)
		}
		return srv.URL, app, func() { srv.Close(); setup.Close() }
	}
}

// Env is a running sidecar on real parts.
type Env struct {
	Sim     *coresim.Sim
	SimURL  string
	Core    *core.Client // the application's client, for set-up
	Sidecar *sidecar.Sidecar
	// URL is the sidecar's HTTP API.
	URL     string
	NATSURL string
	// WorkerPassword is WorkerUser's password on the embedded server.
	WorkerPassword string
	Worker         *worker.Worker
	Registry       *registry.Registry
	t              testing.TB
}

// New starts a sidecar with the given script and tools and the default
// options. Tool defaults: route nats, read_only, a 5s timeout.
func New(t testing.TB, sc coresim.Scenario, tools ...Tool) *Env {
	t.Helper()
	return Start(t, sc, Options{}, tools...)
}

// Start is New with options.
func Start(t testing.TB, sc coresim.Scenario, opts Options, tools ...Tool) *Env {
	t.Helper()
	simCfg := coresim.Config{APIKey: APIKey, Scenario: sc, PerKeyUsers: opts.PerKeyUsers}
	if opts.Sim != nil {
		opts.Sim(&simCfg)
	}
	var (
		sim    *coresim.Sim
		simURL string
		cc     *core.Client
	)
	if opts.ServeCore != nil {
		var stop func()
		sim = coresim.New(simCfg)
		simURL, cc, stop = opts.ServeCore(sim)
		t.Cleanup(stop)
	} else {
		var srv *coresim.Server
		sim, srv = coresim.NewServer(simCfg)
		t.Cleanup(srv.Close)
		simURL = srv.URL
		var err error
		if cc, err = core.New(core.Config{URL: srv.URL, APIKey: APIKey, Timeout: 5 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	cfg, password := Config(t, simURL, opts, tools)
	sopts := opts.Sidecar
	if !opts.PerKeyUsers {
		sopts = append([]sidecar.Option{sidecar.WithAPIKey(APIKey)}, sopts...)
	}
	s, err := sidecar.Start(context.Background(), cfg, sopts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	w, stopWorker := startWorker(t, s.NATSURL(), password, tools)
	// The sidecar stops first: its drives end and cancel their calls, then
	// the workers have nothing left to wait for.
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sidecar run: %v", err)
		}
		stopWorker()
	})
	return &Env{Sim: sim, SimURL: simURL, Core: cc, Sidecar: s, URL: "http://" + s.Addr(), NATSURL: s.NATSURL(),
		WorkerPassword: password, Worker: w, Registry: s.Tools(), t: t}
}

// Config is the sidecar configuration of a test: loopback ports picked by
// the system, a worker user (WorkerUser, with the returned password) on the
// embedded server, the test's tools with their defaults filled in.
func Config(t testing.TB, coreURL string, opts Options, tools []Tool) (config.Config, string) {
	t.Helper()
	cfg := config.Default()
	password := "pw-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	pwFile := filepath.Join(t.TempDir(), "worker-password")
	if err := os.WriteFile(pwFile, []byte(password), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.NATS.Embedded.Workers = append([]config.Worker{{Name: WorkerUser, PasswordFile: pwFile, Tools: []string{"*"}}}, opts.Workers...)
	cfg.Core.URL = coreURL
	cfg.Core.Timeout = 5 * time.Second
	if opts.CoreTimeout > 0 {
		cfg.Core.Timeout = opts.CoreTimeout
	}
	cfg.NATS.SubjectPrefix = Prefix
	cfg.NATS.Embedded.Listen = "127.0.0.1:-1"
	cfg.Server.Listen = "127.0.0.1:0"
	cfg.Server.ShutdownTimeout = 5 * time.Second
	if opts.MaxBodyBytes > 0 {
		cfg.Server.MaxBodyBytes = opts.MaxBodyBytes
	}
	for _, sec := range []struct {
		value string
		file  *string
	}{{opts.Token, &cfg.Server.AuthTokenFile}, {opts.Operator, &cfg.Server.OperatorTokenFile}} {
		if sec.value == "" {
			continue
		}
		*sec.file = filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(*sec.file, []byte(sec.value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if opts.Server != nil {
		opts.Server(&cfg.Server)
	}
	if opts.NATS != nil {
		opts.NATS(&cfg.NATS)
	}
	overlay(reflect.ValueOf(&cfg.Executor).Elem(), reflect.ValueOf(opts.Executor))
	if opts.Executor.CancelPoll == 0 {
		cfg.Executor.CancelPoll = 20 * time.Millisecond
	}
	for _, tl := range tools {
		c := tl.Config
		if c.Route == "" {
			c.Route = registry.Nats
		}
		if c.SideEffects == "" {
			c.SideEffects = config.ReadOnly
		}
		if c.Timeout == 0 {
			c.Timeout = 5 * time.Second
		}
		cfg.Tools = append(cfg.Tools, c)
	}
	if opts.Config != nil {
		opts.Config(&cfg)
	}
	return cfg, password
}

// overlay sets each field of dst that src sets (is not zero), field by
// field in nested structs: a test names only what it changes, and the
// rest keeps config.Default's value.
func overlay(dst, src reflect.Value) {
	for i := range src.NumField() {
		f := src.Field(i)
		switch {
		case f.Kind() == reflect.Struct:
			overlay(dst.Field(i), f)
		case !f.IsZero():
			dst.Field(i).Set(f)
		}
	}
}

// startWorker serves the tools that have a handler from a connection of
// their own, as a worker process would.
func startWorker(t testing.TB, natsURL, password string, tools []Tool) (*worker.Worker, func()) {
	t.Helper()
	if !slices.ContainsFunc(tools, func(tl Tool) bool { return tl.Handler != nil }) {
		return nil, func() {} // no worker: the test connects its own, or none
	}
	nc, err := nats.Connect(natsURL, nats.UserInfo(WorkerUser, password))
	if err != nil {
		t.Fatal(err)
	}
	w := worker.New(nc, Prefix)
	for _, tl := range tools {
		if tl.Handler != nil {
			w.Handle(tl.Config.Name, tl.Handler)
		}
	}
	if err := w.Start(); err != nil {
		nc.Close()
		t.Fatal(err)
	}
	return w, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
		nc.Close()
	}
}

// Run is a run set up the way an application sets one up.
type Run = coresim.RunRef

// Request is the drive request of run r.
func Request(r Run) executor.Request {
	return executor.Request{RunID: r.RunID, ThreadID: r.ThreadID, AssistantID: r.AssistantID, MessageID: r.MessageID, Model: r.Model}
}

// NewRun creates an assistant, a thread, a user message and a run.
func (e *Env) NewRun() Run {
	e.t.Helper()
	return SetUpRun(e.t, e.Core, e.Registry.FunctionTools())
}

// SetUpRun creates, through c, an assistant with tools, a thread, a user
// message and a run, as an application does before it drives the run.
func SetUpRun(t testing.TB, c *core.Client, tools []tool.FunctionTool) Run {
	t.Helper()
	r, err := coresim.SetUpRun(context.Background(), c, tools)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Drive posts a JSON drive of the run to the sidecar's API at base, with
// the given headers (X-API-Key, Authorization), and returns the status and
// the summary with its headers.
func Drive(t testing.TB, base string, r Run, header map[string]string) (*http.Response, executor.Summary) {
	t.Helper()
	resp, raw := DriveRaw(t, base, r, header)
	var sum executor.Summary
	_ = json.Unmarshal(raw, &sum) // a refusal may carry another shape
	return resp, sum
}

// DriveRaw is Drive, returning the answer's body as it came.
func DriveRaw(t testing.TB, base string, r Run, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	body, _ := json.Marshal(r.DriveBody())
	req, err := http.NewRequest("POST", base+"/v1/runs/"+r.RunID+"/drive", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, raw
}

// LogBuffer collects a process's or a logger's output; it is safe for
// concurrent writers.
type LogBuffer = syncbuf.Buffer

// AssertWholeBatches checks the contract for every batch of a run: one
// tool message per call, in call order, with the right ids, every Action
// finalised, and an empty contract log. It returns the Actions.
func (e *Env) AssertWholeBatches(r Run, wantCalls int) []core.Action {
	e.t.Helper()
	return AssertWholeBatches(e.t, e.Sim, r, wantCalls)
}

// DriveWhole drives the run in process, asserts that it completed with
// whole batches of wantCalls calls in all (AssertWholeBatches), and
// returns its summary and Core's tool messages, in call order.
func (e *Env) DriveWhole(r Run, wantCalls int) (executor.Summary, []core.Message) {
	e.t.Helper()
	sum, err := e.Sidecar.Drive(context.Background(), Request(r), nil)
	if err != nil || sum.Status != executor.StatusCompleted {
		e.t.Fatalf("summary %+v err %v", sum, err)
	}
	e.AssertWholeBatches(r, wantCalls)
	return sum, e.Sim.ToolMessages(r.ThreadID)
}

// AssertOutputs checks that tool message i contains want[i].
func AssertOutputs(t testing.TB, msgs []core.Message, want ...string) {
	t.Helper()
	for i, w := range want {
		if i >= len(msgs) || !strings.Contains(msgs[i].Content, w) {
			t.Errorf("tool message %d of %d does not contain %s: %v", i, len(msgs), w, msgs)
		}
	}
}

// AssertWholeBatches is Env.AssertWholeBatches for a simulator of one's own.
func AssertWholeBatches(t testing.TB, sim *coresim.Sim, r Run, wantCalls int) []core.Action {
	t.Helper()
	// A write Core holds is applied after its client is done with it:
	// what it does to the Action counts too.
	poll.Until(t, "Core to apply the writes it holds", func() bool { return sim.Holding() == 0 })
	if v := sim.Violations(); len(v) != 0 {
		t.Errorf("contract violations: %v", v)
	}
	acts := sim.Actions(r.RunID)
	msgs := sim.ToolMessages(r.ThreadID)
	if len(acts) != wantCalls || len(msgs) != wantCalls {
		t.Fatalf("%d actions and %d tool messages, want %d of each", len(acts), len(msgs), wantCalls)
	}
	for i, a := range acts {
		// An Action whose id is not an id cannot be addressed: its tool
		// message has no tool_id, and it is left as Core has it.
		addressable := core.Addressable(a.ID)
		if wantID := map[bool]string{true: a.ID}[addressable]; msgs[i].ToolCallID != a.ToolCallID || msgs[i].ToolID != wantID {
			t.Errorf("tool message %d has (tool_call_id %s, tool_id %s), want (%s, %s)", i, tool.Excerpt(msgs[i].ToolCallID), tool.Excerpt(msgs[i].ToolID), tool.Excerpt(a.ToolCallID), tool.Excerpt(wantID))
		}
		switch {
		case !addressable:
		case a.Status == core.ActionCompleted, a.Status == core.ActionFailed, a.Status == core.ActionCancelled:
		default:
			t.Errorf("action %s (%s) left %s", a.ID, a.ToolName, a.Status)
		}
	}
	return acts
}

// WaitLive waits until the sidecar at base (its HTTP API) reports a worker
// serving each of the tools, named in order.
func WaitLive(t testing.TB, base string, tools ...string) {
	t.Helper()
	want := `"tools_live":["` + strings.Join(tools, `","`) + `"]`
	poll.Until(t, "workers for "+strings.Join(tools, ", "), func() bool {
		resp, err := http.Get(base + "/readyz?live=1")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), want)
	})
}

// FreeAddr is a loopback address whose port is free at the time of the
// call, for a server that must come back on the same address.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Traced turns tracing on, every trace sampled, with spans sent to an
// OTLP/HTTP collector that takes and drops them: for tests of what tracing
// adds (trace ids in summaries, exemplars, links).
func Traced(t testing.TB) func(*config.Config) {
	t.Helper()
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }))
	t.Cleanup(collector.Close)
	return func(c *config.Config) {
		c.Tracing.OTLPEndpoint, c.Tracing.Insecure, c.Tracing.SampleRatio = strings.TrimPrefix(collector.URL, "http://"), true, 1
	}
}

// SoakReps is how many times a fault test repeats: 1 in make test, more
// under make soak (SOAK_REPS=20).
func SoakReps() int {
	if n, err := strconv.Atoi(os.Getenv("SOAK_REPS")); err == nil && n > 0 {
		return n
	}
	return 1
}

// Echo answers {"echo": <args>}.
func Echo(ctx context.Context, c *tool.Call) ([]byte, error) {
	return []byte(`{"echo": ` + string(c.Args) + `}`), nil
}

// Hang waits for cancellation or its deadline.
func Hang(ctx context.Context, c *tool.Call) ([]byte, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// Delayed is h after d, the time the tool takes (or until the call is
// cancelled).
func Delayed(d time.Duration, h tool.Handler) tool.Handler {
	return func(ctx context.Context, c *tool.Call) ([]byte, error) {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return h(ctx, c)
	}
}

// SourcedTools is GET /v1/tools?source=1 of the sidecar at base, by name.
func SourcedTools(t testing.TB, base string) map[string]tool.SourcedTool {
	t.Helper()
	resp, err := http.Get(base + "/v1/tools?source=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list []tool.SourcedTool
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	out := map[string]tool.SourcedTool{}
	for _, l := range list {
		out[l.Function.Name] = l
	}
	return out
}

// WaitDeclared waits until the sidecar at base lists each named tool as
// declared by a worker whose name starts with the language given for it
// ("go", "node", "python"), and returns the list.
func WaitDeclared(t testing.TB, base string, languages map[string]string) map[string]tool.SourcedTool {
	t.Helper()
	var tools map[string]tool.SourcedTool
	poll.Until(t, "the workers' declarations", func() bool {
		tools = SourcedTools(t, base)
		for name, lang := range languages {
			if !slices.ContainsFunc(tools[name].DeclaredBy, func(by string) bool { return strings.HasPrefix(by, lang+" worker ") }) {
				return false
			}
		}
		return true
	})
	return tools
}
