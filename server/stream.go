package server

import (
	"cmp"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/executor"
)

// driveSSE streams the drive's events with go-sse: event types turn,
// content, reasoning, tool_call, progress, approval_required,
// approval_decided, tool_result, error and done,
// each with a JSON payload and an id, and a comment every SSEKeepalive
// while nothing else is sent. A request with Last-Event-ID (checked by
// drive) resumes after that event.
func (s *Server) driveSSE(w http.ResponseWriter, r *http.Request, req executor.Request) {
	var (
		mu   sync.Mutex // the keepalive and the events write to one session
		sess *sse.Session
	)
	// The stream begins once the drive has taken this caller (its owner
	// checked): a drive refused before answers with its status (403 for
	// another caller's run, 404, 400) and its summary, as JSON.
	upgrade := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if sess == nil {
			var err error
			if sess, err = sse.Upgrade(w, r); err != nil {
				return false
			}
			// Answer at once: a caller that attaches to a drive in
			// progress may wait a while for its first event.
			_ = sess.Flush()
		}
		return true
	}
	write := func(m *sse.Message) {
		mu.Lock()
		defer mu.Unlock()
		if sess != nil && sess.Send(m) == nil {
			_ = sess.Flush()
		}
	}
	sent := make(chan struct{}, 1)
	var id string // the event's, for Last-Event-ID
	send := func(typ string, v any) {
		data, err := json.Marshal(v)
		if err != nil {
			return
		}
		m := &sse.Message{Type: sse.Type(typ)}
		if id != "" {
			m.ID = sse.ID(id)
		}
		m.AppendData(string(data))
		write(m)
		select {
		case sent <- struct{}{}:
		default:
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	// A stream that drops leaves the run going for the grace, so that
	// the client reconnects and reads on where it stopped.
	req.Linger = s.cfg.SSEResumeGrace
	var refused *executor.Summary
	sum, err := s.driveRun(r.Context(), req, func(e executor.Event) {
		id = e.ID
		switch e.Type {
		case executor.EventAccepted:
			if upgrade() {
				wg.Go(func() { keepalive(s.cfg.SSEKeepalive, sent, stop, write) })
			}
		case executor.EventContent, executor.EventReasoning, executor.EventError:
			send(string(e.Type), map[string]any{"turn": e.Turn, "text": e.Text})
		case executor.EventToolCall, executor.EventProgress:
			// The call itself, without outcome fields: it has none yet.
			send(string(e.Type), callRef{Turn: e.Turn, ToolCallID: e.Call.ToolCallID, ActionID: e.Call.ActionID, Tool: e.Call.Tool, Lane: e.Call.Lane})
		case executor.EventToolResult:
			send(string(e.Type), e.Call)
		case executor.EventApprovalRequired, executor.EventApprovalDecided:
			// The approval (action_id, tool, arguments, deadline, and
			// the verdict once there is one), with its turn.
			send(string(e.Type), struct {
				Turn int `json:"turn"`
				*approval.Entry
			}{e.Turn, e.Approval})
		case executor.EventTurn:
			send("turn", map[string]int{"turn": e.Turn})
		case executor.EventDone:
			mu.Lock()
			begun := sess != nil
			mu.Unlock()
			if !begun {
				refused = e.Summary
				return
			}
			send("done", e.Summary)
		}
	})
	mu.Lock()
	begun := sess != nil
	mu.Unlock()
	if !begun {
		writeJSON(w, driveStatus(err), cmp.Or(refused, &sum))
	}
}

// callRef names a call in the tool_call and progress events.
type callRef struct {
	Turn       int    `json:"turn"`
	ToolCallID string `json:"tool_call_id"`
	ActionID   string `json:"action_id"`
	Tool       string `json:"tool"`
	Lane       string `json:"lane,omitempty"`
}

// keepalive writes a comment every interval in which no event was sent,
// until stop is closed.
func keepalive(interval time.Duration, sent <-chan struct{}, stop <-chan struct{}, write func(*sse.Message)) {
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-sent:
			t.Reset(interval)
		case <-t.C:
			m := &sse.Message{}
			m.AppendComment("keepalive")
			write(m)
			t.Reset(interval)
		}
	}
}
