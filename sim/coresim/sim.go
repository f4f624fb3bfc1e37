// Package coresim is an in-process simulator of Project David Core: the same
// wire format and quirks as the real Core (reference/core-protocol.md), a
// scripted model, and a contract checker that records what a client does
// wrong. It imports only core's wire types.
package coresim

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/projectdavid/toolsidecar/core"
)

// Violation kinds recorded in the contract log.
const (
	// ViolationMissingOutput: a completions request while a manifest of
	// the previous turn has no tool output.
	ViolationMissingOutput = "missing_output"
	// ViolationNoToolCallID: a tool output without tool_call_id.
	ViolationNoToolCallID = "output_without_tool_call_id"
	// ViolationUnknownToolCallID: a tool output for a call id never issued.
	ViolationUnknownToolCallID = "unknown_tool_call_id"
	// ViolationDuplicateOutput: two outputs for one tool_call_id.
	ViolationDuplicateOutput = "duplicate_output"
	// ViolationOutOfOrder: outputs posted out of the batch's call order.
	ViolationOutOfOrder = "out_of_order"
	// ViolationActionNotFinalised: an Action still pending or processing
	// when its run ends.
	ViolationActionNotFinalised = "action_not_finalised"
	// ViolationToolIDMismatch: tool_id is not the Action of tool_call_id.
	ViolationToolIDMismatch = "tool_id_mismatch"
	// ViolationFinalisedWithoutOutput: an Action set completed, failed or
	// cancelled while its call has no tool output.
	ViolationFinalisedWithoutOutput = "finalised_without_output"
	// ViolationReopened: an Action set pending or processing after it was
	// completed, failed or cancelled, which loses its final status.
	ViolationReopened = "reopened"
	// ViolationProcessingAfterOutput: an Action set processing after its
	// tool output was recorded: Core saw the call start after it ended.
	ViolationProcessingAfterOutput = "processing_after_output"
)

// Violation is one entry of the contract log.
type Violation struct {
	Kind       string
	RunID      string
	ToolCallID string
	Detail     string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s run=%s call=%s: %s", v.Kind, v.RunID, v.ToolCallID, v.Detail)
}

// Request is one request the simulator received, for assertions.
type Request struct {
	Method string
	Path   string
	Body   []byte
	At     time.Time
	// Key is the X-API-Key the request carried.
	Key string
	// Traceparent is the W3C trace context the request carried.
	Traceparent string
}

// Config configures a [Sim].
type Config struct {
	// APIKey, when set, is required in X-API-Key on every endpoint but
	// /v1/completions (which real Core does not authenticate).
	APIKey   string
	Scenario Scenario
	// MaxBodyBytes bounds request bodies. default: 1 MiB
	MaxBodyBytes int64
	// PerKeyUsers makes every distinct X-API-Key a user of its own, as on
	// a Core with many users: threads and runs belong to the key that
	// created them; a foreign run reads 404, a tool output or message on a
	// foreign thread 403. Actions check nothing, as on Core. A request
	// without a key is 401. APIKey is then ignored.
	PerKeyUsers bool
	// SplitWrites writes every answer's head and body in two writes (two
	// TCP segments), as an ASGI server such as uvicorn does: a client must
	// not take the head alone for the answer.
	SplitWrites bool
	// MaxLatency, when set, delays every request by a random time below
	// it before it is handled.
	MaxLatency time.Duration
	// IDPrefix goes into every id after its kind ("run_" + IDPrefix +
	// counter): a simulator started afresh then never reissues an id that
	// a client, a ledger or a live view kept from an earlier one. Empty,
	// ids are the same on every start, so transcripts compare byte for byte.
	IDPrefix string
}

// Sim is the simulator state and its http.Handler. It is safe for
// concurrent use.
type Sim struct {
	cfg Config
	mux *http.ServeMux

	mu         sync.Mutex
	seq        int
	assistants map[string]*assistant
	threads    map[string]*thread
	runs       map[string]*run
	byCreation []*run // the runs in creation order, for listings
	actions    map[string]*action
	violations []Violation
	requests   []Request
	faults     []*activeFault
	holding    atomic.Int32 // requests held by a Hold fault, not yet applied
	// lastTriggered is the newest Action's triggered_at.
	lastTriggered time.Time
	now           func() time.Time
}

type thread struct {
	id        string
	owner     string // the creating key, with PerKeyUsers
	createdAt int64
	messages  []message
	// calls are the thread's Actions by tool_call_id, the first of each:
	// a tool output finds its Action without a scan of every run, which
	// at 10,000 runs took most of the simulator's time under its lock.
	calls map[string]*action
}

type message struct {
	id, role, content, toolID, toolCallID string
	assistantID                           string
	createdAt                             int64
}

type run struct {
	core.Run
	owner string // the creating key, with PerKeyUsers
	turns int
	// createdAt and finishedAt (completed or cancelled) are Unix seconds,
	// as Core stamps them; instructions are the run's or its assistant's.
	createdAt, finishedAt int64
	instructions          string
	batches               [][]*action // actions per tool turn, in call order
	ended                 bool
}

type action struct {
	core.Action
	batch, index int
	outputs      int
	checked      bool // missing output already reported
}

// New builds a simulator.
func New(cfg Config) *Sim {
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	s := &Sim{
		cfg: cfg, mux: http.NewServeMux(),
		assistants: map[string]*assistant{}, threads: map[string]*thread{},
		runs: map[string]*run{}, actions: map[string]*action{}, now: time.Now,
	}
	s.routes()
	for _, f := range cfg.Scenario.Faults {
		s.AddFault(f)
	}
	return s
}

// Server is a simulator served over HTTP on a loopback port.
type Server struct {
	// URL is the base URL, http://127.0.0.1:<port>.
	URL    string
	hs     *http.Server
	done   chan struct{}
	active sync.WaitGroup // handlers running
}

// NewServer starts a simulator on a random loopback port. Close the server
// when done. It panics when no port can be had, as httptest does: it is
// for tests and demos.
func NewServer(cfg Config) (*Sim, *Server) {
	s := New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("coresim: listening on loopback: %v", err))
	}
	srv := &Server{URL: "http://" + ln.Addr().String(), done: make(chan struct{})}
	srv.hs = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.active.Add(1)
		defer srv.active.Done()
		s.ServeHTTP(w, r)
	})}
	go func() {
		defer close(srv.done)
		_ = srv.hs.Serve(ln)
	}()
	return s, srv
}

// Close stops the server at once, closing open connections (streams
// included), and waits until every handler has returned, as httptest's
// Close does.
func (srv *Server) Close() {
	_ = srv.hs.Close()
	<-srv.done
	srv.active.Wait()
}

// SetScenario replaces the script for runs that have not started a turn yet
// and for the next turns of those that have.
func (s *Sim) SetScenario(sc Scenario) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.Scenario = sc
}

// Violations returns a copy of the contract log.
func (s *Sim) Violations() []Violation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.violations)
}

// Requests returns every request received so far.
func (s *Sim) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// CountRequests counts requests with the given method and path prefix.
func (s *Sim) CountRequests(method, pathPrefix string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.requests {
		if r.Method == method && strings.HasPrefix(r.Path, pathPrefix) {
			n++
		}
	}
	return n
}

// Run returns a run as Core holds it, for assertions.
func (s *Sim) Run(runID string) (core.Run, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rn, ok := s.runs[runID]
	if !ok {
		return core.Run{}, false
	}
	return rn.Run, true
}

// Actions returns a run's Actions in creation order.
func (s *Sim) Actions(runID string) []core.Action {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []core.Action
	if r := s.runs[runID]; r != nil {
		for _, b := range r.batches {
			for _, a := range b {
				out = append(out, a.Action)
			}
		}
	}
	return out
}

// ToolMessages returns the tool messages of a thread in arrival order.
func (s *Sim) ToolMessages(threadID string) []core.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []core.Message
	if t := s.threads[threadID]; t != nil {
		for _, m := range t.messages {
			if m.role == "tool" {
				out = append(out, core.Message{ID: m.id, ThreadID: threadID, Role: m.role, Content: m.content, ToolID: m.toolID, ToolCallID: m.toolCallID})
			}
		}
	}
	return out
}

// Context returns the history the model would see on the next turn of a
// thread, after Core's merge of consecutive same-role messages.
func (s *Sim) Context(threadID string) []core.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.contextLocked(threadID)
}

// EndRun checks, as when a run ends, that none of its Actions is still
// pending or processing, and records a violation for each that is.
func (s *Sim) EndRun(runID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.runs[runID]; r != nil {
		s.endRunLocked(r)
	}
}

func (s *Sim) endRunLocked(r *run) {
	if r.ended {
		return
	}
	r.ended = true
	for _, b := range r.batches {
		for _, a := range b {
			// An Action whose id is not an id (a hostile Core's) cannot be
			// addressed: a client leaves it as it is.
			if (a.Status == core.ActionPending || a.Status == core.ActionProcessing) && core.Addressable(a.ID) {
				s.violate(ViolationActionNotFinalised, r.ID, a.ToolCallID, "action "+a.ID+" is "+a.Status)
			}
		}
	}
}

func (s *Sim) violate(kind, runID, callID, detail string) {
	s.violations = append(s.violations, Violation{Kind: kind, RunID: runID, ToolCallID: callID, Detail: detail})
}

// newID makes ids of a kind: prefix, Config.IDPrefix and a zero-padded
// counter, width characters after prefix.
func (s *Sim) newID(prefix string, width int) string {
	s.seq++
	return fmt.Sprintf("%s%s%0*d", prefix, s.cfg.IDPrefix, max(width-len(s.cfg.IDPrefix), 1), s.seq)
}

func (s *Sim) contextLocked(threadID string) []core.Message {
	t := s.threads[threadID]
	if t == nil {
		return nil
	}
	var out []core.Message
	for _, m := range t.messages {
		if n := len(out); n > 0 && out[n-1].Role == m.role {
			out[n-1].Content += "\n" + m.content // the first tool_call_id is kept
			continue
		}
		out = append(out, core.Message{ID: m.id, ThreadID: threadID, Role: m.role, Content: m.content, ToolID: m.toolID, ToolCallID: m.toolCallID})
	}
	return out
}

// lastResults is the merged tool message the model sees last, or "".
func (s *Sim) lastResults(threadID string) string {
	ctx := s.contextLocked(threadID)
	for i := len(ctx) - 1; i >= 0; i-- {
		switch ctx[i].Role {
		case "tool":
			return ctx[i].Content
		case "user":
			return ""
		}
	}
	return ""
}
