package agentsapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/projectdavid/toolsidecar/internal/frames"
	"github.com/projectdavid/toolsidecar/tool"
)

// OpenAIBeta is the header value the Agents API requires.
const OpenAIBeta = "agents=v1"

// KindOpenAI is the OpenAI Agents API's upstream.kind.
const KindOpenAI = "openai-agents"

// OpenAI is the OpenAI Agents API (part A of the reference).
type OpenAI struct{ c *client }

// NewOpenAI builds a client of the Agents API. No I/O.
func NewOpenAI(cfg Config) (*OpenAI, error) {
	c, err := newClient(cfg, func(h http.Header, key string) {
		h.Set("Authorization", "Bearer "+strings.TrimPrefix(key, "Bearer "))
		h.Set("OpenAI-Beta", OpenAIBeta)
	})
	if err != nil {
		return nil, err
	}
	return &OpenAI{c: c}, nil
}

// Kind is "openai-agents".
func (*OpenAI) Kind() string { return KindOpenAI }

// oaSession is the session object, as far as it is read.
type oaSession struct {
	ID              string `json:"id"`
	Status          string `json:"status"`
	RequiredActions []struct {
		Type      string          `json:"type"`
		TurnID    string          `json:"turn_id"`
		CallID    string          `json:"call_id"`
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"required_actions"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// snapshot reads a session object into the package's terms. Required
// actions other than function calls (environment connections, computer
// use approvals) are not the client tools', and are left out.
func (s oaSession) snapshot() Snapshot {
	var out Snapshot
	switch s.Status {
	case "requires_action":
		out.Status = StatusBlocked
	case "idle":
		out.Status = StatusIdle
	case "failed":
		out.Status = StatusFailed
		if s.Error != nil {
			out.Why = s.Error.Code + ": " + s.Error.Message
		}
	default: // in_progress, and any status added later
		out.Status = StatusRunning
	}
	for _, a := range s.RequiredActions {
		if a.Type != "function_call" {
			continue
		}
		c := Call{ID: a.TurnID + "/" + a.CallID, TurnID: a.TurnID, CallID: a.CallID, Name: a.Name, Args: arguments(a.Arguments)}
		if err := tool.CheckID("turn_id", a.TurnID); err != nil {
			c.Problem = err.Error()
		} else if err := tool.CheckCallID(a.CallID); err != nil {
			c.Problem = err.Error()
		}
		out.Pending = append(out.Pending, c)
	}
	return out
}

// arguments are a call's arguments as a JSON value: the API sends an
// object, and a string holding JSON is read as its helper reads it.
func arguments(raw json.RawMessage) json.RawMessage {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return json.RawMessage("{}")
		}
		return json.RawMessage(s)
	}
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage("{}")
	}
	return raw
}

// Read is GET /agents/sessions/{id}.
func (o *OpenAI) Read(ctx context.Context, key, session string) (Snapshot, error) {
	if err := CheckSession(session); err != nil {
		return Snapshot{}, err
	}
	data, err := o.c.do(ctx, http.MethodGet, "/agents/sessions/"+session, key, nil, nil, nil)
	if err != nil {
		return Snapshot{}, err
	}
	var s oaSession
	if err := json.Unmarshal(data, &s); err != nil {
		return Snapshot{}, fmt.Errorf("agentsapi: reading session %s: %w", session, err)
	}
	return s.snapshot(), nil
}

// oaEvent is an event of a session's stream, as far as it is read.
type oaEvent struct {
	Type    string     `json:"type"`
	EventID string     `json:"event_id"`
	TurnID  string     `json:"turn_id"`
	Session *oaSession `json:"session"`
}

// Stream is GET /agents/sessions/{id}/events. Every event carries
// event_id; a session event carries the session, whose required_actions
// are the calls it blocks on.
func (o *OpenAI) Stream(ctx context.Context, key, session string) (*Stream, error) {
	if err := CheckSession(session); err != nil {
		return nil, err
	}
	resp, read, cancel, err := o.c.stream(ctx, "/agents/sessions/"+session+"/events", key)
	if err != nil {
		return nil, err
	}
	s := &Stream{close: func() { read.Stop(); cancel(context.Canceled); _ = resp.Body.Close() }}
	s.Updates = func(yield func(Update, error) bool) {
		for ev, err := range read.Seq {
			if err != nil {
				yield(Update{}, err)
				return
			}
			if ev.Type == frames.OversizedEvent {
				o.c.log.Warn("an event of the session's stream is past its bound; skipped", "session", session, "size", ev.Data)
				continue
			}
			var e oaEvent
			if json.Unmarshal([]byte(ev.Data), &e) != nil || e.Type == "" {
				o.c.log.Warn("an event of the session's stream could not be read; skipped", "session", session, "event", tool.Excerpt(ev.Data))
				continue
			}
			u := Update{EventID: e.EventID, Type: e.Type, Raw: []byte(ev.Data)}
			switch {
			case e.Session != nil && strings.HasPrefix(e.Type, "agent.session.") && strings.Count(e.Type, ".") == 2:
				snap := e.Session.snapshot()
				u.Snapshot = &snap
			case e.Type == "agent.session.turn.cancelled":
				u.CancelledTurn = e.TurnID
			}
			if !yield(u, nil) {
				return
			}
		}
		if err := context.Cause(ctx); err == nil {
			yield(Update{}, fmt.Errorf("agentsapi: the stream of session %s ended", session))
		}
	}
	return s, nil
}

// oaResult is agent.session.input.tool_result.
type oaResult struct {
	Type    string  `json:"type"`
	TurnID  string  `json:"turn_id"`
	CallID  string  `json:"call_id"`
	Success bool    `json:"success"`
	Output  *string `json:"output,omitempty"`
	Error   *string `json:"error,omitempty"`
}

// racePauses are the waits before a result refused as "Unknown pending
// tool call" is posted again: the call was announced before the API
// listed it as pending (the SDK's own helper waits so).
var racePauses = []time.Duration{100 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond}

// Post is POST /agents/sessions/{id}/events with one tool_result per
// call, under an Idempotency-Key made of the calls' identities: a retry
// is the same request.
func (o *OpenAI) Post(ctx context.Context, key, session string, results []Result) error {
	if err := CheckSession(session); err != nil {
		return err
	}
	events := make([]oaResult, len(results))
	ids := make([]string, len(results))
	for i, r := range results {
		out := r.Output
		events[i] = oaResult{Type: "agent.session.input.tool_result", TurnID: r.Call.TurnID, CallID: r.Call.CallID, Success: r.OK}
		if r.OK {
			events[i].Output = &out
		} else {
			events[i].Error = &out
		}
		ids[i] = r.Call.ID
	}
	body, err := json.Marshal(map[string]any{"events": events})
	if err != nil {
		return err
	}
	h := http.Header{"Idempotency-Key": {IdempotencyKey(session, ids)}}
	_, err = o.c.do(ctx, http.MethodPost, "/agents/sessions/"+session+"/events", key, body, h,
		func(he *HTTPError, tries int) (time.Duration, bool) {
			if he.Status != http.StatusBadRequest || !strings.HasPrefix(he.Message, "Unknown pending tool call:") || tries > len(racePauses) {
				return 0, false
			}
			return racePauses[tries-1], true
		})
	return err
}

// IdempotencyKey is the key of one batch's post: a digest of the session
// and its calls' identities, whatever their order.
func IdempotencyKey(session string, ids []string) string {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	d := sha256.New()
	fmt.Fprintf(d, "%d:%s", len(session), session)
	for _, id := range ids {
		fmt.Fprintf(d, "%d:%s", len(id), id)
	}
	return "tsc-" + hex.EncodeToString(d.Sum(nil))
}
