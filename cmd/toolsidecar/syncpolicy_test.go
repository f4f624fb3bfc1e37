package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// TestCheckSyncPolicy: `check` of a durable configuration on an external
// NATS says what it learns of the servers' JetStream sync policy. A user
// of the system account reads it: a server that syncs periodically is a
// warning naming it, its interval and what to set, one that syncs always
// is said to; any other user is told plainly that it cannot be learnt,
// and what to set.
func TestCheckSyncPolicy(t *testing.T) {
	away := "server: {listen: \"" + testenv.FreeAddr(t) + "\"}\n"
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "password")
	if err := os.WriteFile(pwFile, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, nats string
		want       []string
	}{
		{"not the system account", "nats: {url: " + sysServer(t, "any", true) + ", user: app, password_file: " + pwFile + "}\n",
			[]string{"cannot learn the sync policy of an external server", "set `jetstream { sync_interval: always }`"}},
		{"periodic", "nats: {url: " + sysServer(t, "lax", false) + ", user: sys, password_file: " + pwFile + "}\n",
			[]string{"warning: NATS acknowledges JetStream writes before they are on disk on lax (every 2m0s)", "set `jetstream { sync_interval: always }`"}},
		{"always", "nats: {url: " + sysServer(t, "strict", true) + ", user: sys, password_file: " + pwFile + "}\n",
			[]string{"NATS syncs each JetStream write before acknowledging it on strict (sync_interval: always)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte(away+c.nats), 0o600); err != nil {
				t.Fatal(err)
			}
			var out, errOut bytes.Buffer
			if code := run([]string{"check", "--config", path}, &out, &errOut); code != 0 {
				t.Fatalf("check exit %d: %s", code, errOut.String())
			}
			for _, w := range c.want {
				if !strings.Contains(errOut.String(), w) {
					t.Errorf("check said %q, want %q", errOut.String(), w)
				}
			}
		})
	}
}

// sysServer starts a NATS server with JetStream whose user sys is in the
// system account and user app in the global one (both with the password
// secret), and returns its URL.
func sysServer(t *testing.T, name string, syncAlways bool) string {
	t.Helper()
	sys := server.NewAccount("SYS")
	ns, err := server.NewServer(&server.Options{ServerName: name, Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(), SyncAlways: syncAlways,
		Accounts: []*server.Account{sys}, SystemAccount: "SYS",
		Users: []*server.User{{Username: "sys", Password: "secret", Account: sys}, {Username: "app", Password: "secret"}}})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatalf("server %s not ready", name)
	}
	return ns.ClientURL()
}
