// Package batch joins a batch of calls as a whole. Tasks are added while
// the batch is open (as manifests stream in) and run at once, at most
// limit at a time; their results are values, so one failure never cancels
// a sibling. Results are handed to the submit function strictly in index
// order and pipelined: result i is submitted as soon as results 0..i are
// all in. Wait returns only when every task has run and every result has
// been submitted.
//
// The package knows nothing of Core or NATS: it joins functions.
package batch

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sync/errgroup"
)

// Batch is one batch. Use it once: Go while open, then Wait.
type Batch[T any] struct {
	ctx    context.Context
	submit func(i int, v T) error
	group  errgroup.Group

	mu      sync.Mutex
	results []T
	ready   []chan struct{}
	closed  bool
	added   chan struct{} // signalled on Go and on close

	queue chan func() // tasks waiting for the group's limit
	owner sync.WaitGroup
	errs  []error
}

// New opens a batch whose tasks receive ctx and run at most limit at a
// time (limit < 1 means no limit). submit is called from a single goroutine,
// in index order; its errors are collected and returned by Wait, and the
// remaining results are still submitted.
func New[T any](ctx context.Context, limit int, submit func(i int, v T) error) *Batch[T] {
	b := &Batch[T]{ctx: ctx, submit: submit, added: make(chan struct{}, 1), queue: make(chan func(), 1024)}
	if limit > 0 {
		b.group.SetLimit(limit)
	}
	// feeder: the group's Go blocks at the limit; the caller adding tasks
	// (a stream reader) must not.
	b.owner.Go(func() {
		for task := range b.queue {
			b.group.Go(func() error { task(); return nil })
		}
	})
	b.owner.Go(b.submitInOrder)
	return b
}

// Go adds a task; it never blocks on the parallelism limit. It returns the
// task's index.
func (b *Batch[T]) Go(task func(ctx context.Context) T) int {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		panic("batch: Go after Wait")
	}
	i := len(b.results)
	var zero T
	b.results = append(b.results, zero)
	done := make(chan struct{})
	b.ready = append(b.ready, done)
	b.mu.Unlock()
	b.signal()
	b.enqueue(func() {
		v := task(b.ctx)
		b.mu.Lock()
		b.results[i] = v
		b.mu.Unlock()
		close(done)
	})
	return i
}

// enqueue hands a task to the feeder. The queue is large; when it is full
// the task runs on its own goroutine, still owned by the group.
func (b *Batch[T]) enqueue(task func()) {
	select {
	case b.queue <- task:
	default:
		b.owner.Go(func() { b.group.Go(func() error { task(); return nil }) })
	}
}

func (b *Batch[T]) signal() {
	select {
	case b.added <- struct{}{}:
	default:
	}
}

// Len is the number of tasks added so far.
func (b *Batch[T]) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.results)
}

// Wait closes the batch, waits for every task and submission, and returns
// the results in index order with the joined submission errors.
func (b *Batch[T]) Wait() ([]T, error) {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.signal()
	close(b.queue)
	b.owner.Wait()
	b.group.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.results, errors.Join(b.errs...)
}

// submitInOrder walks the indexes: it waits for task i to be added, then
// for its result, then submits it.
func (b *Batch[T]) submitInOrder() {
	for i := 0; ; i++ {
		var done chan struct{}
		for done == nil {
			b.mu.Lock()
			switch {
			case i < len(b.ready):
				done = b.ready[i]
			case b.closed:
				b.mu.Unlock()
				return
			}
			b.mu.Unlock()
			if done == nil {
				<-b.added
			}
		}
		<-done
		b.mu.Lock()
		v := b.results[i]
		b.mu.Unlock()
		if err := b.submit(i, v); err != nil {
			b.mu.Lock()
			b.errs = append(b.errs, fmt.Errorf("batch: submitting result %d: %w", i, err))
			b.mu.Unlock()
		}
	}
}
