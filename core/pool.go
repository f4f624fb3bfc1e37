package core

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// pool is the transport of the client's short calls, and another of its
// completions streams: HTTP/1.1 over kept connections, each request
// written and its answer read on the goroutine that calls RoundTrip (an
// exchange worker, or a turn's). net/http's Transport hands every request
// to a writing and a reading goroutine of its connection; at three to
// four requests to Core per tool call, that was most of the sidecar's CPU
// under load (BENCHMARKS.md, "Core requests on the worker's own
// goroutine"). The request is still written, and the answer parsed, by
// net/http (Request.Write, ReadResponse).
//
// A connection is used by one request at a time. The number in use is
// bounded by the client's workers, or by the turns open at once, so the
// pool bounds only the idle ones.
type pool struct {
	addr        string      // host:port
	tls         *tls.Config // nil for plain HTTP
	dialer      net.Dialer
	dialed      *atomic.Int64
	maxIdle     int
	idleTimeout time.Duration

	mu     sync.Mutex
	idle   []*keptConn // the most recently used last
	pruner *time.Timer // armed while a connection is idle
}

// keptConn is one connection of a pool.
type keptConn struct {
	conn   net.Conn
	raw    net.Conn      // under TLS, the TCP connection
	br     *bufio.Reader // while a request is on it; see buffers
	reused bool
	since  time.Time // when it went idle
}

// newPool is a pool of connections to the host of u (http or https), at
// most maxIdle of them idle, counting the connections it opens in dialed.
func newPool(u *url.URL, maxIdle int, idleTimeout time.Duration, dialed *atomic.Int64) *pool {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	p := &pool{addr: net.JoinHostPort(u.Hostname(), port), dialed: dialed, maxIdle: maxIdle, idleTimeout: idleTimeout,
		dialer: net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}} // as DefaultTransport's
	if u.Scheme == "https" {
		p.tls = &tls.Config{}
	}
	return p
}

// setTLS sets the TLS configuration of the pool's connections, if it
// speaks https.
func (p *pool) setTLS(tc *tls.Config) {
	if p.tls != nil {
		p.tls = tc.Clone()
	}
}

// aLongTimeAgo is a deadline that has passed: setting it ends the
// connection's pending and future reads and writes at once.
var aLongTimeAgo = time.Unix(1, 0)

// errClosedKept is a kept connection that Core closed before it answered
// a request sent on it, most likely as it timed the connection out: the
// request may not have reached Core. Only a request that is safe to
// repeat is sent again (net/http's rule too).
var errClosedKept = errors.New("the kept connection was closed before an answer")

// RoundTrip sends req on a kept or new connection and reads the answer's
// head. The connection is taken until the body is closed; the request's
// context ends it at once.
func (p *pool) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	kc, err := p.get(ctx)
	if err != nil {
		if req.Body != nil {
			req.Body.Close() // as Request.Write would have
		}
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { kc.conn.SetDeadline(aLongTimeAgo) })
	resp, err := kc.exchange(req)
	if err != nil {
		stop()
		kc.conn.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return nil, err
	}
	b := &keptBody{p: p, kc: kc, ctx: ctx, stop: stop, body: resp.Body, left: resp.ContentLength, reuse: !resp.Close && !req.Close}
	if resp.Body == http.NoBody {
		b.left = 0
	}
	resp.Body = b
	return resp, nil
}

// exchange writes req and reads the head of its answer.
func (kc *keptConn) exchange(req *http.Request) (*http.Response, error) {
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(kc.conn)
	err := req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writers.Put(bw)
	kc.br = readers.Get().(*bufio.Reader)
	kc.br.Reset(kc.conn)
	if err == nil && kc.reused {
		_, err = kc.br.Peek(1) // the answer's first byte, or the close
	}
	if err != nil && kc.reused {
		// Core closed the connection as it went idle, after get's check.
		return nil, fmt.Errorf("%w: %w", errClosedKept, err)
	}
	if err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(kc.br, req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 200 {
		// Core sends no interim answer; what follows one is not read.
		resp.Body.Close()
		return nil, fmt.Errorf("unexpected interim answer %s", resp.Status)
	}
	return resp, nil
}

// get takes the most recently used idle connection that is still open,
// or dials one.
func (p *pool) get(ctx context.Context) (*keptConn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := time.Now()
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			break
		}
		kc := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if now.Sub(kc.since) < p.idleTimeout && !closedByPeer(kc.raw) {
			kc.reused = true
			return kc, nil
		}
		kc.conn.Close()
	}
	conn, err := p.dialer.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	p.dialed.Add(1)
	kc := &keptConn{conn: conn, raw: conn}
	if p.tls != nil {
		tc := p.tls.Clone()
		if tc.ServerName == "" {
			tc.ServerName, _, _ = net.SplitHostPort(p.addr)
		}
		tc.NextProtos = []string{"http/1.1"}
		tlsConn := tls.Client(conn, tc)
		if err := tlsConn.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, err
		}
		kc.conn = tlsConn
	}
	return kc, nil
}

// Buffers are lent to a connection while a request is on it: a writer
// while the request is written, a reader until its answer's body is read.
// An idle connection holds neither, and an open completions stream, which
// may last minutes, only a reader. At 10,000 runs thousands of streams are
// open at once (BENCHMARKS.md).
var (
	readers = sync.Pool{New: func() any { return bufio.NewReader(nil) }}
	writers = sync.Pool{New: func() any { return bufio.NewWriter(nil) }}
)

// put keeps kc idle, or closes it when maxIdle are. A connection with
// bytes left unread after its answer is closed: what follows is not an
// answer to anything.
func (p *pool) put(kc *keptConn) {
	if kc.br.Buffered() > 0 {
		kc.conn.Close()
		return
	}
	kc.br.Reset(nil)
	readers.Put(kc.br)
	kc.br = nil
	kc.since = time.Now()
	p.mu.Lock()
	if len(p.idle) >= p.maxIdle {
		p.mu.Unlock()
		kc.conn.Close()
		return
	}
	p.idle = append(p.idle, kc)
	if p.pruner == nil {
		p.pruner = time.AfterFunc(p.idleTimeout, p.prune)
	}
	p.mu.Unlock()
}

// prune closes the connections idle for longer than idleTimeout, and
// comes back while any stay.
func (p *pool) prune() {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0 // the oldest are first
	for n < len(p.idle) && now.Sub(p.idle[n].since) >= p.idleTimeout {
		p.idle[n].conn.Close()
		n++
	}
	p.idle = append(p.idle[:0], p.idle[n:]...)
	clear(p.idle[len(p.idle):cap(p.idle)])
	p.pruner = nil
	if len(p.idle) > 0 {
		p.pruner = time.AfterFunc(p.idleTimeout-now.Sub(p.idle[0].since), p.prune)
	}
}

// CloseIdleConnections closes the idle connections (http.Client's
// method of the same name calls it).
func (p *pool) CloseIdleConnections() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, kc := range p.idle {
		kc.conn.Close()
	}
	p.idle = nil
	if p.pruner != nil {
		p.pruner.Stop()
		p.pruner = nil
	}
}

// keptBody is the body of an answer on a kept connection: once read to
// its end and closed, the connection goes back to the pool; closed
// before, the connection is closed rather than drained (http's own body
// would read the rest, however long, on Close).
type keptBody struct {
	p     *pool
	kc    *keptConn
	ctx   context.Context
	stop  func() bool // ends the context's watch; false if it fired
	body  io.ReadCloser
	left  int64 // bytes still announced by Content-Length; -1 if none was
	ended bool
	reuse bool // the answer did not ask for the connection to be closed
}

func (b *keptBody) Read(p []byte) (int, error) {
	if b.ended {
		return 0, io.EOF
	}
	n, err := b.body.Read(p)
	if b.left >= 0 {
		b.left -= int64(n)
	}
	switch {
	case err == io.EOF || b.left == 0:
		b.ended = true
	case err != nil && b.ctx.Err() != nil:
		err = fmt.Errorf("%w (%v)", b.ctx.Err(), err)
	}
	return n, err
}

func (b *keptBody) Close() error {
	if b.kc == nil {
		return nil
	}
	kc := b.kc
	b.kc = nil
	if b.left == 0 { // an empty body, or one read to its last byte
		b.ended = true
	}
	if b.stop() && b.ended && b.reuse {
		b.p.put(kc)
		return nil
	}
	return kc.conn.Close()
}
