package config

import (
	"net/url"
	"time"
)

// Upstream says where the model is.
type Upstream struct {
	// Kind is core (Project David Core, configured under core), openai
	// (an OpenAI-compatible Chat Completions server: OpenAI, vLLM, Ollama,
	// llama.cpp, LiteLLM), which applications reach at the sidecar's POST
	// /v1/chat/completions, responses (an OpenAI Responses API server:
	// OpenAI, vLLM, Ollama, llama.cpp, LiteLLM), which they reach at POST
	// /v1/responses, or anthropic (a Messages API server: Anthropic,
	// LiteLLM, vLLM, Ollama, llama.cpp), which they reach at POST
	// /v1/messages. Two kinds watch hosted agent sessions instead of
	// driving a model: openai-agents (the OpenAI Agents API, which
	// applications reach under the sidecar's /v1/agents/) and
	// anthropic-agents (Anthropic Managed Agents); when a session blocks on
	// client tools of the registry, the sidecar runs them and posts their
	// results. default: core
	Kind string `koanf:"kind"`
	// URL of the model's API as its official client takes it, for kinds
	// openai, responses and anthropic: with its version for openai and
	// responses (https://api.openai.com/v1, http://127.0.0.1:11434/v1),
	// without for anthropic (https://api.anthropic.com). Likewise
	// https://api.openai.com/v1 for openai-agents and
	// https://api.anthropic.com for anthropic-agents.
	URL string `koanf:"url"`
	// APIKeyFile holds the key sent upstream, for kinds openai and
	// responses (as a bearer token) and anthropic (as x-api-key). Optional:
	// TOOLSIDECAR_UPSTREAM_API_KEY is read when it is empty. Without
	// server.auth_token_file, a caller's own key is sent instead. For
	// kinds openai-agents and anthropic-agents it is the sidecar's own
	// key: sessions that webhooks name are followed with it, and with
	// server.auth_token_file every request passed through carries it.
	APIKeyFile string `koanf:"api_key_file"`
	// RetryBudget bounds the retries of one turn's request (429 after its
	// Retry-After, 5xx, a failed connection, a stream cut before its
	// finish chunk); for kinds openai-agents and anthropic-agents, of one
	// request to the hosted API (a post of a batch's results, a read).
	// default: 30s
	RetryBudget time.Duration `koanf:"retry_budget"`
	// ConnectTimeout bounds how long a turn's request goes on trying to
	// connect to the upstream (a refused connection, a failed DNS lookup,
	// a connection that does not open) before the run fails saying the
	// upstream cannot be reached; retry_budget still bounds the rest.
	// default: 5s
	ConnectTimeout time.Duration `koanf:"connect_timeout"`
	// StreamIdleTimeout bounds the silence of a turn's stream (no byte: an
	// event or a keep-alive comment), for kinds openai, responses and
	// anthropic; past it the turn is retried within retry_budget. For
	// kinds openai-agents and anthropic-agents, the silence of a watched
	// session's stream, past which it is reopened. default: 2m
	StreamIdleTimeout time.Duration `koanf:"stream_idle_timeout"`
	// JournalTTL is how long the journal keeps a run of a model's API
	// (kinds openai, responses, anthropic): a
	// retried request resumes its run within it, and a request with the
	// Idempotency-Key of a run that ended gets that run's answer again.
	// In durable mode the journal is in JetStream; otherwise in memory,
	// and a restart loses it. default: 24h
	JournalTTL time.Duration `koanf:"journal_ttl"`
	// MaxSessions bounds the hosted sessions watched at once, for kinds
	// openai-agents and anthropic-agents: each is one open event stream
	// and two goroutines. A session with nothing of the sidecar's in
	// flight, idle or waiting only on calls of the application's own
	// tools, keeps its slot until another session needs it: then the
	// watch of the one resting the longest ends, and that session is
	// watched again when it is next read through the sidecar, when the
	// application posts to it through the sidecar (its own tools'
	// results), or when a webhook names it (a block of the registry's
	// tools it reaches meanwhile is not answered until then). When every
	// slot holds a session at work, a session created or read is passed
	// through and not watched (logged at warn; a webhook is answered 503,
	// which the API sends again). default: 1000
	MaxSessions int `koanf:"max_sessions"`
	// MaxSessionsPerOwner bounds the sessions watched at once for one
	// caller (the same key in the header the API authenticates: OpenAI's
	// Authorization, Anthropic's X-Api-Key; other headers do not count),
	// so that one caller cannot take every slot; past it the caller's own
	// resting session gives its slot up, or its new session is not
	// watched. The sessions followed with the sidecar's own key (those
	// webhooks name, and every session when server.auth_token_file is set
	// with the sidecar's upstream key, as callers are then not told apart)
	// are not bounded by it. 0: half of max_sessions (at least 1).
	// default: 0
	MaxSessionsPerOwner int `koanf:"max_sessions_per_owner"`
	// WebhookSecretFile holds the signing secret (whsec_<base64>) of the
	// hosted API's webhooks, for kinds openai-agents and anthropic-agents.
	// When set, the sidecar takes POST /v1/sidecar/webhooks/<kind>
	// without its API token, verifies each request's Standard Webhooks
	// signature (a forged or stale one is refused), and follows the
	// session that requires action with its own key (api_key_file, then
	// required), reading it without a stream until its calls are
	// answered. Optional.
	WebhookSecretFile string `koanf:"webhook_secret_file"`
	// Confirmations says who answers the server calls of a session that
	// wait for the client's permission (Anthropic's ask-gated
	// agent.tool_use and agent.mcp_tool_use), for kind anthropic-agents:
	// application (the sidecar leaves them) or approval (each becomes an
	// approval of the approval API, GET /v1/approvals, and the sidecar
	// posts the person's decision as user.tool_confirmation). default:
	// application
	Confirmations string `koanf:"confirmations"`
}

// Who answers a hosted session's permission requests.
const (
	ConfirmByApplication = "application"
	ConfirmByApproval    = "approval"
)

// Upstream kinds.
const (
	UpstreamCore      = "core"
	UpstreamOpenAI    = "openai"
	UpstreamAnthropic = "anthropic"
	UpstreamResponses = "responses"
	// The hosted agent loops: the sidecar watches sessions, it does not
	// drive a model.
	UpstreamOpenAIAgents    = "openai-agents"
	UpstreamAnthropicAgents = "anthropic-agents"
)

// UpstreamKinds are the values upstream.kind takes.
var UpstreamKinds = []string{UpstreamCore, UpstreamOpenAI, UpstreamAnthropic, UpstreamResponses, UpstreamOpenAIAgents, UpstreamAnthropicAgents}

// Hosted reports an upstream of hosted agent sessions (openai-agents,
// anthropic-agents).
func (u Upstream) Hosted() bool {
	return u.Kind == UpstreamOpenAIAgents || u.Kind == UpstreamAnthropicAgents
}

// Model reports an upstream that is a model's API (openai, anthropic,
// responses), which applications reach through the sidecar, rather than
// Core.
func (u Upstream) Model() bool {
	return u.Kind == UpstreamOpenAI || u.Kind == UpstreamAnthropic || u.Kind == UpstreamResponses
}

// UpstreamAPIKeyEnv holds the upstream's key when no
// upstream.api_key_file is set.
const UpstreamAPIKeyEnv = EnvPrefix + "UPSTREAM_API_KEY"

func (u Upstream) validate() []error {
	p := problems{prefix: "upstream"}
	switch u.Kind {
	case UpstreamCore:
	case UpstreamOpenAI, UpstreamResponses, UpstreamOpenAIAgents:
		if !httpURL(u.URL) {
			p.add("url", "must be the http(s) URL of the API with its version (https://api.openai.com/v1), got %q", RedactURL(u.URL))
		}
	case UpstreamAnthropic, UpstreamAnthropicAgents:
		if !httpURL(u.URL) {
			p.add("url", "must be the http(s) URL of the API as its client takes it (https://api.anthropic.com), got %q", RedactURL(u.URL))
		}
	default:
		p.add("kind", "must be core, openai, anthropic, responses, openai-agents or anthropic-agents, got %q", u.Kind)
	}
	p.positive(map[string]int64{"retry_budget": int64(u.RetryBudget), "connect_timeout": int64(u.ConnectTimeout), "stream_idle_timeout": int64(u.StreamIdleTimeout),
		"journal_ttl": int64(u.JournalTTL)}, durationText)
	if u.Hosted() {
		p.positive(map[string]int64{"max_sessions": int64(u.MaxSessions)}, numberText)
		if u.MaxSessionsPerOwner < 0 || u.MaxSessionsPerOwner > u.MaxSessions {
			p.add("max_sessions_per_owner", "must be between 0 (half of max_sessions) and max_sessions (%d), got %d", u.MaxSessions, u.MaxSessionsPerOwner)
		}
	} else if u.WebhookSecretFile != "" {
		p.add("webhook_secret_file", "is for kinds openai-agents and anthropic-agents, not %s", u.Kind)
	}
	switch {
	case u.Confirmations != ConfirmByApplication && u.Confirmations != ConfirmByApproval:
		p.add("confirmations", "must be application or approval, got %q", u.Confirmations)
	case u.Confirmations == ConfirmByApproval && u.Kind != UpstreamAnthropicAgents:
		p.add("confirmations", "approval is for kind anthropic-agents (the only API whose server calls ask the client), not %s", u.Kind)
	}
	return p.list
}

// httpURL reports an http(s) URL with a host.
func httpURL(s string) bool {
	u, err := url.Parse(s)
	return s != "" && err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// Core is the upstream Core API.
type Core struct {
	// TLS to Core: a CA bundle for a private CA, and a client certificate
	// when Core asks for one. All optional.
	TLS TLS `koanf:"tls"`
	// URL of Core, without /v1. default: http://127.0.0.1:9000
	URL string `koanf:"url"`
	// APIKeyFile holds the X-API-Key. Optional: TOOLSIDECAR_CORE_API_KEY
	// is read when it is empty.
	APIKeyFile string `koanf:"api_key_file"`
	// Timeout bounds each non-streaming call, its retries and its wait
	// for a connection included. The writes that make a call's outcome
	// count (its processing mark, tool output and final status) wait for
	// Core's answer up to executor.submit_budget instead: one given up on
	// could still be applied by Core after the call's next write.
	// default: 30s
	Timeout time.Duration `koanf:"timeout"`
	// ConnectTimeout bounds the opening of a connection to Core, and the
	// retries of a call that could not connect: a Core that cannot be
	// reached fails the call after it, saying so. default: 5s
	ConnectTimeout time.Duration `koanf:"connect_timeout"`
	// StreamIdleTimeout bounds the silence between frames. default: 280s
	StreamIdleTimeout time.Duration `koanf:"stream_idle_timeout"`
	// ReadinessCheck makes /readyz also require Core to answer. Off by
	// default: a Core outage is not the sidecar's, and would mark every
	// application pod NotReady at once. default: false
	ReadinessCheck bool `koanf:"readiness_check"`
	// MaxConnections bounds the connections, and so the requests at once,
	// of every call to Core but the completions streams (one connection
	// each); more wait in a queue (toolsidecar_core_requests_queued).
	// default: 64
	MaxConnections int `koanf:"max_connections"`
	// IdleTimeout is how long a connection to Core is kept idle. Keep it
	// below Core's keep-alive timeout (uvicorn's: 5 s), so that the
	// sidecar, not Core, closes an idle connection: a POST that meets
	// Core's close on its way out is not sent again. default: 4s
	IdleTimeout time.Duration `koanf:"idle_timeout"`
}

func (c Core) validate() []error {
	p := problems{prefix: "core"}
	if !httpURL(c.URL) {
		p.add("url", "must be an http(s) URL, got %q", RedactURL(c.URL))
	}
	p.positive(map[string]int64{"timeout": int64(c.Timeout), "connect_timeout": int64(c.ConnectTimeout), "stream_idle_timeout": int64(c.StreamIdleTimeout),
		"idle_timeout": int64(c.IdleTimeout)}, durationText)
	p.positive(map[string]int64{"max_connections": int64(c.MaxConnections)}, numberText)
	return p.list
}
