package sidecar

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/wire"
)

// issueWorkerUser is the embedded server's user for workers that bring no
// credentials of their own: it may serve every tool under the prefix but
// those restricted to named users. Its password is the one in the file at
// path when there is one, so that workers still connected from before a
// restart log in again.
func issueWorkerUser(path, prefix string, restricted []string) (embedded.Worker, error) {
	w := workerUser(prefix, config.WorkerUser, []string{"*"})
	for _, t := range restricted {
		w.DenySubscribe = append(w.DenySubscribe, wire.Subject(prefix, t))
	}
	var old wire.Credentials
	switch data, err := os.ReadFile(path); {
	case err == nil && json.Unmarshal(data, &old) == nil && old.User == config.WorkerUser && len(old.Password) == 64:
		w.Password = old.Password
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return w, fmt.Errorf("sidecar: reading the worker credentials: %w", err)
	default:
		var b [32]byte
		_, _ = rand.Read(b[:])
		w.Password = hex.EncodeToString(b[:])
	}
	return w, nil
}

// writeWorkerCredentials writes the issued user's file at path, readable
// by this user only, in place at once (a worker never reads half of it).
func writeWorkerCredentials(path, url string, w embedded.Worker) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("sidecar: the worker credentials' folder: %w", err)
	}
	data, _ := json.MarshalIndent(wire.Credentials{URL: url, User: w.Name, Password: w.Password}, "", "  ")
	f, err := os.CreateTemp(dir, ".worker-credentials-*")
	if err != nil {
		return fmt.Errorf("sidecar: writing the worker credentials: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(append(data, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path) // CreateTemp's mode is 0600
	}
	if err != nil {
		return fmt.Errorf("sidecar: writing the worker credentials: %w", err)
	}
	return nil
}
