package openaiup

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/modelapi"
)

// run is one run being answered, for every request attached to it: the
// conversation so far, the turn whose calls are running, and the text the
// application is given.
type run struct {
	id       string
	key      runKey
	owner    string // the credentials that began it (executor.CallerOf)
	mu       sync.Mutex
	body     map[string]json.RawMessage // the request's fields but messages and stream
	headers  http.Header                // forwarded on every turn
	base     []json.RawMessage          // the request's messages
	messages []json.RawMessage
	appTools map[string]bool // tools the application declared: their calls are its own
	status   string
	began    bool         // a turn was asked for, here or before a crash
	turn     int          // turns asked for
	pending  *pendingTurn // the turn being read or answered
	result   modelapi.Result
	failed   string // the upstream's error event, which ended the run
	created  int64
	users    int // requests attached (Begin, End)
	// local: this process drives the run (it listed its open calls or
	// asked a turn); until then Run reads it again from the journal,
	// which another sidecar, or this one before a crash, may have moved.
	local bool
	// fresh: begun under a new id by this request (no key, no run to
	// resume): nobody can name it before its first journal record.
	fresh bool
	// headed: the journal holds the run's header; ended: its end.
	headed, ended bool
	// answering: the upstream took a turn (the application's answer may
	// begin).
	answering bool
	// prev are the last turn's outputs, which ride with the next turn's
	// record (journalTurn) or, when none follows, are written alone.
	prev *turnOutputs
	// carried are the calls of a failed turn that had their outputs: the
	// turn asked for again reuses them (runstore.Turn.Handed).
	carried []carriedCall
	// shown is the text the application is given, every turn's, as it
	// comes; wake is closed and replaced when it grows.
	shown strings.Builder
	wake  chan struct{}
}

// carriedCall is a call with its output, from a failed turn.
type carriedCall struct {
	call   *executor.ToolCall
	output string
}

// createdAt is when the run began.
func (r *run) createdAt() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.created
}

// say adds text the application is given.
func (r *run) say(text string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shown.WriteString(text)
	r.wakeUp()
}

func (r *run) wakeUp() {
	close(r.wake)
	r.wake = make(chan struct{})
}

// follow returns the text given past offset from, whether a turn began,
// and a channel closed when either changes.
func (r *run) follow(from int) (text string, began bool, wake <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.shown.String(); len(s) > from {
		text = s[from:]
	}
	return text, r.answering || r.shown.Len() > 0, r.wake
}

// pendingTurn is a turn whose calls are being answered: its assistant
// message goes into the conversation once each of the sidecar's calls
// has its output. Calls are handed over while the turn streams, so their
// outputs may come before the turn is read whole (read).
type pendingTurn struct {
	read      bool                 // the stream is read whole: assistant, order and calls are set
	assistant json.RawMessage      // with every call of the turn, in the API's shape
	order     []modelapi.ToolCall  // every call of the turn, in order
	calls     []*executor.ToolCall // the sidecar's calls, in order
	handed    map[string]bool      // ids of the calls handed to the executor
	idOf      map[string]string    // the executor's id of each of the sidecar's calls, by the assistant message's id
	ghosts    map[string]bool      // handed by an attempt that was cut, and no part of the turn
	outputs   map[string]string    // by tool_call_id
	actions   map[string]string    // the action id of each output's call, by tool_call_id
	started   map[string]bool      // unsafe calls whose start is journaled, by tool_call_id
	journaled bool                 // the journal holds the turn: its unsafe calls may start
	// written is closed when the turn's journal write, begun as its
	// stream ended, is over (nil: none was begun).
	written chan struct{}
	// outputsJournaled counts the outputs the journal holds.
	outputsJournaled int
}

func newPendingTurn() *pendingTurn {
	return &pendingTurn{handed: map[string]bool{}, ghosts: map[string]bool{}, outputs: map[string]string{}, idOf: map[string]string{},
		started: map[string]bool{}, actions: map[string]string{}}
}

// Begin attaches a request to its run: the run in progress under id, or
// a new one with the request's conversation (messages, restored), the
// rest of the request (model, tools, sampling), the tools the application
// declared, whose calls it runs itself, and the headers its turns
// forward. fresh says that no journal can hold the run yet (a new id of
// its own): it is not read there. Each Begin is paired with an End.
func (u *Upstream) Begin(ref runRef, req *request, messages []json.RawMessage) *run {
	u.mu.Lock()
	defer u.mu.Unlock()
	id, fresh := ref.id, ref.fresh
	if r, ok := u.runs[id]; ok {
		r.mu.Lock()
		r.users++
		r.mu.Unlock()
		return r
	}
	r := &run{id: id, key: req.key, owner: req.owner, body: req.Body, headers: req.headers, base: messages, messages: messages, appTools: req.AppTools,
		status: executor.RunActive, created: cmp.Or(ref.created, time.Now().Unix()), users: 1, wake: make(chan struct{}), local: fresh, fresh: fresh}
	u.runs[id] = r
	return r
}

// End returns how the request's run ended: as this process drove it, or
// as the journal has it when another sidecar drove it. Unless the run was
// answered (answered: it completed or reached the turn limit) without the
// application's key, the last turn's journal write is over first and the
// outputs no turn record carries are kept: a run that stopped between
// turns (shut down, cut, cancelled) leaves them for the retry, and a key's
// retry after a crash replays the answer it had. A keyless answer does not
// wait for them: journalEnd settles them after it, before the run's end
// (BENCHMARKS.md, "Journal cost").
func (u *Upstream) End(ctx context.Context, r *run, answered bool) modelapi.Result {
	r.mu.Lock()
	local, explicit, appCalls := r.local, r.key.explicit, len(r.result.AppCalls) > 0
	r.mu.Unlock()
	if local {
		if !answered || explicit || appCalls {
			u.settle(ctx, r)
		}
	} else if err := u.reload(ctx, r); err != nil {
		u.log.Warn("reading the run from the journal", "run_id", r.id, "err", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.result
}

// settle waits for the last turn's journal write and keeps the outputs
// that no turn record carries. The write does not outlive the request.
func (u *Upstream) settle(ctx context.Context, r *run) {
	_ = r.turnWritten(context.WithoutCancel(ctx)) // bounded by runstore.Timeout
	u.keepOutputs(ctx, r)
}

// Release detaches a request from its run, after its answer and the
// run's end are written: until then the run is live, and no request
// without its key claims it. The last request forgets the run.
func (u *Upstream) Release(r *run) {
	u.mu.Lock()
	defer u.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.users--; r.users == 0 {
		delete(u.runs, r.id)
	}
}

// live reports a run this process holds.
func (u *Upstream) live(id string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	_, ok := u.runs[id]
	return ok
}

func (u *Upstream) unsafe(tool string) bool { return u.cfg.Unsafe(tool) }

func (u *Upstream) run(id string) (*run, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	r, ok := u.runs[id]
	if !ok {
		return nil, &executor.UpstreamError{Status: http.StatusNotFound, Err: fmt.Errorf("openaiup: no run %s", id)}
	}
	return r, nil
}

// apply adds a delivered turn to the run's result, and ends the run when
// the turn had no call, or failed.
func (r *run) apply(t turnRecord) {
	res := &r.result
	if res.Model == "" {
		res.Model, res.Created = t.Model, t.Created
	}
	res.Usage.Add(&t.Usage)
	res.Content += t.Content
	res.FinishReason = t.Finish
	switch {
	case t.Failed != "":
		r.failed, r.status = t.Failed, executor.RunFailed
	case len(t.Calls) == 0 && len(t.AppCalls) == 0:
		r.status = executor.RunCompleted
	case len(t.AppCalls) > 0:
		res.FinishReason = "tool_calls"
	}
}

// turnWritten waits for the journal write of the pending turn, begun
// when its stream ended (turn.end).
func (r *run) turnWritten(ctx context.Context) error {
	r.mu.Lock()
	var written chan struct{}
	if r.pending != nil {
		written = r.pending.written
	}
	r.mu.Unlock()
	if written == nil {
		return nil
	}
	select {
	case <-written:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// messages are the turn as the next turn replays it: its assistant
// message and one result per call, in the order of its calls. A call
// without an output is a bug of the loop: the request would be refused
// (400), so it is not sent. With all false, the calls that are not the
// sidecar's are left out (the application answers them).
func (p *pendingTurn) messages(a modelapi.Codec, all bool) ([]json.RawMessage, error) {
	var outputs []modelapi.Output
	for _, c := range p.order {
		id, own := p.idOf[c.ID]
		if !own && !all {
			continue
		}
		content, ok := p.outputs[id]
		if !ok {
			return nil, fmt.Errorf("openaiup: call %s (%s) has no output: the next turn is not asked for", c.ID, c.Function.Name)
		}
		outputs = append(outputs, modelapi.Output{ID: c.ID, Content: content})
	}
	return a.FollowUp(p.assistant, outputs)
}
