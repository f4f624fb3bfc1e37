package ledger

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"golang.org/x/sync/errgroup"
)

// Run leases keep the rule "one driver per run" across sidecars that share
// a NATS cluster. A lease is a key of a KV bucket whose entries expire
// after the lease TTL: taking it is a create-if-absent, holding it is an
// update at the revision last written (so that a sidecar that lost it
// cannot renew over the new holder), and a sidecar that dies simply stops
// renewing. While it drives, the holder publishes the drive's events on
// <prefix>.runs.<run_id>; a drive request that reaches another sidecar
// follows them, and takes the lease over (resuming the run) when it is
// released or expires.

// DefaultLeaseTTL is how long a lease outlives its holder's last renewal.
const DefaultLeaseTTL = 10 * time.Second

// Leases grants run leases. Close stops the renewals.
type Leases struct {
	kv       jetstream.KeyValue
	nc       *nats.Conn
	prefix   string
	instance string
	ttl      time.Duration
	log      *slog.Logger

	mu   sync.Mutex
	held map[string]*Lease

	stop chan struct{}
	wg   sync.WaitGroup

	passes  prometheus.Histogram // nil without metrics
	expired *prometheus.CounterVec
}

// LeaseConfig names the lease bucket and says how long a lease lasts.
type LeaseConfig struct {
	Prefix   string // the tools' subject prefix
	Instance string // this sidecar's stable, unique name
	Replicas int    // of the bucket on a cluster. default: 1
	// TTL: a lease not renewed for this long is free. default:
	// DefaultLeaseTTL. Renewals happen every TTL/3.
	TTL time.Duration
	// Metrics, when set, receives the leases held, how long each pass of
	// renewals takes, and the leases that expired under their drive.
	Metrics prometheus.Registerer
}

// leaseValue is what a lease key holds.
type leaseValue struct {
	Instance string    `json:"instance"`
	Since    time.Time `json:"since"`
}

// OpenLeases creates (or finds) the lease bucket and starts the renewals.
func OpenLeases(ctx context.Context, nc *nats.Conn, cfg LeaseConfig, log *slog.Logger) (*Leases, error) {
	if cfg.Replicas < 1 {
		cfg.Replicas = 1
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultLeaseTTL
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucketName(cfg.Prefix) + "_RUNS", TTL: cfg.TTL,
		Replicas: cfg.Replicas, Storage: jetstream.FileStorage, Description: "toolsidecar run leases: which sidecar drives a run"})
	if err != nil {
		return nil, fmt.Errorf("ledger: lease bucket: %w", err)
	}
	ls := &Leases{kv: kv, nc: nc, prefix: cfg.Prefix, instance: cfg.Instance, ttl: cfg.TTL, log: log,
		held: map[string]*Lease{}, stop: make(chan struct{})}
	if cfg.Metrics != nil {
		ls.register(cfg.Metrics)
	}
	ls.wg.Go(ls.renewLoop)
	return ls, nil
}

// register makes the lease metrics. A pass of renewals that takes a good
// part of the TTL, or leases that expire under their drives, say that
// JetStream cannot keep up with a write per lease every TTL/3: raise
// durability.lease_ttl, or drive fewer runs per sidecar (RELIABILITY.md).
func (ls *Leases) register(reg prometheus.Registerer) {
	f := promauto.With(reg)
	f.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "toolsidecar", Name: "leases_held",
		Help: "Run leases this sidecar holds (durable mode): each one is written every lease_ttl/3."},
		func() float64 { ls.mu.Lock(); defer ls.mu.Unlock(); return float64(len(ls.held)) })
	ls.passes = f.NewHistogram(prometheus.HistogramOpts{Namespace: "toolsidecar", Name: "lease_renewal_pass_seconds",
		Help:    "How long one pass over every held lease took; near lease_ttl, leases expire under their drives.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 11)})
	ls.expired = f.NewCounterVec(prometheus.CounterOpts{Namespace: "toolsidecar", Name: "leases_expired_total",
		Help: "Leases whose key expired while their drive went on: taken back (nobody else took it) or lost (the drive stops before its next turn)."},
		[]string{"outcome"})
	ls.expired.WithLabelValues("taken_back")
	ls.expired.WithLabelValues("lost")
}

// countExpired counts a lease that expired under its drive.
func (ls *Leases) countExpired(outcome string) {
	if ls.expired != nil {
		ls.expired.WithLabelValues(outcome).Inc()
	}
}

// Close stops renewing; the leases still held expire after the TTL.
func (ls *Leases) Close() {
	close(ls.stop)
	ls.wg.Wait()
}

// EventSubject is where the holder of a run's lease publishes its events.
func (ls *Leases) EventSubject(runID string) string { return ls.prefix + ".runs." + runID }

// Acquire takes the lease of a run. When another sidecar holds it, lease
// is nil and holder names that sidecar. A lease this instance held in an
// earlier life (it was killed while driving) is taken back at once: the
// caller asks only when it drives no such run itself.
func (ls *Leases) Acquire(ctx context.Context, runID string) (lease *Lease, holder string, err error) {
	now := time.Now().UTC()
	val, _ := json.Marshal(leaseValue{Instance: ls.instance, Since: now})
	rev, err := ls.kv.Create(ctx, runID, val)
	if errors.Is(err, jetstream.ErrKeyExists) {
		e, gerr := ls.kv.Get(ctx, runID)
		if errors.Is(gerr, jetstream.ErrKeyNotFound) {
			return ls.Acquire(ctx, runID) // released in between
		}
		if gerr != nil {
			return nil, "", fmt.Errorf("ledger: reading the lease of run %s: %w", runID, gerr)
		}
		var cur leaseValue
		if json.Unmarshal(e.Value(), &cur) != nil || cur.Instance != ls.instance {
			return nil, cur.Instance, nil
		}
		rev, err = ls.kv.Update(ctx, runID, val, e.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return ls.Acquire(ctx, runID) // taken or released in between
		}
	}
	if err != nil {
		return nil, "", fmt.Errorf("ledger: taking the lease of run %s: %w", runID, err)
	}
	l := &Lease{ls: ls, runID: runID, val: val, rev: rev, lost: make(chan struct{})}
	l.markRenewed()
	ls.mu.Lock()
	ls.held[runID] = l
	ls.mu.Unlock()
	return l, "", nil
}

// Follow hands fn each event the holder of a run's lease publishes, until
// fn returns true, the lease is free (released, or expired because its
// holder died), or ctx ends (its error is returned).
func (ls *Leases) Follow(ctx context.Context, runID string, fn func(event []byte) (stop bool)) error {
	sub, err := ls.nc.SubscribeSync(ls.EventSubject(runID))
	if err != nil {
		return fmt.Errorf("ledger: following run %s: %w", runID, err)
	}
	defer sub.Unsubscribe()
	// The lease is checked after subscribing, so that no event published
	// between the check and the subscription is missed, and again every
	// TTL/4 while no event comes (an expiry publishes nothing).
	for {
		if _, err := ls.kv.Get(ctx, runID); errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		} else if ctx.Err() != nil {
			return ctx.Err()
		}
		wait, cancel := context.WithTimeout(ctx, ls.ttl/4)
		for {
			m, err := sub.NextMsgWithContext(wait)
			if err != nil {
				break
			}
			if fn(m.Data) {
				cancel()
				return nil
			}
		}
		cancel()
	}
}

// renewers bounds the renewals in flight at once. One at a time, a pass
// over 10,000 held leases outlasted the TTL on a loaded machine, and the
// leases expired under the drives that held them.
const renewers = 32

// renewLoop renews every held lease every TTL/3, up to renewers at once.
// A renewal refused because another sidecar took the lease (this one's
// expired while it was cut off from NATS) loses the lease; a renewal that
// finds the key merely expired takes it back, since nobody else drives the
// run; a renewal that fails otherwise is retried, and the lease is lost
// once the TTL has passed since the last success.
func (ls *Leases) renewLoop() {
	t := time.NewTicker(ls.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ls.stop:
			return
		case <-t.C:
		}
		held := ls.renewalOrder()
		start := time.Now()
		var g errgroup.Group
		g.SetLimit(renewers)
		for _, l := range held {
			g.Go(func() error { l.renew(); return nil })
		}
		_ = g.Wait()
		if ls.passes != nil && len(held) > 0 {
			ls.passes.Observe(time.Since(start).Seconds())
		}
	}
}

// renewalOrder is the held leases, the longest unrenewed first. When a
// pass takes longer than TTL/3, each lease is then renewed about once per
// pass, at the same place in it; in any order, a lease renewed early in
// one pass and late in the next would go two passes without renewal
// (TestRenewalOrder).
func (ls *Leases) renewalOrder() []*Lease {
	ls.mu.Lock()
	held := make([]*Lease, 0, len(ls.held))
	for _, l := range ls.held {
		held = append(held, l)
	}
	ls.mu.Unlock()
	slices.SortFunc(held, func(a, b *Lease) int { return cmp.Compare(a.lastRenewal.Load(), b.lastRenewal.Load()) })
	return held
}

// Lease is one held run lease.
type Lease struct {
	ls    *Leases
	runID string
	val   []byte
	// lastRenewal is when the key was last written, as the time since
	// epoch (monotonic), read without the lock by renewalOrder.
	lastRenewal atomic.Int64

	mu       sync.Mutex
	rev      uint64
	released bool
	lost     chan struct{}
	lostOnce sync.Once
}

// epoch is the origin of lastRenewal: durations from it are monotonic.
var epoch = time.Now()

func (l *Lease) markRenewed() { l.lastRenewal.Store(int64(time.Since(epoch))) }

// sinceRenewal is how long ago the key was last written.
func (l *Lease) sinceRenewal() time.Duration {
	return time.Since(epoch) - time.Duration(l.lastRenewal.Load())
}

func (l *Lease) renew() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.ls.ttl/3)
	defer cancel()
	rev, err := l.ls.kv.Update(ctx, l.runID, l.val, l.rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || (err != nil && l.sinceRenewal() > l.ls.ttl) {
		// Before the lease is given up, the key itself says whether it
		// is still this sidecar's, with a time of its own.
		rctx, rcancel := context.WithTimeout(context.Background(), l.ls.ttl/3)
		rev, err = l.retake(rctx)
		rcancel()
	}
	switch {
	case err == nil:
		l.rev = rev
		l.markRenewed()
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists), l.sinceRenewal() > l.ls.ttl:
		l.ls.log.Warn("run lease lost: another sidecar may drive the run", "run_id", l.runID, "err", err)
		l.ls.countExpired("lost")
		l.markLost()
	default:
		l.ls.log.Warn("run lease renewal failed; retrying", "run_id", l.runID, "err", err)
	}
}

// retake decides a renewal that was refused, or that failed for longer
// than the TTL, from the key itself:
//   - it holds this lease, at a revision the sidecar did not learn (an
//     update that landed after its request timed out): the lease goes on
//     at that revision;
//   - it holds another value: another sidecar took the lease (a revision
//     mismatch: lost);
//   - it has a delete or purge marker: someone released it, which this
//     sidecar did not, so another sidecar took it and gave it up (lost:
//     that sidecar may have driven the run meanwhile);
//   - it has no entry at all: it expired and nobody wrote it since. It is
//     created again; Create is create-if-absent, so of this sidecar and one
//     that would take the run over at that moment exactly one gets it (the
//     loser sees ErrKeyExists).
func (l *Lease) retake(ctx context.Context) (uint64, error) {
	e, err := l.ls.kv.Get(ctx, l.runID)
	switch {
	case err == nil && bytes.Equal(e.Value(), l.val): // the value names this instance and this lease's start
		return e.Revision(), nil
	case err == nil:
		return 0, jetstream.ErrKeyRevisionMismatch
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return 0, err
	}
	if _, err := l.ls.kv.History(ctx, l.runID); !errors.Is(err, jetstream.ErrKeyNotFound) {
		if err == nil {
			return 0, jetstream.ErrKeyRevisionMismatch // a marker: released by another holder
		}
		return 0, err
	}
	rev, err := l.ls.kv.Create(ctx, l.runID, l.val)
	if err == nil {
		l.ls.log.Warn("run lease had expired with nobody else taking it: taken back", "run_id", l.runID)
		l.ls.countExpired("taken_back")
	}
	return rev, err
}

func (l *Lease) markLost() { l.lostOnce.Do(func() { close(l.lost) }) }

// Lost is closed when the lease passed to another sidecar.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Publish sends one event of the drive to the sidecars following it. Best
// effort: a follower that misses events still gets the outcome, from Core,
// when it resumes the run.
func (l *Lease) Publish(event []byte) { _ = l.ls.nc.Publish(l.ls.EventSubject(l.runID), event) }

// Release gives the lease up, if it is still this sidecar's.
func (l *Lease) Release() {
	l.ls.mu.Lock()
	if l.ls.held[l.runID] == l {
		delete(l.ls.held, l.runID)
	}
	l.ls.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.released = true
	ctx, cancel := context.WithTimeout(context.Background(), l.ls.ttl/3)
	defer cancel()
	// Flushed first so that the events reach followers before the lease
	// is seen free. Only the revision this sidecar wrote is deleted.
	_ = l.ls.nc.FlushWithContext(ctx)
	if err := l.ls.kv.Delete(ctx, l.runID, jetstream.LastRevision(l.rev)); err != nil && !isWrongLastSeq(err) {
		l.ls.log.Warn("run lease not released; it expires after its TTL", "run_id", l.runID, "err", err)
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
