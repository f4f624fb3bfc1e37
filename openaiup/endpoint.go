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
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/modelapi"
	"github.com/projectdavid/toolsidecar/runstore"
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
	Memo executor.Memo
	// Driven reports a run that another sidecar drives now (durable
	// mode's run leases): a request without Idempotency-Key does not take
	// it over. nil: only this process's runs are known.
	Driven func(ctx context.Context, runID string) (bool, error)
	Logger *slog.Logger
}

// Endpoint serves the upstream's API to applications (POST
// /v1/chat/completions, POST /v1/messages): the application's request is
// a run, whose tool calls the sidecar answers turn after turn, and whose
// answer is the model's last word, streamed or whole.
type Endpoint struct {
	cfg    EndpointConfig
	api    modelapi.Codec
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
	a := cfg.Upstream.api
	return &Endpoint{cfg: cfg, api: a, log: log.With("component", a.Kind()), parked: newParking(cfg.ParkedTTL, cfg.Memo)}
}

// Pattern is the route the endpoint serves: the API's own path.
func (ep *Endpoint) Pattern() string {
	switch ep.api.API() {
	case modelapi.Messages:
		return "POST /v1/messages"
	case modelapi.Responses:
		return "POST /v1/responses"
	}
	return "POST /v1/chat/completions"
}

// WriteError writes an error as the API answers one: the route's Errors,
// for the requests the server refuses before the endpoint reads them.
func (ep *Endpoint) WriteError(w http.ResponseWriter, status int, msg string) {
	ep.api.API().WriteError(w, status, msg, "invalid_request_error", "")
}

// request is the application's request: what the API's codec reads of
// it, and who asks under which key.
type request struct {
	modelapi.Request
	key     runKey
	owner   string      // who asks (executor.CallerOf): the run's owner
	headers http.Header // the API's forwarded headers the application sent
}

// runKey names the run a request belongs to.
type runKey struct {
	// explicit: the application sent Idempotency-Key; the run id is
	// derived from it and the caller.
	explicit bool
	id       string // the run id, when explicit
	digest   string // of the caller and the whole request
}

// maxIdempotencyKey bounds the Idempotency-Key header, as other APIs do
// (Stripe: 255 characters).
const maxIdempotencyKey = 255

// keyOf derives the run key of a request: from the application's
// Idempotency-Key, or from a digest of the caller's identity and the whole
// request (model, messages, tools, metadata and every setting), given as
// canonical JSON.
func keyOf(r *http.Request, a modelapi.Codec, canonical []byte) (runKey, error) {
	caller := []byte(r.Header.Get("Authorization"))
	if k := r.Header.Get("X-Api-Key"); k != "" { // the Messages API's key
		caller = fmt.Appendf(caller, "\x00x-api-key:%s", k)
	}
	k := runKey{digest: runstore.Digest([]byte("request"), caller, canonical)}
	idem := r.Header.Get("Idempotency-Key")
	if idem == "" {
		return k, nil
	}
	if len(idem) > maxIdempotencyKey {
		return k, &modelapi.BadRequest{Message: fmt.Sprintf("the Idempotency-Key header is longer than %d characters", maxIdempotencyKey)}
	}
	for _, c := range []byte(idem) {
		if c < 0x21 || c > 0x7e {
			return k, &modelapi.BadRequest{Message: "the Idempotency-Key header holds a character that is not printable ASCII"}
		}
	}
	k.explicit, k.id = true, a.RunPrefix()+runstore.ShortDigest([]byte("idempotency-key"), caller, []byte(idem))
	return k, nil
}

func (ep *Endpoint) read(r *http.Request) (*request, error) {
	raw, err := io.ReadAll(r.Body)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, &modelapi.BadRequest{Message: fmt.Sprintf("the request body is larger than %d bytes", tooLarge.Limit), Status: http.StatusRequestEntityTooLarge}
	case err != nil:
		return nil, &modelapi.BadRequest{Message: "reading the request body: " + err.Error()}
	case !utf8.Valid(raw):
		// JSON is UTF-8 (RFC 8259): what is not would reach the upstream
		// as it came, inside the raw members kept for it.
		return nil, &modelapi.BadRequest{Message: "the request body is not valid UTF-8"}
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(raw, &body); err != nil || body == nil {
		return nil, &modelapi.BadRequest{Message: "the request body is not a JSON object"}
	}
	read, err := ep.api.ReadRequest(body, ep.cfg.Tools())
	if err != nil {
		return nil, err
	}
	req := &request{Request: *read}
	if req.headers, err = forwardedOf(r.Header, ep.api.Forwarded()); err != nil {
		return nil, err
	}
	// The run's key is the request as the application asked it; whether
	// the answer is streamed is how it is delivered, not what is asked.
	if req.key, err = keyOf(r, ep.api, req.Canonical); err != nil {
		return nil, err
	}
	req.owner = executor.CallerOf(r.Header)
	return req, nil
}

// ServeHTTP answers an application's request: it names the request's run
// (runOf), drives it or attaches to it, and answers in the API's shape.
func (ep *Endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, err := ep.read(r)
	if err != nil {
		ep.refuse(w, err)
		return
	}
	ref, err := ep.runOf(r.Context(), req.key)
	if err != nil {
		ep.refuse(w, err)
		return
	}
	messages := ep.parked.restore(r.Context(), ep.api, req.Messages)
	up := ep.cfg.Upstream
	id, finished := ref.id, ref.finished
	rn := up.Begin(ref, req, messages)
	defer up.Release(rn)
	w.Header().Set("X-Toolsidecar-Run-Id", id)
	// A resumed run's answer keeps the time the run began.
	out := ep.api.API().NewAnswer(w, r, modelapi.Head{ID: id, Model: req.Model, Created: rn.createdAt(), IncludeUsage: req.IncludeUsage})
	sum, err := ep.drive(r, req, rn, out, finished)
	answered := finished == nil && (sum.Status == executor.StatusCompleted || sum.Status == executor.StatusMaxTurns)
	res := up.End(r.Context(), rn, answered)
	if answered {
		// The end is written once the answer is out, off the time the
		// application waits (after the last turn's record and outputs,
		// for a run without the application's key): until it is, the
		// journal holds the run's turns, and a retry resumes it.
		defer func() {
			_ = http.NewResponseController(w).Flush()
			up.journalEnd(r.Context(), rn, sum)
		}()
	}
	if len(res.AppCalls) > 0 {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
		ep.parked.park(ctx, ep.api, res)
		cancel()
	}
	if r.Context().Err() != nil {
		return // the application went away: its calls were cancelled
	}
	if res.Model != "" {
		out.SetModel(res.Model)
	}
	if sum.Status != executor.StatusCompleted && len(res.AppCalls) == 0 {
		ep.log.Warn("the run failed", "run_id", id, "status", sum.Status, "err", sum.Error)
		fail(w, out, sum, err)
		return
	}
	if req.Stream {
		// What another sidecar's drive said, read from the journal by End.
		if text, _, _ := rn.follow(out.Written()); text != "" {
			out.Content(text)
		}
		out.Finish(res, sum)
		return
	}
	out.Whole(res, sum)
}

// fail reports a run that did not end with the model's answer. Before the
// stream has begun it is an HTTP error: the upstream's refusal as the
// upstream sent it (a 400 stays a 400), a 502 for the upstream's other
// failures, a 422 for the turn limit (the same request would reach it
// again), a 503 for a sidecar that stopped (a retry resumes the run), and
// a 500 for the sidecar's own bug guard. Once the stream has begun it is
// the API's error event.
func fail(w http.ResponseWriter, out *modelapi.Answer, sum executor.Summary, err error) {
	f := modelapi.Failure{Status: http.StatusInternalServerError, Type: "toolsidecar_error", Code: sum.Status}
	var re *modelapi.RefusedError
	switch {
	case errors.As(err, &re):
		f.Status, f.Type = re.Status, "upstream_error"
		if f.Status >= 500 {
			f.Status = http.StatusBadGateway
		}
	case sum.Status == executor.StatusMaxTurns:
		f.Status, f.Type = http.StatusUnprocessableEntity, "max_turns_exceeded"
	case sum.Status == executor.StatusInterrupted:
		f.Status, f.Type = http.StatusServiceUnavailable, "toolsidecar_interrupted"
		w.Header().Set("Retry-After", "1")
	case errors.Is(err, executor.ErrUpstream) || executor.UpstreamStatus(err) != 0 || sum.Status == executor.StatusFailed:
		f.Status, f.Type = http.StatusBadGateway, "upstream_error"
	}
	f.Message = sum.Error
	if f.Message == "" && err != nil {
		f.Message = err.Error()
	}
	if re != nil && json.Valid(re.Body) && re.Status < 500 {
		f.Status, f.Refusal = re.Status, re.Body
	}
	out.Fail(f)
}

// refuse answers a request that does not run: one the API would refuse,
// in its shape, or one whose run the journal could not name.
func (ep *Endpoint) refuse(w http.ResponseWriter, err error) {
	var br *modelapi.BadRequest
	if errors.As(err, &br) {
		ep.api.API().WriteError(w, cmp.Or(br.Status, http.StatusBadRequest), br.Message, "invalid_request_error", br.Param)
		return
	}
	ep.log.Error("reading the journal", "err", err)
	ep.api.API().WriteError(w, http.StatusServiceUnavailable, "the sidecar could not read its journal: "+err.Error(), "toolsidecar_error", "")
}

// drive runs the request's run, streamed or whole. A run that ended (the
// application's key names it) is answered from the journal, without
// asking the upstream.
func (ep *Endpoint) drive(r *http.Request, req *request, rn *run, out *modelapi.Answer, finished *executor.Summary) (executor.Summary, error) {
	switch {
	case finished != nil:
		return *finished, nil
	case req.Stream:
		return ep.stream(r, req, rn, out)
	}
	return ep.cfg.Drive(r.Context(), ep.driveRequest(r, req, rn), nil)
}

func (ep *Endpoint) driveRequest(r *http.Request, req *request, rn *run) executor.Request {
	dreq := executor.Request{RunID: rn.id, Model: req.Model, Traceparent: r.Header.Get("traceparent"), Fresh: rn.fresh, Caller: req.owner}
	if ep.cfg.ForwardAuthorization {
		dreq.CallerKey = ep.api.CallerKey(r)
	}
	return dreq
}

// runRef is the run a request drives: its id; fresh: begun under a new
// id, which no journal holds; finished: how it ended, when it did; created:
// when it began, as its journal header says (0 for a run not begun).
type runRef struct {
	id       string
	fresh    bool
	finished *executor.Summary
	created  int64
}

// runOf names the run a request drives. With the application's
// Idempotency-Key it is the key's run, whatever its state: a live one is
// attached to, one a crash interrupted is resumed, and one that ended is
// answered from the journal (finished). Without it, the request resumes a
// run of the same caller and request that a crash interrupted, if one
// exists and it wins the claim on it; otherwise it starts a run of its own
// (fresh).
func (ep *Endpoint) runOf(ctx context.Context, key runKey) (runRef, error) {
	store := ep.cfg.Upstream.store
	if store == nil {
		return runRef{id: ep.newRunID(key), fresh: true}, nil
	}
	ctx, cancel := runstore.Bound(ctx)
	defer cancel()
	if key.explicit {
		return ep.keyed(ctx, store, key)
	}
	runs, err := store.Runs(ctx, key.digest)
	if err != nil {
		return runRef{}, err
	}
	for _, id := range slices.Backward(runs) {
		if h, ok, err := ep.claim(ctx, store, id); err != nil {
			return runRef{}, err
		} else if ok {
			ep.log.Info("resuming a run that a crash interrupted", "run_id", id)
			return runRef{id: id, created: h.Created}, nil
		}
	}
	return runRef{id: ep.newRunID(key), fresh: true}, nil
}

// keyed is the run of the application's Idempotency-Key: new, begun, or
// finished. The key with another request is refused.
func (ep *Endpoint) keyed(ctx context.Context, store *runstore.Store, key runKey) (runRef, error) {
	h, found, err := store.Header(ctx, key.id)
	if err != nil || !found {
		return runRef{id: key.id}, err
	}
	if h.Request != key.digest {
		return runRef{}, &modelapi.BadRequest{Message: "this Idempotency-Key was used with another request; use a new key for a new request",
			Status: http.StatusUnprocessableEntity}
	}
	ref := runRef{id: key.id, created: h.Created}
	end, err := store.End(ctx, key.id)
	if err != nil || end == nil {
		return ref, err
	}
	var sum executor.Summary
	if err := json.Unmarshal(end.Summary, &sum); err != nil {
		return ref, fmt.Errorf("openaiup: the end of run %s: %w", key.id, err)
	}
	ref.finished = &sum
	return ref, nil
}

// claim takes over a run that a crash interrupted: one that did not end,
// that no sidecar drives, and whose header this request updated first. It
// returns the run's header.
func (ep *Endpoint) claim(ctx context.Context, store *runstore.Store, id string) (runstore.Header, bool, error) {
	if ep.cfg.Upstream.live(id) {
		return runstore.Header{}, false, nil
	}
	// An ended run, the commonest in an index, is ruled out by one read.
	if ended, err := store.Ended(ctx, id); err != nil || ended {
		return runstore.Header{}, false, err
	}
	if ep.cfg.Driven != nil {
		if driven, err := ep.cfg.Driven(ctx, id); err != nil || driven {
			return runstore.Header{}, false, err
		}
	}
	return store.Claim(ctx, id)
}

// newRunID is the id of a new run: the key's, or a random one.
func (ep *Endpoint) newRunID(key runKey) string {
	if key.explicit {
		return key.id
	}
	return ep.api.RunPrefix() + randomToken(24)
}

// stream drives the run and streams its text to the application as the
// run gives it, from its first turn's (a resumed run's earlier turns come
// from the journal; a request attached to a run in progress gets the text
// already given too), with SSE comments while it is quiet.
func (ep *Endpoint) stream(r *http.Request, req *request, rn *run, out *modelapi.Answer) (executor.Summary, error) {
	ctx := r.Context()
	var sum executor.Summary
	var err error
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(done)
		sum, err = ep.cfg.Drive(ctx, ep.driveRequest(r, req, rn), nil)
	})
	defer wg.Wait()
	t := time.NewTicker(ep.cfg.KeepAlive)
	defer t.Stop()
	for {
		text, began, wake := rn.follow(out.Written())
		if text != "" {
			out.Content(text)
		} else if began {
			out.Begin() // the upstream took the turn: the answer is a stream from here
		}
		select {
		case <-done:
			wg.Wait()
			if text, _, _ := rn.follow(out.Written()); text != "" {
				out.Content(text)
			}
			return sum, err
		case <-wake:
		case <-t.C:
			out.KeepAlive()
		}
	}
}

// maxForwarded bounds a forwarded header's value: a list of feature
// names, which the upstream reads, not a place for a body.
const maxForwarded = 1 << 10

// forwardedOf are the headers of names that h carries, each one's values
// joined as one list. A value is a comma-separated list of names: letters,
// digits, '.', '_', '-' and spaces, at most maxForwarded bytes.
func forwardedOf(h http.Header, names []string) (http.Header, error) {
	var out http.Header
	for _, name := range names {
		values := h.Values(name)
		if len(values) == 0 {
			continue
		}
		v := strings.Join(values, ",")
		if len(v) > maxForwarded || strings.TrimFunc(v, featureChar) != "" {
			return nil, &modelapi.BadRequest{Message: fmt.Sprintf("%s: the header must be a comma-separated list of feature names, at most %d bytes", strings.ToLower(name), maxForwarded)}
		}
		if out == nil {
			out = http.Header{}
		}
		out.Set(name, v)
	}
	return out, nil
}

// featureChar reports a character of a forwarded feature list.
func featureChar(c rune) bool {
	return c < utf8.RuneSelf && (c == ',' || c == ' ' || c == '.' || c == '_' || c == '-' ||
		('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9'))
}
