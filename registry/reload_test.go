package registry

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/syncbuf"
)

func TestReloader(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	// Writes are atomic (a rename), as editors and Kubernetes make them.
	write := func(s string) { renameOver(t, path, s) }
	write("tools:\n  - name: a\n")
	cfg, _ := config.Load(path, nil)
	reg, _ := compileTools(cfg.Tools, cfg.NATS.SubjectPrefix)
	live := NewLive(reg)
	preg := prometheus.NewRegistry()
	logs := &syncbuf.Buffer{}
	r := NewReloader(path, nil, cfg, live, preg, slog.New(slog.NewTextHandler(logs, nil)))

	ctx, cancel := context.WithCancel(context.Background())
	trigger := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(ctx, 10*time.Millisecond, trigger) })
	defer func() { cancel(); wg.Wait() }()

	write("tools:\n  - name: a\n  - name: b\n")
	poll.Until(t, "the new tool", func() bool { return len(live.Load().Names()) == 2 })

	// A bad file is rejected: the registry in force stays.
	write("tools:\n  - name: a\n  - name: a\n")
	poll.Until(t, "the rejection", func() bool { return testutil.ToFloat64(r.lastOK) == 0 })
	if got := live.Load().Names(); len(got) != 2 {
		t.Fatalf("bad file replaced the registry: %v", got)
	}
	if testutil.ToFloat64(r.total.WithLabelValues("failure")) != 1 || testutil.ToFloat64(r.total.WithLabelValues("success")) != 1 {
		t.Errorf("reload counters wrong")
	}
	// A change of another key is not applied, and the log says so.
	write("core: {url: http://other:9000}\ntools:\n  - name: c\n")
	trigger <- struct{}{}
	poll.Until(t, "the fixed file", func() bool { n := live.Load().Names(); return len(n) == 1 && n[0] == "c" })
	if testutil.ToFloat64(r.lastOK) != 1 {
		t.Error("last_reload_successful not restored")
	}
	if !strings.Contains(logs.String(), "only a restart applies") || !strings.Contains(logs.String(), "core.url") {
		t.Errorf("no restart notice for core.url in the log:\n%s", logs.String())
	}
	if ts := testutil.ToFloat64(r.lastTime); time.Since(time.Unix(int64(ts), 0)) > time.Minute {
		t.Errorf("last reload timestamp %v", ts)
	}
}

// TestReloaderWatchesTheDirectory: with the periodic check an hour away,
// only the directory's events can put a change in force: a file renamed
// over the configuration, as editors write it, and a Kubernetes ConfigMap
// update, which swaps the ..data symlink of the mounted directory while
// config.yaml stays a symlink into it.
func TestReloaderWatchesTheDirectory(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string) (path string, update func(content string))
	}{
		{"rename over the file", func(t *testing.T, dir string) (string, func(string)) {
			path := filepath.Join(dir, "config.yaml")
			return path, func(s string) { renameOver(t, path, s) }
		}},
		{"ConfigMap symlink swap", func(t *testing.T, dir string) (string, func(string)) {
			n := 0
			update := func(s string) {
				n++
				version := filepath.Join(dir, fmt.Sprintf("..2026_12_04_%d", n))
				if err := os.Mkdir(version, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(version, "config.yaml"), []byte(s), 0o600); err != nil {
					t.Fatal(err)
				}
				tmp := filepath.Join(dir, "..data_tmp")
				if err := os.Symlink(filepath.Base(version), tmp); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
					t.Fatal(err)
				}
			}
			path := filepath.Join(dir, "config.yaml")
			if err := os.Symlink(filepath.Join("..data", "config.yaml"), path); err != nil {
				t.Fatal(err)
			}
			return path, update
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, update := tc.setup(t, t.TempDir())
			update("tools:\n  - name: a\n")
			cfg, err := config.Load(path, nil)
			if err != nil {
				t.Fatal(err)
			}
			reg, _ := compileTools(cfg.Tools, cfg.NATS.SubjectPrefix)
			live := NewLive(reg)
			r := NewReloader(path, nil, cfg, live, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() { r.Run(ctx, time.Hour, nil) })
			defer func() { cancel(); wg.Wait() }()
			<-r.watching
			update("tools:\n  - name: a\n  - name: b\n")
			poll.Until(t, "the new tool, from the directory's events", func() bool { return len(live.Load().Names()) == 2 })
		})
	}
}

// renameOver writes content to path atomically: a new file renamed over
// it, as editors write a file.
func renameOver(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
