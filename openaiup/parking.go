package openaiup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
	"time"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/modelapi"
)

// parking keeps the turns that called the application's tools as well as
// the sidecar's: the application got only its own calls, and its next
// request carries them with its results. restore puts the turn back as
// the model made it (every call, and the sidecar's results), so
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
	Tools     map[string]json.RawMessage `json:"tools"`     // the sidecar's results (tool messages, tool_result blocks), by call id
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
func (p *parking) park(ctx context.Context, a api, res modelapi.Result) {
	if len(res.Parked) == 0 {
		return
	}
	assistant, results := a.splitParked(res.Parked)
	calls, err := a.callsOf(assistant)
	if err != nil {
		return
	}
	pt := parkedTurn{Assistant: assistant, Tools: results}
	for _, c := range calls {
		pt.Order = append(pt.Order, c.ID)
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

// restore puts each parked turn back into an application's messages, as
// the API's restore places it.
func (p *parking) restore(ctx context.Context, a api, msgs []json.RawMessage) []json.RawMessage {
	return a.restore(msgs, func(calls []modelapi.ToolCall) *parkedTurn { return p.find(ctx, calls) })
}

// merge joins the application's answers to its calls (idOf reads the
// call each answers) with the sidecar's, in the turn's call order. An
// answer to no call of the turn, or a second one, follows them: the API
// judges it.
func (pt *parkedTurn) merge(app []json.RawMessage, idOf func(json.RawMessage) string) []json.RawMessage {
	answers := maps.Clone(pt.Tools)
	var extra []json.RawMessage
	for _, raw := range app {
		id := idOf(raw)
		if _, known := answers[id]; known || !slices.Contains(pt.Order, id) {
			extra = append(extra, raw)
			continue
		}
		answers[id] = raw
	}
	var out []json.RawMessage
	for _, id := range pt.Order {
		if raw, ok := answers[id]; ok {
			out = append(out, raw)
		}
	}
	return append(out, extra...)
}

// find is the parked turn of an assistant message whose calls are exactly
// the application's part of that turn.
func (p *parking) find(ctx context.Context, calls []modelapi.ToolCall) *parkedTurn {
	if len(calls) == 0 {
		return nil
	}
	e, ok := p.memo.Recall(ctx, parkKey(calls[0].ID))
	if !ok || time.Now().After(e.Expires) {
		return nil
	}
	var pt parkedTurn
	if json.Unmarshal([]byte(e.Content), &pt) != nil || len(pt.AppCalls) != len(calls) {
		return nil
	}
	for _, c := range calls {
		if !slices.Contains(pt.AppCalls, c.ID) {
			return nil
		}
	}
	return &pt
}

// parkedBytes bounds the turns kept in memory (without durable mode);
// beyond it the oldest are dropped.
const parkedBytes = 32 << 20
