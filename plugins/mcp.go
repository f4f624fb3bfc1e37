package plugins

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/internal/version"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// MCPSettings configure route mcp: each call is a tools/call to a Model
// Context Protocol server, a command spoken to over stdio or a streamable
// HTTP endpoint, through the official Go SDK. Tools that name the same
// server share one session with it.
type MCPSettings struct {
	// Command starts a stdio server (argv, no shell). One of Command and
	// URL is required.
	Command []string `json:"command"`
	// Env is the command's environment beyond PATH; put no secret here.
	Env map[string]string `json:"env"`
	// URL is a streamable HTTP server's endpoint.
	URL string `json:"url"`
	// HeadersFromFiles sends each header with the content of its file
	// (Authorization: a file holding "Bearer …"), read when the session
	// starts.
	HeadersFromFiles map[string]string `json:"headers_from_files"`
	// Tool is the tool's name on the server. default: the tool's own name
	Tool string `json:"tool"`
	// MaxResultBytes bounds a result. default: 1 MiB
	MaxResultBytes int `json:"max_result_bytes"`
	// Import reads the server's tools from tools/list into the registry,
	// each named Prefix + its name, with its description and input
	// schema; the entry's other keys (timeout, retries, side_effects, …)
	// apply to each. Without side_effects on the entry, a tool's class
	// comes from its annotations: readOnlyHint is read_only,
	// idempotentHint idempotent, anything else (no annotations included)
	// unsafe. The entry's own name only labels the server.
	Import bool   `json:"import"`
	Prefix string `json:"prefix"`
}

// mcpKind is route mcp. pool holds its sessions with the servers, one per
// server (its command and environment, or its URL and headers); a session
// starts at its first call, and Close ends them all.
type mcpKind struct {
	inProcess
	pool *mcpPool
}

// Import lists the server's tools, as configurations of route mcp.
func (k *mcpKind) Import(ctx context.Context, entry config.Tool, settings map[string]any) ([]config.Tool, error) {
	mcpServers := k.pool
	s, err := mcpSettings(settings)
	if err != nil {
		return nil, err
	}
	session, err := mcpServers.get(s).sessionFor(ctx)
	if err != nil {
		return nil, fmt.Errorf("MCP server %s: %w", mcpServers.get(s).describe(), err)
	}
	var out []config.Tool
	for t, err := range session.cs.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("tools/list: %w", err)
		}
		tc := entry
		tc.Name, tc.Description = s.Prefix+t.Name, t.Description
		if !tool.ValidName(tc.Name) {
			return nil, fmt.Errorf("the server's tool %q would be named %q, which is not a valid tool name (^[A-Za-z0-9_-]{1,64}$)", t.Name, tc.Name)
		}
		tc.Parameters = nil
		if b, err := json.Marshal(t.InputSchema); err == nil && t.InputSchema != nil {
			_ = json.Unmarshal(b, &tc.Parameters)
		}
		if entry.SideEffects == "" {
			tc.SideEffects = sideEffectsOf(t.Annotations)
		}
		own := map[string]any{}
		for k, v := range settings {
			if k != "import" && k != "prefix" {
				own[k] = v
			}
		}
		own["tool"] = t.Name
		tc.Settings = map[string]any{"mcp": own}
		out = append(out, tc)
	}
	return out, nil
}

// sideEffectsOf is a tool's class from its MCP annotations; a tool
// without them is unsafe, as the specification's defaults say
// (readOnlyHint and idempotentHint false).
func sideEffectsOf(a *mcp.ToolAnnotations) string {
	switch {
	case a == nil:
		return config.Unsafe
	case a.ReadOnlyHint:
		return config.ReadOnly
	case a.IdempotentHint:
		return config.Idempotent
	}
	return config.Unsafe
}

func mcpSettings(settings map[string]any) (MCPSettings, error) {
	var s MCPSettings
	if err := registry.DecodeSettings("mcp", settings, &s); err != nil {
		return s, err
	}
	switch {
	case len(s.Command) == 0 && s.URL == "":
		return s, errors.New("mcp: set command (a stdio server) or url (a streamable HTTP server)")
	case len(s.Command) > 0 && s.URL != "":
		return s, errors.New("mcp: set one of command and url, not both")
	case s.URL != "":
		if u, err := url.Parse(s.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return s, fmt.Errorf("mcp.url: %q is not an http(s) URL", s.URL)
		}
	}
	if s.MaxResultBytes <= 0 {
		s.MaxResultBytes = 1 << 20
	}
	return s, nil
}

func (k *mcpKind) Build(def *registry.Tool, settings map[string]any) (tool.Handler, error) {
	mcpServers := k.pool
	s, err := mcpSettings(settings)
	if err != nil {
		return nil, err
	}
	if s.Import {
		return nil, errors.New("mcp.import: the server's tools could not be imported")
	}
	name := s.Tool
	if name == "" {
		name = def.Name
	}
	return func(ctx context.Context, c *tool.Call) ([]byte, error) {
		return mcpServers.get(s).call(ctx, name, c, s.MaxResultBytes)
	}, nil
}

type mcpPool struct {
	mu    sync.Mutex
	byKey map[string]*mcpServer
	wg    sync.WaitGroup // the watchers of the sessions
}

// Close closes every MCP session of the kind (a stdio server's process
// exits) and waits for their watchers. The sidecar and `toolsidecar
// worker` close their kinds at shutdown; a later call starts a session
// again.
func (k *mcpKind) Close() error {
	p := k.pool
	p.mu.Lock()
	servers := p.byKey
	p.byKey = map[string]*mcpServer{}
	p.mu.Unlock()
	for _, srv := range servers {
		srv.close()
	}
	p.wg.Wait()
	return nil
}

func (p *mcpPool) get(s MCPSettings) *mcpServer {
	key, _ := json.Marshal([]any{s.Command, s.Env, s.URL, s.HeadersFromFiles})
	p.mu.Lock()
	defer p.mu.Unlock()
	srv, ok := p.byKey[string(key)]
	if !ok {
		srv = &mcpServer{pool: p, s: s}
		p.byKey[string(key)] = srv
	}
	return srv
}

// Restarts of a server whose session ended wait this long, doubled after
// each session that ended within mcpStable of its start.
const (
	mcpFirstBackoff = 100 * time.Millisecond
	mcpMaxBackoff   = 30 * time.Second
	mcpStable       = 10 * time.Second
)

// mcpServer is one MCP server and the session with it, started again
// (after a backoff) when it ends, and at once when it is replaced
// (mcpsession.go).
type mcpServer struct {
	pool *mcpPool
	s    MCPSettings

	mu       sync.Mutex
	live     *mcpSession // nil once it ended or was replaced
	backoff  time.Duration
	retryAt  time.Time
	closed   bool
	progress sync.Map // progress token → the call's Progress
}

// sessionFor returns the live session, once its check (if one runs) has
// found it sound, starting one if there is none and the server's backoff
// has passed. Only the wait for the check ends with ctx.
func (m *mcpServer) sessionFor(ctx context.Context) (*mcpSession, error) {
	if err := m.checked(ctx); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live != nil {
		return m.live, nil
	}
	if m.closed {
		return nil, errors.New("the sidecar is shutting down")
	}
	if wait := time.Until(m.retryAt); wait > 0 {
		return nil, fmt.Errorf("the server is restarted in %v (its session ended)", wait.Round(time.Millisecond))
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "toolsidecar", Version: version.Get().Version}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			if f, ok := m.progress.Load(fmt.Sprint(req.Params.ProgressToken)); ok {
				_ = f.(func() error)()
			}
		},
	})
	t, err := m.transport()
	if err != nil {
		return nil, err
	}
	// The session outlives this call: it starts on a context of its own.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(cctx, t, nil)
	if err != nil {
		m.fail()
		return nil, fmt.Errorf("starting the session: %w", err)
	}
	m.live = newMCPSession(cs, t)
	live := m.live
	m.pool.wg.Go(func() { m.watch(live) })
	m.pool.wg.Go(func() { m.checker(live) })
	return live, nil
}

// watch waits for the end of session s. A session that ended of itself
// (its server exited, or broke the protocol) delays the next start; one
// that was replaced does not.
func (m *mcpServer) watch(s *mcpSession) {
	_ = s.cs.Wait()
	m.mu.Lock()
	if m.live == s {
		m.live = nil
		if time.Since(s.started) < mcpStable {
			m.fail() // a server that keeps dying is started again ever more slowly
		} else {
			m.backoff = 0
		}
	}
	m.mu.Unlock()
	close(s.ended)
}

// fail pushes the next start back by the backoff, doubled. m.mu is held.
func (m *mcpServer) fail() {
	m.backoff = min(max(2*m.backoff, mcpFirstBackoff), mcpMaxBackoff)
	m.retryAt = time.Now().Add(m.backoff)
}

func (m *mcpServer) transport() (mcp.Transport, error) {
	if len(m.s.Command) > 0 {
		cmd := exec.Command(m.s.Command[0], m.s.Command[1:]...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		for k, v := range m.s.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stderr = os.Stderr // the server's own log, beside the sidecar's
		return &stdioTransport{cmd: cmd, terminate: 2 * time.Second, limit: mcpFrameBytes(m.s.MaxResultBytes)}, nil
	}
	headers := http.Header{}
	for h, file := range m.s.HeadersFromFiles {
		v, err := config.ReadSecret("mcp.headers_from_files."+h, file)
		if err != nil {
			return nil, err
		}
		headers.Set(h, v)
	}
	// Progress comes on each call's own response stream: no standing
	// stream is held open for messages outside a call.
	return &mcp.StreamableClientTransport{Endpoint: m.s.URL, HTTPClient: &http.Client{Transport: mcpHTTP{headers, mcpFrameBytes(m.s.MaxResultBytes)}},
		DisableStandaloneSSE: true}, nil
}

// mcpHTTP adds the configured headers to every request, and bounds every
// answer while it is read (mcpbound.go).
type mcpHTTP struct {
	h     http.Header
	limit int
}

func (t mcpHTTP) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.h {
		r.Header[k] = v
	}
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil {
		boundedBody(resp, t.limit)
	}
	return resp, err
}

func (m *mcpServer) close() {
	m.mu.Lock()
	m.closed = true
	s := m.live
	m.mu.Unlock()
	if s != nil {
		_ = s.cs.Close()
	}
}

// call runs one tools/call. Its progress notifications restart the call's
// timeout; its cancellation is sent to the server (the SDK's
// notifications/cancelled). A result with isError is a tool_error; an
// empty one, or the session ending during the call, a worker_crash. A call
// that ends with ctx has its session checked (mcpsession.go).
func (m *mcpServer) call(ctx context.Context, name string, c *tool.Call, maxBytes int) ([]byte, error) {
	s, err := m.sessionFor(ctx)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, err // tool.Invoke says timeout or cancelled
	case err != nil:
		return nil, tool.NewError(tool.WorkerCrash, "MCP server %s: %v", m.describe(), err)
	}
	// Asked here too for a call stuck past ctx, writing to a server that
	// reads nothing: the check ends the session, and so the call. A call
	// that timed out is checked at once; a cancelled one only if it is
	// still stuck a check's time later, so that a busy server, which
	// answers its calls in turn, is not restarted because an application
	// left.
	returned := make(chan struct{})
	defer close(returned)
	defer context.AfterFunc(ctx, func() {
		if !timedOut(ctx) {
			select {
			case <-returned:
				return
			case <-time.After(mcpCheckTimeout):
			}
		}
		s.check()
	})()
	token := c.ActionID + "#" + fmt.Sprint(c.Attempt) + "#" + fmt.Sprint(time.Now().UnixNano())
	m.progress.Store(token, c.Progress)
	defer m.progress.Delete(token)
	params := &mcp.CallToolParams{Name: name, Arguments: json.RawMessage(c.Args)}
	params.SetProgressToken(token)
	res, err := s.cs.CallTool(ctx, params)
	var refusal *jsonrpc.Error
	switch {
	case err != nil && ctx.Err() != nil:
		if timedOut(ctx) {
			s.check() // before the call returns: the next call waits for the verdict
		}
		return nil, err // tool.Invoke says timeout or cancelled
	case err != nil && s.replaced.Load():
		// Another call's answer wedged the session, which was replaced
		// under this call: its answer, queued behind, is lost. It ends as
		// on the wedged session, at its own timeout, not as a crash.
		<-ctx.Done()
		return nil, ctx.Err()
	case errors.As(err, &refusal) && refusal.Code == codeTooLarge:
		return nil, tool.NewError(tool.ToolFailed, "MCP server %s: the result of tools/call %q exceeds mcp.max_result_bytes (%d): %s",
			m.describe(), name, maxBytes, refusal.Message)
	case errors.As(err, &refusal) && refusal.Code != codeClientClosing && refusal.Code != codeServerClosing:
		return nil, tool.NewError(tool.ToolFailed, "MCP server %s refused tools/call %q: %v", m.describe(), name, err)
	case err != nil:
		return nil, tool.NewError(tool.WorkerCrash, "MCP server %s: the session ended during the call: %v", m.describe(), err)
	}
	out, empty := mcpResult(res)
	switch {
	case res.IsError:
		return nil, tool.NewError(tool.ToolFailed, "%s", out)
	case empty:
		return nil, tool.NewError(tool.WorkerCrash, "MCP server %s answered tools/call %q with an empty result", m.describe(), name)
	case len(out) > maxBytes:
		return nil, tool.NewError(tool.ToolFailed, "result of %d bytes exceeds mcp.max_result_bytes (%d)", len(out), maxBytes)
	}
	return []byte(out), nil
}

// The JSON-RPC codes of a connection shutting down (the SDK's
// ErrClientClosing and ErrServerClosing): the session ended, the server
// refused nothing.
const (
	codeClientClosing = -32003
	codeServerClosing = -32004
)

func (m *mcpServer) describe() string {
	if len(m.s.Command) > 0 {
		return fmt.Sprintf("%q", m.s.Command[0])
	}
	return m.s.URL
}

// mcpResult is a result as the model reads it: the structured content as
// JSON when there is some, else the text of the content blocks (any other
// block as its JSON), one per line. empty: nothing at all.
func mcpResult(res *mcp.CallToolResult) (string, bool) {
	if res.StructuredContent != nil {
		b, err := json.Marshal(res.StructuredContent)
		if err == nil && !bytes.Equal(b, []byte("null")) {
			return string(b), false
		}
	}
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
			continue
		}
		b, _ := json.Marshal(c)
		parts = append(parts, string(b))
	}
	parts = slices.DeleteFunc(parts, func(p string) bool { return p == "" })
	return strings.Join(parts, "\n"), len(parts) == 0
}

// timedOut reports a call that ended at its timeout (the attempt's limit
// cancels it with DeadlineExceeded), not by a cancellation.
func timedOut(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), context.DeadlineExceeded)
}
