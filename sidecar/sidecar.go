// Package sidecar assembles the daemon: the embedded or external NATS
// connection, the Core client, the tool registry and its reloader, the
// executor with its routes, the HTTP server, metrics and tracing. `toolsidecar
// run`, `toolsidecar demo` and the tests all build the sidecar here, so that
// what is tested is what runs.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/plugins"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/server"
)

// ErrShutdownTimeout is the cause given to drives still running when the
// shutdown deadline passes.
var ErrShutdownTimeout = errors.New("sidecar: shutdown deadline passed")

// Option configures a [Sidecar].
type Option func(*options)

type options struct {
	log       *slog.Logger
	apiKey    *string
	tracer    trace.Tracer
	cfgPath   string
	overrides []string
}

// WithLogger sets the logger. default: discard
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithAPIKey gives the Core API key directly, for programs that embed the
// sidecar and hold the key themselves. default: core.api_key_file, else
// TOOLSIDECAR_CORE_API_KEY
func WithAPIKey(key string) Option { return func(o *options) { o.apiKey = &key } }

// WithTracer replaces the tracer that the tracing section would build.
func WithTracer(t trace.Tracer) Option { return func(o *options) { o.tracer = t } }

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

	embedded    *embedded.Server // nil with an external NATS
	natsURL     string
	nc          *nats.Conn
	natsClosed  chan struct{}
	client      *bridge.Client
	live        *registry.Live
	reloader    *registry.Reloader // nil without WithReload
	exec        *executor.Executor
	srv         *server.Server
	hs          *http.Server
	ln          net.Listener
	stopTracing func(context.Context) error
	cancelBase  context.CancelCauseFunc

	runCtx    context.Context // ends when shutdown begins; stops the reloader
	stopRun   context.CancelFunc
	wg        sync.WaitGroup // Run's goroutines
	closers   []func()       // undo New, last first
	shutOnce  sync.Once
	shutError error
}

// New assembles a sidecar for cfg. On error, whatever it started is
// stopped again.
func New(cfg config.Config, opts ...Option) (_ *Sidecar, err error) {
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	s := &Sidecar{cfg: cfg, log: o.log, started: time.Now(), natsClosed: make(chan struct{})}
	defer func() {
		if err != nil {
			s.undo()
		}
	}()
	reg, err := registry.New(cfg.Tools, cfg.NATS.SubjectPrefix)
	if err != nil {
		return nil, err
	}
	s.live = registry.NewLive(reg)
	s.metrics = prometheus.NewRegistry()
	s.metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := s.connectNATS(); err != nil {
		return nil, err
	}
	cc, err := s.coreClient(o.apiKey)
	if err != nil {
		return nil, err
	}
	if err := s.buildExecutor(cc, o.tracer); err != nil {
		return nil, err
	}
	if o.cfgPath != "" {
		s.reloader = registry.NewReloader(o.cfgPath, o.overrides, s.live, s.metrics, s.log.With("component", "reload"))
	}
	if err := s.buildServer(); err != nil {
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
// connects and opens the dispatch client.
func (s *Sidecar) connectNATS() error {
	s.natsURL = s.cfg.NATS.URL
	if s.natsURL == "" {
		ns, err := embedded.Start(embedded.Config{Listen: s.cfg.NATS.Embedded.Listen})
		if err != nil {
			return err
		}
		s.embedded, s.natsURL = ns, ns.ClientURL()
		s.closers = append(s.closers, ns.Shutdown)
		s.log.Info("embedded NATS started", "url", s.natsURL)
	}
	nc, err := bridge.Connect(connectConfig(s.cfg.NATS, s.natsURL, "toolsidecar"), s.metrics, s.log,
		nats.ClosedHandler(func(*nats.Conn) { close(s.natsClosed) }))
	if err != nil {
		return err
	}
	s.nc = nc
	s.closers = append(s.closers, nc.Close)
	if s.client, err = bridge.Open(nc, s.cfg.NATS.SubjectPrefix); err != nil {
		return err
	}
	s.closers = append(s.closers, func() { _ = s.client.Close() })
	return nil
}

// connectConfig is the one mapping from the nats section to a connection;
// the sidecar and `toolsidecar worker` both use it.
func connectConfig(c config.NATS, url, name string) bridge.ConnectConfig {
	return bridge.ConnectConfig{URL: url, Name: name, CredsFile: c.CredsFile,
		CAFile: c.TLS.CAFile, CertFile: c.TLS.CertFile, KeyFile: c.TLS.KeyFile}
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
	return core.New(core.Config{URL: s.cfg.Core.URL, APIKey: apiKey, Timeout: s.cfg.Core.Timeout,
		StreamIdleTimeout: s.cfg.Core.StreamIdleTimeout}, core.WithMetrics(s.metrics))
}

// buildExecutor wires the loop: NATS for route nats, the in-process
// transport for every other route kind.
func (s *Sidecar) buildExecutor(cc *core.Client, tr trace.Tracer) error {
	s.stopTracing = func(context.Context) error { return nil }
	if tr == nil {
		var err error
		if tr, s.stopTracing, err = tracer(s.cfg.Tracing); err != nil {
			return err
		}
	}
	local := plugins.NewLocal(s.live, s.log.With("component", "plugins"))
	opts := []executor.Option{executor.WithLogger(s.log.With("component", "executor")), executor.WithTracer(tr),
		executor.WithObserver(executor.NewMetrics(s.metrics, func(t string) bool { _, ok := s.live.Load().Lookup(t); return ok }))}
	for _, kind := range registry.Kinds() {
		if kind != registry.Nats {
			opts = append(opts, executor.WithRoute(kind, local))
		}
	}
	s.exec = executor.New(s.cfg.Executor, cc, s.live, s.client, opts...)
	return nil
}

func (s *Sidecar) buildServer() error {
	var token string
	if f := s.cfg.Server.AuthTokenFile; f != "" {
		var err error
		if token, err = config.ReadSecret(f); err != nil {
			return err
		}
	}
	scfg := server.Config{Token: token, MaxBodyBytes: s.cfg.Server.MaxBodyBytes, Gatherer: s.metrics,
		Logger: s.log.With("component", "server"), Ready: readiness(s.cfg.Core.URL, s.nc.IsConnected)}
	if s.cfg.Server.Proxy {
		scfg.CoreURL = s.cfg.Core.URL
	}
	srv, err := server.New(scfg, s.exec, tools{live: s.live, client: s.client})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.cfg.Server.Listen)
	if err != nil {
		return fmt.Errorf("sidecar: server.listen: %w", err)
	}
	s.closers = append(s.closers, func() { _ = ln.Close() })
	base, cancelBase := context.WithCancelCause(context.Background())
	s.srv, s.ln, s.cancelBase = srv, ln, cancelBase
	s.hs = &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return base }}
	return nil
}

// Addr is the address the HTTP API listens on.
func (s *Sidecar) Addr() string { return s.ln.Addr().String() }

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

// Reload re-reads the configuration file now (SIGHUP). Without WithReload
// it does nothing.
func (s *Sidecar) Reload() error {
	if s.reloader == nil {
		return nil
	}
	return s.reloader.Reload()
}

// Run serves the HTTP API (and watches the configuration file) until ctx
// ends, then shuts down within server.shutdown_timeout; or until Shutdown
// is called elsewhere. It returns an error when the listener fails.
func (s *Sidecar) Run(ctx context.Context) error {
	serveErr := make(chan error, 1)
	s.wg.Go(func() { serveErr <- s.hs.Serve(s.ln) })
	if s.reloader != nil {
		s.wg.Go(func() { s.reloader.Run(s.runCtx, 2*time.Second, nil) })
	}
	s.log.Info("toolsidecar ready", "listen", s.Addr(), "core", s.cfg.Core.URL, "nats", s.natsURL,
		"tools", len(s.live.Load().Names()), "proxy", s.cfg.Server.Proxy, "startup_ms", time.Since(s.started).Milliseconds())
	var err error
	select {
	case <-ctx.Done():
		s.log.Info("shutting down: finishing in-flight batches", "timeout", s.cfg.Server.ShutdownTimeout)
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
// ctx's deadline; then the drives still running are cancelled (their calls
// finalised as cancelled, which the executor bounds by itself); then the
// reloader stops, NATS is drained and the embedded server stops; last, the
// traces still buffered are flushed. It is safe to call more than once.
func (s *Sidecar) Shutdown(ctx context.Context) error {
	s.shutOnce.Do(func() { s.shutError = s.shutdown(ctx) })
	return s.shutError
}

func (s *Sidecar) shutdown(ctx context.Context) error {
	s.exec.Stop()
	if err := s.hs.Shutdown(ctx); err != nil {
		s.log.Warn("shutdown deadline: cancelling the drives still running", "err", err)
		s.cancelBase(ErrShutdownTimeout)
		s.srv.Wait()
	}
	s.cancelBase(nil)
	s.stopRun()
	s.wg.Wait()
	_ = s.client.Close()
	if err := s.nc.Drain(); err != nil {
		s.log.Warn("draining NATS", "err", err)
		s.nc.Close()
	}
	<-s.natsClosed // Drain closes the connection, at the latest after its timeout
	s.closers = nil
	if s.embedded != nil {
		s.embedded.Shutdown()
	}
	_ = s.ln.Close() // when Run never served
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.stopTracing(fctx); err != nil {
		s.log.Warn("flushing traces", "err", err)
	}
	s.log.Info("toolsidecar stopped")
	return nil
}

// readiness: NATS connected and Core answering HTTP at all.
func readiness(coreURL string, natsUp func() bool) func(context.Context) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	return func(ctx context.Context) error {
		if !natsUp() {
			return errors.New("NATS not connected")
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, coreURL, nil)
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
	live   *registry.Live
	client *bridge.Client
}

func (t tools) FunctionTools() []core.FunctionTool { return t.live.Load().FunctionTools() }

func (t tools) Live(ctx context.Context) (map[string]bool, error) { return t.client.Live(ctx, 0) }
