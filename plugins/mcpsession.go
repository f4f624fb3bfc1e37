package plugins

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A session with an MCP server can be wedged while its server lives: over
// stdio every message follows the one before it on the server's output, so
// an answer that drips past its call's timeout holds every answer behind
// it (issue #61), and a server that stops reading its input holds every
// request. Such a session would time out every call after. A call that
// ends with its context (its timeout, or a cancellation) therefore has its
// session checked: a ping it does not answer within mcpCheckTimeout
// replaces it, a stdio server killed (its process group and descendants
// too) and an HTTP session closed, and the next call starts a new one at
// once. Calls to the server wait for the verdict, so that none is sent
// into the wedge.

// mcpCheckTimeout bounds a check's ping: ample for a server that reads and
// answers, short beside a call's timeout, since calls wait for it.
const mcpCheckTimeout = 2 * time.Second

// mcpSession is one session with an MCP server.
type mcpSession struct {
	cs      *mcp.ClientSession
	started time.Time
	kill    func()        // ends a stdio server at once; nil over HTTP
	ended   chan struct{} // closed when the session has ended
	suspect chan struct{} // asks the session's checker for a check
	// replaced is set before the session is ended as wedged: a call then
	// cut off lost its answer to another call's wedge.
	replaced atomic.Bool

	mu       sync.Mutex
	checking chan struct{} // while a check runs; closed at its verdict
	done     bool          // the session ended: nothing is checked
}

func newMCPSession(cs *mcp.ClientSession, t mcp.Transport) *mcpSession {
	s := &mcpSession{cs: cs, started: time.Now(), ended: make(chan struct{}), suspect: make(chan struct{}, 1)}
	if st, ok := t.(*stdioTransport); ok {
		p := st.cmd.Process
		s.kill = func() {
			// Signal 0 goes through the process's own handle: a server
			// already reaped is not looked for by a pid now another's.
			if p.Signal(syscall.Signal(0)) == nil {
				_ = killTree(p.Pid)
			}
		}
	}
	return s
}

// check asks for a check of the session, unless one runs already; it
// never blocks.
func (s *mcpSession) check() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done || s.checking != nil {
		return
	}
	s.checking = make(chan struct{})
	s.suspect <- struct{}{} // room: one ask at most is pending, while checking is set
}

// checked waits for the verdict on the live session, if it is being
// checked.
func (m *mcpServer) checked(ctx context.Context) error {
	m.mu.Lock()
	s := m.live
	m.mu.Unlock()
	if s == nil {
		return nil
	}
	s.mu.Lock()
	verdict := s.checking
	s.mu.Unlock()
	if verdict == nil {
		return nil
	}
	select {
	case <-verdict:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checker runs the checks of session s until it ends.
func (m *mcpServer) checker(s *mcpSession) {
	for {
		select {
		case <-s.suspect:
			m.probe(s)
		case <-s.ended:
			s.mu.Lock()
			s.done = true
			if s.checking != nil {
				close(s.checking)
				s.checking = nil
			}
			s.mu.Unlock()
			return
		}
	}
}

// probe pings session s and replaces it when no answer comes in time.
func (m *mcpServer) probe(s *mcpSession) {
	ctx, cancel := context.WithTimeout(context.Background(), mcpCheckTimeout)
	defer cancel()
	answered := make(chan error, 1)
	// Not waited for past the bound: a ping stuck writing to a server
	// that reads nothing ends when the session does.
	m.pool.wg.Go(func() { answered <- s.cs.Ping(ctx, nil) })
	var err error
	select {
	case err = <-answered:
	case <-ctx.Done():
		err = ctx.Err()
	}
	wedged := errors.Is(err, context.DeadlineExceeded) && m.retire(s)
	s.mu.Lock()
	close(s.checking)
	s.checking = nil
	s.mu.Unlock()
	if wedged {
		// After the verdict: closing waits for the calls still on the
		// session, each until its own end, and the calls after it wait
		// for none of them.
		_ = s.cs.Close()
	}
}

// retire takes session s, wedged, from its server (the next call starts
// another) and kills a stdio server, unless the session ended meanwhile or
// the sidecar is closing it.
func (m *mcpServer) retire(s *mcpSession) bool {
	m.mu.Lock()
	live := m.live == s && !m.closed
	if live {
		m.live = nil
	}
	m.mu.Unlock()
	if !live {
		return false
	}
	s.replaced.Store(true)
	if s.kill != nil {
		s.kill()
	}
	return true
}
