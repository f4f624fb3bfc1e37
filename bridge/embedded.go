package bridge

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// StartEmbedded starts an in-process NATS server listening on listen
// (host:port; port -1 picks a free one). Call Shutdown on it, after the
// connections using it are drained.
func StartEmbedded(listen string) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("bridge: embedded listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("bridge: embedded listen %q: %w", listen, err)
	}
	opts := &server.Options{
		ServerName: "toolsidecar-embedded",
		Host:       host, Port: port,
		NoLog: true, NoSigs: true,
		MaxPayload: 8 << 20,
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("bridge: embedded server: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("bridge: embedded server on %s not ready", listen)
	}
	return ns, nil
}
