package coreup

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
	"strings"

	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/tool"
)

// ProxyConfig configures proxy mode.
type ProxyConfig struct {
	// CoreURL is where proxied requests go.
	CoreURL string
	// Transport carries them (Core's TLS, say). default: http.DefaultTransport
	Transport http.RoundTripper
	// Drive drives the runs of POST /v1/completions.
	Drive executor.DriveFunc
	// RunCancelled is told of each run that Core cancelled at a request
	// through the proxy, so that its calls stop at once rather than at the
	// next poll of Core.
	RunCancelled func(runID string)
	Logger       *slog.Logger
}

// Proxy is proxy mode: the sidecar answers Core's own API, so that an
// unmodified SDK pointed at it gets fully tool-resolved streams.
// Completions serves POST /v1/completions (it drives a run); Forward
// serves every other /v1/ request, passed to Core unchanged.
type Proxy struct {
	Completions http.Handler
	Forward     http.Handler
}

// NewProxy builds proxy mode. No I/O.
func NewProxy(cfg ProxyConfig) (*Proxy, error) {
	u, err := url.Parse(cfg.CoreURL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("coreup: core url %q: %v", cfg.CoreURL, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	forward := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.Host = u.Host
			r.Out.Header.Del("Authorization") // the sidecar's token is not Core's
		},
		Transport:     cfg.Transport,
		FlushInterval: -1, // stream bodies as they come
		ModifyResponse: func(resp *http.Response) error {
			if id, ok := cancelledRun(resp); ok && cfg.RunCancelled != nil {
				cfg.RunCancelled(id)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				// The caller's body passed the server's bound: its fault,
				// not Core's.
				writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", tooLarge.Limit))
				return
			}
			log.Warn("proxy to Core failed", "path", tool.Excerpt(r.URL.Path), "err", err)
			writeError(w, http.StatusBadGateway, "Core unreachable: "+err.Error())
		},
	}
	return &Proxy{Completions: completions{drive: cfg.Drive, forward: forward}, Forward: forward}, nil
}

// cancelledRun reports the run that a successful POST
// /v1/runs/{id}/cancel through the proxy cancelled.
func cancelledRun(resp *http.Response) (string, bool) {
	r := resp.Request
	if r == nil || r.Method != http.MethodPost || resp.StatusCode/100 != 2 {
		return "", false
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/v1/runs/")
	if !ok {
		return "", false
	}
	id, ok := strings.CutSuffix(rest, "/cancel")
	return id, ok && id != "" && !strings.Contains(id, "/")
}

// writeError answers in the sidecar's error shape.
func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": tool.Truncate(msg, tool.MaxErrorMessage)})
}

// completions answers Core's POST /v1/completions. The loop drives the
// run; the client receives Core's own frames ("data: <chunk>"), without
// the manifests the sidecar handled, and one [DONE] after the last turn. A
// buffered request (stream: false) goes to Core unchanged.
type completions struct {
	drive   executor.DriveFunc
	forward http.Handler
}

func (p completions) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		core.CompletionRequest
		Stream  *bool  `json:"stream"`
		Content string `json:"content,omitempty"`
	}
	raw, err := io.ReadAll(r.Body)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", tooLarge.Limit))
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		writeError(w, http.StatusUnprocessableEntity, "invalid body: "+err.Error())
		return
	}
	if body.Stream != nil && !*body.Stream {
		r.Body = io.NopCloser(bytes.NewReader(raw))
		r.ContentLength = int64(len(raw))
		p.forward.ServeHTTP(w, r)
		return
	}
	c := body.CompletionRequest
	req := executor.Request{RunID: c.RunID, ThreadID: c.ThreadID, AssistantID: c.AssistantID, MessageID: c.MessageID,
		Model: c.Model, MetaData: c.MetaData, ProviderKey: c.APIKey, Traceparent: r.Header.Get("traceparent"),
		CallerKey: r.Header.Get("X-API-Key")}

	if err := req.Check(); err != nil {
		writeError(w, http.StatusUnprocessableEntity, err.Error()) // Core's status for a body it cannot validate
		return
	}
	f := &coreFramer{w: w}
	sum, derr := p.drive(r.Context(), req, func(e executor.Event) {
		switch e.Type {
		case executor.EventContent, executor.EventReasoning, executor.EventChunk, executor.EventError:
			if len(e.Raw) > 0 {
				f.frame(e.Raw)
			}
		}
	})
	if derr != nil {
		var he *core.HTTPError
		if !f.started && errors.As(derr, &he) {
			// Nothing streamed yet: answer as Core answered.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(he.Status)
			fmt.Fprint(w, he.Body)
			return
		}
	}
	if sum.Status != executor.StatusCompleted {
		// The run did not reach an answer (failed, cancelled, turn limit,
		// shutdown): say so in Core's router-error shape, which the SDK
		// reads, rather than end as if the answer were complete.
		msg, _ := json.Marshal(map[string]string{"type": "error", "run_id": c.RunID,
			"message": "toolsidecar: run " + sum.Status + ": " + sum.Error})
		f.frame(msg)
	}
	f.done()
}

// coreFramer writes frames exactly as Core does.
type coreFramer struct {
	w       http.ResponseWriter
	started bool
}

func (f *coreFramer) start() {
	if f.started {
		return
	}
	f.started = true
	h := f.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	f.w.WriteHeader(http.StatusOK)
}

func (f *coreFramer) frame(data []byte) {
	f.start()
	fmt.Fprintf(f.w, "data: %s\n\n", data)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
}

func (f *coreFramer) done() { f.frame([]byte("[DONE]")) }
