package runstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/internal/sizedcache"
)

// Journal stores the records of runs, with their revisions for the
// compare-and-set that claims a run. Keys hold letters, digits, '.', '-'
// and '_'. A record lives for the journal's TTL. Durable mode's journal is
// the ledger's KV bucket (ledger.Journal); [NewMemoryJournal] is the other.
type Journal interface {
	// Get returns a record and its revision; a missing one is nil, 0, nil.
	Get(ctx context.Context, key string) ([]byte, uint64, error)
	// Create writes a record that must not exist ([ErrExists]).
	Create(ctx context.Context, key string, value []byte) (uint64, error)
	// Update rewrites a record at its revision ([ErrChanged]).
	Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error)
	// Put writes a record, whatever was there.
	Put(ctx context.Context, key string, value []byte) error
}

// Errors of a Journal's conditional writes, which every Journal returns
// (or wraps) as they are.
var (
	// ErrExists is Create's error for a record that exists.
	ErrExists = errors.New("runstore: the journal record exists")
	// ErrChanged is Update's error for a record that is not at the
	// revision given, or is missing.
	ErrChanged = errors.New("runstore: the journal record changed")
)

// Timeout bounds the journal's part of one step of a run (a read of the
// run, a turn's records, its end): a journal that does not answer must not
// hold a run past it.
const Timeout = 5 * time.Second

// Bound is ctx for the journal: not cancelled with ctx, so that a write a
// run begun is not cut when its request goes away, and bounded by
// [Timeout].
func Bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), Timeout)
}

// memJournal is a Journal in memory: records live for the TTL, and the
// oldest are dropped first once they hold more than maxBytes.
type memJournal struct {
	ttl time.Duration

	mu      sync.Mutex
	records *sizedcache.Cache[memRecord]
	rev     uint64
}

type memRecord struct {
	value []byte
	rev   uint64
}

// NewMemoryJournal is a Journal in memory, for a sidecar without durable
// mode: it serves retries that reach this process while it lives. Records
// live for ttl; past maxBytes the oldest are dropped.
func NewMemoryJournal(ttl time.Duration, maxBytes int) Journal {
	return &memJournal{ttl: ttl, records: sizedcache.New(maxBytes, func(r memRecord) int { return len(r.value) })}
}

func (m *memJournal) Get(_ context.Context, key string) ([]byte, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.records.Get(key)
	if !ok {
		return nil, 0, nil
	}
	return r.value, r.rev, nil
}

func (m *memJournal) Create(_ context.Context, key string, value []byte) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, found := m.records.Get(key); found {
		return 0, ErrExists
	}
	return m.write(key, value), nil
}

func (m *memJournal) Update(_ context.Context, key string, value []byte, rev uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, found := m.records.Get(key); !found || cur.rev != rev {
		return 0, ErrChanged
	}
	return m.write(key, value), nil
}

func (m *memJournal) Put(_ context.Context, key string, value []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.write(key, value)
	return nil
}

// write stores value under key at the next revision. m.mu is held.
func (m *memJournal) write(key string, value []byte) uint64 {
	m.rev++
	m.records.Put(key, memRecord{value, m.rev}, time.Now().Add(m.ttl))
	return m.rev
}
