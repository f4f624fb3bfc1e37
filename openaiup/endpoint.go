package openaiup

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/tool"
)

// EndpointConfig configures the application-facing endpoint.
type EndpointConfig struct {
	Upstream *Upstream
	Drive    executor.DriveFunc
	// Tools are the registry's tools in force: each request's tools get
	// them added.
	Tools func() []tool.FunctionTool
	// ForwardAuthorization sends the caller's own bearer key upstream.
	// Only when the sidecar has no API token: otherwise that header is
	// the sidecar's token, which never leaves it.
	ForwardAuthorization bool
	// KeepAlive is how often a quiet stream gets an SSE comment while its
	// tools run. default: 15s
	KeepAlive time.Duration
	// ParkedTTL is how long the sidecar's outcomes of a turn that also
	// called the application's tools are kept for its next request.
	// default: 1h
	ParkedTTL time.Duration
	// Memo keeps those outcomes: durable mode's ledger, so that another
	// sidecar of the cluster, or this one restarted, takes the next
	// request. default: memory
	Memo   executor.Memo
	Logger *slog.Logger
}

// Endpoint serves POST /v1/chat/completions: the application's request is
// a run, whose tool calls the sidecar answers turn after turn, and whose
// answer is the model's last word, streamed or whole.
type Endpoint struct {
	cfg    EndpointConfig
	log    *slog.Logger
	parked *parking
}

// NewEndpoint builds the endpoint. No I/O.
func NewEndpoint(cfg EndpointConfig) *Endpoint {
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = 15 * time.Second
	}
	if cfg.ParkedTTL <= 0 {
		cfg.ParkedTTL = time.Hour
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Endpoint{cfg: cfg, log: log.With("component", "openai"), parked: newParking(cfg.ParkedTTL, cfg.Memo)}
}

// request is what the endpoint reads of the application's request; the
// rest is passed upstream as it came.
type request struct {
	body     map[string]json.RawMessage
	messages []json.RawMessage
	stream   bool
	usage    bool // stream_options.include_usage
	model    string
	appTools map[string]bool
}

// badRequest is a request the API would refuse: a 400 in its shape (413
// for a body over the server's bound).
type badRequest struct {
	msg, param string
	status     int // default: 400
}

func (e *badRequest) Error() string { return e.msg }

func (ep *Endpoint) read(r *http.Request) (*request, error) {
	raw, err := io.ReadAll(r.Body)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, &badRequest{msg: fmt.Sprintf("the request body is larger than %d bytes", tooLarge.Limit), status: http.StatusRequestEntityTooLarge}
	case err != nil:
		return nil, &badRequest{msg: "reading the request body: " + err.Error()}
	case !utf8.Valid(raw):
		// JSON is UTF-8 (RFC 8259): what is not would reach the upstream
		// as it came, inside the raw members kept for it.
		return nil, &badRequest{msg: "the request body is not valid UTF-8"}
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(raw, &body); err != nil || body == nil {
		return nil, &badRequest{msg: "the request body is not a JSON object"}
	}
	req := &request{body: body, appTools: map[string]bool{}}
	if err := json.Unmarshal(body["messages"], &req.messages); err != nil || len(req.messages) == 0 {
		return nil, &badRequest{msg: "messages must be a non-empty array", param: "messages"}
	}
	_ = json.Unmarshal(body["model"], &req.model)
	if raw, ok := body["n"]; ok {
		var n int
		if json.Unmarshal(raw, &n) != nil || n > 1 {
			return nil, &badRequest{msg: "n > 1 is not supported: each choice would need its own tool calls", param: "n"}
		}
	}
	if raw, ok := body["stream"]; ok {
		_ = json.Unmarshal(raw, &req.stream)
	}
	if raw, ok := body["stream_options"]; ok && string(raw) != "null" {
		if !req.stream {
			return nil, &badRequest{msg: "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param: "stream_options"}
		}
		var so struct {
			IncludeUsage bool `json:"include_usage"`
		}
		_ = json.Unmarshal(raw, &so)
		req.usage = so.IncludeUsage
	}
	var tools []json.RawMessage
	if raw, ok := body["tools"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &tools); err != nil {
			return nil, &badRequest{msg: "tools must be an array", param: "tools"}
		}
	}
	own := map[string]bool{}
	for _, t := range ep.cfg.Tools() {
		own[t.Function.Name] = true
	}
	for i, raw := range tools {
		var t tool.FunctionTool
		if err := json.Unmarshal(raw, &t); err != nil || t.Function.Name == "" {
			return nil, &badRequest{msg: fmt.Sprintf("tools[%d] is not a function tool", i), param: fmt.Sprintf("tools[%d]", i)}
		}
		if own[t.Function.Name] {
			return nil, &badRequest{msg: fmt.Sprintf("tools[%d]: %s is a tool of the sidecar; rename the application's tool", i, tool.Excerpt(t.Function.Name)),
				param: fmt.Sprintf("tools[%d].function.name", i)}
		}
		req.appTools[t.Function.Name] = true
	}
	for _, t := range ep.cfg.Tools() {
		raw, _ := json.Marshal(t)
		tools = append(tools, raw)
	}
	if len(tools) > 0 {
		body["tools"], _ = json.Marshal(tools)
	}
	delete(body, "messages")
	delete(body, "stream")
	delete(body, "stream_options")
	return req, nil
}

func (ep *Endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, err := ep.read(r)
	if err != nil {
		var br *badRequest
		errors.As(err, &br)
		writeAPIError(w, cmp.Or(br.status, http.StatusBadRequest), br.msg, "invalid_request_error", br.param)
		return
	}
	messages := ep.parked.restore(r.Context(), req.messages)
	id := "chatcmpl-" + randomToken(24)
	ep.cfg.Upstream.Begin(id, req.body, messages, req.appTools)
	dreq := executor.Request{RunID: id, Model: req.model, Traceparent: r.Header.Get("traceparent")}
	if key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && ep.cfg.ForwardAuthorization {
		dreq.CallerKey = key
	}
	out := &answer{w: w, r: r, id: id, model: req.model, created: time.Now().Unix(), usage: req.usage}
	w.Header().Set("X-Toolsidecar-Run-Id", id)
	var sum executor.Summary
	if req.stream {
		sum, err = ep.stream(r.Context(), dreq, out)
	} else {
		sum, err = ep.cfg.Drive(r.Context(), dreq, nil)
	}
	res, _ := ep.cfg.Upstream.End(id)
	if len(res.AppCalls) > 0 {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
		ep.parked.park(ctx, res)
		cancel()
	}
	if r.Context().Err() != nil {
		return // the application went away: its calls were cancelled
	}
	if res.Model != "" {
		out.model = res.Model
	}
	if sum.Status != executor.StatusCompleted && len(res.AppCalls) == 0 {
		ep.log.Warn("chat completion failed", "run_id", id, "status", sum.Status, "err", sum.Error)
		out.fail(sum, err)
		return
	}
	if req.stream {
		out.finish(res, sum)
		return
	}
	out.whole(res, sum)
}

// stream drives the run with its events written to the application as
// they come, and SSE comments while it is quiet.
func (ep *Endpoint) stream(ctx context.Context, dreq executor.Request, out *answer) (executor.Summary, error) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(ep.cfg.KeepAlive)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				out.keepAlive()
			}
		}
	})
	defer func() {
		close(stop)
		wg.Wait()
	}()
	return ep.cfg.Drive(ctx, dreq, func(e executor.Event) {
		switch e.Type {
		case executor.EventContent:
			out.content(e.Text)
		case executor.EventToolCall:
			out.begin() // the upstream took the turn: the answer is a stream from here
		}
	})
}

// writeAPIError writes an error in the API's shape.
func writeAPIError(w http.ResponseWriter, status int, msg, typ, param string) {
	var e apiError
	e.Error.Message, e.Error.Type = tool.Truncate(msg, tool.MaxErrorMessage), typ
	if param != "" {
		e.Error.Param = &param
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(e)
}
