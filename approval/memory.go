package approval

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"
)

// keepDecided is how long Memory keeps a verdict, for a re-drive of the
// run in the same process.
const keepDecided = time.Hour

// Memory is a Store in the process: its approvals end with it.
type Memory struct {
	mu      sync.Mutex
	entries map[string]*memEntry
}

type memEntry struct {
	e       Entry
	decided chan struct{} // closed with the verdict
}

// NewMemory returns an empty store.
func NewMemory() *Memory { return &Memory{entries: map[string]*memEntry{}} }

// Open implements Store.
func (m *Memory) Open(_ context.Context, r Request) (Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forgetOld()
	if me, ok := m.entries[r.ActionID]; ok {
		return me.e, nil
	}
	me := &memEntry{e: Entry{Request: r}, decided: make(chan struct{})}
	m.entries[r.ActionID] = me
	return me.e, nil
}

// forgetOld drops verdicts older than keepDecided; called with mu held.
func (m *Memory) forgetOld() {
	for id, me := range m.entries {
		if v := me.e.Verdict; v != nil && time.Since(v.DecidedAt) > keepDecided {
			delete(m.entries, id)
		}
	}
}

// Await implements Store.
func (m *Memory) Await(ctx context.Context, actionID string) (Verdict, error) {
	m.mu.Lock()
	me, ok := m.entries[actionID]
	m.mu.Unlock()
	if !ok {
		return Verdict{}, ErrNotFound
	}
	select {
	case <-me.decided:
		m.mu.Lock()
		defer m.mu.Unlock()
		return *me.e.Verdict, nil
	case <-ctx.Done():
		return Verdict{}, context.Cause(ctx)
	}
}

// Get implements Store.
func (m *Memory) Get(_ context.Context, actionID string) (Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	me, ok := m.entries[actionID]
	if !ok {
		return Entry{}, ErrNotFound
	}
	return me.e, nil
}

// Decide implements Store.
func (m *Memory) Decide(_ context.Context, actionID string, v Verdict) (Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	me, ok := m.entries[actionID]
	switch {
	case !ok:
		return Entry{}, ErrNotFound
	case me.e.Verdict != nil:
		return me.e, ErrDecided
	}
	me.e.Verdict = &v
	close(me.decided)
	return me.e, nil
}

// Pending implements Store.
func (m *Memory) Pending(context.Context) ([]Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := []Entry{}
	for _, me := range m.entries {
		if me.e.Verdict == nil {
			out = append(out, me.e)
		}
	}
	SortOldestFirst(out)
	return out, nil
}

// SortOldestFirst sorts approvals by request time, then Action ID.
func SortOldestFirst(es []Entry) {
	slices.SortFunc(es, func(a, b Entry) int {
		return cmp.Or(a.RequestedAt.Compare(b.RequestedAt), cmp.Compare(a.ActionID, b.ActionID))
	})
}
