package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/projectdavid/toolsidecar/config"
)

// Reloader re-reads the configuration file and puts its tools in force.
// A file that does not load or compile is rejected with a logged error, and
// the registry in force stays. Only the tools are reloaded; other keys need
// a restart.
type Reloader struct {
	path      string
	overrides []string
	running   config.Config
	live      *Live
	log       *slog.Logger
	sum       [32]byte // the content in force
	seen      [32]byte // a new content seen once, loaded when it holds
	total     *prometheus.CounterVec
	lastOK    prometheus.Gauge
	lastTime  prometheus.Gauge
}

// NewReloader watches path for live. Metrics go on reg.
// running is the configuration in force: keys other than tools that a
// reload finds changed are reported as needing a restart.
func NewReloader(path string, overrides []string, running config.Config, live *Live, reg prometheus.Registerer, log *slog.Logger) *Reloader {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{path: path, overrides: overrides, running: running, live: live, log: log}
	r.total, r.lastOK, r.lastTime = reloadMetrics(reg)
	if data, err := os.ReadFile(path); err == nil {
		r.sum = sha256.Sum256(data)
	}
	return r
}

// RegisterReloadMetrics registers the reload series of a sidecar that has
// no file to reload: the configuration in force loaded, and nothing was
// reloaded since. Dashboards and alerts then find them everywhere.
func RegisterReloadMetrics(reg prometheus.Registerer) { reloadMetrics(reg) }

// reloadMetrics registers the reload series, as of a successful start.
func reloadMetrics(reg prometheus.Registerer) (total *prometheus.CounterVec, lastOK, lastTime prometheus.Gauge) {
	f := promauto.With(reg)
	lastTime = f.NewGauge(prometheus.GaugeOpts{Namespace: "toolsidecar", Subsystem: "config", Name: "last_reload_timestamp_seconds",
		Help: "When the configuration was last loaded or reloaded (successfully or not), in Unix seconds."})
	total = f.NewCounterVec(prometheus.CounterOpts{Namespace: "toolsidecar", Subsystem: "config", Name: "reloads_total",
		Help: "Configuration reloads by result."}, []string{"result"})
	lastOK = f.NewGauge(prometheus.GaugeOpts{Namespace: "toolsidecar", Subsystem: "config", Name: "last_reload_successful",
		Help: "Whether the last configuration load or reload succeeded."})
	total.WithLabelValues("success")
	total.WithLabelValues("failure")
	lastOK.Set(1)
	lastTime.SetToCurrentTime()
	return total, lastOK, lastTime
}

// Reload loads the file now.
func (r *Reloader) Reload() error {
	r.lastTime.SetToCurrentTime()
	cfg, err := config.Load(r.path, r.overrides)
	if err == nil {
		var reg *Registry
		if reg, err = New(cfg.RegisteredTools(), cfg.NATS.SubjectPrefix); err == nil {
			// Recorded first: whoever sees the new tools also sees the
			// reload in the metrics and the log.
			r.total.WithLabelValues("success").Inc()
			r.lastOK.Set(1)
			r.log.Info("tools reloaded", "tools", len(reg.Names()))
			if keys := config.Changed(r.running, cfg); len(keys) > 0 {
				r.log.Warn("the file changed keys that only a restart applies; they are not in force", "keys", keys)
			}
			r.live.Store(reg)
			return nil
		}
	}
	r.total.WithLabelValues("failure").Inc()
	r.lastOK.Set(0)
	r.log.Error("config reload rejected; the previous tools stay in force", "path", r.path, "err", err)
	return err
}

// Run reloads whenever the file's content changes (checked every
// interval), and on every value received from trigger (SIGHUP), until ctx
// ends. A new content is loaded once it is the same on two checks in a
// row, so that a file caught half-written (empty, say) is not put in force.
func (r *Reloader) Run(ctx context.Context, interval time.Duration, trigger <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-trigger:
			_ = r.Reload()
		case <-t.C:
			data, err := os.ReadFile(r.path)
			if err != nil {
				continue
			}
			sum := sha256.Sum256(data)
			switch {
			case bytes.Equal(sum[:], r.sum[:]):
			case bytes.Equal(sum[:], r.seen[:]):
				r.sum = sum
				_ = r.Reload()
			default:
				r.seen = sum
			}
		}
	}
}
