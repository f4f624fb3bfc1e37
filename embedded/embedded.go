// Package embedded runs the in-process NATS server of the default setup, so
// that a sidecar needs no NATS of its own to start. Authentication is on:
// the sidecar connects in process as a user whose password exists only in
// memory, workers connect as configured users who may serve only their
// tools and publish only replies, and anonymous clients are refused unless
// allowed.
package embedded

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/config"
)

// SidecarUser is the user the sidecar connects as; the configuration
// reserves the name.
const SidecarUser = config.SidecarUser

// Config says how to run the server.
type Config struct {
	// Listen is host:port; port -1 picks a free one.
	Listen string
	// MaxPayload bounds one message. default: 8 MiB
	MaxPayload int32
	// Workers are the users workers connect as.
	Workers []Worker
	// AllowAnonymous lets clients without credentials in, with every
	// permission.
	AllowAnonymous bool
	// TLS, when set, serves the listener over TLS (with ClientCAs and
	// ClientAuth set, it verifies client certificates).
	TLS *tls.Config
	// StoreDir, when set, turns JetStream on with its files there.
	StoreDir string
	// SyncPeriodic lets JetStream acknowledge a write before it is on
	// disk, syncing every 2 minutes (nats-server's default): a power
	// failure or an OS crash loses what was acknowledged since. Off, each
	// write is synced before it is acknowledged (sync_interval: always).
	SyncPeriodic bool
}

// Worker is a worker's user: a password or a public nkey, and the
// subjects it may subscribe to. It may publish only replies to the
// requests it received, as many as it likes (progress, then the result).
type Worker struct {
	Name     string
	Password string
	NKey     string
	// Subscribe lists what it may subscribe to: "subject" or, for a queue
	// subscription only, "subject queue" (NATS queue permissions).
	Subscribe []string
	// DenySubscribe lists subjects it may not subscribe to, nor receive
	// through a wildcard subscription.
	DenySubscribe []string
	// Publish lists subjects the worker may publish to beyond replies.
	Publish []string
}

// Server is a running embedded NATS server.
type Server struct {
	ns       *server.Server
	password string
}

// Start starts the server and waits until it accepts connections.
func Start(cfg Config) (*Server, error) {
	host, portStr, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("embedded: listen %q: %w", cfg.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("embedded: listen %q: %w", cfg.Listen, err)
	}
	if cfg.MaxPayload <= 0 {
		cfg.MaxPayload = 8 << 20
	}
	s := &Server{password: randomSecret()}
	opts := &server.Options{
		ServerName: "toolsidecar-embedded",
		Host:       host, Port: port,
		NoLog: true, NoSigs: true,
		MaxPayload: cfg.MaxPayload,
		Users:      []*server.User{{Username: SidecarUser, Password: s.password}},
	}
	if cfg.StoreDir != "" {
		opts.JetStream, opts.StoreDir = true, cfg.StoreDir
		// The ledger's record of an unsafe call is acknowledged before the
		// call runs: lost with the page cache, the call would run again.
		opts.SyncAlways = !cfg.SyncPeriodic
	}
	if cfg.TLS != nil {
		opts.TLSConfig, opts.TLS = cfg.TLS, true
		opts.TLSVerify = cfg.TLS.ClientCAs != nil
	}
	for _, w := range cfg.Workers {
		perms := &server.Permissions{
			Subscribe: &server.SubjectPermission{Allow: append(w.Subscribe, "$SRV.>"), Deny: w.DenySubscribe},
			Publish:   &server.SubjectPermission{Allow: append([]string{}, w.Publish...)},
			Response:  &server.ResponsePermission{MaxMsgs: -1},
		}
		if w.NKey != "" {
			opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: w.NKey, Permissions: perms})
		} else {
			opts.Users = append(opts.Users, &server.User{Username: w.Name, Password: w.Password, Permissions: perms})
		}
	}
	if cfg.AllowAnonymous {
		opts.Users = append(opts.Users, &server.User{Username: "anonymous", Password: randomSecret()})
		opts.NoAuthUser = "anonymous"
	}
	if port > 0 {
		// The server reports a bind failure only through its log (off
		// here) and a readiness timeout: try the address first, so that a
		// port in use is said at once, with the address.
		ln, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("embedded: cannot listen on %s (nats.embedded.listen): %w", cfg.Listen, err)
		}
		ln.Close()
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded: server on %s not ready (is the port taken?)", cfg.Listen)
	}
	s.ns = ns
	return s, nil
}

// randomSecret is 32 random bytes, hex: a password that lives only in
// this process.
func randomSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ClientURL is the URL workers connect to.
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// InProcessURL is the URL to give with ConnectOptions: an in-process
// connection needs no TLS, whatever the listener serves.
func (s *Server) InProcessURL() string {
	return strings.Replace(s.ns.ClientURL(), "tls://", "nats://", 1)
}

// ConnectOptions connect the sidecar itself: in process (no socket), as
// the sidecar user.
func (s *Server) ConnectOptions() []nats.Option {
	return []nats.Option{nats.InProcessServer(s.ns), nats.UserInfo(SidecarUser, s.password)}
}

// Shutdown stops the server and waits until it has stopped. Drain the
// connections that use it first.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}
