package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectdavid/toolsidecar/runstore"
)

// Journal is a KV bucket of records that outlive the sidecar for a TTL:
// the runs of OpenAI-compatible applications (package runstore), so that
// a retried request resumes its run on any sidecar of the cluster. Its
// conditional writes fail with runstore's errors, which is all it knows of
// the records.
type Journal struct{ kv jetstream.KeyValue }

var _ runstore.Journal = (*Journal)(nil)

// Journal returns the journal bucket, opened with the ledger.
func (l *Ledger) Journal() *Journal { return &Journal{l.journal} }

// Get returns a record and its revision; a missing one is nil, 0, nil.
func (j *Journal) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	e, err := j.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, 0, nil
	case err != nil:
		return nil, 0, fmt.Errorf("ledger: journal %s: %w", key, err)
	}
	return e.Value(), e.Revision(), nil
}

// Create writes a record that must not exist (runstore.ErrExists).
func (j *Journal) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	rev, err := j.kv.Create(ctx, key, value)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, runstore.ErrExists
	}
	if err != nil {
		return 0, fmt.Errorf("ledger: journal %s: %w", key, err)
	}
	return rev, nil
}

// Update rewrites a record at its revision (runstore.ErrChanged).
func (j *Journal) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	rev, err := j.kv.Update(ctx, key, value, rev)
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, runstore.ErrChanged
	}
	if err != nil {
		return 0, fmt.Errorf("ledger: journal %s: %w", key, err)
	}
	return rev, nil
}

// Put writes a record, waiting for JetStream to store it.
func (j *Journal) Put(ctx context.Context, key string, value []byte) error {
	if _, err := j.kv.Put(ctx, key, value); err != nil {
		return fmt.Errorf("ledger: journal %s: %w", key, err)
	}
	return nil
}
