package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/plugins"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/server"
	"github.com/projectdavid/toolsidecar/worker"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/net/netutil"
)

// ErrNothingToServe: the configuration has no tool that runs in process.
var ErrNothingToServe = errors.New("sidecar: no exec or http tool in the configuration: nothing to serve")

// ServeWorkers serves the configuration's in-process tools (exec, http and
// any other kind with a handler) as NATS workers on <prefix>.<name>, in
// queue group toolsidecar, until ctx ends; then it finishes the calls in
// flight. With nats.url empty it joins a sidecar's embedded server on
// nats.embedded.listen.
func ServeWorkers(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	kinds := plugins.Kinds(registry.Base(nil), plugins.Options{MaxExecProcesses: cfg.Executor.MaxExecProcesses, Logger: log.With("component", "plugins")})
	defer kinds.Close()
	reg, err := registry.New(ctx, cfg, kinds)
	if err != nil {
		return err
	}
	url := cfg.NATS.URL
	if url == "" {
		url = "nats://" + cfg.NATS.Embedded.Listen
	}
	cc := connectConfig(cfg.NATS, url, "toolsidecar-worker")
	if err := readNATSSecrets(cfg.NATS, &cc); err != nil {
		return err
	}
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	life := bridge.NewLifeline(log)
	nc, err := bridge.Connect(ctx, cc, metrics, log, life.Option())
	if err != nil {
		return err
	}
	defer nc.Close()
	w := worker.New(nc, cfg.NATS.SubjectPrefix, worker.WithLogger(log.With("component", "worker")))
	metrics.MustRegister(workerCollector{w})
	served := 0
	for _, t := range reg.Tools() {
		if t.Handler == nil {
			continue
		}
		w.Handle(t.Name, t.Handler)
		served++
		log.Info("serving tool", "tool", t.Name, "route", t.Route, "subject", t.Subject)
	}
	if served == 0 {
		return ErrNothingToServe
	}
	if err := w.Start(); err != nil {
		return err
	}
	stopOps, err := serveOps(cfg.Server, nc, life.Err, metrics, log)
	if err != nil {
		_ = w.Stop(context.Background())
		return err
	}
	var lost error
	select {
	case <-ctx.Done():
	case <-life.Closed():
		lost = life.Err()
	}
	life.Stopping()
	log.Info("worker stopping: finishing calls in flight")
	err = w.Stop(context.Background())
	stopOps()
	if err != nil || lost != nil {
		return errors.Join(lost, err)
	}
	return nc.Drain()
}

// serveOps serves /healthz, /readyz (NATS connected) and /metrics on
// server.ops_listen, when it is set, for a worker's probes and scraping.
// The returned func stops it.
func serveOps(c config.Server, nc *nats.Conn, live func() error, g prometheus.Gatherer, log *slog.Logger) (func(), error) {
	if c.OpsListen == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", c.OpsListen)
	if err != nil {
		return nil, fmt.Errorf("sidecar: server.ops_listen: %w", err)
	}
	ready := func(context.Context) error {
		if !nc.IsConnected() {
			return errors.New("NATS not connected")
		}
		return nil
	}
	hs := httpServer(c, server.Probes(live, ready, g), context.Background(), log)
	var wg sync.WaitGroup
	wg.Go(func() { _ = hs.Serve(netutil.LimitListener(ln, c.MaxConnections)) })
	log.Info("ops listener", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
		wg.Wait()
	}, nil
}

// workerCollector exports the worker library's per-tool figures, read at
// scrape time: calls in flight (the signal to scale workers on), calls
// completed and failed.
type workerCollector struct{ w *worker.Worker }

var (
	workerInFlight = prometheus.NewDesc("toolsidecar_worker_calls_in_flight", "Calls a worker process is running.", []string{"tool"}, nil)
	workerCalls    = prometheus.NewDesc("toolsidecar_worker_calls_total", "Calls a worker process completed (any outcome).", []string{"tool"}, nil)
	workerErrors   = prometheus.NewDesc("toolsidecar_worker_call_errors_total", "Calls a worker process answered with an error.", []string{"tool"}, nil)
	workerRunners  = prometheus.NewDesc("toolsidecar_worker_runners", "Calls a worker process runs at once at most.", nil, nil)
)

func (workerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{workerInFlight, workerCalls, workerErrors, workerRunners} {
		ch <- d
	}
}

func (c workerCollector) Collect(ch chan<- prometheus.Metric) {
	runners := 0
	for _, st := range c.w.Stats() {
		ch <- prometheus.MustNewConstMetric(workerInFlight, prometheus.GaugeValue, float64(st.InFlight), st.Tool)
		ch <- prometheus.MustNewConstMetric(workerCalls, prometheus.CounterValue, float64(st.Completed), st.Tool)
		ch <- prometheus.MustNewConstMetric(workerErrors, prometheus.CounterValue, float64(st.Errors), st.Tool)
		runners = st.Runners
	}
	ch <- prometheus.MustNewConstMetric(workerRunners, prometheus.GaugeValue, float64(runners))
}
