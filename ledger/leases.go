package ledger

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
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

	"github.com/projectdavid/toolsidecar/tool"
)

// Run leases keep the rule "one driver per run" across sidecars that share
// a NATS cluster. Two KV buckets hold them:
//   - <STEM>_SIDECARS has a key per live sidecar, its instance ID, naming
//     the process's incarnation (random, new at each start). The sidecar
//     rewrites it every TTL/3 and the bucket drops an entry not written for
//     the TTL: a sidecar that dies leaves it after the TTL, and one restarted
//     under its instance ID replaces it at once.
//   - <STEM>_DRIVES has a key per driven run, naming the instance and the
//     incarnation that drives it. Taking a run is a create-if-absent; a key
//     whose holder is not alive (no key in _SIDECARS, or another
//     incarnation there) is taken over by an update at its revision, so
//     that of two sidecars that try, exactly one wins.
//
// Holding leases costs one write per sidecar every TTL/3 and two per drive
// (take, release), however many runs a sidecar drives. A key per run
// rewritten every TTL/3 would need 3,000 writes a second at 10,000 runs,
// more than JetStream keeps up with beside a loaded sidecar.
//
// While it drives, the holder publishes the drive's events on
// <prefix>.runs.<run_id> once a sidecar follows them: a drive request that
// reaches another sidecar says so on <prefix>.runs.<run_id>.follow, follows
// the events, and takes the lease over (resuming the run) when it is
// released or its holder is gone. Most runs have no follower, and their
// events cost nothing in NATS (BENCHMARKS.md, "Journal cost").

// DefaultLeaseTTL is how long a sidecar's leases outlive its last renewal.
const DefaultLeaseTTL = 10 * time.Second

// DefaultHoldTTL is how long a run's key outlives its last write. It only
// clears the keys of holders that died and whose runs nobody drove again
// (a holder rewrites its keys every HoldTTL/3), and, on a NATS server
// without per-message TTLs (before 2.11), the markers of released leases.
const DefaultHoldTTL = time.Hour

// Leases grants run leases. Close stops the renewals.
type Leases struct {
	holds    jetstream.KeyValue // <STEM>_DRIVES
	alive    jetstream.KeyValue // <STEM>_SIDECARS
	nc       *nats.Conn
	prefix   string
	instance string
	ttl      time.Duration
	holdTTL  time.Duration
	// markerTTL is how long the marker of a released lease stays: the
	// TTL, or 0 where the server has no per-message TTLs (the marker then
	// stays for holdTTL).
	markerTTL time.Duration
	log       *slog.Logger

	// self is this sidecar's key in alive, the value of the run keys it
	// writes too. regRev is the key's revision, guarded by regMu; it is
	// read and written by the renewals only. lastBeat is when the last
	// write of it that succeeded was sent, as the time since epoch: the
	// key lives at least TTL past it. gen counts the times the key was
	// written anew after it had lapsed.
	self     []byte
	regMu    sync.Mutex
	regRev   uint64
	lastBeat atomic.Int64
	gen      atomic.Uint64

	mu     sync.Mutex
	held   map[string]*Lease
	closed bool // Close began: a lease released later is released at once

	follows *nats.Subscription // the followers' announcements, for every run

	stop  chan struct{}
	fence chan struct{} // wakes the run keys' upkeep after the sidecar's key lapsed
	wg    sync.WaitGroup

	renewals prometheus.Histogram // nil without metrics
	expired  *prometheus.CounterVec
}

// LeaseConfig names the lease buckets and says how long a lease lasts.
type LeaseConfig struct {
	Prefix   string // the tools' subject prefix
	Instance string // this sidecar's stable, unique name
	Replicas int    // of the buckets on a cluster. default: 1
	MaxBytes int64  // bounds each bucket. default: no bound
	// TTL: the leases of a sidecar that has not renewed its key for this
	// long are free. default: DefaultLeaseTTL. Renewals happen every TTL/3.
	TTL time.Duration
	// HoldTTL: a run's key not written for this long is dropped. default:
	// DefaultHoldTTL.
	HoldTTL time.Duration
	// Metrics, when set, receives the leases held, how long each renewal
	// takes, and the leases whose holder's key lapsed under their drive.
	Metrics prometheus.Registerer
}

// holder is the value of both kinds of key: a sidecar's incarnation.
type holder struct {
	Instance    string    `json:"instance"`
	Incarnation string    `json:"incarnation"`
	Since       time.Time `json:"since"`
}

// OpenLeases creates (or finds) the lease buckets, writes this sidecar's
// key and starts the renewals.
func OpenLeases(ctx context.Context, nc *nats.Conn, cfg LeaseConfig, log *slog.Logger) (*Leases, error) {
	cfg.Replicas = max(cfg.Replicas, 1)
	cfg.TTL = cmp.Or(max(cfg.TTL, 0), DefaultLeaseTTL)
	cfg.HoldTTL = cmp.Or(max(cfg.HoldTTL, 0), DefaultHoldTTL)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	bucket := func(suffix string, ttl, markerTTL time.Duration, desc string) (jetstream.KeyValue, error) {
		kv, err := create(ctx, func(ctx context.Context) (jetstream.KeyValue, error) {
			return js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucketName(cfg.Prefix) + suffix, TTL: ttl,
				LimitMarkerTTL: markerTTL, Replicas: cfg.Replicas, Storage: jetstream.FileStorage, Description: desc, MaxBytes: cmp.Or(cfg.MaxBytes, -1)})
		})
		if err != nil {
			return nil, fmt.Errorf("ledger: lease bucket %s: %w", suffix, err)
		}
		return kv, nil
	}
	// A released lease leaves a marker; with one drive after another, the
	// markers would pile up for the hold TTL.
	markerTTL := max(cfg.TTL, time.Second) // the server's least
	holds, err := bucket("_DRIVES", cfg.HoldTTL, markerTTL, "toolsidecar run leases: which sidecar drives a run")
	if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
		markerTTL = 0
		holds, err = bucket("_DRIVES", cfg.HoldTTL, 0, "toolsidecar run leases: which sidecar drives a run")
	}
	if err != nil {
		return nil, err
	}
	alive, err := bucket("_SIDECARS", cfg.TTL, 0, "toolsidecar sidecars alive: the incarnation of each")
	if err != nil {
		return nil, err
	}
	var id [8]byte
	rand.Read(id[:])
	self, _ := json.Marshal(holder{Instance: cfg.Instance, Incarnation: hex.EncodeToString(id[:]), Since: time.Now().UTC()})
	ls := &Leases{holds: holds, alive: alive, nc: nc, prefix: cfg.Prefix, instance: cfg.Instance, ttl: cfg.TTL, holdTTL: cfg.HoldTTL,
		markerTTL: markerTTL, log: log, self: self, held: map[string]*Lease{}, stop: make(chan struct{}), fence: make(chan struct{}, 1)}
	// Put, not create: the key of this instance's earlier life is replaced,
	// which frees that life's leases at once.
	sent := sinceEpoch()
	rev, err := alive.Put(ctx, cfg.Instance, self)
	if err != nil {
		return nil, fmt.Errorf("ledger: writing this sidecar's key: %w", err)
	}
	ls.regRev = rev
	ls.lastBeat.Store(int64(sent))
	if ls.follows, err = nc.Subscribe(ls.followSubject("*"), ls.followed); err != nil {
		return nil, fmt.Errorf("ledger: listening for followers: %w", err)
	}
	if cfg.Metrics != nil {
		ls.instrument(cfg.Metrics)
	}
	ls.wg.Go(func() { ls.every(nil, ls.beat) })
	ls.wg.Go(func() { ls.every(ls.fence, ls.upkeep) })
	return ls, nil
}

// instrument makes the lease metrics. Renewals that take a good part of
// the TTL, or leases whose holder's key lapsed under their drives, say that
// JetStream or the link to it is too slow for the TTL: raise
// durability.lease_ttl (RELIABILITY.md, Run leases).
func (ls *Leases) instrument(reg prometheus.Registerer) {
	f := promauto.With(reg)
	f.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "toolsidecar", Name: "leases_held",
		Help: "Run leases this sidecar holds (durable mode)."},
		func() float64 { return float64(ls.heldCount()) })
	ls.renewals = f.NewHistogram(prometheus.HistogramOpts{Namespace: "toolsidecar", Name: "lease_renewal_seconds",
		Help:    "How long one renewal of this sidecar's key, which keeps all its leases, took; near lease_ttl/3, its leases may lapse.",
		Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}})
	ls.expired = f.NewCounterVec(prometheus.CounterOpts{Namespace: "toolsidecar", Name: "leases_expired_total",
		Help: "Leases whose sidecar key lapsed while their drive went on: taken back (nobody else took it) or lost (the drive stops before its next turn)."},
		[]string{"outcome"})
	ls.expired.WithLabelValues("taken_back")
	ls.expired.WithLabelValues("lost")
}

// countExpired counts a lease whose holder's key lapsed under its drive.
func (ls *Leases) countExpired(outcome string) {
	if ls.expired != nil {
		ls.expired.WithLabelValues(outcome).Inc()
	}
}

// Close stops renewing and waits for the leases released later; the
// leases still held are free after the TTL. A second Close waits too.
func (ls *Leases) Close() {
	ls.mu.Lock()
	first := !ls.closed
	ls.closed = true
	ls.mu.Unlock()
	if first {
		_ = ls.follows.Unsubscribe()
		close(ls.stop)
	}
	ls.wg.Wait()
}

// EventSubject is where the holder of a run's lease publishes its events.
func (ls *Leases) EventSubject(runID string) string { return ls.prefix + ".runs." + runID }

// followSubject is where a sidecar following a run says so to its holder.
func (ls *Leases) followSubject(runID string) string { return ls.EventSubject(runID) + ".follow" }

// followed marks the lease the announcement names, when this sidecar holds
// it, as followed: its events are published from now on.
func (ls *Leases) followed(m *nats.Msg) {
	runID := strings.TrimSuffix(strings.TrimPrefix(m.Subject, ls.prefix+".runs."), ".follow")
	ls.mu.Lock()
	l := ls.held[runID]
	ls.mu.Unlock()
	if l != nil {
		l.watched.Store(true)
	}
}

// errLapsed refuses a lease while this sidecar's own key may have lapsed:
// a run key naming it would look free to the other sidecars.
var errLapsed = errors.New("ledger: this sidecar's key in NATS was not renewed within the lease TTL; no lease is taken until it is")

// Acquire takes the lease of a run. When another sidecar holds it, lease
// is nil and holder names that sidecar. A lease of a holder that is gone
// (a sidecar that died, or this instance's earlier life) is taken over at
// once: the caller asks only when it drives no such run itself.
func (ls *Leases) Acquire(ctx context.Context, runID string) (lease *Lease, holder string, err error) {
	if err := tool.CheckID("run_id", runID); err != nil {
		return nil, "", fmt.Errorf("ledger: %w", err)
	}
	return ls.acquire(ctx, runID, acquireTries)
}

// acquireTries bounds the rounds of one Acquire whose run key changed, or
// read as absent, between its create and its update. A key that changes
// hands that often, or a replica that answers the read stale each time
// (KV reads are direct gets), is an error for the caller to retry after a
// pause, not a recursion without end.
const acquireTries = 8

func (ls *Leases) acquire(ctx context.Context, runID string, tries int) (lease *Lease, holder string, err error) {
	if tries == 0 {
		return nil, "", fmt.Errorf("ledger: the lease of run %s changed, or read as absent, %d times while it was being taken", runID, acquireTries)
	}
	if ls.sinceBeat() > ls.ttl {
		return nil, "", errLapsed
	}
	gen := ls.gen.Load()
	rev, err := ls.holds.Create(ctx, runID, ls.self)
	if errors.Is(err, jetstream.ErrKeyExists) {
		e, gerr := ls.holds.Get(ctx, runID)
		if errors.Is(gerr, jetstream.ErrKeyNotFound) {
			return ls.acquire(ctx, runID, tries-1) // released in between
		}
		if gerr != nil {
			return nil, "", fmt.Errorf("ledger: reading the lease of run %s: %w", runID, gerr)
		}
		cur, alive, aerr := ls.holderOf(ctx, e)
		if aerr != nil {
			return nil, "", fmt.Errorf("ledger: reading the holder of run %s: %w", runID, aerr)
		}
		if alive && cur.Instance != ls.instance {
			return nil, cur.Instance, nil
		}
		rev, err = ls.holds.Update(ctx, runID, ls.self, e.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return ls.acquire(ctx, runID, tries-1) // taken or released in between
		}
		if err == nil && cur.Instance != ls.instance {
			ls.log.Info("run lease taken over from a sidecar that is gone", "run_id", runID, "holder", cur.Instance)
		}
	}
	if err != nil {
		return nil, "", fmt.Errorf("ledger: taking the lease of run %s: %w", runID, err)
	}
	l := &Lease{ls: ls, runID: runID, rev: rev, lost: make(chan struct{})}
	l.gen.Store(gen)
	l.markWritten()
	ls.mu.Lock()
	ls.held[runID] = l
	ls.mu.Unlock()
	return l, "", nil
}

// holderOf reads the holder a run's key names, and whether it is alive:
// its sidecar's key names the same incarnation. A value that does not
// decode names nobody alive.
func (ls *Leases) holderOf(ctx context.Context, e jetstream.KeyValueEntry) (holder, bool, error) {
	var h holder
	if json.Unmarshal(e.Value(), &h) != nil || h.Instance == "" {
		return h, false, nil
	}
	reg, found, err := ls.registered(ctx, h.Instance)
	if err != nil || !found {
		return h, false, err
	}
	var cur holder
	return h, json.Unmarshal(reg, &cur) == nil && cur.Incarnation == h.Incarnation, nil
}

// registered reads a sidecar's key from the leader of its bucket's
// stream. A KV Get is a direct get, which any replica may answer, and a
// replica can say a key is not there that the stream has: during a NATS
// node loss, a live sidecar was taken for gone that way, its runs taken
// over while it drove them, and an unsafe call ran twice
// (TestClusterNodeLoss, RELIABILITY.md). The leader answers with what the
// stream has committed; while there is none, the read fails, and a lease
// is not taken over on a guess.
func (ls *Leases) registered(ctx context.Context, instance string) (value []byte, found bool, err error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, registeredTimeout)
		defer cancel()
	}
	bucket := ls.alive.Bucket()
	req, _ := json.Marshal(struct {
		LastBySubject string `json:"last_by_subj"`
	}{"$KV." + bucket + "." + instance})
	msg, err := ls.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.KV_"+bucket, req)
	if err != nil {
		return nil, false, fmt.Errorf("ledger: reading sidecar %s's key: %w", instance, err)
	}
	var resp struct {
		Message *struct {
			Header []byte `json:"hdrs"`
			Data   []byte `json:"data"`
		} `json:"message"`
		Error *struct {
			ErrCode     jetstream.ErrorCode `json:"err_code"`
			Description string              `json:"description"`
		} `json:"error"`
	}
	switch err := json.Unmarshal(msg.Data, &resp); {
	case err != nil:
		return nil, false, fmt.Errorf("ledger: reading sidecar %s's key: %w", instance, err)
	case resp.Error != nil && resp.Error.ErrCode == jetstream.JSErrCodeMessageNotFound:
		return nil, false, nil
	case resp.Error != nil:
		return nil, false, fmt.Errorf("ledger: reading sidecar %s's key: %s", instance, resp.Error.Description)
	case resp.Message == nil:
		return nil, false, fmt.Errorf("ledger: reading sidecar %s's key: an answer without the message", instance)
	}
	if len(resp.Message.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return nil, false, fmt.Errorf("ledger: reading sidecar %s's key: %w", instance, err)
		}
		if op := h.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
			return nil, false, nil
		}
	}
	return resp.Message.Data, true, nil
}

// registeredTimeout bounds a read of a sidecar's key whose caller set no
// deadline, as nats.go's own KV reads are bounded.
const registeredTimeout = 5 * time.Second

// Driven reports a run whose lease a sidecar alive holds (this one
// included).
func (ls *Leases) Driven(ctx context.Context, runID string) (bool, error) {
	if err := tool.CheckID("run_id", runID); err != nil {
		return false, fmt.Errorf("ledger: %w", err)
	}
	free, err := ls.free(ctx, runID)
	return !free && err == nil, err
}

// free says whether nobody alive holds a run's lease.
func (ls *Leases) free(ctx context.Context, runID string) (bool, error) {
	e, err := ls.holds.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	_, alive, err := ls.holderOf(ctx, e)
	return !alive && err == nil, err
}

// Follow hands fn each event the holder of a run's lease publishes, until
// fn returns true, the lease is free (released, or its holder is gone), or
// ctx ends (its error is returned).
func (ls *Leases) Follow(ctx context.Context, runID string, fn func(event []byte) (stop bool)) error {
	if err := tool.CheckID("run_id", runID); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	sub, err := ls.nc.SubscribeSync(ls.EventSubject(runID))
	if err != nil {
		return fmt.Errorf("ledger: following run %s: %w", runID, err)
	}
	defer sub.Unsubscribe()
	// The lease is checked after subscribing, so that no event published
	// between the check and the subscription is missed, and again every
	// followPoll while no event comes (a holder's death publishes nothing,
	// and a holder restarted under its instance ID frees its runs at once).
	// Each time the holder is told again that the run is followed: a
	// holder that took the lease since has not heard it. Events published
	// before the holder heard it the first time are not received: a
	// follower gets the events from about then on, and the summary.
	every := min(ls.ttl/4, followPoll)
	for {
		_ = ls.nc.Publish(ls.followSubject(runID), nil)
		if free, _ := ls.free(ctx, runID); free {
			return nil
		} else if ctx.Err() != nil {
			return ctx.Err()
		}
		wait, cancel := context.WithTimeout(ctx, every)
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

// followPoll is the longest a follower waits between two checks of the
// lease: two reads, for the few drives that follow another sidecar.
const followPoll = time.Second

// renewers bounds the run keys written at once by the upkeep. One at a
// time, 10,000 writes outlasted a 10 s TTL on a loaded machine.
const renewers = 32

// every runs fn every TTL/3, and whenever wake fires, until Close. The
// renewals of the sidecar's key (beat) and the run keys' upkeep each run
// in a loop of their own: a pass over thousands of run keys must not delay
// a renewal.
func (ls *Leases) every(wake <-chan struct{}, fn func()) {
	t := time.NewTicker(ls.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ls.stop:
			return
		case <-t.C:
		case <-wake:
		}
		fn()
	}
}

// beat renews this sidecar's key at the revision it last wrote. A renewal
// that fails is retried at the next beat; once the TTL has passed since
// the last success, every lease held is lost (other sidecars may take
// them over). When the key turns out to have lapsed (it expired, or was
// replaced), it is written again and the run keys are fenced: each is
// rewritten at the revision this sidecar knows, which fails for a run
// another sidecar took over meanwhile.
func (ls *Leases) beat() {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), ls.ttl/3)
	defer cancel()
	ls.regMu.Lock()
	defer ls.regMu.Unlock()
	sent := sinceEpoch()
	rev, err := ls.alive.Update(ctx, ls.instance, ls.self, ls.regRev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || (err != nil && ls.sinceBeat() > ls.ttl) {
		rev, err = ls.rewriteKey(ctx)
	}
	switch {
	case err == nil:
		ls.regRev = rev
		ls.lastBeat.Store(int64(sent))
		if ls.renewals != nil {
			ls.renewals.Observe(time.Since(start).Seconds())
		}
	case ls.sinceBeat() > ls.ttl:
		ls.log.Warn("this sidecar's key was not renewed within the lease TTL: its leases are lost", "err", err)
		for _, l := range ls.heldLeases(func(*Lease) bool { return true }) {
			if l.markLost() {
				ls.countExpired("lost")
			}
		}
	default:
		ls.log.Warn("renewing this sidecar's key failed; retrying", "err", err)
	}
}

// rewriteKey decides a renewal that was refused, or that failed for
// longer than the TTL, from the key itself. When it still holds this
// incarnation (an update landed after its request timed out), that
// revision is renewed. Otherwise the key lapsed and is written again, and
// the upkeep fences the run keys.
func (ls *Leases) rewriteKey(ctx context.Context) (uint64, error) {
	rev, err := writeOver(ctx, ls.alive, ls.instance, ls.self)
	switch {
	case err == nil:
		return rev, nil
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		ls.log.Error("another process wrote this sidecar's key: instance_id must be unique among sidecars", "instance_id", ls.instance)
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return 0, err
	}
	rev, err = ls.alive.Put(ctx, ls.instance, ls.self)
	if err != nil {
		return 0, err
	}
	ls.log.Warn("this sidecar's key had lapsed: written again; its leases are checked", "held", ls.heldCount())
	ls.gen.Add(1)
	select {
	case ls.fence <- struct{}{}:
	default:
	}
	return rev, nil
}

// upkeep writes the run keys that need it, the longest unwritten first:
// those written before this sidecar's key last lapsed (fencing), and those
// close to the hold TTL.
func (ls *Leases) upkeep() {
	gen := ls.gen.Load()
	var g errgroup.Group
	g.SetLimit(renewers)
	for _, l := range ls.renewalOrder(func(l *Lease) bool { return l.gen.Load() < gen || l.sinceWrite() > ls.holdTTL/3 }) {
		g.Go(func() error { l.keep(gen); return nil })
	}
	_ = g.Wait()
}

// heldLeases is the leases held for which want says true, in no order.
func (ls *Leases) heldLeases(want func(*Lease) bool) []*Lease {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var held []*Lease
	for _, l := range ls.held {
		if want(l) {
			held = append(held, l)
		}
	}
	return held
}

// heldCount is how many leases are held.
func (ls *Leases) heldCount() int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return len(ls.held)
}

// renewalOrder is the held leases for which want says true, the longest
// unwritten first, so that a pass that cannot write them all in time
// still writes each one in turn (TestRenewalOrder). Most passes want none:
// only those are sorted.
func (ls *Leases) renewalOrder(want func(*Lease) bool) []*Lease {
	held := ls.heldLeases(want)
	slices.SortFunc(held, func(a, b *Lease) int { return cmp.Compare(a.lastWrite.Load(), b.lastWrite.Load()) })
	return held
}

// epoch is the origin of the lease clocks: durations from it are monotonic.
var epoch = time.Now()

func sinceEpoch() time.Duration { return time.Since(epoch) }

// sinceBeat is how long ago the last successful renewal of this sidecar's
// key was sent.
func (ls *Leases) sinceBeat() time.Duration { return sinceEpoch() - time.Duration(ls.lastBeat.Load()) }
