package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/plugins"
	"github.com/projectdavid/toolsidecar/registry"
)

// worker serves the configuration's exec and http tools as NATS workers on
// <prefix>.<name>, in queue group toolsidecar, until SIGTERM or SIGINT.
// With nats.url empty it joins a sidecar's embedded server on
// nats.embedded.listen.
func worker(cfg config.Config, reg *registry.Registry, log *slog.Logger) error {
	url := cfg.NATS.URL
	if url == "" {
		url = "nats://" + cfg.NATS.Embedded.Listen
	}
	nc, err := bridge.Connect(bridge.ConnectConfig{URL: url, Name: "toolsidecar-worker", CredsFile: cfg.NATS.CredsFile,
		CAFile: cfg.NATS.TLS.CAFile, CertFile: cfg.NATS.TLS.CertFile, KeyFile: cfg.NATS.TLS.KeyFile}, nil, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	w := bridge.NewWorker(nc, cfg.NATS.SubjectPrefix, bridge.WithLogger(log.With("component", "worker")))
	served := 0
	for _, t := range reg.Tools() {
		if t.Route == "nats" {
			continue
		}
		h, err := plugins.Handler(t)
		if err != nil {
			return err
		}
		w.Handle(t.Name, h)
		served++
		log.Info("serving tool", "tool", t.Name, "route", t.Route, "subject", t.Subject)
	}
	if served == 0 {
		return errors.New("no exec or http tool in the configuration: nothing to serve")
	}
	if err := w.Start(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	log.Info("worker stopping: finishing calls in flight")
	if err := w.Stop(context.Background()); err != nil {
		return err
	}
	return nc.Drain()
}
