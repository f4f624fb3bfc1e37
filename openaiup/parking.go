package openaiup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"time"

	"github.com/projectdavid/toolsidecar/executor"
)

// parking keeps the turns that called the application's tools as well as
// the sidecar's: the application got only its own calls, and its next
// request carries them with its tool messages. restore puts the turn back
// as the model made it (every call, and the sidecar's tool messages), so
// that the model sees its whole turn answered. The turns are kept in a
// Memo under each application call's id: durable mode's ledger, which any
// sidecar of the cluster reads and which outlives a restart, or memory.
type parking struct {
	ttl  time.Duration
	memo executor.Memo
}

// parkedTurn is a kept turn.
type parkedTurn struct {
	Assistant json.RawMessage            `json:"assistant"` // with every call of the turn
	Order     []string                   `json:"order"`     // the turn's call ids, in order
	Tools     map[string]json.RawMessage `json:"tools"`     // the sidecar's tool messages, by call id
	AppCalls  []string                   `json:"app_calls"` // the ids of the application's calls
}

func newParking(ttl time.Duration, memo executor.Memo) *parking {
	if memo == nil {
		memo = executor.NewMemoryMemo(parkedBytes)
	}
	return &parking{ttl: ttl, memo: memo}
}

// parkKey is where a turn is kept for one of its application calls:
// hashed, since call ids may hold any character and ledger keys may not.
func parkKey(callID string) string {
	h := sha256.Sum256([]byte(callID))
	return "openai.parked." + hex.EncodeToString(h[:])
}

// park keeps a run's last turn (Result.Parked) under its application
// calls' ids.
func (p *parking) park(ctx context.Context, res Result) {
	if len(res.Parked) == 0 {
		return
	}
	var a message
	if json.Unmarshal(res.Parked[0], &a) != nil {
		return
	}
	pt := parkedTurn{Assistant: res.Parked[0], Tools: map[string]json.RawMessage{}}
	for _, c := range a.ToolCalls {
		pt.Order = append(pt.Order, c.ID)
	}
	for _, raw := range res.Parked[1:] {
		var m message
		if json.Unmarshal(raw, &m) == nil {
			pt.Tools[m.ToolCallID] = raw
		}
	}
	for _, c := range res.AppCalls {
		pt.AppCalls = append(pt.AppCalls, c.ID)
	}
	data, err := json.Marshal(pt)
	if err != nil {
		return
	}
	until := time.Now().Add(p.ttl)
	for _, id := range pt.AppCalls {
		p.memo.Remember(ctx, parkKey(id), executor.MemoEntry{ToolCallID: id, Content: string(data), Expires: until})
	}
}

// restore puts each parked turn back into an application's messages: an
// assistant message whose calls are the application's part of a parked
// turn becomes the whole turn, and its tool messages are joined by the
// sidecar's, in the turn's call order.
func (p *parking) restore(ctx context.Context, msgs []json.RawMessage) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(msgs))
	for i := 0; i < len(msgs); i++ {
		var m message
		_ = json.Unmarshal(msgs[i], &m)
		pt := p.find(ctx, m)
		if pt == nil {
			out = append(out, msgs[i])
			continue
		}
		answers := map[string]json.RawMessage{}
		for id, raw := range pt.Tools {
			answers[id] = raw
		}
		var extra []json.RawMessage // tool messages of no call of the turn: the API judges them
		for i+1 < len(msgs) {
			var t message
			if json.Unmarshal(msgs[i+1], &t) != nil || t.Role != "tool" {
				break
			}
			i++
			if _, known := answers[t.ToolCallID]; known || !slices.Contains(pt.Order, t.ToolCallID) {
				extra = append(extra, msgs[i])
				continue
			}
			answers[t.ToolCallID] = msgs[i]
		}
		out = append(out, pt.Assistant)
		for _, id := range pt.Order {
			if raw, ok := answers[id]; ok {
				out = append(out, raw)
			}
		}
		out = append(out, extra...)
	}
	return out
}

// find is the parked turn of an assistant message whose calls are exactly
// the application's part of that turn.
func (p *parking) find(ctx context.Context, m message) *parkedTurn {
	if m.Role != "assistant" || len(m.ToolCalls) == 0 {
		return nil
	}
	e, ok := p.memo.Recall(ctx, parkKey(m.ToolCalls[0].ID))
	if !ok || time.Now().After(e.Expires) {
		return nil
	}
	var pt parkedTurn
	if json.Unmarshal([]byte(e.Content), &pt) != nil || len(pt.AppCalls) != len(m.ToolCalls) {
		return nil
	}
	for _, c := range m.ToolCalls {
		if !slices.Contains(pt.AppCalls, c.ID) {
			return nil
		}
	}
	return &pt
}

// parkedBytes bounds the turns kept in memory (without durable mode);
// beyond it the oldest are dropped.
const parkedBytes = 32 << 20
