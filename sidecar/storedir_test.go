//go:build unix

package sidecar_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// TestDefaultStoreDirIsPrivate: the default store folder,
// <temp dir>/toolsidecar-nats-<port>, is created 0700 by the sidecar
// (umask aside), and a start is refused, naming the folder and what to
// do, when the folder is there already and others may write into it or
// it is a symbolic link: another local user made it first, and could
// move the worker credentials and JetStream's files; so is one another
// user owns (made by chown when the test runs as root). Before, the
// sidecar used whatever it found there.
func TestDefaultStoreDirIsPrivate(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	old := syscall.Umask(0)
	t.Cleanup(func() { syscall.Umask(old) })
	start := func(listen string) (string, error) {
		t.Helper()
		cfg, _ := testenv.Config(t, "http://127.0.0.1:1", testenv.Options{NATS: func(n *config.NATS) {
			n.Embedded.Listen, n.Embedded.WorkerCredentials = listen, true
		}}, nil)
		s, err := sidecar.Start(context.Background(), cfg)
		if err == nil {
			if err := s.Shutdown(context.Background()); err != nil {
				t.Error(err)
			}
		}
		_, port, _ := strings.Cut(listen, ":")
		return filepath.Join(tmp, "toolsidecar-nats-"+port), err
	}
	dir, err := start(testenv.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(dir); err != nil || info.Mode().Perm() != 0o700 {
		t.Fatalf("the store folder: %v %v, want mode 0700 with the umask at 0", info.Mode(), err)
	}
	for name, prepare := range map[string]func(string) error{
		"group-writable": func(d string) error { return errors.Join(os.Mkdir(d, 0o700), os.Chmod(d, 0o770)) },
		"other-writable": func(d string) error { return errors.Join(os.Mkdir(d, 0o700), os.Chmod(d, 0o707)) },
		"symlink":        func(d string) error { return os.Symlink(t.TempDir(), d) },
		"another user's": func(d string) error {
			if os.Getuid() != 0 {
				t.Skip("making a folder of another user's takes root")
			}
			return errors.Join(os.Mkdir(d, 0o700), os.Chown(d, 4242, 4242))
		},
	} {
		t.Run(name, func(t *testing.T) {
			listen := testenv.FreeAddr(t)
			_, port, _ := strings.Cut(listen, ":")
			dir := filepath.Join(tmp, "toolsidecar-nats-"+port)
			if err := prepare(dir); err != nil {
				t.Fatal(err)
			}
			_, err := start(listen)
			var se *sidecar.StartError
			if !errors.As(err, &se) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "owner uid") ||
				!strings.Contains(err.Error(), "set nats.embedded.store_dir") {
				t.Fatalf("start: %v; want refused, naming %s, its owner and what to do", err, dir)
			}
			if _, err := os.Stat(filepath.Join(dir, "worker-credentials.json")); err == nil {
				t.Error("the worker credentials were written into the refused folder")
			}
		})
	}
}

// TestConfiguredStoreDir: a configured store_dir that a user other than
// this one and root owns is refused, and so is one of this (non-root)
// user's that every user may write into. One that its group may write
// into (a volume with an fsGroup), a root-owned one every user may write
// into (a Kubernetes emptyDir: started, with a warning), or one reached
// by a symbolic link (the operator's) is used. As root, the test makes a
// folder of another user's by chown; otherwise, its own folder 0777.
func TestConfiguredStoreDir(t *testing.T) {
	start := func(dir string) (string, error) {
		t.Helper()
		var logs bytes.Buffer
		cfg, _ := testenv.Config(t, "http://127.0.0.1:1", testenv.Options{NATS: func(n *config.NATS) { n.Embedded.StoreDir = dir }}, nil)
		s, err := sidecar.Start(context.Background(), cfg, sidecar.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		if err == nil {
			err = s.Shutdown(context.Background())
		}
		return logs.String(), err
	}
	open := t.TempDir()
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if os.Getuid() == 0 {
		if logs, err := start(open); err != nil || !strings.Contains(logs, "every user may write into it") {
			t.Errorf("a root-owned store_dir every user may write into: %v, logged %q; want used, with a warning", err, logs)
		}
		theirs := t.TempDir()
		if err := os.Chown(theirs, 4242, 4242); err != nil {
			t.Fatal(err)
		}
		if _, err := start(theirs); err == nil || !strings.Contains(err.Error(), "owned by uid 4242") || !strings.Contains(err.Error(), theirs) {
			t.Errorf("a store_dir of uid 4242's: %v, want refused", err)
		}
	} else if _, err := start(open); err == nil || !strings.Contains(err.Error(), "chmod o-w") || !strings.Contains(err.Error(), open) {
		t.Errorf("a store_dir every user may write into: %v, want refused", err)
	}
	group := t.TempDir()
	if err := os.Chmod(group, 0o770); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "store")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{group, link, filepath.Join(t.TempDir(), "new")} {
		if _, err := start(dir); err != nil {
			t.Errorf("store_dir %s: %v", dir, err)
		}
	}
}
