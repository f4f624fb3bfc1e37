package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/projectdavid/toolsidecar/internal/retry"
)

// One driver per run across sidecars: in durable mode, a drive first takes
// the run's lease (package ledger). When another sidecar holds it, the
// drive follows that sidecar's events and, once the lease is free (the
// drive ended, or its sidecar died and stopped renewing), takes it and
// resumes the run from the upstream's state.

// Leases grants run leases shared by the sidecars of a NATS cluster.
type Leases interface {
	// Acquire takes a run's lease. When another sidecar holds it, lease
	// is nil and holder names that sidecar.
	Acquire(ctx context.Context, runID string) (lease Lease, holder string, err error)
	// Follow hands fn the events the holder publishes, until fn returns
	// true, the lease is free, or ctx ends (its error is returned).
	Follow(ctx context.Context, runID string, fn func(event []byte) (stop bool)) error
}

// Lease is a held run lease.
type Lease interface {
	// Lost is closed when the lease passed to another sidecar.
	Lost() <-chan struct{}
	// Followed says whether another sidecar follows the run; events are
	// published only then.
	Followed() bool
	// Publish sends an event to the sidecars following the run.
	Publish(event []byte)
	// Release gives the lease up.
	Release()
}

// WithLeases makes drives take run leases from l. default: none (one
// driver per run within this sidecar only)
func WithLeases(l Leases) Option { return func(e *Executor) { e.leases = l } }

// ErrLeaseLost: the run's lease passed to another sidecar, or could not be
// renewed for longer than it lasts (this one was cut off from NATS, or
// JetStream fell behind), so another may take it; this drive stops before
// its next turn and leaves the run to the new holder.
var ErrLeaseLost = errors.New("executor: the run's lease was lost (taken by another sidecar, or not renewed within durability.lease_ttl); another sidecar may drive the run")

// relayed is an event as it travels between sidecars: with its raw chunk,
// which the local API frames as is.
type relayed struct {
	Event
	Raw json.RawMessage `json:"raw,omitempty"`
}

// leadEnd is how a drive ended without this sidecar driving it.
type leadEnd struct {
	sum Summary
	err error
}

// takeLease takes the run's lease and reads the run under it. While
// another sidecar holds the lease, it relays that sidecar's events; when
// that drive ends, or this one cannot start, it returns no lease and how
// the drive ended.
func (e *Executor) takeLease(d *drive, req Request) (Lease, Run, *leadEnd) {
	followed := false
	for {
		lease, holder, err := e.acquire(d.ctx, req.RunID)
		if err != nil {
			return nil, Run{}, e.failedBeforeStart(d, req, "taking the run's lease: "+err.Error(), err)
		}
		if lease != nil {
			// Read the run again under the lease: another sidecar may have
			// driven it to its end since the first read (and released the
			// lease just before this one took it).
			run, err := e.up.Run(d.ctx, req.RunID)
			if err != nil {
				lease.Release()
				return nil, Run{}, e.failedBeforeStart(d, req, "reading the run: "+err.Error(), err)
			}
			return lease, run, nil
		}
		if !followed {
			e.obs.DriveAttached()
			e.log.Info("run driven by another sidecar: following it", "run_id", req.RunID, "holder", holder)
		}
		followed = true
		var final *Summary
		err = e.leases.Follow(d.ctx, req.RunID, func(b []byte) bool {
			var ev relayed
			if json.Unmarshal(b, &ev) != nil {
				return false
			}
			if ev.Type == EventDone && ev.Summary != nil {
				final = ev.Summary
				return true
			}
			ev.Event.Raw = ev.Raw
			d.emit(ev.Event)
			return false
		})
		switch {
		case final != nil:
			d.emit(Event{Type: EventDone, Turn: final.Turns, Summary: final})
			return nil, Run{}, &leadEnd{*final, summaryErr(*final)}
		case err != nil:
			sum := Summary{RunID: req.RunID, Upstream: e.up.Kind(), Status: StatusCancelled, Calls: []CallResult{}, Error: context.Cause(d.ctx).Error()}
			d.emit(Event{Type: EventDone, Summary: &sum})
			return nil, Run{}, &leadEnd{sum, nil}
		}
	}
}

// acquireFor bounds the retries of a lease that NATS could not grant (no
// JetStream leader for a moment, say, while a cluster node is replaced).
const acquireFor = 15 * time.Second

// acquire takes a run's lease, retrying while NATS fails to answer.
func (e *Executor) acquire(ctx context.Context, runID string) (Lease, string, error) {
	type acquired struct {
		lease  Lease
		holder string
	}
	got, err := backoff.Retry(ctx, func() (acquired, error) {
		lease, holder, err := e.leases.Acquire(ctx, runID)
		return acquired{lease, holder}, err
	}, backoff.WithBackOff(retry.Lease.New()),
		backoff.WithMaxElapsedTime(acquireFor),
		backoff.WithNotify(func(err error, _ time.Duration) {
			e.log.Warn("taking the run's lease failed; retrying", "run_id", runID, "err", err)
		}))
	return got.lease, got.holder, err
}

// runLeased runs the loop while the lease is held, publishing its events
// to followers; a lost lease stops the drive before its next turn.
func (e *Executor) runLeased(d *drive, req Request, run Run, lease Lease) (Summary, error) {
	defer lease.Release()
	req.leaseLost = lease.Lost()
	return e.run(d.ctx, req, run, func(ev Event) {
		d.emit(ev)
		if !lease.Followed() {
			return // nobody to tell: no encoding, no message
		}
		if b, err := json.Marshal(relayed{Event: ev, Raw: ev.Raw}); err == nil {
			lease.Publish(b)
		}
	})
}

// runFresh drives a fresh run (Request.Fresh) while its lease is taken:
// the first turn streams meanwhile, and the upstream's first write that
// lets another sidecar name the run waits for the lease (Request.Leased). Nobody
// can follow such a run, so its events are not published. A lease that
// could not be taken stops the drive before its next turn, as a lost one
// does.
func (e *Executor) runFresh(d *drive, req Request, run Run) (Summary, error) {
	p := &pendingLease{done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(p.done)
		lease, holder, err := e.acquire(d.ctx, req.RunID)
		if err == nil && lease == nil {
			err = fmt.Errorf("the fresh run %s is driven by sidecar %s", req.RunID, holder)
		}
		p.lease, p.err = lease, err
	})
	req.pending = p
	sum, err := e.run(d.ctx, req, run, d.emit)
	wg.Wait()
	if p.lease != nil {
		p.lease.Release()
	}
	return sum, err
}

// pendingLease is the lease of a fresh run, being taken; lease and err
// are set when done is closed.
type pendingLease struct {
	done  chan struct{}
	lease Lease
	err   error
}

// Leased waits until the drive of this request holds its run's lease,
// and returns why it could not be taken. Only a fresh run's lease is taken
// while the drive runs (Fresh): the executor hands the request, with the
// lease being taken, to Upstream.Turn, and an upstream calls Leased before
// the write that lets other sidecars name the run (openaiup's first
// journal record), so that they find it driven. For any other request it
// returns nil at once.
func (r Request) Leased(ctx context.Context) error {
	p := r.pending
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("executor: taking the run's lease: %w", p.err)
		}
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// leaseGone says why the drive may not go on under the run's lease, if it
// may not: the lease was lost, or a fresh run's could not be taken.
func (r Request) leaseGone() error {
	if leaseLost(r.leaseLost) {
		return ErrLeaseLost
	}
	if p := r.pending; p != nil {
		select {
		case <-p.done:
			if p.err != nil {
				return fmt.Errorf("executor: taking the run's lease: %w", p.err)
			}
			if leaseLost(p.lease.Lost()) {
				return ErrLeaseLost
			}
		default:
		}
	}
	return nil
}

// leaseLost reports a lost lease without blocking.
func leaseLost(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
