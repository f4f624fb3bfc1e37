package ledger

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Lease is one held run lease.
type Lease struct {
	ls    *Leases
	runID string
	// lastWrite is when the run key was last written, as the time since
	// epoch; gen is the sidecar key's generation then (Leases.gen). Both
	// are read without the lock by the upkeep.
	lastWrite atomic.Int64
	gen       atomic.Uint64

	watched atomic.Bool // a sidecar follows the run

	mu       sync.Mutex
	rev      uint64
	released bool
	lost     chan struct{}
	lostOnce sync.Once
}

func (l *Lease) markWritten() { l.lastWrite.Store(int64(sinceEpoch())) }

// sinceWrite is how long ago the run key was last written.
func (l *Lease) sinceWrite() time.Duration { return sinceEpoch() - time.Duration(l.lastWrite.Load()) }

// keep rewrites the run key at the revision this lease wrote last, as of
// the sidecar key's generation gen. A write that fences the key after the
// sidecar key lapsed counts the lease taken back, or lost when another
// sidecar took the run over meanwhile.
func (l *Lease) keep(gen uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released || l.isLost() {
		return
	}
	fencing := l.gen.Load() < gen
	ctx, cancel := context.WithTimeout(context.Background(), l.ls.ttl/3)
	defer cancel()
	rev, err := l.ls.holds.Update(ctx, l.runID, l.ls.self, l.rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		rev, err = l.retake(ctx)
	}
	switch {
	case err == nil:
		l.rev = rev
		l.gen.Store(gen)
		l.markWritten()
		if fencing {
			l.ls.countExpired("taken_back")
		}
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
		l.ls.log.Warn("run lease lost: another sidecar may drive the run", "run_id", l.runID, "err", err)
		if l.markLost() {
			l.ls.countExpired("lost")
		}
	default:
		l.ls.log.Warn("writing a run lease's key failed; retrying", "run_id", l.runID, "err", err)
	}
}

// retake decides a write that was refused from the run key itself:
//   - it names this sidecar, at a revision the lease did not learn (a
//     write that landed after its request timed out): it is written at
//     that revision;
//   - it names another holder: that sidecar took the run over (lost);
//   - it is gone: this sidecar did not release it, so another one took
//     it and gave it up, and may have driven the run meanwhile (lost).
//     The key cannot have expired under this lease: the upkeep rewrites
//     it every HoldTTL/3.
func (l *Lease) retake(ctx context.Context) (uint64, error) {
	rev, err := writeOver(ctx, l.ls.holds, l.runID, l.ls.self)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, jetstream.ErrKeyRevisionMismatch
	}
	return rev, err
}

// writeOver writes val into key at the revision the bucket has, provided
// the key still holds val: a write that landed after its request timed
// out left the writer a revision behind. ErrKeyNotFound: the key is gone;
// ErrKeyRevisionMismatch: it holds another value.
func writeOver(ctx context.Context, kv jetstream.KeyValue, key string, val []byte) (uint64, error) {
	e, err := kv.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	if !bytes.Equal(e.Value(), val) {
		return 0, jetstream.ErrKeyRevisionMismatch
	}
	return kv.Update(ctx, key, val, e.Revision())
}

// markLost closes Lost, and says whether this call did.
func (l *Lease) markLost() (first bool) {
	l.lostOnce.Do(func() { close(l.lost); first = true })
	return first
}

func (l *Lease) isLost() bool {
	select {
	case <-l.lost:
		return true
	default:
		return false
	}
}

// Lost is closed when the lease passed, or may have passed, to another
// sidecar.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Followed says whether a sidecar has said it follows the run: until one
// has, Publish need not be called.
func (l *Lease) Followed() bool { return l.watched.Load() }

// Publish sends one event of the drive to the sidecars following it. Best
// effort: a follower that misses events still gets the outcome, from Core,
// when it resumes the run.
func (l *Lease) Publish(event []byte) { _ = l.ls.nc.Publish(l.ls.EventSubject(l.runID), event) }

// Release gives the lease up, if it is still this sidecar's.
func (l *Lease) Release() {
	l.forget()
	l.giveUp()
}

// ReleaseLater gives the lease up as Release does, off the caller's path:
// a drive's answer does not wait for the two NATS round trips (about a
// third of a millisecond on one machine, BENCHMARKS.md). Until they are
// done the lease reads as held, so another sidecar's drive of the run
// follows for that long. Close waits for them.
func (l *Lease) ReleaseLater() {
	l.forget()
	l.ls.mu.Lock()
	later := !l.ls.closed // Close has not begun waiting
	if later {
		l.ls.wg.Go(l.giveUp)
	}
	l.ls.mu.Unlock()
	if !later {
		l.giveUp()
	}
}

// forget stops renewing the lease.
func (l *Lease) forget() {
	l.ls.mu.Lock()
	defer l.ls.mu.Unlock()
	if l.ls.held[l.runID] == l {
		delete(l.ls.held, l.runID)
	}
}

// giveUp removes the lease's key, if it is still this sidecar's revision.
func (l *Lease) giveUp() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.released = true
	ctx, cancel := context.WithTimeout(context.Background(), l.ls.ttl/3)
	defer cancel()
	// Flushed first so that the events reach followers before the lease
	// is seen free. Only the revision this sidecar wrote is removed.
	_ = l.ls.nc.FlushWithContext(ctx)
	var err error
	if l.ls.markerTTL > 0 {
		err = l.ls.holds.Purge(ctx, l.runID, jetstream.LastRevision(l.rev), jetstream.PurgeTTL(l.ls.markerTTL))
	} else {
		err = l.ls.holds.Delete(ctx, l.runID, jetstream.LastRevision(l.rev))
	}
	if err != nil && !isWrongLastSeq(err) {
		l.ls.log.Warn("run lease not released; it is free when this sidecar's key lapses", "run_id", l.runID, "err", err)
	}
}

// isWrongLastSeq: a write at a revision that is no longer the key's (the
// lease moved on); replicated streams use the second code.
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// bucketName turns a subject prefix into the stem of the JetStream names.
func bucketName(prefix string) string {
	return strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(prefix))
}
