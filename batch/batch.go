// Package batch joins a batch of calls as a whole. Tasks are added while
// the batch is open (as manifests stream in) and run at once, at most
// limit at a time (queued in order beyond it); their results are values,
// so one failure never cancels a sibling. Results are handed to the submit
// function strictly in index order, one at a time, and pipelined: result i
// is submitted as soon as results 0..i are all in and result i-1 is
// submitted, by the goroutine that completed that prefix (a task's, or
// the callback of the submission before), so a batch keeps no goroutine
// of its own while its calls or its submissions wait. Wait returns only
// when every task has run and every result has been submitted.
//
// The package knows nothing of Core or NATS: it joins functions.
package batch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"
)

// Batch is one batch. Use it once: Go while open, then Close and wait on
// Done, or just Wait.
type Batch[T any] struct {
	ctx    context.Context
	submit func(i int, v T, done func(error))
	group  errgroup.Group // the goroutines that start tasks
	tasks  sync.WaitGroup // tasks holding a slot, until their result is handed to submit

	mu       sync.Mutex
	results  []T
	closed   bool
	queue    []func()         // tasks waiting for a slot under the limit
	finished []bool           // by index: the task has run
	after    map[int][]func() // tasks waiting for the task at an index
	running  int              // tasks holding a slot, at most limit
	limit    int
	errs     []error

	next       int  // the index submitted next
	submitting bool // a goroutine is in the submit loop, or a submission is on its way
	calling    bool // the submit loop is inside submit
	doneInline bool // the submission reported before submit returned
	doneClosed bool
	done       chan struct{} // closed when the batch is closed and every result is submitted
}

// New opens a batch whose tasks receive ctx and run at most limit at a
// time (limit < 1 means no limit). submit is called in index order and
// never concurrently, on the goroutine of a task that has just finished
// (a submission is part of its task's slot); its errors are collected and
// returned by Wait, and the remaining results are still submitted.
func New[T any](ctx context.Context, limit int, submit func(i int, v T) error) *Batch[T] {
	return NewThen(ctx, limit, func(i int, v T, done func(error)) { done(submit(i, v)) })
}

// NewThen is New for a submit function that reports through done, exactly
// once, from any goroutine, before or after it returns: a submission that
// waits for a callback holds no goroutine, and the next result is
// submitted from that callback. A task's slot is handed on once submit
// has returned, not once it has reported: submissions are one at a time
// anyway, and need no slot to bound them.
func NewThen[T any](ctx context.Context, limit int, submit func(i int, v T, done func(error))) *Batch[T] {
	return &Batch[T]{ctx: ctx, submit: submit, limit: limit, done: make(chan struct{})}
}

// Go adds a task; it never blocks on the parallelism limit. It returns the
// task's index.
func (b *Batch[T]) Go(task func(ctx context.Context) T) int {
	return b.GoAfter(-1, task)
}

// GoAfter adds a task that starts only once task prev (an index Go or
// GoAfter returned) has finished, so that tasks can run in sequence inside
// a parallel batch; prev < 0 means no predecessor. A task waiting for its
// predecessor holds no slot of the limit. Its result is still submitted at
// its own index.
func (b *Batch[T]) GoAfter(prev int, task func(ctx context.Context) T) int {
	return b.StartAfter(prev, func(ctx context.Context, done func(T)) { done(task(ctx)) })
}

// StartAfter is GoAfter for a task that reports its result through done,
// exactly once, from any goroutine, before or after it returns: a task
// that waits for a callback holds a slot of the limit but no goroutine.
func (b *Batch[T]) StartAfter(prev int, task func(ctx context.Context, done func(T))) int {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		panic("batch: Go after Close")
	}
	i := len(b.results)
	var zero T
	b.results = append(b.results, zero)
	b.finished = append(b.finished, false)
	start := func() {
		var once atomic.Bool
		task(b.ctx, func(v T) {
			if !once.CompareAndSwap(false, true) {
				panic(fmt.Sprintf("batch: task %d reported twice", i))
			}
			b.finish(i, v)
		})
	}
	if prev >= 0 && prev < i && !b.finished[prev] {
		if b.after == nil {
			b.after = map[int][]func(){}
		}
		b.after[prev] = append(b.after[prev], start)
		b.mu.Unlock()
		return i
	}
	b.mu.Unlock()
	b.launch(start)
	return i
}

// launch starts a task under the limit, or queues it.
func (b *Batch[T]) launch(start func()) {
	// At the limit the task waits in the queue, and a finishing task hands
	// its slot on: no goroutine exists only to feed others, and the caller
	// (a stream reader) never blocks. The count is kept here, under the
	// same lock as the queue, so that no task is queued in a gap between
	// a slot's release and its count.
	b.mu.Lock()
	run := b.limit < 1 || b.running < b.limit
	if run {
		b.running++
		b.tasks.Add(1)
	} else {
		b.queue = append(b.queue, start)
	}
	b.mu.Unlock()
	if run {
		b.group.Go(func() error { start(); return nil })
	}
}

// finish records task i's result, starts the tasks that waited for it,
// submits what is ready, and hands the task's slot to the next task queued.
func (b *Batch[T]) finish(i int, v T) {
	defer b.tasks.Done()
	b.mu.Lock()
	b.results[i] = v
	b.finished[i] = true
	next := b.after[i]
	delete(b.after, i)
	b.mu.Unlock()
	for _, n := range next {
		b.launch(n)
	}
	b.submitReady()
	b.mu.Lock()
	var start func()
	if len(b.queue) > 0 {
		start, b.queue = b.queue[0], b.queue[1:]
		b.tasks.Add(1)
	} else {
		b.running--
	}
	b.mu.Unlock()
	if start != nil {
		b.group.Go(func() error { start(); return nil })
	}
}

// Len is the number of tasks added so far.
func (b *Batch[T]) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.results)
}

// Close ends intake: no task may be added after it.
func (b *Batch[T]) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.closeDoneLocked()
}

// Done is closed once the batch is closed and every result is submitted.
func (b *Batch[T]) Done() <-chan struct{} { return b.done }

// Wait closes the batch, waits for every task and submission, and returns
// the results in index order with the joined submission errors.
func (b *Batch[T]) Wait() ([]T, error) {
	b.Close()
	<-b.done
	b.tasks.Wait()
	b.group.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.results, errors.Join(b.errs...)
}

// submitReady submits the results that are in, from the next index on,
// in order. One submit loop runs at a time; a result that comes in
// meanwhile is seen by the loop's next check, which is made under the lock
// the finishing task took to record it.
func (b *Batch[T]) submitReady() {
	b.mu.Lock()
	if b.submitting {
		b.mu.Unlock()
		return
	}
	b.submitting = true
	b.pump()
}

// pump is the submit loop. It submits ready results until one is still on
// its way (its callback goes on with the loop) or none is ready. A
// submission that reports before submit returns is a trampoline's bounce:
// the loop goes on here, so a batch of quick submissions does not recurse.
// The caller holds b.mu and has set submitting; pump releases b.mu.
func (b *Batch[T]) pump() {
	for b.next < len(b.results) && b.finished[b.next] {
		i, v := b.next, b.results[b.next]
		b.calling, b.doneInline = true, false
		b.mu.Unlock()
		var once atomic.Bool
		b.submit(i, v, func(err error) {
			if !once.CompareAndSwap(false, true) {
				panic(fmt.Sprintf("batch: result %d reported submitted twice", i))
			}
			b.submitted(i, err)
		})
		b.mu.Lock()
		b.calling = false
		if !b.doneInline {
			b.mu.Unlock() // on its way: its callback goes on with the loop
			return
		}
	}
	b.submitting = false
	b.closeDoneLocked()
	b.mu.Unlock()
}

// submitted records that result i was submitted, and goes on with the
// submit loop unless the loop is still inside submit.
func (b *Batch[T]) submitted(i int, err error) {
	b.mu.Lock()
	if err != nil {
		b.errs = append(b.errs, fmt.Errorf("batch: submitting result %d: %w", i, err))
	}
	b.next++
	if b.calling {
		b.doneInline = true
		b.mu.Unlock()
		return
	}
	b.pump()
}

// closeDoneLocked closes done once the batch is closed and every result
// is submitted. The caller holds b.mu.
func (b *Batch[T]) closeDoneLocked() {
	if b.closed && !b.submitting && b.next == len(b.results) && !b.doneClosed {
		b.doneClosed = true
		close(b.done)
	}
}
