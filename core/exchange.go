package core

import (
	"context"
	"sync"
	"sync/atomic"
)

// Exchanges with Core (every call but the completions stream) run on a
// bounded set of worker goroutines, at most as many as the connections
// they can use. A caller waits for its answer on a channel only: its own
// goroutine never runs the HTTP client, whose deep frames would grow its
// stack to 16 KiB and keep it there while the call then waits for its
// worker. At thousands of calls in flight those stacks were most of the
// sidecar's memory (BENCHMARKS.md, "Core exchanges on workers of their
// own").

// exchange is one request to Core, queued for a worker.
type exchange struct {
	ctx                    context.Context
	method, path, endpoint string
	body                   []byte
	out                    any
	state                  atomic.Int32 // queued, taken or dropped
	done                   chan error   // buffered: a worker never blocks on it
	then                   func(error)  // instead of done, for a caller that does not wait
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

// do runs one exchange on a worker and returns its error. A caller whose
// ctx ends while its request is still queued returns at once; one already
// taken waits for the worker, whose request ends with ctx.
func (c *Client) do(ctx context.Context, method, path, endpoint string, body []byte, out any) error {
	x := &exchange{ctx: ctx, method: method, path: path, endpoint: endpoint, body: body, out: out, done: make(chan error, 1)}
	c.enqueue(x)
	select {
	case err := <-x.done:
		return err
	case <-ctx.Done():
		if x.state.CompareAndSwap(queued, dropped) {
			return ctx.Err()
		}
		return <-x.done
	}
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
		err := c.once(x.ctx, x.method, x.path, x.endpoint, x.body, x.out)
		if x.then != nil {
			x.then(err)
		} else {
			x.done <- err
		}
	}
}
