package openaiup

import (
	"encoding/json"
	"slices"
	"sync"
	"time"
)

// maxParked bounds the turns kept for the applications' next requests;
// beyond it the turn kept longest is dropped.
const maxParked = 10000

// parking keeps the turns that called the application's tools as well as
// the sidecar's: the application got only its own calls, and its next
// request carries them with its tool messages. restore puts the turn back
// as the model made it (every call, and the sidecar's tool messages), so
// that the model sees its whole turn answered.
type parking struct {
	ttl time.Duration

	mu     sync.Mutex
	byCall map[string]*parkedTurn // by the id of each of the application's calls
}

type parkedTurn struct {
	assistant json.RawMessage            // with every call of the turn
	order     []string                   // the turn's call ids, in order
	tools     map[string]json.RawMessage // the sidecar's tool messages, by call id
	until     time.Time
}

func newParking(ttl time.Duration) *parking {
	return &parking{ttl: ttl, byCall: map[string]*parkedTurn{}}
}

// park keeps a run's last turn (Result.Parked) under its application
// calls' ids.
func (p *parking) park(res Result) {
	if len(res.Parked) == 0 {
		return
	}
	var a message
	if json.Unmarshal(res.Parked[0], &a) != nil {
		return
	}
	pt := &parkedTurn{assistant: res.Parked[0], tools: map[string]json.RawMessage{}, until: time.Now().Add(p.ttl)}
	for _, c := range a.ToolCalls {
		pt.order = append(pt.order, c.ID)
	}
	for _, raw := range res.Parked[1:] {
		var m message
		if json.Unmarshal(raw, &m) == nil {
			pt.tools[m.ToolCallID] = raw
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prune()
	for _, c := range res.AppCalls {
		p.byCall[c.ID] = pt
	}
}

// prune drops expired turns, and the oldest beyond maxParked.
func (p *parking) prune() {
	now := time.Now()
	var oldest string
	for id, pt := range p.byCall {
		if now.After(pt.until) {
			delete(p.byCall, id)
			continue
		}
		if oldest == "" || pt.until.Before(p.byCall[oldest].until) {
			oldest = id
		}
	}
	if len(p.byCall) >= maxParked && oldest != "" {
		delete(p.byCall, oldest)
	}
}

// restore puts each parked turn back into an application's messages: an
// assistant message whose calls are the application's part of a parked
// turn becomes the whole turn, and its tool messages are joined by the
// sidecar's, in the turn's call order.
func (p *parking) restore(msgs []json.RawMessage) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(msgs))
	for i := 0; i < len(msgs); i++ {
		var m message
		_ = json.Unmarshal(msgs[i], &m)
		pt := p.find(m)
		if pt == nil {
			out = append(out, msgs[i])
			continue
		}
		answers := map[string]json.RawMessage{}
		for id, raw := range pt.tools {
			answers[id] = raw
		}
		var extra []json.RawMessage // tool messages of no call of the turn: the API judges them
		for i+1 < len(msgs) {
			var t message
			if json.Unmarshal(msgs[i+1], &t) != nil || t.Role != "tool" {
				break
			}
			i++
			if _, known := answers[t.ToolCallID]; known || !slices.Contains(pt.order, t.ToolCallID) {
				extra = append(extra, msgs[i])
				continue
			}
			answers[t.ToolCallID] = msgs[i]
		}
		out = append(out, pt.assistant)
		for _, id := range pt.order {
			if raw, ok := answers[id]; ok {
				out = append(out, raw)
			}
		}
		out = append(out, extra...)
	}
	return out
}

// find is the parked turn of an assistant message whose calls are all
// the application's part of that turn.
func (p *parking) find(m message) *parkedTurn {
	if m.Role != "assistant" || len(m.ToolCalls) == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pt := p.byCall[m.ToolCalls[0].ID]
	if pt == nil || time.Now().After(pt.until) {
		return nil
	}
	for _, c := range m.ToolCalls {
		if p.byCall[c.ID] != pt {
			return nil
		}
	}
	return pt
}
