package executor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/internal/sizedcache"
	"github.com/projectdavid/toolsidecar/tool"
)

// Memo remembers the results of dedupe tools by run, tool and arguments,
// so that a call the model repeats in a later turn under a new
// tool_call_id is answered without dispatching. The durable ledger is one
// (a JetStream bucket); without it the executor keeps a bounded memo in
// memory.
type Memo interface {
	// Recall finds the entry stored under key; a miss or an error is false.
	Recall(ctx context.Context, key string) (MemoEntry, bool)
	// Remember stores an entry, best effort.
	Remember(ctx context.Context, key string, e MemoEntry)
}

// MemoEntry is a remembered result.
type MemoEntry struct {
	ToolCallID string    `json:"tool_call_id"` // the call that produced it
	Content    string    `json:"content"`
	Expires    time.Time `json:"expires"`
}

// WithMemo stores dedupe results in m. default: a memo in memory
func WithMemo(m Memo) Option { return func(e *Executor) { e.memo = m } }

// dedupeKey names a call by its run, its tool and its arguments as
// canonical JSON (keys sorted, no spaces), so that {"a":1,"b":2} and
// {"b": 2, "a": 1} are the same call. ok is false for arguments that are
// not JSON.
func dedupeKey(m *ToolCall) (string, bool) {
	d := json.NewDecoder(bytes.NewReader(argsOrEmpty(m.Args)))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return "", false
	}
	canon, err := json.Marshal(v)
	if err != nil {
		return "", false
	}
	h := sha256.New()
	for _, part := range [][]byte{[]byte(m.RunID), []byte(m.Tool), canon} {
		h.Write(part)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)), true
}

// dedupe is the dedupe policy: a call of a dedupe tool is answered from an
// earlier identical call of its run when the memo has one (it is never
// dispatched), and a successful result is remembered for the calls after.
type dedupe struct{ e *Executor }

func (p *dedupe) concerns(in *callIn) bool {
	return in.Tool != nil && in.Tool.Policies.DedupeTTL > 0
}

func (p *dedupe) intercept(ctx context.Context, in *callIn, next step) answer {
	e := p.e
	key, ok := dedupeKey(in.ToolCall)
	if !ok {
		return next(ctx, in)
	}
	if me, ok := e.memo.Recall(ctx, key); ok && time.Now().Before(me.Expires) {
		callLog(in.Log, in.ToolCall).Info("call answered from an earlier call of the run", "from", me.ToolCallID)
		e.obs.CallDeduped(in.ToolCall.Tool)
		in.Res.DedupedFrom = me.ToolCallID
		return answer{Outcome: tool.Outcome{Data: []byte(me.Content)}}
	}
	a := next(ctx, in)
	if a.Err == nil && !a.left && len(a.Data) <= e.cfg.MaxResultBytes {
		e.memo.Remember(context.WithoutCancel(ctx), key, MemoEntry{ToolCallID: in.ToolCallID, Content: string(a.Data),
			Expires: time.Now().Add(in.Tool.Policies.DedupeTTL)})
	}
	return a
}

// memMemo is the memo in memory: entries expire with their TTL, and the
// oldest are dropped beyond maxBytes of content, so that it cannot grow
// without bound.
type memMemo struct {
	mu      sync.Mutex
	entries *sizedcache.Cache[MemoEntry]
}

func newMemMemo(maxBytes int) *memMemo {
	return &memMemo{entries: sizedcache.New(maxBytes, func(e MemoEntry) int { return len(e.Content) })}
}

// NewMemoryMemo is a Memo in memory holding at most maxBytes of content:
// the oldest entries, and the expired ones among them, are dropped first.
func NewMemoryMemo(maxBytes int) Memo { return newMemMemo(maxBytes) }

func (m *memMemo) Recall(_ context.Context, key string) (MemoEntry, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.entries.Get(key)
}

func (m *memMemo) Remember(_ context.Context, key string, e MemoEntry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.entries.Put(key, e, e.Expires)
}

// argsOrEmpty is a call's arguments, {} for none.
func argsOrEmpty(a json.RawMessage) json.RawMessage {
	if len(a) == 0 || string(a) == "null" {
		return json.RawMessage("{}")
	}
	return a
}
