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
	Kind    string // agentsapi.KindOpenAI
	Watcher *Watcher
	// Transport carries the requests. default: http.DefaultTransport
	Transport http.RoundTripper
	// OwnKey, when set, replaces the caller's credential on every request
	// (the sidecar's API token is then what callers send): the sessions
	// are the sidecar's key's.
	OwnKey string
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
	proxy *httputil.ReverseProxy
	log   *slog.Logger
}

// NewEndpoint builds the pass-through. No I/O.
func NewEndpoint(cfg EndpointConfig) (*Endpoint, error) {
	base, err := url.Parse(strings.TrimSuffix(cfg.URL, "/"))
	if err != nil || base.Host == "" || (base.Scheme != "http" && base.Scheme != "https") {
		return nil, fmt.Errorf("agentsup: url %q is not an http(s) URL", cfg.URL)
	}
	if cfg.Kind != agentsapi.KindOpenAI {
		return nil, fmt.Errorf("agentsup: no pass-through for kind %q", cfg.Kind)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Endpoint{cfg: cfg, log: log.With("component", cfg.Kind)}
	e.proxy = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			// The client's base is the sidecar's /v1: the upstream's base
			// holds its own version (https://api.openai.com/v1).
			r.Out.URL.Scheme, r.Out.URL.Host = base.Scheme, base.Host
			r.Out.URL.Path = base.Path + strings.TrimPrefix(r.In.URL.Path, "/v1")
			r.Out.URL.RawPath = ""
			r.Out.Host = base.Host
			if cfg.OwnKey != "" {
				r.Out.Header.Set("Authorization", "Bearer "+cfg.OwnKey)
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

// Pattern is the route the endpoint serves.
func (e *Endpoint) Pattern() string { return "/v1/agents/" }

func (e *Endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) { e.proxy.ServeHTTP(w, r) }

// WriteError answers in the API's error shape.
func (e *Endpoint) WriteError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"type": "invalid_request_error",
		"message": tool.Truncate(msg, tool.MaxErrorMessage), "code": nil, "param": nil}})
}

// watch starts following the session of a successful create or read:
// POST /v1/agents/sessions (the id in the answer), GET
// /v1/agents/sessions/{id} and its events stream (the id in the path).
func (e *Endpoint) watch(resp *http.Response) error {
	r := resp.Request
	if r == nil || resp.StatusCode/100 != 2 {
		return nil
	}
	path := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, strings.TrimSuffix(mustPath(e.cfg.URL), "/")), "/")
	var id string
	switch rest, ok := strings.CutPrefix(path, "agents/sessions"); {
	case !ok:
		return nil
	case rest == "" && r.Method == http.MethodPost:
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			return nil // a streamed create: the session is watched once read
		}
		data, err := io.ReadAll(io.LimitReader(resp.Body, int64(e.cfg.MaxBodyBytes)+1))
		_ = resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(data))
		resp.ContentLength = int64(len(data))
		resp.Header.Set("Content-Length", strconv.Itoa(len(data)))
		if err != nil || len(data) > e.cfg.MaxBodyBytes {
			return nil
		}
		var s struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(data, &s)
		id = s.ID
	case r.Method == http.MethodGet:
		rest = strings.TrimPrefix(rest, "/")
		rest = strings.TrimSuffix(rest, "/events")
		if strings.Contains(rest, "/") {
			return nil
		}
		id = rest
	default:
		return nil
	}
	if id == "" {
		return nil
	}
	key := e.cfg.OwnKey
	if key == "" {
		key = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	if err := e.cfg.Watcher.Watch(id, key, executor.CallerOf(r.Header)); err != nil {
		e.log.Warn("the session is not watched", "session", tool.Excerpt(id), "err", err)
	}
	return nil
}

func mustPath(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Path
}
