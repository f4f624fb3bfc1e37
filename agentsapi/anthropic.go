package agentsapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/projectdavid/toolsidecar/internal/clock"
	"github.com/projectdavid/toolsidecar/internal/frames"
	"github.com/projectdavid/toolsidecar/internal/retry"
	"github.com/projectdavid/toolsidecar/tool"
)

// The headers Managed Agents require.
const (
	AnthropicBeta    = "managed-agents-2026-04-01"
	AnthropicVersion = "2023-06-01"
)

// KindAnthropic is Anthropic Managed Agents' upstream.kind.
const KindAnthropic = "anthropic-agents"

// historyPage is how many events one read of a session's history asks
// for; historyPages bounds the pages read (a session of more events is
// read up to there, and its older blocks are taken as answered).
const (
	historyPage  = 100
	historyPages = 1000
)

// Anthropic is Anthropic Managed Agents (part B of the reference).
type Anthropic struct{ c *client }

// NewAnthropic builds a client of Managed Agents. No I/O.
func NewAnthropic(cfg Config) (*Anthropic, error) {
	c, err := newClient(cfg, func(h http.Header, key string) {
		if strings.HasPrefix(key, "Bearer ") {
			h.Set("Authorization", key) // as the caller sent it
		} else {
			h.Set("x-api-key", key)
		}
		h.Set("anthropic-version", AnthropicVersion)
		h.Set("anthropic-beta", AnthropicBeta)
	})
	if err != nil {
		return nil, err
	}
	return &Anthropic{c: c}, nil
}

// Kind is "anthropic-agents".
func (*Anthropic) Kind() string { return KindAnthropic }

// anEvent is a session event, as far as it is read.
type anEvent struct {
	ID         string          `json:"id"`
	Type       string          `json:"type"`
	Name       string          `json:"name"`
	Input      json.RawMessage `json:"input"`
	Thread     string          `json:"session_thread_id"`
	AnswerOf   string          `json:"custom_tool_use_id"`
	Confirmed  string          `json:"tool_use_id"` // user.tool_confirmation's
	Permission string          `json:"evaluated_permission"`
	StopReason *struct {
		Type     string   `json:"type"`
		EventIDs []string `json:"event_ids"`
	} `json:"stop_reason"`
	Error *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// call reads an agent.custom_tool_use event.
func (e anEvent) call() Call {
	c := Call{ID: e.ID, ThreadID: e.Thread, Name: e.Name, Args: e.Input}
	if len(c.Args) == 0 || string(c.Args) == "null" {
		c.Args = json.RawMessage("{}")
	}
	if err := tool.CheckCallID(e.ID); err != nil {
		c.Problem = err.Error()
	}
	return c
}

// asks reports a server call that waits for the client's permission.
func (e anEvent) asks() bool {
	return (e.Type == "agent.tool_use" || e.Type == "agent.mcp_tool_use") && e.Permission == "ask"
}

// status is the session's status after a status event; "" for another.
// blocked names the calls an idle event blocks on.
func (e anEvent) status() (status string, blocked []string) {
	switch e.Type {
	case "session.status_idle":
		if e.StopReason != nil && e.StopReason.Type == "requires_action" {
			return StatusBlocked, e.StopReason.EventIDs
		}
		return StatusIdle, nil
	case "session.status_running", "session.status_rescheduled":
		return StatusRunning, nil
	case "session.status_terminated", "session.deleted":
		return StatusEnded, nil
	}
	return "", nil
}

// Read reads the session's history (the API keeps it; the stream does
// not replay it): its last status, and the custom calls its last idle
// event blocks on that no result answers.
func (a *Anthropic) Read(ctx context.Context, key, session string) (Snapshot, error) {
	if err := CheckSession(session); err != nil {
		return Snapshot{}, err
	}
	uses, asks := map[string]Call{}, map[string]Call{}
	answered := map[string]bool{}
	snap := Snapshot{Status: StatusIdle}
	var blocked []string
	err := a.history(ctx, key, session, readTypes, func(e anEvent) {
		switch {
		case e.Type == "agent.custom_tool_use":
			uses[e.ID] = e.call()
		case e.asks():
			asks[e.ID] = e.call()
		case e.Type == "user.custom_tool_result":
			answered[e.AnswerOf] = true
		case e.Type == "user.tool_confirmation":
			answered[e.Confirmed] = true
		case e.Type == "session.error" && e.Error != nil:
			snap.Why = e.Error.Type + ": " + e.Error.Message
		}
		if st, ids := e.status(); st != "" {
			snap.Status, blocked = st, ids
		}
	})
	if err != nil {
		return Snapshot{}, err
	}
	if snap.Status == StatusBlocked {
		for _, id := range blocked {
			if c, ok := uses[id]; ok && !answered[id] {
				snap.Pending = append(snap.Pending, c)
			} else if c, ok := asks[id]; ok && !answered[id] {
				snap.Confirmations = append(snap.Confirmations, c)
			}
		}
	}
	return snap, nil
}

// Stream is GET /v1/sessions/{id}/events/stream. A block's idle event
// names its calls by id: the calls the stream announced, or, for one it
// did not (announced before it opened), a read of the history.
func (a *Anthropic) Stream(ctx context.Context, key, session string) (*Stream, error) {
	if err := CheckSession(session); err != nil {
		return nil, err
	}
	resp, read, cancel, err := a.c.stream(ctx, "/v1/sessions/"+session+"/events/stream", key)
	if err != nil {
		return nil, err
	}
	s := &Stream{close: func() { read.Stop(); cancel(context.Canceled); _ = resp.Body.Close() }}
	s.Updates = func(yield func(Update, error) bool) {
		uses, asks := map[string]Call{}, map[string]Call{}
		for ev, err := range read.Seq {
			if err != nil {
				yield(Update{}, err)
				return
			}
			switch ev.Type {
			case "ping":
				continue
			case frames.OversizedEvent:
				a.c.log.Warn("an event of the session's stream is past its bound; skipped", "session", session, "size", ev.Data)
				continue
			}
			var e anEvent
			if json.Unmarshal([]byte(ev.Data), &e) != nil || e.Type == "" {
				a.c.log.Warn("an event of the session's stream could not be read; skipped", "session", session, "event", tool.Excerpt(ev.Data))
				continue
			}
			u := Update{EventID: e.ID, Type: e.Type, Raw: []byte(ev.Data)}
			switch st, ids := e.status(); {
			case e.Type == "agent.custom_tool_use":
				uses[e.ID] = e.call()
			case e.asks():
				asks[e.ID] = e.call()
			case e.Type == "user.interrupt":
				u.CancelledTurn = "*"
			case e.Type == "error":
				a.c.log.Warn("the session's stream reported an error", "session", session, "event", tool.Excerpt(ev.Data))
			case st == StatusBlocked:
				snap := Snapshot{Status: st}
				for _, id := range ids {
					if c, ok := asks[id]; ok {
						snap.Confirmations = append(snap.Confirmations, c)
						continue
					}
					c, ok := uses[id]
					if !ok {
						// Announced before this stream opened, or not a
						// custom call: the history says.
						if snap, err = a.Read(ctx, key, session); err != nil {
							yield(Update{}, err)
							return
						}
						break
					}
					snap.Pending = append(snap.Pending, c)
				}
				u.Snapshot = &snap
			case st != "":
				u.Snapshot = &Snapshot{Status: st}
			}
			if !yield(u, nil) {
				return
			}
		}
		if context.Cause(ctx) == nil {
			yield(Update{}, fmt.Errorf("agentsapi: the stream of session %s ended", session))
		}
	}
	return s, nil
}

// anResult is user.custom_tool_result: never user.tool_result, which does
// not answer a custom call.
type anResult struct {
	Type     string      `json:"type"`
	UseID    string      `json:"custom_tool_use_id"`
	Content  []textBlock `json:"content"`
	IsError  bool        `json:"is_error"`
	ThreadID string      `json:"session_thread_id,omitempty"`
}

type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// Post is POST /v1/sessions/{id}/events with one user.custom_tool_result
// per call. The API has no idempotency key: before a retry of a request
// that may have been applied (a connection error, a 5xx), the history is
// read, and the results it holds are not posted again.
func (a *Anthropic) Post(ctx context.Context, key, session string, results []Result) error {
	if err := CheckSession(session); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, a.c.cfg.RetryBudget)
	defer cancel()
	b := retry.UpstreamTurn.New()
	uncertain := false
	for tries := 1; ; tries++ {
		if uncertain {
			left, err := a.unanswered(ctx, key, session, results)
			if err == nil {
				if results = left; len(results) == 0 {
					return nil
				}
			}
		}
		events := make([]anResult, len(results))
		for i, r := range results {
			events[i] = anResult{Type: "user.custom_tool_result", UseID: r.Call.ID, Content: []textBlock{{Type: "text", Text: r.Output}},
				IsError: !r.OK, ThreadID: r.Call.ThreadID}
		}
		body, err := json.Marshal(map[string]any{"events": events})
		if err != nil {
			return err
		}
		_, wait, err := a.c.once(ctx, http.MethodPost, "/v1/sessions/"+session+"/events", key, body, nil)
		if err == nil {
			return nil
		}
		var he *HTTPError
		switch {
		case errors.As(err, &he) && !retryable(he.Status):
			return err
		case errors.As(err, &he):
			uncertain = uncertain || he.Status >= 500
		case ctx.Err() != nil:
			return err
		default:
			uncertain = true
		}
		wait = max(wait, b.NextBackOff())
		a.c.log.Debug("results posted again", "session", session, "try", tries, "wait", wait, "err", err)
		if clock.Sleep(ctx, wait) != nil {
			return fmt.Errorf("%w (retry budget %v spent)", err, a.c.cfg.RetryBudget)
		}
	}
}

// unanswered are the results whose calls the history does not show
// answered.
func (a *Anthropic) unanswered(ctx context.Context, key, session string, results []Result) ([]Result, error) {
	answered := map[string]bool{}
	err := a.history(ctx, key, session, []string{"user.custom_tool_result"}, func(e anEvent) {
		if e.Type == "user.custom_tool_result" {
			answered[e.AnswerOf] = true
		}
	})
	if err != nil {
		return nil, err
	}
	var left []Result
	for _, r := range results {
		if !answered[r.Call.ID] {
			left = append(left, r)
		}
	}
	return left, nil
}

// readTypes are the event types Read needs: a page of the history holds
// no others (a user's message, an agent's text, a document: as large as
// the session's, and nothing to the sidecar), which keeps pages within
// the read's bound.
var readTypes = []string{"agent.custom_tool_use", "agent.tool_use", "agent.mcp_tool_use", "user.custom_tool_result",
	"user.tool_confirmation", "session.error", "session.status_idle", "session.status_running", "session.status_rescheduled",
	"session.status_terminated", "session.deleted"}

// history reads the session's events of the types named, oldest first,
// page by page, and hands each to fn.
func (a *Anthropic) history(ctx context.Context, key, session string, types []string, fn func(anEvent)) error {
	page, limit := "", historyPage
	for range historyPages {
		q := url.Values{"limit": {fmt.Sprint(limit)}, "order": {"asc"}, "types[]": types}
		if page != "" {
			q.Set("page", page)
		}
		data, err := a.c.do(ctx, http.MethodGet, "/v1/sessions/"+session+"/events?"+q.Encode(), key, nil, nil, nil)
		if errors.Is(err, ErrTooLarge) && limit > 1 {
			// Large events (results near max_result_bytes) fill a page
			// past the bound: the same page again, in fewer events.
			limit = max(1, limit/8)
			continue
		}
		if err != nil {
			return err
		}
		limit = historyPage
		var list struct {
			Data     []anEvent `json:"data"`
			NextPage *string   `json:"next_page"`
		}
		if err := json.Unmarshal(data, &list); err != nil {
			return fmt.Errorf("agentsapi: reading the events of session %s: %w", session, err)
		}
		for _, e := range list.Data {
			fn(e)
		}
		if list.NextPage == nil || *list.NextPage == "" {
			return nil
		}
		page = *list.NextPage
	}
	return nil
}

// Confirm answers a server call that waits for permission:
// user.tool_confirmation with result allow, or deny with the message (the
// API takes deny_message with deny only).
func (a *Anthropic) Confirm(ctx context.Context, key, session, callID string, allow bool, message string) error {
	if err := CheckSession(session); err != nil {
		return err
	}
	ev := map[string]any{"type": "user.tool_confirmation", "tool_use_id": callID, "result": "allow"}
	if !allow {
		ev["result"] = "deny"
		if message != "" {
			ev["deny_message"] = message
		}
	}
	body, err := json.Marshal(map[string]any{"events": []any{ev}})
	if err != nil {
		return err
	}
	_, err = a.c.do(ctx, http.MethodPost, "/v1/sessions/"+session+"/events", key, body, nil, nil)
	return err
}
