package sidecar

import (
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/server"
)

// startingProbes answers the probes while the sidecar is still starting
// (its first NATS connection retried): /healthz 200, anything else 503
// with the reason, on the API and ops addresses. The real server binds
// those addresses once they are released.
type startingProbes struct {
	log     *slog.Logger
	mu      sync.Mutex
	reason  string
	servers []*http.Server
	started bool
	wg      sync.WaitGroup
}

// notReady records why, and starts serving on addrs at the first call.
func (p *startingProbes) notReady(reason string, addrs ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reason = reason
	if p.started {
		return
	}
	p.started = true
	h := server.Starting(func() string {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.reason
	})
	for _, addr := range addrs {
		if addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			p.log.Warn("cannot answer probes while starting", "listen", addr, "err", err)
			continue
		}
		hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		p.servers = append(p.servers, hs)
		p.wg.Go(func() { _ = hs.Serve(ln) })
	}
}

// stop releases the addresses.
func (p *startingProbes) stop() {
	p.mu.Lock()
	servers := p.servers
	p.servers = nil
	p.mu.Unlock()
	for _, hs := range servers {
		_ = hs.Close()
	}
	p.wg.Wait()
}
