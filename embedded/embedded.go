// Package embedded runs the in-process NATS server of the default setup, so
// that a sidecar needs no NATS of its own to start.
package embedded

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Config says how to run the server.
type Config struct {
	// Listen is host:port; port -1 picks a free one.
	Listen string
	// MaxPayload bounds one message. default: 8 MiB
	MaxPayload int32
}

// Server is a running embedded NATS server.
type Server struct{ ns *server.Server }

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
	ns, err := server.NewServer(&server.Options{
		ServerName: "toolsidecar-embedded",
		Host:       host, Port: port,
		NoLog: true, NoSigs: true,
		MaxPayload: cfg.MaxPayload,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded: server on %s not ready", cfg.Listen)
	}
	return &Server{ns: ns}, nil
}

// ClientURL is the URL clients connect to.
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// Shutdown stops the server and waits until it has stopped. Drain the
// connections that use it first.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}
