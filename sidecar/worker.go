package sidecar

import (
	"context"
	"errors"
	"log/slog"

	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/plugins"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/worker"
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
	reg, err := registry.New(cfg.Tools, cfg.NATS.SubjectPrefix)
	if err != nil {
		return err
	}
	plugins.SetMaxProcesses(cfg.Executor.MaxExecProcesses)
	url := cfg.NATS.URL
	if url == "" {
		url = "nats://" + cfg.NATS.Embedded.Listen
	}
	cc := connectConfig(cfg.NATS, url, "toolsidecar-worker")
	if err := readNATSSecrets(cfg.NATS, &cc); err != nil {
		return err
	}
	nc, err := bridge.Connect(cc, nil, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	w := worker.New(nc, cfg.NATS.SubjectPrefix, worker.WithLogger(log.With("component", "worker")))
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
	<-ctx.Done()
	log.Info("worker stopping: finishing calls in flight")
	if err := w.Stop(context.Background()); err != nil {
		return err
	}
	return nc.Drain()
}
