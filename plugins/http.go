package plugins

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

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
}

func init() { registry.RegisterKind("http", newHTTP) }

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
	return s, nil
}

func newHTTP(_ *registry.Tool, settings map[string]any) (tool.Handler, error) {
	s, err := httpSettings(settings)
	if err != nil {
		return nil, err
	}
	var token string
	if s.BearerTokenFile != "" {
		if token, err = config.ReadSecret(s.BearerTokenFile); err != nil {
			return nil, err
		}
	}
	hc := &http.Client{}
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
