package worker

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/wire"
)

// DefaultCredentials is where a sidecar on its defaults (embedded NATS on
// 127.0.0.1:4222, no store_dir) writes the worker credentials.
func DefaultCredentials() string {
	return filepath.Join(os.TempDir(), "toolsidecar-nats-4222", wire.CredentialsFile)
}

// Connect connects to the sidecar's NATS as the documentation says a
// worker does, in this order:
//   - TOOLSIDECAR_WORKER_CREDENTIALS names the credentials file the
//     sidecar's embedded server issued (its URL and user);
//   - else NATS_URL, with NATS_USER and NATS_PASSWORD when set;
//   - else, with neither set, the file a sidecar on its defaults writes
//     ([DefaultCredentials]) when it exists, else nats.DefaultURL.
//
// NATS_URL, when set, overrides the file's URL. The file must belong to
// this user and be readable by no one else, as the sidecar writes it: a
// file anyone could have put there would send the worker's calls to
// another server. opts come after the worker's own (reconnect for ever).
func Connect(opts ...nats.Option) (*nats.Conn, error) {
	url := os.Getenv("NATS_URL")
	all := []nats.Option{nats.MaxReconnects(-1)}
	path := os.Getenv(wire.CredentialsEnv)
	if path == "" && url == "" && os.Getenv("NATS_USER") == "" {
		if _, err := os.Stat(DefaultCredentials()); err == nil {
			path = DefaultCredentials()
		}
	}
	switch {
	case path != "":
		c, err := readCredentials(path)
		if err != nil {
			return nil, err
		}
		url = cmp.Or(url, c.URL)
		all = append(all, nats.UserInfo(c.User, c.Password))
	case os.Getenv("NATS_USER") != "":
		all = append(all, nats.UserInfo(os.Getenv("NATS_USER"), os.Getenv("NATS_PASSWORD")))
	}
	nc, err := nats.Connect(cmp.Or(url, nats.DefaultURL), append(all, opts...)...)
	switch {
	case err != nil && path == "" && os.Getenv("NATS_USER") == "":
		// A server that wants credentials says only "Authorization
		// Violation": say which were looked for, and where.
		return nil, fmt.Errorf("worker: connecting to %s without credentials: %w (%s)", cmp.Or(url, nats.DefaultURL), err, NoCredentials(url))
	case err != nil:
		return nil, fmt.Errorf("worker: connecting to %s: %w", cmp.Or(url, nats.DefaultURL), err)
	}
	return nc, nil
}

// NoCredentials says why a worker connects without credentials: which
// file it looked for, and the variables that name others. url is NATS_URL.
func NoCredentials(url string) string {
	if url != "" {
		return fmt.Sprintf("NATS_URL is set and neither %s (the sidecar's credentials file) nor NATS_USER is", wire.CredentialsEnv)
	}
	return fmt.Sprintf("no credentials file at %s, where a sidecar on its defaults writes it (is the sidecar started?), and %s names no other", DefaultCredentials(), wire.CredentialsEnv)
}

// readCredentials reads a credentials file that only this user controls.
func readCredentials(path string) (wire.Credentials, error) {
	var c wire.Credentials
	info, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, fmt.Errorf("worker: the credentials file %s does not exist: is the sidecar started (it writes the file), and is %s its path?", path, wire.CredentialsEnv)
	} else if err != nil {
		return c, fmt.Errorf("worker: credentials: %w", err)
	}
	if err := ownFile(info); err != nil {
		return c, fmt.Errorf("worker: the credentials file %s: %w", path, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("worker: credentials: %w", err)
	}
	if err := json.Unmarshal(data, &c); err != nil || c.User == "" || c.Password == "" {
		return c, fmt.Errorf("worker: the credentials file %s is not the sidecar's (JSON with url, user and password)", path)
	}
	return c, nil
}
