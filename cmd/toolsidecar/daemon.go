package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/plugins"
	"github.com/projectdavid/toolsidecar/registry"
	httpserver "github.com/projectdavid/toolsidecar/server"
)

// daemon wires the components, serves until SIGTERM or SIGINT, then shuts
// down in reverse order: stop new turns and intake, let in-flight batches
// finish and submit (server.shutdown_timeout), cancel what is left, drain
// NATS, stop the embedded server. A second signal exits at once.
func daemon(cfg config.Config, cfgPath string, sets []string, reg *registry.Registry, log *slog.Logger) error {
	started := time.Now()
	apiKey, err := cfg.APIKey()
	if err != nil {
		return err
	}
	var token string
	if cfg.Server.AuthTokenFile != "" {
		if token, err = config.ReadSecret(cfg.Server.AuthTokenFile); err != nil {
			return err
		}
	}
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	natsURL := cfg.NATS.URL
	var ns *server.Server
	if natsURL == "" {
		if ns, err = bridge.StartEmbedded(cfg.NATS.Embedded.Listen); err != nil {
			return err
		}
		defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
		natsURL = ns.ClientURL()
		log.Info("embedded NATS started", "url", natsURL)
	}
	nc, err := bridge.Connect(bridge.ConnectConfig{URL: natsURL, Name: "toolsidecar", CredsFile: cfg.NATS.CredsFile,
		CAFile: cfg.NATS.TLS.CAFile, CertFile: cfg.NATS.TLS.CertFile, KeyFile: cfg.NATS.TLS.KeyFile}, metrics, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	client, err := bridge.Open(nc, cfg.NATS.SubjectPrefix)
	if err != nil {
		return err
	}

	cc, err := core.New(core.Config{URL: cfg.Core.URL, APIKey: apiKey, Timeout: cfg.Core.Timeout, StreamIdleTimeout: cfg.Core.StreamIdleTimeout},
		core.WithMetrics(metrics))
	if err != nil {
		return err
	}
	tr, stopTracing, err := tracer(cfg.Tracing)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(ctx); err != nil {
			log.Warn("flushing traces", "err", err)
		}
	}()
	live := registry.NewLive(reg)
	local := plugins.NewLocal(live, log.With("component", "plugins"))
	opts := []executor.Option{executor.WithLogger(log.With("component", "executor")), executor.WithTracer(tr)}
	for _, kind := range plugins.Kinds() {
		opts = append(opts, executor.WithRoute(kind, local))
	}
	ex := executor.New(cfg.Executor, cc, live, client, append(opts,
		executor.WithObserver(executor.NewMetrics(metrics, func(t string) bool { _, ok := live.Load().Lookup(t); return ok })))...)

	scfg := httpserver.Config{Token: token, MaxBodyBytes: cfg.Server.MaxBodyBytes, Gatherer: metrics,
		Logger: log.With("component", "server"), Ready: readiness(cfg.Core.URL, nc.IsConnected)}
	if cfg.Server.Proxy {
		scfg.CoreURL = cfg.Core.URL
	}
	srv, err := httpserver.New(scfg, ex, tools{live: live, client: client})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		return err
	}
	base, cancelBase := context.WithCancelCause(context.Background())
	defer cancelBase(nil)
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return base }}

	var wg sync.WaitGroup
	serveErr := make(chan error, 1)
	wg.Go(func() { serveErr <- hs.Serve(ln) })
	reloadCtx, stopReload := context.WithCancel(context.Background())
	hup := make(chan os.Signal, 1)
	trigger := make(chan struct{}, 1)
	if cfgPath != "" {
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		rl := registry.NewReloader(cfgPath, sets, live, metrics, log.With("component", "reload"))
		wg.Go(func() { rl.Run(reloadCtx, 2*time.Second, trigger) })
		wg.Go(func() {
			for {
				select {
				case <-reloadCtx.Done():
					return
				case <-hup:
					select {
					case trigger <- struct{}{}:
					case <-reloadCtx.Done():
						return
					}
				}
			}
		})
	}
	log.Info("toolsidecar ready", "listen", ln.Addr().String(), "core", cfg.Core.URL, "nats", natsURL,
		"tools", len(reg.Names()), "proxy", cfg.Server.Proxy, "startup_ms", time.Since(started).Milliseconds())

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	select {
	case err := <-serveErr:
		stopReload()
		wg.Wait()
		return fmt.Errorf("serving http: %w", err)
	case sig := <-sigs:
		log.Info("shutting down: finishing in-flight batches", "signal", sig.String(), "timeout", cfg.Server.ShutdownTimeout)
	}
	// A second signal forces the exit; this goroutine ends with the process.
	go func() {
		sig := <-sigs
		log.Error("second signal: exiting now", "signal", sig.String())
		os.Exit(1)
	}()

	ex.Stop()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		log.Warn("shutdown timeout: cancelling the drives still running", "err", err)
		cancelBase(errors.New("sidecar shutdown timeout"))
		srv.Wait()
	}
	stopReload()
	wg.Wait()
	client.Close()
	if err := nc.Drain(); err != nil {
		log.Warn("draining NATS", "err", err)
	}
	for nc.IsDraining() {
		time.Sleep(10 * time.Millisecond)
	}
	log.Info("toolsidecar stopped")
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

func (t tools) Live(ctx context.Context) (map[string]bool, error) { return t.client.LiveDefault(ctx) }
