package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
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
	watching  chan struct{} // closed once Run watches the directory (tests wait for it)
	watched   sync.Once
}

// NewReloader watches path for live. Metrics go on reg.
// running is the configuration in force: keys other than tools that a
// reload finds changed are reported as needing a restart.
func NewReloader(path string, overrides []string, running config.Config, live *Live, reg prometheus.Registerer, log *slog.Logger) *Reloader {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{path: path, overrides: overrides, running: running, live: live, log: log, watching: make(chan struct{})}
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

// importTimeout bounds the reading of the tools that a reload imports.
const importTimeout = 30 * time.Second

// Reload loads the file now, with the route kinds of the registry in
// force; what it imports is read within ctx.
func (r *Reloader) Reload(ctx context.Context) error {
	r.lastTime.SetToCurrentTime()
	cfg, err := config.Load(r.path, r.overrides)
	if err == nil {
		ctx, cancel := context.WithTimeout(ctx, importTimeout)
		defer cancel()
		// The tools that workers declare stay: the file is put in force
		// with them; one that its entry contradicts is left out, as at
		// start (Registry.Conflicts).
		_, err = r.live.Update(func(cur *Registry) (*Registry, error) {
			reg, err := New(ctx, cfg, cur.kinds, cur.declared...)
			if err != nil {
				return nil, err
			}
			// Recorded first: whoever sees the new tools also sees the
			// reload in the metrics and the log.
			r.total.WithLabelValues("success").Inc()
			r.lastOK.Set(1)
			r.log.Info("tools reloaded", "tools", len(reg.Names()))
			for _, c := range reg.Conflicts() {
				r.log.Error("a worker's tool declaration is left out", "tool", c.Tool, "err", c)
			}
			if keys := config.Changed(r.running, cfg); len(keys) > 0 {
				r.log.Warn("the file changed keys that only a restart applies; they are not in force", "keys", keys)
			}
			return reg, nil
		})
		if err == nil {
			return nil
		}
	}
	r.total.WithLabelValues("failure").Inc()
	r.lastOK.Set(0)
	r.log.Error("config reload rejected; the previous tools stay in force", "path", r.path, "err", err)
	return err
}

// settleDelay is how long a change of the file must hold before it is
// read, and then read again: a file caught half-written (empty, say) is
// not put in force, and a change is in force within about three times it.
const settleDelay = 100 * time.Millisecond

// Run reloads whenever the file's content changes, and on every value
// received from trigger (SIGHUP), until ctx ends. The file's directory is
// watched (fsnotify): a rename over the file, as editors write it, and
// the swap of a symlinked directory, as Kubernetes updates a mounted
// ConfigMap, are both events there. A change is read once events have
// been quiet for settleDelay and loaded once the content is the same on
// two reads in a row. The file is also checked every interval, for a
// file system that sends no events.
func (r *Reloader) Run(ctx context.Context, interval time.Duration, trigger <-chan struct{}) {
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w, err := fsnotify.NewWatcher(); err != nil {
		r.log.Warn("the configuration file is not watched; it is checked every interval", "interval", interval, "err", err)
	} else {
		defer w.Close()
		if err := w.Add(filepath.Dir(r.path)); err != nil {
			r.log.Warn("the configuration file's directory is not watched; it is checked every interval", "interval", interval, "err", err)
		}
		events, errs = w.Events, w.Errors
	}
	r.watched.Do(func() { close(r.watching) })
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	defer settle.Stop()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-trigger:
			_ = r.Reload(ctx)
		case <-events:
			settle.Reset(settleDelay)
		case err := <-errs:
			r.log.Warn("watching the configuration file", "err", err)
		case <-settle.C:
			if r.check(ctx) {
				settle.Reset(settleDelay) // read it again to see that it holds
			}
		case <-t.C:
			r.check(ctx)
		}
	}
}

// check reads the file and loads a new content once it is the same on two
// checks in a row. It reports a new content seen for the first time.
func (r *Reloader) check(ctx context.Context) (pending bool) {
	data, err := os.ReadFile(r.path)
	if err != nil {
		return false
	}
	sum := sha256.Sum256(data)
	switch {
	case bytes.Equal(sum[:], r.sum[:]):
	case bytes.Equal(sum[:], r.seen[:]):
		r.sum = sum
		_ = r.Reload(ctx)
	default:
		r.seen = sum
		return true
	}
	return false
}
