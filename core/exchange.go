package core

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// Exchanges with Core (every call but the completions stream) run on a
// bounded set of worker goroutines, at most as many as the connections
// they can use. A caller hears its answer through a callback, and the
// synchronous calls wait for that callback on a channel only: no caller's
// goroutine runs the HTTP client, whose deep frames would grow its stack
// to 16 KiB and keep it there while the call then waits for its worker. At
// thousands of calls in flight those stacks were most of the sidecar's
// memory (BENCHMARKS.md, "Core exchanges on workers of their own").

// exchange is one attempt of a request to Core, queued for a worker.
type exchange struct {
	k     *calling     // the request; its answered hears the attempt's error once, unless dropped by drop
	state atomic.Int32 // queued, taken or dropped
	stop  func() bool  // unregisters the end of the request's ctx, once a worker has it
}

const (
	queued int32 = iota
	taken
	dropped // its caller gave up while it was queued
)

// exchanges is the queue and its workers. Workers start as requests queue
// and return once the queue is empty, so an idle client holds none.
type exchanges struct {
	max int

	mu      sync.Mutex
	queue   []*exchange
	workers int
}

// newExchange is an attempt of k that, should its context end while the
// attempt is still queued, ends at once with the context's error: a
// caller whose budget is spent, or a retry whose exchange ran out of
// time, does not wait for a worker to reach its turn in the queue. The
// context is the caller's for a first attempt, and the exchange's, with
// its deadline, for a retry. A context that never ends (a processing
// mark's, thousands of which may queue at once) needs no watch.
func newExchange(k *calling) *exchange {
	x := &exchange{k: k, stop: neverEnds}
	ctx := k.parent
	if k.ctx != nil {
		ctx = k.ctx
	}
	if ctx.Done() == nil {
		return x
	}
	x.stop = context.AfterFunc(ctx, func() {
		if x.state.CompareAndSwap(queued, dropped) {
			k.answered(fmt.Errorf("core: %s %s: not sent: %w", k.method, k.path, ctx.Err()))
		}
	})
	return x
}

// neverEnds is the stop of an exchange whose context cannot end.
func neverEnds() bool { return false }

// drop withdraws x while it is queued, and reports whether it did.
func (x *exchange) drop() bool {
	return x.state.CompareAndSwap(queued, dropped)
}

// enqueue queues x and starts a worker if one is free.
func (c *Client) enqueue(x *exchange) {
	q := &c.exchanges
	q.mu.Lock()
	q.queue = append(q.queue, x)
	if q.workers < q.max {
		q.workers++
		go c.work()
	}
	q.mu.Unlock()
}

// queued counts the exchanges waiting for a worker (some may have been
// dropped by their callers and not yet skipped).
func (q *exchanges) queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}

// work runs queued exchanges until there are none.
func (c *Client) work() {
	q := &c.exchanges
	for {
		q.mu.Lock()
		if len(q.queue) == 0 {
			q.queue = nil // let the drained array go
			q.workers--
			q.mu.Unlock()
			return
		}
		x := q.queue[0]
		q.queue[0] = nil
		q.queue = q.queue[1:]
		q.mu.Unlock()
		if !x.state.CompareAndSwap(queued, taken) {
			continue
		}
		x.stop()
		k := x.k
		k.answered(c.once(k.sent(), k.method, k.path, k.endpoint, k.body, k.out))
	}
}
