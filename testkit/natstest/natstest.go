// Package natstest starts the real NATS parts that transport tests need: an
// embedded server on a random port with two connections (one for the
// sidecar, one for workers), and Go workers. Everything is stopped by
// t.Cleanup. It is for tests only.
package natstest

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

// Prefix is the subject prefix the helpers use.
const Prefix = "t"

// Start starts a server that lets anonymous clients in (the transport
// is under test here, not authentication) and returns its URL.
func Start(t testing.TB) string {
	t.Helper()
	ns, err := embedded.Start(embedded.Config{Listen: "127.0.0.1:-1", AllowAnonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	return ns.ClientURL()
}

// Connect starts a server and returns a sidecar connection and a worker
// connection to it.
func Connect(t testing.TB) (side, work *nats.Conn) {
	t.Helper()
	return connectTo(t, Start(t))
}

// ConnectJetStream is Connect on a server with JetStream on (files in a
// temporary folder), for durable mode.
func ConnectJetStream(t testing.TB) (side, work *nats.Conn) {
	t.Helper()
	ns, err := embedded.Start(embedded.Config{Listen: "127.0.0.1:-1", AllowAnonymous: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	return connectTo(t, ns.ClientURL())
}

func connectTo(t testing.TB, url string) (side, work *nats.Conn) {
	t.Helper()
	for _, nc := range []**nats.Conn{&side, &work} {
		var err error
		if *nc, err = nats.Connect(url); err != nil {
			t.Fatal(err)
		}
		t.Cleanup((*nc).Close)
	}
	return side, work
}

// Worker serves handlers on nc under [Prefix] until the test ends.
func Worker(t testing.TB, nc *nats.Conn, handlers map[string]tool.Handler, opts ...worker.Option) *worker.Worker {
	t.Helper()
	return WorkerOn(t, nc, Prefix, handlers, opts...)
}

// WorkerOn serves handlers on nc under prefix until the test ends.
func WorkerOn(t testing.TB, nc *nats.Conn, prefix string, handlers map[string]tool.Handler, opts ...worker.Option) *worker.Worker {
	t.Helper()
	w := worker.New(nc, prefix, opts...)
	for name, h := range handlers {
		w.Handle(name, h)
	}
	Serve(t, w)
	return w
}

// Serve starts w, with its tools registered (handled or declared), until
// the test ends.
func Serve(t testing.TB, w *worker.Worker) {
	t.Helper()
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { StopWorker(w) })
}

// StopWorker stops w, waiting up to 5s for its calls.
func StopWorker(w *worker.Worker) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = w.Stop(ctx)
}

// Manifest is a manifest of tool "echo" with args {"x": 1}.
const Manifest = `{"type": "tool_call_manifest", "run_id": "run_1", "action_id": "act_1", "tool_call_id": "call_1", "tool": "echo", "args": {"x": 1}}`

// Request is one attempt of the named tool with [Manifest] as body.
func Request(name string, timeout time.Duration) tool.Request {
	return tool.Request{Tool: name, Body: []byte(Manifest), ActionID: "act_1", Attempt: 2, Timeout: timeout}
}

// Client opens a sidecar's dispatch client on nc under prefix, closed when
// the test ends.
func Client(t testing.TB, nc *nats.Conn, prefix string) *bridge.Client {
	t.Helper()
	c, err := bridge.Open(nc, prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Dial connects to url, closed when the test ends.
func Dial(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// DialCounting is Dial with a count of the write calls made on the
// connection's socket, each a write syscall: how well a client batches what
// it sends.
func DialCounting(t testing.TB, url string) (*nats.Conn, *atomic.Int64) {
	t.Helper()
	d := &countingDialer{writes: new(atomic.Int64)}
	nc, err := nats.Connect(url, nats.SetCustomDialer(d))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, d.writes
}

type countingDialer struct {
	net.Dialer
	writes *atomic.Int64
}

func (d *countingDialer) Dial(network, address string) (net.Conn, error) {
	c, err := d.Dialer.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return countingConn{c, d.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}
