// Package server is the application-facing HTTP API of the sidecar: the
// drive endpoint (SSE or JSON), proxy mode (Core's own API, with
// /v1/completions driven by the loop so that an unmodified SDK gets a
// tool-resolved stream), the tool list, health, readiness and metrics.
package server

import (
	"context"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/pprof"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/tool"
)

// OpenAPI is the API's description (OpenAPI 3.1), served at
// /openapi.json; a test checks the server's real answers against it.
//
//go:embed openapi.json
var OpenAPI []byte

// Tools lists the tools in force, in Core's assistant tools shape, and
// which of them have a live worker.
type Tools interface {
	FunctionTools() []tool.FunctionTool
	Live(ctx context.Context) (map[string]bool, error)
	// SourcedTools is FunctionTools, each with where it is defined.
	SourcedTools() []tool.SourcedTool
}

// Route is one route of an upstream's own API.
type Route struct {
	Pattern string // as http.ServeMux takes it
	Handler http.Handler
	// Drive: the route drives a run, and counts against MaxDrives (429
	// beyond); others are not bounded (a proxied read, say).
	Drive bool
	// AnyBody: the route takes bodies of any type (Core's API passed
	// through, whose uploads are multipart); the sidecar's own routes take
	// JSON only.
	AnyBody bool
	// Errors writes an error in the shape of the route's API (OpenAI's
	// {"error": {"message", "type", ...}}, say): a request for a path
	// under the route's that no route serves, or for a method it does not
	// take, or whose body gives a key twice, is answered with it. Nil: the
	// sidecar's own {"error": "..."}.
	Errors func(w http.ResponseWriter, status int, msg string)
	// Forwarded: the body, a whole conversation on every request, goes
	// on to an upstream (a model API), which reads it whole. Only its
	// top-level object, which the route reads, is checked for duplicate
	// keys: checking every level costs twice the decoding the route does
	// anyway and an allocation per string (internal/dupkey's
	// BenchmarkFind, 1 MiB: 15-18 ms, against 10 ms for the top level
	// and 8 ms for json.Unmarshal).
	Forwarded bool
}

// Config configures the server.
type Config struct {
	// Routes are served beside the drive API, behind the same token and
	// body bound: an upstream's own API answered by the sidecar (Core's,
	// in proxy mode: package coreup).
	Routes []Route
	// Token, when set, is required as "Authorization: Bearer <token>" on
	// every route but /healthz and /readyz.
	Token string
	// Operator is the operator's token (server.operator_token_file): it
	// is taken wherever Token is, and the live view shows its holder every
	// caller's runs. "": none.
	Operator string
	// AllowedHosts are the names, beside localhost and IP addresses, that
	// a request's Host may give (browser.go).
	AllowedHosts []string
	// MaxBodyBytes bounds request bodies. default: 1 MiB
	MaxBodyBytes int64
	// MaxDrives bounds the drives in progress (drive API and proxy-mode
	// completions); more are answered 429 with Retry-After. default: 512
	MaxDrives int
	// Ready reports whether the sidecar can serve: Core reachable, NATS
	// connected.
	Ready func(ctx context.Context) error
	// Live reports whether the process can still serve at all: an error
	// fails /healthz with 503, so that the orchestrator restarts it.
	// default: always live
	Live func() error
	// ReadyInfo adds facts to the /readyz answer (durable mode, say).
	ReadyInfo func() map[string]any
	// SSEKeepalive is how often a quiet SSE drive sends a comment.
	// default: 15s
	SSEKeepalive time.Duration
	// SSEResumeGrace is how long a drive outlives its last SSE stream, for
	// the client to reconnect with Last-Event-ID. 0: cancelled at once.
	SSEResumeGrace time.Duration
	// Pprof serves Go's profiles under /debug/pprof/ on the ops handler.
	Pprof bool
	// Approvals, when set, serves GET /v1/approvals and POST
	// /v1/approvals/{action_id}.
	Approvals approval.Store
	// Pages are served without the token: pages that carry no data of
	// their own (the live view's HTML, script and style), which a browser
	// loads before it has a token to send. Their data routes are in
	// Routes, behind the token.
	Pages []Route
	// Signed are served without the token, their bodies bounded: routes
	// whose requests carry a signature their handler verifies (a hosted
	// API's webhooks, which cannot send the sidecar's token).
	Signed []Route
	// Gatherer serves /metrics. default: prometheus.DefaultGatherer
	Gatherer prometheus.Gatherer
	Logger   *slog.Logger
}

// Server is the HTTP handler.
type Server struct {
	cfg      Config
	driveRun executor.DriveFunc // Executor.Drive
	tools    Tools
	log      *slog.Logger
	mux      *http.ServeMux
	// active counts requests being served, so shutdown can wait for drives
	// that outlive http.Server.Shutdown's deadline.
	active sync.WaitGroup
	drives chan struct{} // a slot per drive in progress
	ops    *http.ServeMux
	pages  *http.ServeMux // Config.Pages: served without the token
	// guarded is the API behind the browser checks (browser.go);
	// opsGuarded the ops handler.
	guarded, opsGuarded http.Handler
	routes              map[string]Route // Routes by pattern
	// patterns are every pattern the API listener serves, in the order
	// registered: what Patterns reports.
	patterns []string
}

// Patterns are the routes the API listener serves, as http.ServeMux
// patterns: the sidecar's own, its upstream's, the pages and the signed
// routes. A test compares them with openapi.json, so that the description
// names every route the server really has.
func (s *Server) Patterns() []string { return slices.Clone(s.patterns) }

// handle registers h on mux at pattern, and records the pattern.
func (s *Server) handle(mux *http.ServeMux, pattern string, h http.Handler) {
	mux.Handle(pattern, h)
	s.patterns = append(s.patterns, pattern)
}

// Wait blocks until no request is being served.
func (s *Server) Wait() { s.active.Wait() }

// New builds the server, which drives runs with drive (Executor.Drive). No
// I/O.
func New(cfg Config, drive executor.DriveFunc, tools Tools) (*Server, error) {
	if cfg.MaxDrives <= 0 {
		cfg.MaxDrives = 512
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.SSEKeepalive <= 0 {
		cfg.SSEKeepalive = 15 * time.Second
	}
	if cfg.Gatherer == nil {
		cfg.Gatherer = prometheus.DefaultGatherer
	}
	if cfg.Ready == nil {
		cfg.Ready = func(context.Context) error { return nil }
	}
	if cfg.Live == nil {
		cfg.Live = func() error { return nil }
	}
	s := &Server{cfg: cfg, driveRun: drive, tools: tools, log: cfg.Logger, mux: http.NewServeMux(), ops: http.NewServeMux(),
		drives: make(chan struct{}, cfg.MaxDrives), pages: http.NewServeMux()}
	for _, p := range cfg.Signed {
		h := p.Handler
		s.handle(s.pages, p.Pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
			h.ServeHTTP(w, r)
		}))
	}
	for _, p := range cfg.Pages {
		s.handle(s.pages, p.Pattern, p.Handler)
	}
	if cfg.Approvals != nil {
		s.handle(s.mux, "GET /v1/approvals", http.HandlerFunc(s.listApprovals))
		s.handle(s.mux, "POST /v1/approvals/{action_id}", http.HandlerFunc(s.decide))
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.routes = map[string]Route{}
	for _, rt := range cfg.Routes {
		s.routes[rt.Pattern] = rt
		h := s.unbounded(rt.Handler.ServeHTTP)
		if rt.Drive {
			h = s.limited(rt.Handler.ServeHTTP)
		}
		s.handle(s.mux, rt.Pattern, h)
	}
	s.handle(s.mux, "POST /v1/runs/{run_id}/drive", s.limited(s.drive))
	s.handle(s.mux, "GET /v1/tools", http.HandlerFunc(s.listTools))
	s.handle(s.mux, "GET /openapi.json", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(OpenAPI)
	}))
	s.patterns = append(s.patterns, probes(s.mux, cfg.Live, s.ready, cfg.Gatherer)...)
	probes(s.ops, cfg.Live, s.ready, cfg.Gatherer)
	hs := newHosts(cfg.AllowedHosts)
	s.guarded, s.opsGuarded = hs.guard(http.HandlerFunc(s.serve)), hs.guard(jsonErrors(s.ops))
	if cfg.Pprof {
		s.ops.HandleFunc("GET /debug/pprof/", pprof.Index)
		s.ops.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		s.ops.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		s.ops.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		s.ops.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return s, nil
}

// Probes is the ops handler of a process without the API (`toolsidecar
// worker`): /healthz (503 with live's error), /readyz (503 with ready's
// error) and /metrics from g.
func Probes(live func() error, ready func(context.Context) error, g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	probes(mux, live, func(w http.ResponseWriter, r *http.Request) {
		if err := ready(r.Context()); err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	}, g)
	return mux
}

// probes registers /healthz, /readyz and /metrics on mux, and returns
// their patterns.
func probes(mux *http.ServeMux, live func() error, ready http.HandlerFunc, g prometheus.Gatherer) []string {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := live(); err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		health(w, r)
	})
	mux.HandleFunc("GET /readyz", ready)
	// OpenMetrics when the scraper asks for it (Prometheus does): the
	// call and drive histograms carry trace_id exemplars there.
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	return []string{"GET /healthz", "GET /readyz", "GET /metrics"}
}

// health answers liveness: the process serves.
func health(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Starting answers while the sidecar is still starting: /healthz 200 as
// usual, every other path 503 with reason(), so that a probe says why the
// sidecar is not ready yet.
func Starting(reason func() string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			health(w, r)
			return
		}
		writeError(w, http.StatusServiceUnavailable, reason())
	})
}

// Ops is the handler of the ops listener: /healthz, /readyz and /metrics,
// without the API token, so that probes and scraping need no secret and no
// API listener outside loopback.
func (s *Server) Ops() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.active.Add(1)
		defer s.active.Done()
		s.opsGuarded.ServeHTTP(w, r)
	})
}

// limited runs a drive within the cap on drives in progress: past it the
// answer is 429 with Retry-After, and no run is touched. A drive may last
// long, so the server's write timeout does not apply to it.
func (s *Server) limited(h http.HandlerFunc) http.HandlerFunc {
	return s.unbounded(func(w http.ResponseWriter, r *http.Request) {
		select {
		case s.drives <- struct{}{}:
			defer func() { <-s.drives }()
		default:
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusTooManyRequests, fmt.Sprintf("the sidecar is at its limit of %d drives in progress", cap(s.drives)))
			return
		}
		h(w, r)
	})
}

// unbounded lifts the write deadline for a handler that streams or waits
// on Core.
func (s *Server) unbounded(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
		h(w, r)
	}
}

// ServeHTTP checks the request as it came from a browser would be checked
// (browser.go), authenticates, bounds the body and routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.active.Add(1)
	defer s.active.Done()
	s.guarded.ServeHTTP(w, r)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if _, pattern := s.pages.Handler(r); pattern != "" {
		s.pages.ServeHTTP(w, r)
		return
	}
	if s.cfg.Token != "" && r.URL.Path != "/healthz" && r.URL.Path != "/readyz" {
		if !bearer(r, s.cfg.Token) && !bearer(r, s.cfg.Operator) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="toolsidecar"`)
			writeError(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
	}
	h, pattern := s.mux.Handler(r)
	if pattern == "" {
		s.noRoute(w, r, h)
		return
	}
	rt := s.routes[pattern] // the zero Route for the sidecar's own
	if !rt.AnyBody && !jsonBody(r) {
		writeError(w, http.StatusUnsupportedMediaType, "send the body as JSON, with Content-Type: application/json")
		return
	}
	if r.Body != nil {
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
		if !rt.AnyBody && changesState(r.Method) && !uniqueKeys(w, r, rt) {
			return
		}
	}
	// A caller's W3C trace context becomes the parent of the drive's spans.
	r = r.WithContext(otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
	s.mux.ServeHTTP(w, r)
}

// bearer reports a request that presents token as its bearer token; never
// for an empty token.
func bearer(r *http.Request, token string) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return token != "" && ok && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

// noRoute answers a request that no route serves (h is the mux's own 404
// or 405 answer) in JSON, in the shape of the route family the path falls
// under: a client of an API reads every error of it the same way.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request, h http.Handler) {
	writeErr := writeError
	for _, rt := range s.cfg.Routes {
		if rt.Errors != nil && underRoute(r.URL.Path, rt.Pattern) {
			writeErr = rt.Errors
		}
	}
	jsonNotFound(w, r, h, writeErr)
}

// underRoute reports a path at or under a route pattern's path.
func underRoute(path, pattern string) bool {
	_, p, hasMethod := strings.Cut(pattern, " ")
	if !hasMethod {
		p = pattern
	}
	p = strings.TrimSuffix(p, "/")
	return path == p || strings.HasPrefix(path, p+"/")
}

// jsonNotFound writes, with writeErr, the status the mux's own answer h
// would have written (404, or 405 with its Allow header) and a sentence
// saying what is missing, instead of its text/plain line.
func jsonNotFound(w http.ResponseWriter, r *http.Request, h http.Handler, writeErr func(http.ResponseWriter, int, string)) {
	c := &statusOnly{header: http.Header{}}
	h.ServeHTTP(c, r)
	if c.status == http.StatusMethodNotAllowed {
		allow := c.header.Get("Allow")
		w.Header().Set("Allow", allow)
		writeErr(w, c.status, fmt.Sprintf("method %s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, allow))
		return
	}
	writeErr(w, http.StatusNotFound, fmt.Sprintf("no route %s %s", r.Method, r.URL.Path))
}

// statusOnly keeps the status and headers a handler writes, and drops its
// body.
type statusOnly struct {
	header http.Header
	status int
}

func (c *statusOnly) Header() http.Header { return c.header }
func (c *statusOnly) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}
func (c *statusOnly) Write(b []byte) (int, error) {
	c.WriteHeader(http.StatusOK)
	return len(b), nil
}

// jsonErrors serves mux, answering the requests that none of its routes
// serve in JSON (the ops listener's).
func jsonErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h, pattern := mux.Handler(r); pattern == "" {
			jsonNotFound(w, r, h, writeError)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// ready answers 503 unless Core is reachable and NATS connected. With
// ?live=1 it also lists the tools that have a live worker ($SRV.INFO), so
// an operator sees at once which tools would fail with no responders.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Ready(r.Context()); err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	out := map[string]any{"status": "ready"}
	if s.cfg.ReadyInfo != nil {
		maps.Copy(out, s.cfg.ReadyInfo())
	}
	if r.URL.Query().Get("live") == "1" && s.tools != nil {
		live, err := s.tools.Live(r.Context())
		if err != nil {
			out["live_error"] = err.Error()
		}
		up, down := []string{}, []string{} // lists, never null
		for _, t := range s.tools.FunctionTools() {
			if live[t.Function.Name] {
				up = append(up, t.Function.Name)
			} else {
				down = append(down, t.Function.Name)
			}
		}
		out["tools_live"], out["tools_without_worker"] = up, down
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) listTools(w http.ResponseWriter, r *http.Request) {
	var live map[string]bool
	if r.URL.Query().Get("live") == "1" {
		var err error
		if live, err = s.tools.Live(r.Context()); err != nil {
			writeError(w, http.StatusServiceUnavailable, "liveness unknown: "+err.Error())
			return
		}
	}
	if r.URL.Query().Get("source") == "1" {
		writeJSON(w, http.StatusOK, withWorker(s.tools.SourcedTools(), live, func(t tool.SourcedTool) string { return t.Function.Name }))
		return
	}
	writeJSON(w, http.StatusOK, withWorker(s.tools.FunctionTools(), live, func(t tool.FunctionTool) string { return t.Function.Name }))
}

// withWorker keeps the tools that live says have a worker; all of them
// when live is nil (not asked).
func withWorker[T any](tools []T, live map[string]bool, name func(T) string) []T {
	if live == nil {
		return tools
	}
	return slices.DeleteFunc(tools, func(t T) bool { return !live[name(t)] })
}

func (s *Server) drive(w http.ResponseWriter, r *http.Request) {
	// The body is an executor.Request without run_id, which the path gives.
	var req executor.Request
	if !decodeStrict(w, r, &req) {
		return
	}
	if req.RunID != "" && req.RunID != r.PathValue("run_id") {
		writeError(w, http.StatusBadRequest, "run_id in the body differs from the path")
		return
	}
	req.RunID = r.PathValue("run_id")
	req.CallerKey = r.Header.Get("X-API-Key")
	req.Caller = executor.CallerOf(r.Header)
	req.Traceparent = r.Header.Get("traceparent")
	var missing []string
	for name, v := range map[string]string{"thread_id": req.ThreadID, "assistant_id": req.AssistantID, "message_id": req.MessageID, "model": req.Model} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		writeError(w, http.StatusBadRequest, "missing fields: "+strings.Join(missing, ", "))
		return
	}
	if err := req.Check(); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		req.ResumeAfter = r.Header.Get("Last-Event-ID")
		if req.ResumeAfter != "" && !eventID.MatchString(req.ResumeAfter) {
			writeError(w, http.StatusBadRequest, "Last-Event-ID is not the id of a drive's event (<drive>-<n>)")
			return
		}
		s.driveSSE(w, r, req)
		return
	}
	// The request context ends when the client goes away: that cancels
	// the drive under the loop's cancellation rule (once every caller
	// attached to the run's drive has gone).
	sum, err := s.driveRun(r.Context(), req, nil)
	writeJSON(w, driveStatus(err), sum)
}

// eventID is the form of a drive event's id (executor.Event.ID).
var eventID = regexp.MustCompile(`^[0-9a-z]{1,13}-[0-9]{1,19}$`)

// driveStatus is the HTTP status of a drive, whose summary is the body in
// every case: 200 for a drive that ended as the run's rules say
// (completed, cancelled, interrupted, turn limit); Core's own 401, 403 or
// 404 when the caller's identity may not read the run (404: no such run);
// 409 when the request names another thread or assistant than the run's;
// 500 for the sidecar's own bug guard; 502 for a run that failed upstream
// (Core or the model).
func driveStatus(err error) int {
	switch code := executor.UpstreamStatus(err); {
	case err == nil:
		return http.StatusOK
	case errors.Is(err, executor.ErrInvalidRequest):
		return http.StatusBadRequest
	case code == http.StatusUnauthorized, code == http.StatusForbidden, code == http.StatusNotFound:
		return code
	case errors.Is(err, executor.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, executor.ErrGuard):
		return http.StatusInternalServerError
	}
	return http.StatusBadGateway
}

// decodeStrict decodes one JSON object: unknown fields and trailing data
// are errors.
func decodeStrict(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("data after the JSON object")
		}
	}
	if err != nil {
		status := http.StatusBadRequest
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			status = http.StatusRequestEntityTooLarge
		}
		writeError(w, status, "invalid body: "+err.Error())
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": tool.Truncate(msg, tool.MaxErrorMessage)})
}
