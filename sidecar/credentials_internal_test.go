package sidecar

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/projectdavid/toolsidecar/wire"
)

// TestWorkerCredentialsAcrossRestarts: the password in the store folder's
// file is issued again on a restart, so connected workers log in again; a
// file that is not the sidecar's (garbage, another user, a short password)
// gets a fresh password, and the file written is 0600 and reads back.
func TestWorkerCredentialsAcrossRestarts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "creds", wire.CredentialsFile)
	first, err := issueWorkerUser(path, "p", nil)
	if err != nil || len(first.Password) != 64 {
		t.Fatalf("issued %+v, %v", first, err)
	}
	if err := writeWorkerCredentials(path, "nats://127.0.0.1:1", first); err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("file %v %v", info, err)
	}
	var c wire.Credentials
	data, _ := os.ReadFile(path)
	if err := json.Unmarshal(data, &c); err != nil || c != (wire.Credentials{URL: "nats://127.0.0.1:1", User: "toolsidecar-worker", Password: first.Password}) {
		t.Fatalf("file reads %+v, %v", c, err)
	}
	again, err := issueWorkerUser(path, "p", nil)
	if err != nil || again.Password != first.Password {
		t.Fatalf("after a restart the password changed: %v", err)
	}
	for _, bad := range []string{"garbage{", `{"user": "toolsidecar-worker", "password": "short"}`, `{"user": "someone", "password": "` + first.Password + `"}`} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		w, err := issueWorkerUser(path, "p", nil)
		if err != nil || len(w.Password) != 64 || w.Password == first.Password {
			t.Errorf("file %q: issued %q, %v; want a fresh password", bad, w.Password, err)
		}
	}
}
