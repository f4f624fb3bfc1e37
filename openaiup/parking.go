package openaiup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
func (p *parking) park(ctx context.Context, a modelapi.Codec, res modelapi.Result) {
	if len(res.Parked) == 0 {
		return
	}
	assistant, results := a.SplitParked(res.Parked)
	calls, err := a.CallsOf(assistant)
	if err != nil {
		return
	}
	pt := modelapi.ParkedTurn{Assistant: assistant, Tools: results}
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
// the API's Restore places it.
func (p *parking) restore(ctx context.Context, a modelapi.Codec, msgs []json.RawMessage) []json.RawMessage {
	return a.Restore(msgs, func(calls []modelapi.ToolCall) *modelapi.ParkedTurn { return p.find(ctx, calls) })
}

// find is the parked turn of an assistant message whose calls are exactly
// the application's part of that turn.
func (p *parking) find(ctx context.Context, calls []modelapi.ToolCall) *modelapi.ParkedTurn {
	if len(calls) == 0 {
		return nil
	}
	e, ok := p.memo.Recall(ctx, parkKey(calls[0].ID))
	if !ok || time.Now().After(e.Expires) {
		return nil
	}
	var pt modelapi.ParkedTurn
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
