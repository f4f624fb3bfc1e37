package worker_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/wire"
	"github.com/projectdavid/toolsidecar/worker"
)

// TestConnectReadsTheCredentialsFile: a worker connects with the file
// TOOLSIDECAR_WORKER_CREDENTIALS names, to a server that refuses anonymous
// clients; a file others may read, a missing file and a file of another
// shape are refused before any connection, each saying why.
func TestConnectReadsTheCredentialsFile(t *testing.T) {
	ns, err := embedded.Start(embedded.Config{Listen: "127.0.0.1:-1",
		Workers: []embedded.Worker{{Name: "toolsidecar-worker", Password: "pw-1234", Subscribe: []string{"t.>"}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	dir := t.TempDir()
	write := func(name string, mode os.FileMode, data string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good, _ := json.Marshal(map[string]string{"url": ns.ClientURL(), "user": "toolsidecar-worker", "password": "pw-1234"})
	wrongPW, _ := json.Marshal(map[string]string{"url": ns.ClientURL(), "user": "toolsidecar-worker", "password": "nope"})
	t.Setenv("NATS_URL", "")
	t.Setenv("NATS_USER", "")
	for _, tc := range []struct {
		name, path, want string
	}{
		{"the sidecar's file", write("ok.json", 0o600, string(good)), ""},
		{"readable by others", write("open.json", 0o644, string(good)), "others may read"},
		{"missing", filepath.Join(dir, "none.json"), "does not exist: is the sidecar started"},
		{"not the sidecar's", write("other.json", 0o600, `{"token": "x"}`), "not the sidecar's"},
		{"a stale password", write("stale.json", 0o600, string(wrongPW)), "Authorization Violation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(wire.CredentialsEnv, tc.path)
			nc, err := worker.Connect()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("connect: %v", err)
				}
				defer nc.Close()
				if err := nc.Flush(); err != nil || !nc.IsConnected() {
					t.Fatalf("not connected: %v", err)
				}
				return
			}
			if err == nil {
				nc.Close()
				t.Fatalf("connected; want an error with %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want %q", err, tc.want)
			}
		})
	}
}

// TestServiceNameAndMetadata: the worker registers under the name every
// library shares, with its language and library version in the metadata,
// which $SRV.INFO reports.
func TestServiceNameAndMetadata(t *testing.T) {
	side, work := natstest.Connect(t)
	natstest.Worker(t, work, map[string]tool.Handler{"t": func(context.Context, *tool.Call) ([]byte, error) { return nil, nil }})
	msg, err := side.Request("$SRV.INFO."+wire.ServiceName, nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		t.Fatal(err)
	}
	if info.Name != "toolsidecar-worker" || info.Metadata["language"] != "go" || info.Metadata["library_version"] == "" {
		t.Fatalf("info %+v", info)
	}
}

// TestConnectWithoutCredentialsSaysWhy: a worker that finds no credentials
// and is refused by a server that wants them names what it looked for:
// the variable that names the sidecar's file, and, with no NATS_URL, the
// file a sidecar on its defaults writes.
func TestConnectWithoutCredentialsSaysWhy(t *testing.T) {
	ns, err := embedded.Start(embedded.Config{Listen: "127.0.0.1:-1",
		Workers: []embedded.Worker{{Name: "toolsidecar-worker", Password: "pw-1234", Subscribe: []string{"t.>"}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	t.Setenv("TMPDIR", t.TempDir()) // no sidecar on its defaults here
	t.Setenv(wire.CredentialsEnv, "")
	t.Setenv("NATS_USER", "")
	t.Setenv("NATS_URL", ns.ClientURL())
	nc, err := worker.Connect()
	if err == nil {
		nc.Close()
		t.Fatal("connected without credentials")
	}
	for _, want := range []string{"Authorization Violation", "without credentials", wire.CredentialsEnv, "NATS_USER"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if why := worker.NoCredentials(""); !strings.Contains(why, worker.DefaultCredentials()) || !strings.Contains(why, wire.CredentialsEnv) {
		t.Errorf("without NATS_URL: %q names neither the file looked for nor the variable", why)
	}
}
