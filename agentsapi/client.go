package agentsapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/projectdavid/toolsidecar/internal/clock"
	"github.com/projectdavid/toolsidecar/internal/frames"
	"github.com/projectdavid/toolsidecar/internal/retry"
)

// Config configures a client of either API.
type Config struct {
	// URL is the API's base as its official client takes it:
	// https://api.openai.com/v1 (OpenAI), https://api.anthropic.com
	// (Anthropic).
	URL string
	// HTTP sends the requests. default: a client of its own, no timeout (a
	// stream is long; IdleTimeout bounds its silences)
	HTTP *http.Client
	// MaxEventBytes bounds one event of a stream, one read's body and an
	// error body while they are read. Required.
	MaxEventBytes int
	// IdleTimeout bounds a stream's silence (no event); past it the stream
	// counts as cut. Required.
	IdleTimeout time.Duration
	// RetryBudget bounds the retries of one request through 429, 5xx and
	// 529 (a Retry-After longer than the wait wins). Required.
	RetryBudget time.Duration
	Logger      *slog.Logger
}

// client is what both APIs share: requests with their headers, retried
// within the budget, and bounded reads.
type client struct {
	cfg     Config
	headers func(h http.Header, key string)
	log     *slog.Logger
}

func newClient(cfg Config, headers func(http.Header, string)) (*client, error) {
	if cfg.MaxEventBytes <= 0 || cfg.IdleTimeout <= 0 || cfg.RetryBudget <= 0 {
		return nil, fmt.Errorf("agentsapi: MaxEventBytes (%d), IdleTimeout (%v) and RetryBudget (%v) must be positive",
			cfg.MaxEventBytes, cfg.IdleTimeout, cfg.RetryBudget)
	}
	if !strings.HasPrefix(cfg.URL, "http://") && !strings.HasPrefix(cfg.URL, "https://") {
		return nil, fmt.Errorf("agentsapi: url %q is not an http(s) URL", cfg.URL)
	}
	cfg.URL = strings.TrimSuffix(cfg.URL, "/")
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &client{cfg: cfg, headers: headers, log: log}, nil
}

// retryable reports a status worth trying again: 408, 409 is not (the
// session's state), 429, 5xx and Anthropic's 529.
func retryable(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusRequestTimeout || status >= 500
}

// do sends one request, the same one again through connection errors,
// 429 and 5xx within the retry budget, and returns the body of its 2xx
// answer (bounded). again, when set, may ask for one more try after a
// refusal the API's own race explains (it returns the wait, or false).
func (c *client) do(ctx context.Context, method, path, key string, body []byte, extra http.Header,
	again func(err *HTTPError, tries int) (time.Duration, bool)) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RetryBudget)
	defer cancel()
	b := retry.UpstreamTurn.New()
	for tries := 1; ; tries++ {
		out, wait, err := c.once(ctx, method, path, key, body, extra)
		if err == nil {
			return out, nil
		}
		var he *HTTPError
		switch {
		case errors.Is(err, ErrTooLarge): // the same answer again: final
			return nil, err
		case errors.As(err, &he) && retryable(he.Status):
			wait = max(wait, b.NextBackOff())
		case errors.As(err, &he) && again != nil:
			w, ok := again(he, tries)
			if !ok {
				return nil, err
			}
			wait = w
		case errors.As(err, &he):
			return nil, err
		case ctx.Err() != nil:
			return nil, err
		default: // a connection error: the request may not have arrived
			wait = b.NextBackOff()
		}
		c.log.Debug("request to the hosted API tried again", "method", method, "try", tries, "wait", wait, "err", err)
		if clock.Sleep(ctx, wait) != nil {
			return nil, fmt.Errorf("%w (retry budget %v spent)", err, c.cfg.RetryBudget)
		}
	}
}

// once sends the request once: its 2xx body, or the error and the wait
// its Retry-After asks for.
func (c *client) once(ctx context.Context, method, path, key string, body []byte, extra http.Header) ([]byte, time.Duration, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.cfg.URL+path, rd)
	if err != nil {
		return nil, 0, err
	}
	c.headers(req.Header, key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	for k, v := range extra {
		req.Header[k] = v
	}
	resp, err := c.cfg.HTTP.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, int64(c.cfg.MaxEventBytes)+1))
	if err != nil {
		return nil, 0, err
	}
	if resp.StatusCode/100 != 2 { // its message, cut at the bound
		return nil, clock.RetryAfter(resp.Header.Get("Retry-After"), time.Now()), &HTTPError{Status: resp.StatusCode, Message: errorMessage(data)}
	}
	if len(data) > c.cfg.MaxEventBytes {
		return nil, 0, fmt.Errorf("%w: %s %s: more than %d bytes", ErrTooLarge, method, path, c.cfg.MaxEventBytes)
	}
	return data, 0, nil
}

// ErrTooLarge: an answer passed Config.MaxEventBytes. It is final, not
// tried again: the API would send the same answer.
var ErrTooLarge = errors.New("agentsapi: the answer is larger than its bound")

// errorMessage reads {"error": {"message": ...}}, both APIs' shape, or
// the body.
func errorMessage(data []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	return string(data)
}

// stream opens a GET stream and yields each event's data and name.
func (c *client) stream(ctx context.Context, path, key string) (*http.Response, *frames.EventStream, context.CancelCauseFunc, error) {
	sctx, cancel := context.WithCancelCause(ctx)
	req, err := http.NewRequestWithContext(sctx, http.MethodGet, c.cfg.URL+path, nil)
	if err != nil {
		cancel(err)
		return nil, nil, nil, err
	}
	c.headers(req.Header, key)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.cfg.HTTP.Do(req)
	if err != nil {
		cancel(err)
		return nil, nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, int64(c.cfg.MaxEventBytes)))
		resp.Body.Close()
		cancel(nil)
		return nil, nil, nil, &HTTPError{Status: resp.StatusCode, Message: errorMessage(data)}
	}
	read := frames.ReadEvents(resp.Body, c.cfg.MaxEventBytes, oversized, c.cfg.IdleTimeout, func() { cancel(ErrIdle) })
	return resp, read, cancel, nil
}

// ErrIdle: a stream said nothing for the idle timeout.
var ErrIdle = errors.New("agentsapi: the stream was silent past its idle timeout")

// oversized stands for an event too long to read: it is skipped, and
// logged by type.
func oversized(o frames.Oversized) []byte {
	return fmt.Appendf(nil, "event: %s\ndata: {\"size\":%d}\n\n", frames.OversizedEvent, o.Size)
}
