package config

import (
	"net/url"
	"strings"
	"time"
)

// Server is the application-facing HTTP server.
type Server struct {
	// Listen address. default: 127.0.0.1:8741 (loopback)
	Listen string `koanf:"listen"`
	// OpsListen, when set, serves /healthz, /readyz and /metrics, without
	// the API token, on a listener of their own (probes and scraping).
	// default: "" (off)
	OpsListen string `koanf:"ops_listen"`
	// Pprof serves Go's profiles under /debug/pprof/ on the ops listener
	// (never on the API's), for an operator chasing CPU or memory.
	// default: false
	Pprof bool `koanf:"pprof"`
	// ReadHeaderTimeout, ReadTimeout and IdleTimeout bound a connection
	// that stalls or idles. defaults: 10s, 30s, 120s
	ReadHeaderTimeout time.Duration `koanf:"read_header_timeout"`
	ReadTimeout       time.Duration `koanf:"read_timeout"`
	IdleTimeout       time.Duration `koanf:"idle_timeout"`
	// MaxHeaderBytes bounds request headers. default: 64 KiB
	MaxHeaderBytes int `koanf:"max_header_bytes"`
	// MaxConnections bounds open connections; MaxDrives bounds drives in
	// progress (more are answered 429 with Retry-After). defaults: 1024, 512
	MaxConnections int `koanf:"max_connections"`
	MaxDrives      int `koanf:"max_drives"`
	// HTTP2Cleartext also serves HTTP/2 without TLS (h2c, prior knowledge)
	// on the API's listener, so that a client can carry many drives on
	// one connection, at most MaxStreams at once. default: false
	HTTP2Cleartext bool `koanf:"http2_cleartext"`
	// MaxStreams bounds the requests at once on one HTTP/2 connection.
	// default: 250
	MaxStreams int `koanf:"max_streams"`
	// SSEKeepalive is how often an SSE drive that has nothing to say sends
	// a comment, so that proxies and clients do not time it out. default:
	// 15s
	SSEKeepalive time.Duration `koanf:"sse_keepalive"`
	// SSEResumeGrace is how long a run driven over SSE goes on after its
	// last stream dropped, for the client to reconnect with Last-Event-ID
	// and read on from the event it last had. A run whose clients do not
	// come back within it is cancelled; 0 cancels at once. default: 10s
	SSEResumeGrace time.Duration `koanf:"sse_resume_grace"`
	// Proxy answers Core's own API on /v1/... default: true
	Proxy bool `koanf:"proxy"`
	// MCP serves the registered tools as an MCP server (streamable HTTP,
	// stateless) on /mcp, behind the API token. Its calls run through the
	// same dispatch and policies as a model's, and have no Core Action.
	// default: false
	MCP bool `koanf:"mcp"`
	// UI serves the live view of runs, batches and approvals on /ui. The
	// page carries no data; what it shows comes from /ui/events and
	// /v1/approvals, behind the API token. default: true
	UI bool `koanf:"ui"`
	// AllowedHosts are the host names, beside localhost and IP addresses,
	// that requests may name in their Host header: a page that rebinds its
	// own DNS name to the sidecar's address is refused, token or not.
	// "*" allows every name. default: [] (loopback names and addresses)
	AllowedHosts []string `koanf:"allowed_hosts"`
	// UIHistory is how many finished runs the live view keeps.
	// default: 200
	UIHistory int `koanf:"ui_history"`
	// UITraceURL links each run of the live view to its trace: an http(s)
	// URL of the tracing backend in which {trace_id} is replaced by the
	// run's trace id (https://grafana.example/explore?traceId={trace_id}).
	// default: "" (no link)
	UITraceURL string `koanf:"ui_trace_url"`
	// AuthTokenFile holds a bearer token required on every route but
	// health. Optional.
	AuthTokenFile string `koanf:"auth_token_file"`
	// OperatorTokenFile holds the operator's bearer token: taken wherever
	// the API token is, it shows the live view and GET /v1/sidecar/runs
	// every caller's runs and hosted sessions; any other request sees
	// only the runs its own credentials drove. It must differ from the
	// API token. Optional: without it nobody sees the whole board.
	OperatorTokenFile string `koanf:"operator_token_file"`
	// ShutdownTimeout bounds the drain of in-flight batches. default: 30s
	ShutdownTimeout time.Duration `koanf:"shutdown_timeout"`
	// MaxBodyBytes bounds request bodies. default: 1 MiB
	MaxBodyBytes int64 `koanf:"max_body_bytes"`
}

func (s Server) validate() []error {
	p := problems{prefix: "server"}
	p.hostPort("listen", s.Listen, false)
	p.hostPort("ops_listen", s.OpsListen, true)
	p.positive(map[string]int64{"shutdown_timeout": int64(s.ShutdownTimeout), "sse_keepalive": int64(s.SSEKeepalive)}, durationText)
	p.positive(map[string]int64{"read_header_timeout": int64(s.ReadHeaderTimeout), "read_timeout": int64(s.ReadTimeout),
		"idle_timeout": int64(s.IdleTimeout), "max_header_bytes": int64(s.MaxHeaderBytes), "max_connections": int64(s.MaxConnections),
		"max_drives": int64(s.MaxDrives), "max_streams": int64(s.MaxStreams), "ui_history": int64(s.UIHistory), "max_body_bytes": s.MaxBodyBytes}, numberText)
	if u, err := url.Parse(s.UITraceURL); s.UITraceURL != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		!strings.Contains(s.UITraceURL, "{trace_id}")) {
		p.add("ui_trace_url", "must be an http(s) URL with {trace_id} in it, got %q", s.UITraceURL)
	}
	if s.SSEResumeGrace < 0 {
		p.add("sse_resume_grace", "must not be negative, got %s", s.SSEResumeGrace)
	}
	if s.Pprof && s.OpsListen == "" {
		p.add("pprof", "needs server.ops_listen: profiles are served there only")
	}
	return p.list
}
