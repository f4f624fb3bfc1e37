// Package batch joins a batch of calls as a whole. Each call runs on a
// goroutine of its own, added while the batch is open (as manifests stream
// in), and is joined by an errgroup. A call takes one of limit slots for
// the part of its work that must be bounded (its tool running), and takes
// its turn in the batch's order for the part that must be ordered (its
// output's post): the turn of call i comes only after call i-1's turn has
// ended. A failed call is a value of the caller's; Wait returns only the
// errors the calls return, after every call has ended.
//
// The package knows nothing of Core or NATS: it joins functions.
package batch

import (
	"context"

	"golang.org/x/sync/errgroup"
)

// Batch is one batch. Go adds calls from one goroutine; Wait joins them.
type Batch struct {
	g     errgroup.Group
	slots chan struct{} // nil: no limit
	tail  chan struct{} // closed when the last added call's turn has ended
	n     int
}

// New opens a batch whose calls hold at most limit slots at a time
// (limit < 1: no limit).
func New(limit int) *Batch {
	b := &Batch{tail: make(chan struct{})}
	close(b.tail) // the first call's turn has no predecessor
	if limit > 0 {
		b.slots = make(chan struct{}, limit)
	}
	return b
}

// Place is one call's place in its batch: its index, its slot and its turn.
type Place struct {
	Index int
	b     *Batch
	prev  <-chan struct{} // the previous call's turn has ended
	turn  chan struct{}   // this call's turn has ended
	ended bool
}

// Go runs f on a goroutine of its own, at the next place of the batch.
// Calls to Go must not be concurrent with each other or with Wait. The
// place's turn ends when f returns, if f has not taken it, so that a call
// that ends early never holds back the calls after it.
func (b *Batch) Go(f func(p *Place) error) {
	p := &Place{Index: b.n, b: b, prev: b.tail, turn: make(chan struct{})}
	b.n++
	b.tail = p.turn
	b.g.Go(func() error {
		defer p.endTurn()
		return f(p)
	})
}

// Len is the number of calls added.
func (b *Batch) Len() int { return b.n }

// Wait waits for every call and returns the first error one returned.
func (b *Batch) Wait() error { return b.g.Wait() }

// Slot waits for a free slot, or for ctx to end (then it returns ctx's
// cause). release gives the slot back; it must be called once, before
// the call waits for its turn, so that a slot holder never waits for
// another call.
func (p *Place) Slot(ctx context.Context) (release func(), err error) {
	if p.b.slots == nil {
		return func() {}, nil
	}
	select {
	case p.b.slots <- struct{}{}:
		return func() { <-p.b.slots }, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// InOrder waits until every earlier call's turn has ended, runs f, and
// ends this call's turn. It waits without a context: an earlier call's
// turn always ends, when its own ordered step does or when it returns.
func (p *Place) InOrder(f func()) {
	<-p.prev
	defer p.endTurn()
	f()
}

// endTurn lets the next call take its turn. InOrder's f and the wrapper of
// Go both run on the call's goroutine, so no lock is needed.
func (p *Place) endTurn() {
	if p.ended {
		return
	}
	p.ended = true
	// A turn skipped (the call ended without InOrder) still ends after
	// the turns before it: the next call must not overtake them.
	<-p.prev
	close(p.turn)
}
