package agentsup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	"github.com/projectdavid/toolsidecar/agentsapi"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/tool"
)

// EndpointConfig configures the pass-through.
type EndpointConfig struct {
	// URL is the API's base, as agentsapi.Config takes it.
	URL     string
	Kind    string // agentsapi.KindOpenAI or agentsapi.KindAnthropic
	Watcher *Watcher
	// Transport carries the requests. default: http.DefaultTransport
	Transport http.RoundTripper
	// OwnKey, when set, replaces the caller's credential on every request
	// (the sidecar's API token is then what callers send): the sessions
	// are the sidecar's key's.
	OwnKey string
	// SidecarToken: callers authenticate to the sidecar with
	// Authorization: Bearer <its token>. That header is the sidecar's and
	// never goes upstream, nor is it read as the caller's upstream key.
	SidecarToken bool
	// MaxBodyBytes bounds a session's JSON read to find its id.
	MaxBodyBytes int
	Logger       *slog.Logger
}

// Endpoint passes the hosted API through to the upstream with the
// caller's own credential, and watches every session that a caller
// creates or reads through it: the upstream checks the credential, and
// the watch follows the session with it.
type Endpoint struct {
	cfg   EndpointConfig
	api   surface
	proxy *httputil.ReverseProxy
	log   *slog.Logger
}

// surface is what differs between the two APIs' pass-through.
type surface struct {
	// trim is the prefix of the caller's path that the upstream's base
	// holds already (OpenAI's base ends in /v1; Anthropic's has none).
	trim     string
	patterns []string
	// create is the path, under the base, of the create of a session;
	// sessions the prefix of a session's paths.
	create, sessions string
	// credential keeps of a request's headers the one the API
	// authenticates with, as it came; key reads the caller's key from
	// it; setKey sets one.
	credential func(h http.Header) http.Header
	key        func(h http.Header) string
	setKey     func(h http.Header, key string)
}

// only is the header name of h alone, or none when h has no name.
func only(h http.Header, name string) http.Header {
	if v := h.Get(name); v != "" {
		return http.Header{name: {v}}
	}
	return http.Header{}
}

var surfaces = map[string]surface{
	agentsapi.KindOpenAI: {trim: "/v1", patterns: []string{"/v1/agents/"}, create: "/agents/sessions", sessions: "/agents/sessions/",
		credential: func(h http.Header) http.Header { return only(h, "Authorization") },
		key:        func(h http.Header) string { return strings.TrimPrefix(h.Get("Authorization"), "Bearer ") },
		setKey:     func(h http.Header, key string) { h.Set("Authorization", "Bearer "+key) }},
	agentsapi.KindAnthropic: {patterns: []string{"/v1/agents", "/v1/agents/", "/v1/sessions", "/v1/sessions/"}, create: "/v1/sessions", sessions: "/v1/sessions/",
		// x-api-key, or the whole Authorization (Bearer …), which
		// @anthropic-ai/sdk 1.17 sends its apiKey as: agentsapi sends it
		// back in the form it came.
		credential: func(h http.Header) http.Header {
			if h.Get("X-Api-Key") != "" {
				return only(h, "X-Api-Key")
			}
			return only(h, "Authorization")
		},
		key: func(h http.Header) string {
			if k := h.Get("X-Api-Key"); k != "" {
				return k
			}
			return h.Get("Authorization")
		},
		setKey: func(h http.Header, key string) { h.Del("Authorization"); h.Set("X-Api-Key", key) }},
}

// NewEndpoint builds the pass-through. No I/O.
func NewEndpoint(cfg EndpointConfig) (*Endpoint, error) {
	base, err := url.Parse(strings.TrimSuffix(cfg.URL, "/"))
	if err != nil || base.Host == "" || (base.Scheme != "http" && base.Scheme != "https") {
		return nil, fmt.Errorf("agentsup: url %q is not an http(s) URL", cfg.URL)
	}
	api, ok := surfaces[cfg.Kind]
	if !ok {
		return nil, fmt.Errorf("agentsup: no pass-through for kind %q", cfg.Kind)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Endpoint{cfg: cfg, api: api, log: log.With("component", cfg.Kind)}
	e.proxy = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			// The client's base is the sidecar's: the upstream's base may
			// hold the version already (https://api.openai.com/v1).
			r.Out.URL.Scheme, r.Out.URL.Host = base.Scheme, base.Host
			r.Out.URL.Path = base.Path + strings.TrimPrefix(r.In.URL.Path, api.trim)
			r.Out.URL.RawPath = ""
			r.Out.Host = base.Host
			if cfg.SidecarToken {
				r.Out.Header.Del("Authorization")
			}
			if cfg.OwnKey != "" {
				api.setKey(r.Out.Header, cfg.OwnKey)
			}
		},
		Transport:      cfg.Transport,
		FlushInterval:  -1, // streams pass as they come
		ModifyResponse: e.watch,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				e.WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", tooLarge.Limit))
				return
			}
			e.log.Warn("pass-through to the hosted API failed", "path", tool.Excerpt(r.URL.Path), "err", err)
			e.WriteError(w, http.StatusBadGateway, "the hosted API is unreachable")
		},
	}
	return e, nil
}

// Patterns are the routes the endpoint serves.
func (e *Endpoint) Patterns() []string { return e.api.patterns }

// ServeHTTP refuses what the upstream must not see, then passes the
// request on.
func (e *Endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodOptions {
		// A CORS preflight: the sidecar grants none, and does not relay
		// the upstream's grant either.
		e.WriteError(w, http.StatusMethodNotAllowed, "the sidecar answers no cross-origin preflight")
		return
	}
	if seg := escapingSegment(r.URL.EscapedPath()); seg != "" {
		e.WriteError(w, http.StatusBadRequest, "the path has a segment that could leave the API's prefix upstream: "+strconv.Quote(tool.Excerpt(seg)))
		return
	}
	e.proxy.ServeHTTP(w, r)
}

// escapingSegment is the first segment of an escaped path that an
// upstream could read as another path than the one routed here: a dot
// segment, or an encoded slash, backslash or dot (the pass-through sends
// the decoded path, so %2F would become a separator and %2E%2E a parent).
// "" when there is none.
func escapingSegment(escaped string) string {
	for seg := range strings.SplitSeq(escaped, "/") {
		low := strings.ToLower(seg)
		if seg == "." || seg == ".." || strings.Contains(low, "%2f") || strings.Contains(low, "%5c") || strings.Contains(low, "%2e") || strings.Contains(seg, "\\") {
			return seg
		}
	}
	return ""
}

// WriteError answers in the API's error shape.
func (e *Endpoint) WriteError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	msg = tool.Truncate(msg, tool.MaxErrorMessage)
	if e.cfg.Kind == agentsapi.KindAnthropic {
		_ = json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]any{"type": "invalid_request_error", "message": msg}})
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"type": "invalid_request_error", "message": msg, "code": nil, "param": nil}})
}

// watch starts following the session of a successful create or read:
// the create of a session (the id in the answer), a read of a session,
// of its events or of its stream, or a post of events to it (the
// application's own tools' results, or its next message: the id in the
// path). A session whose watch gave its slot up while it waited on the
// application is so watched again as soon as the application answers.
func (e *Endpoint) watch(resp *http.Response) error {
	for k := range resp.Header {
		if strings.HasPrefix(k, "Access-Control-") {
			resp.Header.Del(k) // the upstream's CORS grants are not the sidecar's
		}
	}
	r := resp.Request
	if r == nil || resp.StatusCode/100 != 2 {
		return nil
	}
	rel := strings.TrimPrefix(r.URL.Path, strings.TrimSuffix(mustPath(e.cfg.URL), "/"))
	var id string
	switch rest, ok := strings.CutPrefix(rel, e.api.sessions); {
	case rel == e.api.create && r.Method == http.MethodPost && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"):
		// A streamed create: the session is watched once an event of the
		// stream names it, as the stream passes.
		resp.Body = &sniff{rc: resp.Body, bound: e.cfg.MaxBodyBytes, found: func(id string) { _, _ = e.follow(id, r.Header) }}
		return nil
	case rel == e.api.create && r.Method == http.MethodPost:
		if id = e.createdID(resp); id == "" {
			return nil
		}
	case ok && (r.Method == http.MethodGet || r.Method == http.MethodPost && strings.HasSuffix(rest, "/events")):
		rest = strings.TrimSuffix(strings.TrimSuffix(rest, "/stream"), "/events")
		if strings.Contains(rest, "/") {
			return nil
		}
		id = rest
	default:
		return nil
	}
	owner, err := e.follow(id, r.Header)
	if err != nil {
		// The session exists upstream, but its client tools will not run
		// here: the application hears it, not only the log.
		resp.Header.Set(WatchHeader, "refused: "+tool.Truncate(err.Error(), 200))
		return nil
	}
	// The owner's own stream of the session also shows each call the
	// sidecar answered; another caller's (which the upstream let read it)
	// shows nothing of the sidecar's.
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		if results, cancel, ok := e.cfg.Watcher.cfg.Upstream.listen(id, owner); ok {
			resp.Body = e.merge(id, resp.Body, results, cancel)
		}
	}
	return nil
}

// WatchHeader, on the answer to a create or read of a session, says that
// the sidecar does not watch it, and why (every one of
// upstream.max_sessions at work): its client tools are left to the
// application until a later read is watched.
const WatchHeader = "Toolsidecar-Watch"

// follow watches a session with the credential of the request that
// created or read it; the error says why it is not watched.
func (e *Endpoint) follow(id string, h http.Header) (owner string, err error) {
	if e.cfg.OwnKey != "" {
		// The upstream sees the sidecar's key alone: callers are told
		// apart by nothing it checks (each presents the sidecar's token,
		// and any other header of theirs is the caller's to choose), so
		// the sessions are one owner's, the token's, and not bounded per
		// owner.
		owner = executor.CallerOf(only(h, "Authorization"))
		err = e.cfg.Watcher.WatchShared(id, e.cfg.OwnKey, owner)
	} else {
		if e.cfg.SidecarToken {
			h = h.Clone()
			h.Del("Authorization") // the sidecar's token, not an upstream key
		}
		// The owner is the credential the upstream authenticates, alone:
		// a header it does not read would name another owner for each
		// value, past upstream.max_sessions_per_owner. The live view
		// shows the session to a request that carries that credential
		// (live.Access).
		cred := e.api.credential(h)
		owner = executor.CallerOf(cred)
		err = e.cfg.Watcher.Watch(id, e.api.key(cred), owner)
	}
	if err != nil {
		e.log.Warn("the session is not watched", "session", tool.Excerpt(id), "err", err)
	}
	return owner, err
}

// sniff passes a streamed create's events on, and calls found with the
// session's id from the first event that names it (in its session
// object, or as session_id). A line past bound is not read for it.
type sniff struct {
	rc    io.ReadCloser
	bound int
	found func(id string)
	line  []byte
	done  bool
}

func (s *sniff) Read(p []byte) (int, error) {
	n, err := s.rc.Read(p)
	for b := p[:n]; !s.done && len(b) > 0; {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			s.keep(b)
			break
		}
		s.keep(b[:i])
		s.scan()
		s.line, b = s.line[:0], b[i+1:]
	}
	return n, err
}

func (s *sniff) keep(b []byte) {
	if len(s.line)+len(b) <= s.bound {
		s.line = append(s.line, b...)
	}
}

// scan reads a whole line of the stream.
func (s *sniff) scan() {
	data, ok := bytes.CutPrefix(bytes.TrimRight(s.line, "\r"), []byte("data:"))
	if !ok {
		return
	}
	var ev struct {
		SessionID string `json:"session_id"`
		Session   *struct {
			ID string `json:"id"`
		} `json:"session"`
	}
	if json.Unmarshal(bytes.TrimSpace(data), &ev) != nil {
		return
	}
	id := ev.SessionID
	if ev.Session != nil && ev.Session.ID != "" {
		id = ev.Session.ID
	}
	if id != "" {
		s.done = true
		s.found(id)
	}
}

func (s *sniff) Close() error { return s.rc.Close() }

// createdID reads the id of the session a create answered, leaving the
// whole body for the caller; "" for a body past the bound, which passes
// as it comes, its session not watched until it is read through the
// sidecar.
func (e *Endpoint) createdID(resp *http.Response) string {
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return ""
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, int64(e.cfg.MaxBodyBytes)+1))
	if err != nil || len(data) > e.cfg.MaxBodyBytes {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(data), resp.Body), resp.Body}
		e.log.Warn("the session is not watched: its create answer is larger than the bound; a read of the session through the sidecar watches it",
			"bound", e.cfg.MaxBodyBytes)
		return ""
	}
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(data))
	resp.ContentLength = int64(len(data))
	resp.Header.Set("Content-Length", strconv.Itoa(len(data)))
	var s struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(data, &s)
	return s.ID
}

func mustPath(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Path
}
