// Package sidecar assembles the daemon: the embedded or external NATS
// connection, the Core client, the tool registry and its reloader, the
// executor with its routes, the HTTP server, metrics and tracing. `toolsidecar
// run`, `toolsidecar demo` and the tests all build the sidecar here, so that
// what is tested is what runs.
package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/netutil"

	"github.com/projectdavid/toolsidecar/agentsapi"
	"github.com/projectdavid/toolsidecar/agentsup"
	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/coreup"
	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/internal/version"
	"github.com/projectdavid/toolsidecar/ledger"
	"github.com/projectdavid/toolsidecar/live"
	"github.com/projectdavid/toolsidecar/mcpserve"
	"github.com/projectdavid/toolsidecar/openaiup"
	"github.com/projectdavid/toolsidecar/plugins"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/runstore"
	"github.com/projectdavid/toolsidecar/server"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/wire"
)

// ErrShutdownTimeout is the cause given to drives still running when the
// shutdown deadline passes.
var ErrShutdownTimeout = errors.New("sidecar: shutdown deadline passed")

// Option configures a [Sidecar].
type Option func(*options)

type options struct {
	kinds     registry.Kinds
	log       *slog.Logger
	apiKey    *string
	tp        trace.TracerProvider
	cfgPath   string
	overrides []string
}

// WithKinds adds route kinds to the default set (nats, builtin, and
// package plugins' exec, http and mcp). default: none
func WithKinds(k registry.Kinds) Option { return func(o *options) { o.kinds = k } }

// WithLogger sets the logger. default: discard
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithAPIKey gives the Core API key directly, for programs that embed the
// sidecar and hold the key themselves. default: core.api_key_file, else
// TOOLSIDECAR_CORE_API_KEY
func WithAPIKey(key string) Option { return func(o *options) { o.apiKey = &key } }

// WithTracerProvider replaces the tracer provider that the tracing section
// would build.
func WithTracerProvider(tp trace.TracerProvider) Option { return func(o *options) { o.tp = tp } }

// WithReload watches the configuration file at path (loaded with the given
// --set overrides) and puts its tools in force when it changes, and on
// [Sidecar.Reload]. default: no reload
func WithReload(path string, overrides []string) Option {
	return func(o *options) { o.cfgPath, o.overrides = path, overrides }
}

// Sidecar is an assembled daemon. New starts what can fail at start (the
// embedded NATS server, the NATS connection, the listener); Run serves;
// Shutdown stops everything in order.
type Sidecar struct {
	cfg     config.Config
	log     *slog.Logger
	metrics *prometheus.Registry
	started time.Time

	embedded   *embedded.Server // nil with an external NATS
	instance   string
	ledger     *ledger.Ledger // nil unless durable
	leases     *ledger.Leases // nil unless durable
	durableOff string         // why durable mode is off, when it is
	tempStore  string         // a store folder of this run only, removed at shutdown
	natsURL    string
	nc         *nats.Conn
	// What discovery knows of the tools workers declare (see redeclare).
	bus *busTools
	// natsLife says when the NATS connection closed, and whether the
	// sidecar had asked for it: a close it did not ask for stops it.
	natsLife    *bridge.Lifeline
	client      *bridge.Client
	live        *registry.Live
	offered     *registry.Screen // the registry's tools as the model gets them
	leftOut     *prometheus.CounterVec
	reloader    *registry.Reloader // nil without WithReload
	exec        *executor.Executor
	openai      *openaiup.Upstream // nil unless upstream.kind is openai or anthropic
	agents      *agentsup.Upstream // nil unless upstream.kind is openai-agents or anthropic-agents
	watcher     *agentsup.Watcher  // the hosted sessions' watches, with agents
	approvals   approval.Store     // the ledger's when durable
	board       *live.Board        // nil with server.ui false
	srv         *server.Server
	hs          *http.Server
	ln          net.Listener
	opsHS       *http.Server // nil without server.ops_listen
	opsLn       net.Listener
	stopTracing func(context.Context) error
	tp          trace.TracerProvider
	cancelBase  context.CancelCauseFunc

	runCtx    context.Context // ends when shutdown begins; stops the reloader
	stopRun   context.CancelFunc
	wg        sync.WaitGroup // Run's goroutines
	closers   []func()       // undo New, last first
	shutOnce  sync.Once
	shutError error
}

// StartError is a failure to assemble the sidecar (New): a port in use, a
// server that cannot be reached, a file that cannot be read.
type StartError struct{ Err error }

func (e *StartError) Error() string { return "failed to start: " + e.Err.Error() }
func (e *StartError) Unwrap() error { return e.Err }

// Start assembles a sidecar for cfg: it starts what can fail at start (the
// embedded NATS server, the NATS connection, the tools' imports, the
// listeners), within ctx. On error, whatever it started is stopped again,
// and the error is a *StartError. Run serves; Shutdown stops.
func Start(ctx context.Context, cfg config.Config, opts ...Option) (_ *Sidecar, err error) {
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	s := &Sidecar{cfg: cfg, log: o.log, started: time.Now(), instance: instanceID(cfg)}
	defer func() {
		if err != nil {
			s.undo()
			err = &StartError{Err: err}
		}
	}()
	s.metrics = prometheus.NewRegistry()
	s.metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := s.connectNATS(ctx); err != nil {
		return nil, err
	}
	kinds := plugins.Kinds(registry.Base(s.client), plugins.Options{MaxExecProcesses: cfg.Executor.MaxExecProcesses,
		Logger: s.log.With("component", "plugins")}).With(o.kinds)
	s.closers = append(s.closers, func() { _ = kinds.Close() })
	reg, err := registry.New(ctx, cfg, kinds)
	if err != nil {
		return nil, err
	}
	if reg, err = s.declaredAtStart(ctx, reg); err != nil {
		return nil, err
	}
	s.live = registry.NewLive(reg)
	s.leftOut = registry.LeftOutMetric(s.metrics)
	s.offered = registry.NewScreen("model", s.leftOut, s.log.With("component", "registry"))
	s.stopTracing = func(context.Context) error { return nil }
	otel.SetTextMapPropagator(propagator) // the server reads callers' traceparent through it
	// The SDK's own errors (an export that failed) go to the structured
	// log, not to stderr as plain lines among the JSON records.
	tlog := s.log.With("component", "telemetry")
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { tlog.Warn("telemetry error", "err", err) }))
	if s.tp = o.tp; s.tp == nil {
		if s.tp, s.stopTracing, err = tracerProvider(s.cfg.Tracing); err != nil {
			return nil, err
		}
	}
	s.registerInfo()
	cc, err := s.coreClient(o.apiKey)
	if err != nil {
		return nil, err
	}
	if err := s.buildExecutor(cc); err != nil {
		return nil, err
	}
	if o.cfgPath == "" {
		registry.RegisterReloadMetrics(s.metrics)
	} else {
		s.reloader = registry.NewReloader(o.cfgPath, o.overrides, cfg, s.live, s.metrics, s.log.With("component", "reload"))
	}
	if err := s.buildServer(cc.Transport()); err != nil {
		return nil, err
	}
	s.runCtx, s.stopRun = context.WithCancel(context.Background())
	return s, nil
}

// undo stops what New started, last first.
func (s *Sidecar) undo() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// connectNATS starts the embedded server when no URL is configured, then
// connects (in process to the embedded server) and opens the dispatch
// client.
func (s *Sidecar) connectNATS(ctx context.Context) error {
	s.natsURL = s.cfg.NATS.URL
	cc, extra := connectConfig(s.cfg.NATS, s.natsURL, "toolsidecar"), []nats.Option(nil)
	if s.natsURL == "" {
		ecfg, err := embeddedConfig(s.cfg.NATS)
		if err != nil {
			return err
		}
		dir, credsPath := "", s.cfg.NATS.Embedded.WorkerCredentialsFile
		if s.cfg.Durability.Enabled || s.cfg.NATS.Embedded.WorkerCredentials && credsPath == "" {
			if dir, err = s.storeDir(); err != nil {
				return err
			}
		}
		if s.cfg.Durability.Enabled {
			ecfg.StoreDir = dir
		}
		if credsPath == "" {
			credsPath = filepath.Join(dir, wire.CredentialsFile)
		}
		var issued *embedded.Worker
		if s.cfg.NATS.Embedded.WorkerCredentials {
			w, err := issueWorkerUser(credsPath, s.cfg.NATS.SubjectPrefix, restrictedTools(s.cfg.NATS))
			if err != nil {
				return err
			}
			ecfg.Workers, issued = append(ecfg.Workers, w), &w
		}
		if ecfg.StoreDir != "" && ecfg.SyncPeriodic {
			s.log.Warn("the embedded NATS server acknowledges JetStream writes before they are on disk (nats.embedded.sync: periodic): " +
				"a power failure or an OS crash loses them, and an unsafe call whose record is lost may run again")
		}
		if ecfg.AllowAnonymous {
			s.log.Warn("the embedded NATS server lets clients without credentials in, with every permission (nats.embedded.allow_anonymous)")
		}
		ns, err := embedded.Start(ecfg)
		if err != nil {
			return err
		}
		s.embedded, s.natsURL = ns, ns.ClientURL()
		s.closers = append(s.closers, ns.Shutdown)
		s.log.Info("embedded NATS started", "url", s.natsURL, "worker_users", len(ecfg.Workers))
		if issued != nil {
			if err := writeWorkerCredentials(credsPath, s.natsURL, *issued); err != nil {
				return err
			}
			s.log.Info("worker credentials written: a worker library reads them there, or from the file "+wire.CredentialsEnv+" names",
				"path", credsPath, "user", issued.Name)
		}
		cc, extra = bridge.ConnectConfig{URL: ns.InProcessURL(), Name: "toolsidecar"}, ns.ConnectOptions()
	} else if err := readNATSSecrets(s.cfg.NATS, &cc); err != nil {
		return err
	} else {
		// While the first connection is retried, the probes say why the
		// sidecar is not ready yet.
		w := &startingProbes{log: s.log}
		defer w.stop()
		cc.OnRetry = func(err error) {
			w.notReady(fmt.Sprintf("starting: connecting to NATS at %s: %v (retrying)", config.RedactURL(cc.URL), err),
				s.cfg.Server.Listen, s.cfg.Server.OpsListen)
		}
	}
	// After a reconnection, calls in flight look for the replies that came
	// while the sidecar was cut off (durable mode keeps them).
	var client atomic.Pointer[bridge.Client] // set below; the hook may run on NATS's goroutine meanwhile
	cc.OnReconnect = func() {
		if c := client.Load(); c != nil {
			c.Resync()
		}
	}
	s.natsLife = bridge.NewLifeline(s.log.With("component", "nats"))
	nc, err := bridge.Connect(ctx, cc, s.metrics, s.log, append(extra, s.natsLife.Option())...)
	if err != nil {
		return err
	}
	s.nc = nc
	s.closers = append(s.closers, nc.Close)
	bopts := []bridge.Option{bridge.WithMetrics(s.metrics)}
	if s.cfg.Durability.Enabled {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		l, err := ledger.Open(ctx, nc, ledger.Config{Prefix: s.cfg.NATS.SubjectPrefix, Instance: s.instance, Replicas: s.cfg.Durability.Replicas,
			MaxBytes: s.cfg.Durability.MaxBytes, MaxReplyBytes: int32(s.cfg.Executor.MaxResultBytes + 64<<10),
			JournalTTL: s.cfg.Upstream.JournalTTL})
		cancel()
		switch {
		case errors.Is(err, ledger.ErrNoJetStream):
			s.durableOff = "the NATS server has no JetStream"
			s.log.Warn("durable mode off: the NATS server has no JetStream; replies that arrive while the sidecar is away are lost", "err", err)
		case err != nil:
			return err
		default:
			lctx, lcancel := context.WithTimeout(context.Background(), 10*time.Second)
			ls, err := ledger.OpenLeases(lctx, nc, ledger.LeaseConfig{Prefix: s.cfg.NATS.SubjectPrefix, Instance: s.instance,
				Replicas: s.cfg.Durability.Replicas, TTL: s.cfg.Durability.LeaseTTL, Metrics: s.metrics, MaxBytes: s.cfg.Durability.MaxBytes}, s.log.With("component", "leases"))
			lcancel()
			if err != nil {
				return err
			}
			s.ledger, s.leases = l, ls
			s.closers = append(s.closers, ls.Close)
			bopts = append(bopts, bridge.WithInbox(l.Inbox()), bridge.WithLedger(l))
			s.log.Info("durable mode on", "instance_id", s.instance, "replies", l.Inbox()+".*")
		}
	}
	if !s.cfg.Durability.Enabled {
		s.durableOff = "durability.enabled is false"
	}
	durable := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "toolsidecar", Name: "durable",
		Help: "1 when durable mode is on (outcome ledger and captured replies on JetStream), else 0."})
	if s.ledger != nil {
		durable.Set(1)
	}
	s.metrics.MustRegister(durable)
	if s.client, err = bridge.Open(nc, s.cfg.NATS.SubjectPrefix, bopts...); err != nil {
		return err
	}
	client.Store(s.client)
	s.closers = append(s.closers, func() { _ = s.client.Close() })
	return nil
}

// storeDir is where the embedded server keeps JetStream's files: the
// configured folder, or one under the temporary folder named by the listen
// port (a random port gets a fresh folder, removed at shutdown). Each is
// checked as storedir.go says.
func (s *Sidecar) storeDir() (string, error) {
	if d := s.cfg.NATS.Embedded.StoreDir; d != "" {
		return d, checkStoreDir(d, s.log)
	}
	_, port, _ := net.SplitHostPort(s.cfg.NATS.Embedded.Listen)
	if port == "-1" || port == "0" {
		d, err := os.MkdirTemp("", "toolsidecar-nats-")
		if err != nil {
			return "", err
		}
		s.closers = append(s.closers, func() { os.RemoveAll(d) })
		s.tempStore = d
		return d, nil
	}
	d := filepath.Join(os.TempDir(), "toolsidecar-nats-"+port)
	return d, privateStoreDir(d)
}

// instanceID is the configured instance_id, else the hostname, made a
// valid subject token.
func instanceID(cfg config.Config) string {
	id := cfg.InstanceID
	if id == "" {
		id, _ = os.Hostname()
	}
	if id == "" {
		id = "toolsidecar"
	}
	return strings.Map(func(r rune) rune {
		if r == '.' || r == '*' || r == '>' || r == ' ' || r < 0x21 {
			return '_'
		}
		return r
	}, id)
}

// workerUser is an embedded server's worker user without its secret: it
// may serve its tools ("*" is every tool) through the workers' queue group
// only (a plain subscription to a tool's subject would receive every call
// of it, beside the worker that runs it), subscribe to the cancel subject,
// and publish replies: to the requests it got, and to the sidecar's
// durable namespace, so that a reply buffered while NATS restarted is
// still allowed after the reconnect (those subjects end in unguessable
// tokens). It may read nothing of the namespaces only sidecars read, not
// even through a wildcard (wire.SidecarsOnly): another call's progress
// would give away its reply subject, and with it the call's outcome.
// Only the workers that may serve a tool receive its describe requests,
// so only they declare it (discovery.Describe).
func workerUser(prefix, name string, tools []string) embedded.Worker {
	w := embedded.Worker{Name: name, Subscribe: []string{wire.CancelWildcard(prefix)}, DenySubscribe: wire.SidecarsOnly(prefix),
		Publish: []string{wire.RepliesWildcard(prefix)}}
	for _, t := range tools {
		w.Subscribe = append(w.Subscribe, wire.Subject(prefix, t)+" "+wire.QueueGroup)
	}
	return w
}

// restrictedTools are the tools that the configuration gives to named
// worker users: the issued credential may not serve them.
func restrictedTools(n config.NATS) []string {
	var out []string
	for _, w := range n.Embedded.Workers {
		for _, t := range w.Tools {
			if t != "*" && !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	return out
}

// embeddedConfig turns the embedded section into the server's users: each
// worker may subscribe to its tools' subjects and the cancel subject.
func embeddedConfig(n config.NATS) (embedded.Config, error) {
	ecfg := embedded.Config{Listen: n.Embedded.Listen, AllowAnonymous: n.Embedded.AllowAnonymous,
		SyncPeriodic: n.Embedded.Sync == config.SyncPeriodic}
	for i, w := range n.Embedded.Workers {
		ew := workerUser(n.SubjectPrefix, w.Name, w.Tools)
		ew.NKey = w.NKey
		if w.PasswordFile != "" {
			var err error
			if ew.Password, err = config.ReadSecret(fmt.Sprintf("nats.embedded.workers[%d].password_file", i), w.PasswordFile); err != nil {
				return ecfg, err
			}
		}
		ecfg.Workers = append(ecfg.Workers, ew)
	}
	if t := n.Embedded.TLS; t.CertFile != "" {
		tc, err := serverTLS(t)
		if err != nil {
			return ecfg, fmt.Errorf("sidecar: nats.embedded.tls: %w", err)
		}
		ecfg.TLS = tc
	}
	return ecfg, nil
}

// readNATSSecrets reads the credentials of an external NATS from their
// files into cc.
func readNATSSecrets(n config.NATS, cc *bridge.ConnectConfig) error {
	var err error
	if n.PasswordFile != "" {
		if cc.Password, err = config.ReadSecret("nats.password_file", n.PasswordFile); err != nil {
			return err
		}
	}
	if n.TokenFile != "" {
		if cc.Token, err = config.ReadSecret("nats.token_file", n.TokenFile); err != nil {
			return err
		}
	}
	return nil
}

// connectConfig is the one mapping from the nats section to a connection;
// the sidecar and `toolsidecar worker` both use it. Secrets are read by
// readNATSSecrets.
func connectConfig(c config.NATS, url, name string) bridge.ConnectConfig {
	return bridge.ConnectConfig{URL: url, Name: name, CredsFile: c.CredsFile, User: c.User, NKeySeedFile: c.NKeySeedFile,
		CAFile: c.TLS.CAFile, CertFile: c.TLS.CertFile, KeyFile: c.TLS.KeyFile, FirstTry: c.ConnectRetry}
}

func (s *Sidecar) coreClient(key *string) (*core.Client, error) {
	var apiKey string
	if key != nil {
		apiKey = *key
	} else {
		var err error
		if apiKey, err = s.cfg.APIKey(); err != nil {
			return nil, err
		}
	}
	opts := []core.Option{core.WithMetrics(s.metrics)}
	tc, err := coreTLS(s.cfg.Core.TLS)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, core.WithTLS(tc))
	}
	// Calls to Core carry the drive's traceparent, and become client spans
	// of the drive when spans are recorded.
	opts = append(opts, core.WithRoundTripper(func(rt http.RoundTripper) http.RoundTripper { return coreTransport(s.tp, rt) }))
	return core.New(core.Config{URL: s.cfg.Core.URL, APIKey: apiKey, Timeout: s.cfg.Core.Timeout, ConnectTimeout: s.cfg.Core.ConnectTimeout,
		StreamIdleTimeout: s.cfg.Core.StreamIdleTimeout, MaxConns: s.cfg.Core.MaxConnections, IdleTimeout: s.cfg.Core.IdleTimeout,
		MaxFrameBytes: maxFrameBytes(s.cfg.Executor.MaxArgsBytes)}, opts...)
}

// maxFrameBytes bounds a frame of an upstream's stream, while it is read,
// by the arguments a call may have: a manifest's ids and envelope beside
// them, or the informational tool_call chunk, whose arguments are one JSON
// string (escaping may double them). A manifest past it is its own call's
// invalid_args outcome; one between max_args_bytes and it says by how
// much its arguments are over.
func maxFrameBytes(maxArgs int) int { return 2*maxArgs + 64<<10 }

// buildExecutor wires the loop: NATS for route nats, the in-process
// transport for every other route kind.
func (s *Sidecar) buildExecutor(cc *core.Client) error {
	tr := s.tp.Tracer("github.com/projectdavid/toolsidecar")
	metrics := executor.NewMetrics(s.metrics, func(t string) bool { _, ok := s.live.Load().Lookup(t); return ok },
		s.live.Load().Names(), longestCall(s.live.Load()))
	s.live.Watch(func(r *registry.Registry) { metrics.InitTools(r.Names()) })
	opts := []executor.Option{executor.WithLogger(s.log.With("component", "executor")), executor.WithTracer(tr),
		executor.WithRecoverer(recoverer(s.ledger)),
		executor.WithObserver(metrics)}
	if s.leases != nil {
		opts = append(opts, executor.WithLeases(runLeases{s.leases}))
	}
	s.approvals = approval.NewMemory()
	if s.ledger != nil {
		opts = append(opts, executor.WithMemo(ledgerMemo{s.ledger, s.log.With("component", "dedupe")}), executor.WithResultStore(s.ledger))
		s.approvals = s.ledger.Approvals()
	}
	opts = append(opts, executor.WithApprovals(s.approvals))
	if s.cfg.Server.UI {
		s.board = live.NewBoard(s.cfg.Server.UIHistory)
		opts = append(opts, executor.WithTap(s.board.Observe))
	}
	up, err := s.upstream(cc)
	if err != nil {
		return err
	}
	s.exec = executor.New(ExecutorConfig(s.cfg.Executor), up, s.live, opts...)
	return nil
}

// ExecutorConfig is the executor's settings from the configuration's
// executor section, whose defaults config.Default gave.
func ExecutorConfig(c config.Executor) executor.Config {
	return executor.Config{MaxTurns: c.MaxTurns, MaxParallel: c.MaxParallel, FailRunOnMissingTool: c.MissingTool == config.MissingToolFailRun,
		MaxArgsBytes: c.MaxArgsBytes, MaxResultBytes: c.MaxResultBytes, MaxErrorBytes: c.MaxErrorBytes,
		CancelPoll: c.CancelPoll, CancelPollRPS: c.CancelPollRPS, SubmitBudget: c.SubmitBudget,
		RunBudget: executor.RunBudget{MaxCalls: c.RunBudget.MaxCalls, MaxToolTime: c.RunBudget.MaxToolTime, MaxResultBytes: c.RunBudget.MaxResultBytes,
			Stop: c.RunBudget.OnBudget == config.OnBudgetStop},
		ClaimCheckPreviewBytes: c.ClaimCheckPreviewBytes, ReadPageBytes: c.ClaimCheckBytes, MaxHedgeRatio: c.MaxHedgeRatio}
}

// upstream is the side where the model is: Core, or an OpenAI-compatible
// server that the sidecar's POST /v1/chat/completions drives.
func (s *Sidecar) upstream(cc *core.Client) (executor.Upstream, error) {
	if s.cfg.Upstream.Hosted() {
		return s.hostedUpstream()
	}
	if !s.cfg.Upstream.Model() {
		return coreup.New(cc), nil
	}
	key, err := s.cfg.UpstreamAPIKey()
	if err != nil {
		return nil, err
	}
	// Turns carry the drive's traceparent, as Core's requests do.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// One dial waits no longer than the whole of upstream.connect_timeout.
	tr.DialContext = (&net.Dialer{Timeout: s.cfg.Upstream.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext
	client := &http.Client{Transport: coreTransport(s.tp, tr)}
	var journal runstore.Journal
	if s.ledger != nil {
		journal = s.ledger.Journal()
	} else {
		journal = runstore.NewMemoryJournal(s.cfg.Upstream.JournalTTL, memoryJournalBytes)
	}
	s.openai, err = openaiup.New(openaiup.Config{API: s.cfg.Upstream.Kind, URL: s.cfg.Upstream.URL, APIKey: key, Client: client, Journal: journal,
		RetryBudget: s.cfg.Upstream.RetryBudget, IdleTimeout: s.cfg.Upstream.StreamIdleTimeout, ConnectTimeout: s.cfg.Upstream.ConnectTimeout, Logger: s.log,
		MaxResponseBytes: maxFrameBytes(s.cfg.Executor.MaxArgsBytes),
		Unsafe: func(name string) bool {
			t, ok := s.live.Load().Lookup(name)
			return ok && t.SideEffects == config.Unsafe
		}})
	return s.openai, err
}

// blockCalls sizes the bound of a hosted session's event: one that
// carries every call of a block is read whole up to this many calls'
// bounds (9.2 MiB at the default max_args_bytes), as a model API's turn.
const blockCalls = 16

// hostedUpstream is a hosted agent API's sessions (upstream.kind
// openai-agents or anthropic-agents), watched for the registry's calls.
func (s *Sidecar) hostedUpstream() (executor.Upstream, error) {
	key, err := s.cfg.UpstreamAPIKey()
	if err != nil {
		return nil, err
	}
	client := &http.Client{Transport: coreTransport(s.tp, http.DefaultTransport.(*http.Transport).Clone())}
	// One event (OpenAI's requires_action) or read carries every pending
	// call of a block with its arguments, each bounded by max_args_bytes
	// (the executor refuses a longer one as invalid_args): sized for 16.
	acfg := agentsapi.Config{URL: s.cfg.Upstream.URL, HTTP: client, MaxEventBytes: blockCalls * maxFrameBytes(s.cfg.Executor.MaxArgsBytes),
		IdleTimeout: s.cfg.Upstream.StreamIdleTimeout, RetryBudget: s.cfg.Upstream.RetryBudget, Logger: s.log.With("component", s.cfg.Upstream.Kind)}
	var api agentsapi.API
	if s.cfg.Upstream.Kind == config.UpstreamAnthropicAgents {
		api, err = agentsapi.NewAnthropic(acfg)
	} else {
		api, err = agentsapi.NewOpenAI(acfg)
	}
	if err != nil {
		return nil, err
	}
	var journal runstore.Journal // the ledger's, in durable mode: a restart finds what was started and answered
	if s.ledger != nil {
		journal = s.ledger.Journal()
	}
	var approvals approval.Store // with confirmations: approval, the same store as the tools' approvals
	if s.cfg.Upstream.Confirmations == config.ConfirmByApproval {
		approvals = s.approvals
	}
	s.agents, err = agentsup.New(agentsup.Config{API: api, APIKey: key, Logger: s.log, Journal: journal, Approvals: approvals,
		Owns: func(name string) bool { _, ok := s.live.Load().Lookup(name); return ok },
		Unsafe: func(name string) bool {
			t, ok := s.live.Load().Lookup(name)
			return ok && t.SideEffects == config.Unsafe
		}})
	return s.agents, err
}

// buildServer builds the API; coreRT reaches Core for the proxy and the
// readiness probe, with the Core client's TLS.
func (s *Sidecar) buildServer(coreRT http.RoundTripper) error {
	var token, operator string
	for _, sec := range []struct {
		key, file string
		into      *string
	}{{"server.auth_token_file", s.cfg.Server.AuthTokenFile, &token}, {"server.operator_token_file", s.cfg.Server.OperatorTokenFile, &operator}} {
		if sec.file == "" {
			continue
		}
		var err error
		if *sec.into, err = config.ReadSecret(sec.key, sec.file); err != nil {
			return err
		}
	}
	if operator != "" && operator == token {
		return errors.New("server.operator_token_file holds the API token of server.auth_token_file: every caller would see every other's runs; give the operator a token of its own")
	}
	scfg := server.Config{Token: token, Operator: operator, AllowedHosts: s.cfg.Server.AllowedHosts, MaxBodyBytes: s.cfg.Server.MaxBodyBytes, MaxDrives: s.cfg.Server.MaxDrives, Gatherer: s.metrics, SSEKeepalive: s.cfg.Server.SSEKeepalive, SSEResumeGrace: s.cfg.Server.SSEResumeGrace,
		Logger: s.log.With("component", "server"), Ready: readiness(s.cfg.Core, coreRT, s.nc.IsConnected), Live: s.natsLife.Err, ReadyInfo: s.readyInfo,
		Pprof: s.cfg.Server.Pprof, Approvals: s.approvals}
	switch {
	case s.agents != nil:
		w, err := agentsup.NewWatcher(agentsup.WatcherConfig{Upstream: s.agents, Drive: s.exec.Drive, Max: s.cfg.Upstream.MaxSessions,
			MaxPerOwner: s.cfg.Upstream.MaxSessionsPerOwner})
		if err != nil {
			return err
		}
		var own string // with the sidecar's own token, sessions are its upstream key's
		if token != "" {
			if own, err = s.cfg.UpstreamAPIKey(); err != nil {
				return err
			}
			// OpenAI's key travels in Authorization, which then carries
			// the sidecar's token: without a key of its own the sidecar
			// would have none to send.
			if own == "" && s.cfg.Upstream.Kind == config.UpstreamOpenAIAgents {
				return fmt.Errorf("upstream.kind %s with server.auth_token_file needs the sidecar's own upstream key (upstream.api_key_file or %s): callers' Authorization header carries the sidecar's token", s.cfg.Upstream.Kind, config.UpstreamAPIKeyEnv)
			}
		}
		ep, err := agentsup.NewEndpoint(agentsup.EndpointConfig{URL: s.cfg.Upstream.URL, Kind: s.cfg.Upstream.Kind, Watcher: w, OwnKey: own, SidecarToken: token != "",
			Transport: coreTransport(s.tp, http.DefaultTransport.(*http.Transport).Clone()), MaxBodyBytes: maxFrameBytes(s.cfg.Executor.MaxArgsBytes), Logger: s.log})
		if err != nil {
			return err
		}
		s.watcher = w
		for _, p := range ep.Patterns() {
			scfg.Routes = append(scfg.Routes, server.Route{Pattern: p, Handler: ep, AnyBody: true, Errors: ep.WriteError})
		}
		if f := s.cfg.Upstream.WebhookSecretFile; f != "" {
			secret, err := config.ReadSecret("upstream.webhook_secret_file", f)
			if err != nil {
				return err
			}
			key, err := s.cfg.UpstreamAPIKey()
			if err != nil {
				return err
			}
			wh, err := agentsup.NewWebhook(agentsup.WebhookConfig{Kind: s.cfg.Upstream.Kind, Watcher: w, Secret: secret, Key: key, Logger: s.log, Metrics: s.metrics})
			if err != nil {
				return err
			}
			scfg.Signed = append(scfg.Signed, server.Route{Pattern: wh.Pattern(), Handler: wh})
		}
	case s.openai != nil:
		var memo executor.Memo // memory, unless durable
		if s.ledger != nil {
			memo = ledgerMemo{s.ledger, s.log.With("component", s.cfg.Upstream.Kind)}
		}
		var driven func(context.Context, string) (bool, error)
		if s.leases != nil {
			driven = s.leases.Driven
		}
		ep := openaiup.NewEndpoint(openaiup.EndpointConfig{Upstream: s.openai, Drive: s.exec.Drive, Memo: memo, Driven: driven,
			Tools:                func() []tool.FunctionTool { return s.offered.FunctionTools(s.live.Load()) },
			ForwardAuthorization: token == "", KeepAlive: s.cfg.Server.SSEKeepalive, Logger: s.log})
		scfg.Routes = []server.Route{{Pattern: ep.Pattern(), Handler: ep, Drive: true, Errors: ep.WriteError, Forwarded: true}}
	case s.cfg.Server.Proxy:
		p, err := coreup.NewProxy(coreup.ProxyConfig{CoreURL: s.cfg.Core.URL, Transport: coreRT, Drive: s.exec.Drive,
			RunCancelled: func(runID string) { s.exec.CancelRun(runID) }, Logger: s.log.With("component", "server")})
		if err != nil {
			return err
		}
		scfg.Routes = []server.Route{{Pattern: "POST /v1/completions", Handler: p.Completions, Drive: true}, {Pattern: "/v1/", Handler: p.Forward, AnyBody: true}}
	}
	if s.board != nil {
		pages := live.Pages()
		for _, p := range []string{"GET /ui", "GET /ui/{$}", "GET /ui/app.js", "GET /ui/style.css"} {
			scfg.Pages = append(scfg.Pages, server.Route{Pattern: p, Handler: pages})
		}
		access := live.Access{Operator: operator, Token: token}
		runs := live.Runs(s.board, access)
		scfg.Routes = append(scfg.Routes, server.Route{Pattern: "GET /ui/events", Handler: live.Events(live.Config{Board: s.board, Access: access,
			Approvals: s.approvals, Keepalive: s.cfg.Server.SSEKeepalive, TraceURL: s.cfg.Server.UITraceURL, Logger: s.log.With("component", "ui")})},
			// Under /v1/sidecar/, not /v1/runs/: in proxy mode that is Core's.
			server.Route{Pattern: "GET /v1/sidecar/runs", Handler: runs}, server.Route{Pattern: "GET /v1/sidecar/runs/{run_id}", Handler: runs})
	}
	if s.cfg.Server.MCP {
		scfg.Routes = append(scfg.Routes, server.Route{Pattern: "/mcp", Handler: mcpserve.New(s.live, s.exec.Call,
			registry.NewScreen("mcp", s.leftOut, s.log.With("component", "mcp")))})
	}
	srv, err := server.New(scfg, s.exec.Drive, tools{live: s.live, offered: s.offered, client: s.client})
	if err != nil {
		return err
	}
	base, cancelBase := context.WithCancelCause(context.Background())
	s.srv, s.cancelBase = srv, cancelBase
	if s.ln, s.hs, err = s.listen("server.listen", s.cfg.Server.Listen, srv, base); err != nil {
		return err
	}
	if s.cfg.Server.HTTP2Cleartext {
		serveCleartextHTTP2(s.hs, s.cfg.Server.MaxStreams)
	}
	if s.board != nil {
		s.hs.RegisterOnShutdown(s.board.Close)
	}
	if s.cfg.Server.OpsListen != "" {
		if s.opsLn, s.opsHS, err = s.listen("server.ops_listen", s.cfg.Server.OpsListen, srv.Ops(), base); err != nil {
			return err
		}
	}
	return nil
}

// listen opens a listener, bounded in connections, and the HTTP server for
// it, bounded in time and header size. The write timeout applies to short
// answers; drives lift it (they stream, or wait on the model).
func (s *Sidecar) listen(key, addr string, h http.Handler, base context.Context) (net.Listener, *http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("sidecar: %s: %w", key, err)
	}
	s.closers = append(s.closers, func() { _ = ln.Close() })
	return netutil.LimitListener(ln, s.cfg.Server.MaxConnections), httpServer(s.cfg.Server, h, base, s.log), nil
}

// httpServer is an HTTP server with server.*'s bounds on a connection.
func httpServer(c config.Server, h http.Handler, base context.Context, log *slog.Logger) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: c.ReadHeaderTimeout, ReadTimeout: c.ReadTimeout,
		WriteTimeout: writeTimeout, IdleTimeout: c.IdleTimeout, MaxHeaderBytes: c.MaxHeaderBytes,
		BaseContext: func(net.Listener) context.Context { return base },
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
}

// serveCleartextHTTP2 makes hs speak HTTP/2 without TLS as well, at most
// maxStreams requests at once per connection. A drive held open over
// HTTP/1.1 costs a connection, its buffers and net/http's reader
// goroutine, which many drives on one HTTP/2 connection share
// (BENCHMARKS.md).
func serveCleartextHTTP2(hs *http.Server, maxStreams int) {
	hs.Protocols = new(http.Protocols)
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	hs.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: maxStreams}
}

// writeTimeout bounds writing a short answer (health, metrics, tools).
const writeTimeout = 60 * time.Second

// OpsAddr is the address of the ops listener, or "" without one.
func (s *Sidecar) OpsAddr() string {
	if s.opsLn == nil {
		return ""
	}
	return s.opsLn.Addr().String()
}

// Addr is the address the HTTP API listens on.
func (s *Sidecar) Addr() string { return s.ln.Addr().String() }

// Routes are the patterns the API listener serves (server.Server's
// Patterns): which depend on upstream.kind and the server settings.
func (s *Sidecar) Routes() []string { return s.srv.Patterns() }

// NATSURL is the URL of the NATS server the sidecar uses; workers connect
// there.
func (s *Sidecar) NATSURL() string { return s.natsURL }

// Metrics is the sidecar's Prometheus registry, as served on /metrics.
func (s *Sidecar) Metrics() prometheus.Gatherer { return s.metrics }

// Tools is the registry in force.
func (s *Sidecar) Tools() *registry.Registry { return s.live.Load() }

// Drive drives one run in process, as the drive API does.
func (s *Sidecar) Drive(ctx context.Context, req executor.Request, sink executor.Sink) (executor.Summary, error) {
	return s.exec.Drive(ctx, req, sink)
}

// Reload re-reads the configuration file now (SIGHUP); what it imports is
// read within ctx. Without WithReload it does nothing.
func (s *Sidecar) Reload(ctx context.Context) error {
	if s.reloader == nil {
		return nil
	}
	return s.reloader.Reload(ctx)
}

// Run serves the HTTP API (and watches the configuration file) until ctx
// ends, then shuts down within server.shutdown_timeout; or until Shutdown
// is called elsewhere. It returns an error when the listener fails.
func (s *Sidecar) Run(ctx context.Context) error {
	serveErr := make(chan error, 2)
	s.wg.Go(func() { serveErr <- s.hs.Serve(s.ln) })
	if s.opsHS != nil {
		s.wg.Go(func() { serveErr <- s.opsHS.Serve(s.opsLn) })
	}
	if s.reloader != nil {
		s.wg.Go(func() { s.reloader.Run(s.runCtx, 2*time.Second, nil) })
	}
	if every := s.cfg.NATS.DiscoverInterval; every > 0 {
		s.wg.Go(func() { s.discover(s.runCtx, every) })
	}
	s.log.Info("toolsidecar ready", "listen", s.Addr(), "ops_listen", s.OpsAddr(), "upstream", s.cfg.Upstream.Kind, "upstream_url", s.upstreamURL(),
		"nats", config.RedactURL(s.natsURL),
		"tools", len(s.live.Load().Names()), "proxy", s.cfg.Server.Proxy, "startup_ms", time.Since(s.started).Milliseconds())
	var err error
	select {
	case <-ctx.Done():
		s.log.Info("shutting down: finishing in-flight batches", "timeout", s.cfg.Server.ShutdownTimeout)
	case <-s.natsLife.Closed():
		if err = s.natsLife.Err(); err == nil {
			return nil // Shutdown was called
		}
		err = fmt.Errorf("sidecar: %w", err)
		// No reply can come: the calls in flight are left at once, as a
		// crash would leave them, for the next drive of their runs.
		s.log.Error("shutting down: NATS is gone; the calls in flight are left for the next drive of their runs")
		s.exec.Abandon()
	case err = <-serveErr:
		if errors.Is(err, http.ErrServerClosed) {
			return nil // Shutdown was called
		}
		err = fmt.Errorf("sidecar: serving http: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Server.ShutdownTimeout)
	defer cancel()
	return errors.Join(err, s.Shutdown(sctx))
}

// Shutdown stops the sidecar in reverse order of dependence: no new turn
// and no new request; in-flight batches finish and are submitted until
// ctx's deadline; then the drives still running are abandoned as a crash
// would leave them (their unfinished calls stay open, with no write, for
// the next drive of their runs: executor.Abandon); then the
// reloader stops, NATS is drained and the embedded server stops; last, the
// traces still buffered are flushed. It is safe to call more than once.
func (s *Sidecar) Shutdown(ctx context.Context) error {
	s.shutOnce.Do(func() { s.shutError = s.shutdown(ctx) })
	return s.shutError
}

func (s *Sidecar) shutdown(ctx context.Context) error {
	s.natsLife.Stopping()
	s.exec.Drain()
	if s.watcher != nil {
		s.watcher.Close(ctx) // the drives finish their batches, then the watches end
	}
	if err := s.hs.Shutdown(ctx); err != nil {
		s.log.Warn("shutdown deadline: the calls still running are left, open, for the next drive of their runs", "err", err)
		s.exec.Abandon() // before the requests' contexts end, so that their cause is the executor's
		s.cancelBase(ErrShutdownTimeout)
		s.srv.Wait()
	}
	s.cancelBase(nil)
	if s.opsHS != nil {
		_ = s.opsHS.Close() // probes and scrapes are short: no drain
	}
	s.stopRun()
	s.wg.Wait()
	_ = s.live.Load().Kinds().Close() // the drives have ended: no call uses a session
	if s.leases != nil {
		s.leases.Close() // the drives have ended and released theirs
	}
	_ = s.client.Close()
	if err := s.nc.Drain(); err != nil {
		s.log.Warn("draining NATS", "err", err)
		s.nc.Close()
	}
	<-s.natsLife.Closed() // Drain closes the connection, at the latest after its timeout
	s.closers = nil
	if s.embedded != nil {
		s.embedded.Shutdown()
	}
	if s.tempStore != "" {
		_ = os.RemoveAll(s.tempStore)
	}
	_ = s.ln.Close() // when Run never served
	if s.opsLn != nil {
		_ = s.opsLn.Close()
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.stopTracing(fctx); err != nil {
		s.log.Warn("flushing traces", "err", err)
	}
	s.log.Info("toolsidecar stopped")
	return nil
}

// readyInfo tells /readyz whether durable mode is on, and why not.
func (s *Sidecar) readyInfo() map[string]any {
	if s.ledger != nil {
		return map[string]any{"durable": true}
	}
	return map[string]any{"durable": false, "durable_off": s.durableOff}
}

// ledgerMemo is the durable ledger as a Memo: the executor's dedupe
// results, and the OpenAI endpoint's kept turns (the logger's component
// says whose).
type ledgerMemo struct {
	l   *ledger.Ledger
	log *slog.Logger
}

func (m ledgerMemo) Recall(ctx context.Context, key string) (executor.MemoEntry, bool) {
	var e executor.MemoEntry
	b, ok, err := m.l.Recall(ctx, key)
	if err != nil {
		m.log.Warn("ledger lookup failed; taken as a miss", "err", err)
	}
	if !ok || json.Unmarshal(b, &e) != nil {
		return e, false
	}
	return e, true
}

func (m ledgerMemo) Remember(ctx context.Context, key string, e executor.MemoEntry) {
	b, _ := json.Marshal(e)
	if err := m.l.Remember(ctx, key, b); err != nil {
		m.log.Warn("ledger: entry not stored", "err", err)
	}
}

// recoverer is the ledger as the executor's Recoverer, or nil when not
// durable (a nil *Ledger in an interface would not be nil).
func recoverer(l *ledger.Ledger) executor.Recoverer {
	if l == nil {
		return nil
	}
	return l
}

// longestCall is the longest any registered tool's call may last: its
// timeout (or max_duration, which progress may reach) times its attempts.
func longestCall(reg *registry.Registry) time.Duration {
	var longest time.Duration
	for _, t := range reg.Tools() {
		longest = max(longest, max(t.Timeout, t.MaxDuration)*time.Duration(t.Retries+1))
	}
	return longest
}

// registerInfo adds toolsidecar_build_info and the NATS connection gauge.
func (s *Sidecar) registerInfo() {
	v := version.Get()
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "toolsidecar", Name: "build_info",
		Help: "Always 1; the labels say which build runs."}, []string{"version", "revision", "goversion"})
	info.WithLabelValues(v.Version, v.Revision, v.GoVersion).Set(1)
	upstream := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "toolsidecar", Name: "upstream_info",
		Help: "Always 1; kind says which upstream the runs are driven on (upstream.kind: core, openai, responses, anthropic, openai-agents, anthropic-agents), url where (no credentials, no query)."}, []string{"kind", "url"})
	upstream.WithLabelValues(s.cfg.Upstream.Kind, s.upstreamURL()).Set(1)
	s.metrics.MustRegister(upstream)
	s.metrics.MustRegister(info, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "toolsidecar", Name: "nats_connected",
		Help: "1 while the sidecar's NATS connection is up, else 0."}, func() float64 {
		if s.nc.IsConnected() {
			return 1
		}
		return 0
	}))
}

// upstreamURL is where the runs are driven, as logs and metrics show it:
// Core's URL or the OpenAI-compatible upstream's, without credentials in
// its userinfo and without its query, where a key may be.
func (s *Sidecar) upstreamURL() string {
	raw := s.cfg.Core.URL
	if s.cfg.Upstream.Model() || s.cfg.Upstream.Hosted() {
		raw = s.cfg.Upstream.URL
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable)"
	}
	if u.RawQuery != "" {
		u.RawQuery = "…"
	}
	u.Fragment = ""
	return config.RedactURL(u.String())
}

// memoryJournalBytes bounds the journal of OpenAI-compatible runs without
// durable mode; beyond it the oldest records are dropped.
const memoryJournalBytes = 64 << 20

// runLeases is the ledger's leases as the executor's.
type runLeases struct{ *ledger.Leases }

func (l runLeases) Acquire(ctx context.Context, runID string) (executor.Lease, string, error) {
	lease, holder, err := l.Leases.Acquire(ctx, runID)
	if lease == nil {
		return nil, holder, err
	}
	return laterLease{lease}, "", nil
}

// laterLease is released off the drive's path (ReleaseLater): the answer
// does not wait for it.
type laterLease struct{ *ledger.Lease }

func (l laterLease) Release() { l.ReleaseLater() }

// readiness: NATS connected, and, with core.readiness_check, Core answering
// HTTP at all.
func readiness(cc config.Core, rt http.RoundTripper, natsUp func() bool) func(context.Context) error {
	hc := &http.Client{Transport: rt, Timeout: 2 * time.Second}
	return func(ctx context.Context) error {
		if !natsUp() {
			return errors.New("NATS not connected")
		}
		if !cc.ReadinessCheck {
			return nil
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cc.URL, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("core unreachable: %w", err)
		}
		resp.Body.Close()
		return nil
	}
}

// tools serves the tool list and its liveness to the server.
type tools struct {
	live    *registry.Live
	offered *registry.Screen
	client  *bridge.Client
}

// FunctionTools is the list an application gives Core's assistant: the
// model's, as the model-API modes send it.
func (t tools) FunctionTools() []tool.FunctionTool { return t.offered.FunctionTools(t.live.Load()) }

func (t tools) SourcedTools() []tool.SourcedTool { return t.live.Load().SourcedTools() }

func (t tools) Live(ctx context.Context) (map[string]bool, error) { return t.client.Live(ctx, 0) }
