package plugins

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// HTTPSettings configure route http: each call POSTs the manifest to URL.
// A 2xx body is the result; a 4xx is a tool_error (429: rate_limited); a
// 5xx or a timeout may be retried.
type HTTPSettings struct {
	// URL is required, http or https.
	URL string `json:"url"`
	// Headers are sent with every call; put no secret here.
	Headers map[string]string `json:"headers"`
	// BearerTokenFile, when set, sends "Authorization: Bearer <file>".
	BearerTokenFile string `json:"bearer_token_file"`
	// MaxResponseBytes bounds the body read. default: 1 MiB
	MaxResponseBytes int `json:"max_response_bytes"`
	// FollowRedirects is "never" (a redirect is an error outcome) or
	// "same_origin" (followed only to the URL's own scheme, host and
	// port). default: never
	FollowRedirects string `json:"follow_redirects"`
	// AllowLinkLocal lets the tool reach link-local addresses
	// (169.254.0.0/16, fe80::/10), where cloud metadata services answer.
	// default: false
	AllowLinkLocal bool `json:"allow_link_local"`
}

// Redirect policies of the http route.
const (
	RedirectNever      = "never"
	RedirectSameOrigin = "same_origin"
)

// httpKind is route http.
type httpKind struct{ inProcess }

func httpSettings(settings map[string]any) (HTTPSettings, error) {
	var s HTTPSettings
	if err := registry.DecodeSettings("http", settings, &s); err != nil {
		return s, err
	}
	u, err := url.Parse(s.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return s, fmt.Errorf("http.url: %q is not an http(s) URL", s.URL)
	}
	if s.MaxResponseBytes <= 0 {
		s.MaxResponseBytes = 1 << 20
	}
	switch s.FollowRedirects {
	case "":
		s.FollowRedirects = RedirectNever
	case RedirectNever, RedirectSameOrigin:
	default:
		return s, fmt.Errorf("http.follow_redirects: must be never or same_origin, got %q", s.FollowRedirects)
	}
	return s, nil
}

// Refusals of the http route's policy: a tool error, not retried.
var (
	errLinkLocal = errors.New("link-local address refused (http.allow_link_local is false)")
	errRedirect  = errors.New("redirect not followed")
)

// idlePerTool is how many connections an http tool keeps open between
// calls: as many calls at once then reuse them.
const idlePerTool = 64

// client is the HTTP client of one tool: redirects only as the settings
// allow (never across origins, so no credential leaves for another host),
// and no link-local destination unless allowed, whatever DNS says.
func (s HTTPSettings) client() *http.Client {
	origin, _ := url.Parse(s.URL)
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	if !s.AllowLinkLocal {
		dialer.Control = func(_, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			if ip, err := netip.ParseAddr(host); err == nil && (ip.Unmap().IsLinkLocalUnicast() || ip.Unmap().IsLinkLocalMulticast()) {
				return fmt.Errorf("%w: %s", errLinkLocal, host)
			}
			return nil
		}
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = dialer.DialContext
	t.Proxy = nil // the tool's URL is reached directly, not through an environment proxy
	// Go's default keeps 2 connections idle per host: every burst of calls
	// beyond that would open new ones (and over TLS pay a handshake each).
	t.MaxIdleConnsPerHost = idlePerTool
	return &http.Client{Transport: t, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if s.FollowRedirects != RedirectSameOrigin {
			return fmt.Errorf("%w: %s (http.follow_redirects: never)", errRedirect, req.URL.Redacted())
		}
		if req.URL.Scheme != origin.Scheme || req.URL.Host != origin.Host {
			return fmt.Errorf("%w: %s is another origin", errRedirect, req.URL.Redacted())
		}
		if len(via) >= 5 {
			return fmt.Errorf("%w: more than 5 redirects", errRedirect)
		}
		return nil
	}}
}

func (httpKind) Build(_ *registry.Tool, settings map[string]any) (tool.Handler, error) {
	s, err := httpSettings(settings)
	if err != nil {
		return nil, err
	}
	var token string
	if s.BearerTokenFile != "" {
		if token, err = config.ReadSecret("http.bearer_token_file", s.BearerTokenFile); err != nil {
			return nil, err
		}
	}
	hc := s.client()
	return func(ctx context.Context, c *tool.Call) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, bytes.NewReader(c.Manifest))
		if err != nil {
			return nil, tool.NewError(tool.ToolFailed, "building request: %v", err)
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range s.Headers {
			req.Header.Set(k, v)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		req.Header.Set(tool.HeaderAttempt, strconv.Itoa(c.Attempt))
		req.Header.Set(tool.HeaderIdempotencyKey, c.IdempotencyKey)
		if c.Traceparent != "" {
			req.Header.Set(tool.HeaderTraceparent, c.Traceparent)
		}
		if !c.Deadline.IsZero() {
			req.Header.Set(tool.HeaderDeadline, strconv.FormatInt(c.Deadline.UnixMilli(), 10))
		}
		resp, err := hc.Do(req)
		if err != nil {
			if ctx.Err() != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
				return nil, tool.NewError(tool.Timeout, "%s did not answer before the deadline", s.URL)
			}
			if ctx.Err() != nil {
				return nil, tool.NewError(tool.Cancelled, "request to %s cancelled", s.URL)
			}
			if errors.Is(err, errRedirect) || errors.Is(err, errLinkLocal) {
				return nil, tool.NewError(tool.ToolFailed, "%s: %v", s.URL, errors.Unwrap(err))
			}
			return nil, tool.NewError(tool.WorkerCrash, "%s unreachable: %v", s.URL, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, int64(s.MaxResponseBytes)+1))
		if err != nil {
			return nil, tool.NewError(tool.WorkerCrash, "reading %s: %v", s.URL, err)
		}
		if len(body) > s.MaxResponseBytes {
			return nil, tool.NewError(tool.ToolFailed, "response exceeds %d bytes", s.MaxResponseBytes)
		}
		excerpt := strings.TrimSpace(string(body[:min(len(body), stderrExcerpt)]))
		switch {
		case resp.StatusCode/100 == 2:
			return body, nil
		case resp.StatusCode == http.StatusTooManyRequests:
			return nil, tool.NewError(tool.RateLimited, "HTTP 429 from %s: %s", s.URL, excerpt)
		case resp.StatusCode >= 500:
			// Retryable: the taxonomy's retryable type for a broken server.
			return nil, tool.NewError(tool.WorkerCrash, "HTTP %d from %s: %s", resp.StatusCode, s.URL, excerpt)
		default:
			return nil, tool.NewError(tool.ToolFailed, "HTTP %d from %s: %s", resp.StatusCode, s.URL, excerpt)
		}
	}, nil
}
