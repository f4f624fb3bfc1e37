package core

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// conns is the round tripper of the client's own requests to Core over
// HTTP/1.1: net/http writes each request (Request.Write) and reads each
// answer (ReadResponse); conns only keeps the connections. A request is
// written and its answer read on the caller's goroutine, where net/http's
// Transport hands both to two goroutines of the connection's: at 1,000
// runs those hand-offs and their wake-ups were a third of the sidecar's
// CPU per call (BENCHMARKS.md, "CPU per call after #64"). It serves plain
// HTTP and TLS; a proxy is left to net/http's Transport (New).
//
// A kept connection is used again only while it has been idle for less
// than idle, and only once a peek at its socket (one system call, where
// net/http's Transport has a goroutine reading each idle connection)
// finds it open and silent: Core closed it (a restart, its keep-alive),
// or sent bytes that answer nothing, and it is closed instead.
type conns struct {
	addr    string      // host:port
	tls     *tls.Config // nil: plain HTTP
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	connect time.Duration // bounds a connection's opening and its TLS handshake
	idle    time.Duration
	keep    bool // false: one connection per request (completions streams)
	maxIdle int
	dialed  *atomic.Int64

	// dials bounds the new connections not yet answered on: a batch's
	// requests all at once would otherwise open one each, more than a
	// small accept queue takes (Python's ThreadingHTTPServer: 5), and the
	// attempts it drops wait out the kernel's 1 s retransmission timeout.
	// A connection holds its place until Core's first answer on it, which
	// shows that Core accepted it: the kernel completes a connection
	// before the server accepts it.
	dials chan struct{}
	// handoff gives a connection put back to a request waiting to dial:
	// a kept connection is used before a new one is opened.
	handoff chan *conn

	mu     sync.Mutex
	free   []*conn // idle, the most recently used last
	reaper *time.Timer
}

// maxDials bounds the connections a transport opens at once (see
// conns.dials), under the smallest listen backlog of Core's servers.
const maxDials = 4

// conn is one connection to Core with its reader.
type conn struct {
	nc   net.Conn
	raw  syscall.Conn // the socket under TLS, for the peek
	br   *bufio.Reader
	used time.Time
	// limit is what may still be read from nc: the bound of an answer's
	// headers while they are read, none while its body is.
	limit int64
	// new holds a place in conns.dials until the first answer.
	new bool
}

// maxHeaderBytes bounds an answer's headers, its informational answers'
// included, as net/http's Transport's MaxResponseHeaderBytes does by
// default: a Core whose headers never end fails the request, not the
// sidecar's memory.
const maxHeaderBytes = 10 << 20

// earlyAnswerWait is how long an answer is waited for once its request
// could not be written whole (net/http's maxWriteWaitBeforeConnReuse).
const earlyAnswerWait = 50 * time.Millisecond

// Read reads nc, within the limit.
func (c *conn) Read(p []byte) (int, error) {
	if c.limit <= 0 {
		return 0, fmt.Errorf("core: Core's response headers exceeded %d bytes", maxHeaderBytes)
	}
	if int64(len(p)) > c.limit {
		p = p[:c.limit]
	}
	n, err := c.nc.Read(p)
	c.limit -= int64(n)
	return n, err
}

// writers buffer requests as they are written: a connection needs one
// only then, and a turn's stream would otherwise hold its own for the
// whole turn.
var writers = sync.Pool{New: func() any { return bufio.NewWriter(nil) }}

// write writes req to nc in one buffer's flushes.
func write(nc net.Conn, req *http.Request) error {
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(nc)
	err := req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writers.Put(bw)
	return err
}

// newConns is a round tripper to addr, over TLS when tc is set, that
// keeps up to maxIdle connections idle for idle each, or none when keep
// is false.
func newConns(addr string, tc *tls.Config, connect, idle time.Duration, keep bool, maxIdle int, dialed *atomic.Int64) *conns {
	return &conns{addr: addr, tls: tc, dial: (&net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}).DialContext,
		connect: connect, idle: idle, keep: keep, maxIdle: maxIdle, dialed: dialed,
		dials: make(chan struct{}, maxDials), handoff: make(chan *conn)}
}

// RoundTrip sends req on a kept connection, or a new one, and returns
// the answer; its body is read on the caller's goroutine, and the
// connection is kept once it has been read to the end.
func (p *conns) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	var (
		c   *conn
		err error
	)
	if ctx.Err() != nil {
		// A request whose context has ended is not written, on a kept
		// connection either: the deadline that AfterFunc sets below would
		// come only after the write.
		err = context.Cause(ctx)
	} else {
		c, err = p.get(ctx)
	}
	if err != nil {
		if req.Body != nil {
			req.Body.Close() // as a RoundTripper must, on errors too (Request.Write does once it runs)
		}
		return nil, err
	}
	// The request's context ends a request in flight by ending the
	// connection's reads and writes; the connection is then not kept.
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) (*http.Response, error) {
		p.answered(c)
		stop()
		c.nc.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (%v)", context.Cause(ctx), err)
		}
		return nil, err
	}
	werr := write(c.nc, req)
	if werr != nil {
		if ctx.Err() != nil {
			return fail(werr)
		}
		// Core may have answered before it read the whole request (a 413,
		// a 401) and closed: that answer, come already, is the request's,
		// as net/http's Transport has it.
		c.nc.SetReadDeadline(time.Now().Add(earlyAnswerWait))
	}
	c.limit = maxHeaderBytes
	resp, err := http.ReadResponse(c.br, req)
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(c.br, req) // an informational answer precedes the answer
	}
	p.answered(c)
	c.limit = math.MaxInt64
	if err != nil {
		if werr != nil {
			err = werr
		}
		return fail(err)
	}
	reuse := werr == nil && p.keep && !resp.Close && resp.StatusCode != http.StatusSwitchingProtocols
	resp.Body = &body{ReadCloser: resp.Body, p: p, c: c, stop: stop, reuse: reuse, length: resp.ContentLength}
	return resp, nil
}

// get is a kept connection found open, or one put back while it waits
// for its turn to dial, or a new one.
func (p *conns) get(ctx context.Context) (*conn, error) {
	if c := p.kept(); c != nil {
		return c, nil
	}
	for {
		select {
		case p.dials <- struct{}{}:
			c, err := p.open(ctx)
			if err != nil {
				<-p.dials
				return nil, err
			}
			c.new = true
			return c, nil
		case c := <-p.handoff:
			if p.usable(c) {
				return c, nil
			}
			c.nc.Close()
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// answered gives back c's place among the new connections, once Core
// has answered on it (or it failed).
func (p *conns) answered(c *conn) {
	if c.new {
		c.new = false
		<-p.dials
	}
}

// usable reports whether kept connection c may carry a request.
func (p *conns) usable(c *conn) bool {
	return time.Since(c.used) < p.idle && open(c.raw) && c.silent()
}

// kept is a kept connection found open, or nil.
func (p *conns) kept() *conn {
	for {
		p.mu.Lock()
		n := len(p.free)
		if n == 0 {
			p.mu.Unlock()
			break
		}
		c := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		p.mu.Unlock()
		if p.usable(c) {
			return c
		}
		c.nc.Close()
	}
	return nil
}

// open opens a new connection.
func (p *conns) open(ctx context.Context) (*conn, error) {
	nc, err := p.dial(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	p.dialed.Add(1)
	raw, _ := nc.(syscall.Conn)
	if p.tls != nil {
		tc := tls.Client(nc, p.tls)
		hctx, cancel := context.WithTimeout(ctx, p.connect) // as for the connection itself
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			nc.Close()
			return nil, err
		}
		nc = tc
	}
	c := &conn{nc: nc, raw: raw, limit: math.MaxInt64}
	c.br = bufio.NewReader(c)
	return c, nil
}

// put keeps c for the next request, or closes it when enough are kept.
func (p *conns) put(c *conn) {
	c.used = time.Now()
	select {
	case p.handoff <- c: // a request waiting to dial takes it
		return
	default:
	}
	p.mu.Lock()
	if len(p.free) >= p.maxIdle {
		p.mu.Unlock()
		c.nc.Close()
		return
	}
	p.free = append(p.free, c)
	if p.reaper == nil {
		p.reaper = time.AfterFunc(p.idle, p.reap)
	}
	p.mu.Unlock()
}

// reap closes the connections idle for idle, and comes back while some
// are kept: a connection is not left open on the sidecar's side after
// Core has closed it.
func (p *conns) reap() {
	now := time.Now()
	p.mu.Lock()
	var stale []*conn
	kept := p.free[:0]
	for _, c := range p.free {
		if now.Sub(c.used) >= p.idle {
			stale = append(stale, c)
		} else {
			kept = append(kept, c)
		}
	}
	clear(p.free[len(kept):])
	p.free = kept
	if len(kept) > 0 {
		p.reaper.Reset(p.idle - now.Sub(kept[0].used))
	} else {
		p.reaper = nil
	}
	p.mu.Unlock()
	for _, c := range stale {
		c.nc.Close()
	}
}

// CloseIdleConnections closes the kept connections.
func (p *conns) CloseIdleConnections() {
	p.mu.Lock()
	free := p.free
	p.free = nil
	p.mu.Unlock()
	for _, c := range free {
		c.nc.Close()
	}
}

// open peeks at a kept connection's socket without waiting: it is open
// when nothing is there to read. End of stream (Core closed it), bytes
// that answer no request, or an error, and it is not used again.
func open(raw syscall.Conn) bool {
	if raw == nil {
		return true
	}
	sc, err := raw.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	var b [1]byte
	err = sc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = n < 0 && errors.Is(err, syscall.EAGAIN)
		return true // never wait for the socket to be readable
	})
	return err == nil && ok
}

// silent reports that nothing waits above the socket either: a TLS
// connection reads from the socket all that has come, and keeps the
// records after the one it was reading (stray bytes, Core's close_notify)
// where the peek at the socket does not see them. It reads them, with a
// deadline already past: none is there when the read times out.
func (c *conn) silent() bool {
	if _, ok := c.nc.(*tls.Conn); !ok {
		return true
	}
	c.nc.SetReadDeadline(time.Unix(1, 0))
	_, err := c.br.Peek(1)
	c.nc.SetReadDeadline(time.Time{})
	return errors.Is(err, os.ErrDeadlineExceeded)
}

// body is an answer's body: read to the end, it gives its connection
// back to be kept; closed before, it closes the connection, without
// reading the rest (an error's excerpt is not followed by megabytes).
type body struct {
	io.ReadCloser
	p      *conns
	c      *conn
	stop   func() bool
	reuse  bool
	length int64 // the announced length, or -1
	n      int64 // read so far
	eof    bool
	done   bool
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	if err == io.EOF || b.n == b.length {
		b.eof = true
	}
	return n, err
}

// rest reads what is left of the body, for at most wait and 64 KiB, so
// that its connection can be kept: after a stream's [DONE], Core's end of
// the body comes in a write of its own.
func (b *body) rest(wait time.Duration) {
	if b.eof || b.done {
		return
	}
	b.c.nc.SetReadDeadline(time.Now().Add(wait))
	_, _ = io.CopyN(io.Discard, b, 64<<10)
	b.c.nc.SetReadDeadline(time.Time{}) // Close follows: the connection is read no more before it is kept or closed
}

// Close gives the connection back when the body was read to the end, the
// request's context did not end it, and nothing follows the answer.
func (b *body) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	if b.ReadCloser == http.NoBody || b.length == 0 {
		b.eof = true
	}
	if !b.eof {
		b.stop()
		b.c.nc.Close() // before the body's Close, which would read the rest
		return b.ReadCloser.Close()
	}
	err := b.ReadCloser.Close()
	if b.stop() && b.reuse && b.c.br.Buffered() == 0 {
		b.p.put(b.c)
		return err
	}
	b.c.nc.Close()
	return err
}

// tlsFor is tc (nil: the defaults) for a connection to host over
// HTTP/1.1.
func tlsFor(tc *tls.Config, host string) *tls.Config {
	if tc == nil {
		tc = &tls.Config{}
	}
	tc = tc.Clone()
	if tc.ServerName == "" {
		tc.ServerName = host
	}
	tc.NextProtos = []string{"http/1.1"}
	return tc
}

// hostPort is u's host and port, the scheme's port when u names none.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}
