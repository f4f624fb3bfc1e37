// Package batch joins a batch of calls as a whole. Each call runs on a
// goroutine of its own, added while the batch is open (as manifests stream
// in), and is joined by an errgroup. A call takes one of limit slots for
// the part of its work that must be bounded (its tool running), and takes
// its turn in the batch's order for the parts that must be ordered: the
// turn of call i comes only after call i-1's turn has ended. There are
// three such turns, one after the other (Arrive, InOrder, then
// ThenInOrder), so that a call's later ordered step may overlap the next
// call's earlier one. A failed
// call is a value of the caller's; Wait returns only the errors the calls
// return, after every call has ended.
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
	slots chan struct{}        // nil: no limit
	tail  [turns]chan struct{} // closed when the last added call's turns have ended
	n     int
}

// New opens a batch whose calls hold at most limit slots at a time
// (limit < 1: no limit).
func New(limit int) *Batch {
	b := &Batch{}
	for i := range b.tail {
		b.tail[i] = make(chan struct{})
		close(b.tail[i]) // the first call's turns have no predecessor
	}
	if limit > 0 {
		b.slots = make(chan struct{}, limit)
	}
	return b
}

// Place is one call's place in its batch: its index, its slot and its turn.
type Place struct {
	Index int
	b     *Batch
	prev  [turns]<-chan struct{} // the previous call's turns have ended
	turn  [turns]chan struct{}   // this call's turns have ended
	ended [turns]bool
}

// turns is the number of ordered turns of a call.
const turns = 3

// Go runs f on a goroutine of its own, at the next place of the batch.
// Calls to Go must not be concurrent with each other or with Wait. The
// place's turns end when f returns, if f has not taken them, so that a
// call that ends early never holds back the calls after it.
func (b *Batch) Go(f func(p *Place) error) {
	p := &Place{Index: b.n, b: b}
	for i := range turns {
		p.prev[i], p.turn[i] = b.tail[i], make(chan struct{})
	}
	b.n++
	b.tail = p.turn
	b.g.Go(func() error {
		defer p.endTurns(turns)
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

// Arrive waits until every earlier call's arrival turn has ended, runs f,
// and ends this call's arrival turn: f runs in the order the calls were
// added, before either of the turns below. It waits without a context:
// an earlier call's turn always ends, when its own ordered step does or
// when it returns.
func (p *Place) Arrive(f func()) { p.inTurn(0, f) }

// InOrder is Arrive for the next turn: f runs once this call's arrival
// turn and every earlier call's InOrder turn have ended.
func (p *Place) InOrder(f func()) { p.inTurn(1, f) }

// ThenInOrder is InOrder for the last turn, which follows the call's
// InOrder turn.
func (p *Place) ThenInOrder(f func()) { p.inTurn(2, f) }

// inTurn ends this call's earlier turns, then runs f in turn i.
func (p *Place) inTurn(i int, f func()) {
	p.endTurns(i)
	<-p.prev[i]
	defer p.endTurn(i)
	f()
}

// endTurns ends this call's turns before turn n, in order.
func (p *Place) endTurns(n int) {
	for i := range n {
		p.endTurn(i)
	}
}

// endTurn lets the next call take its turn i. The turns and the wrapper of
// Go all run on the call's goroutine, so no lock is needed.
func (p *Place) endTurn(i int) {
	if p.ended[i] {
		return
	}
	p.ended[i] = true
	// A turn skipped (the call ended without it) still ends after the
	// turns before it: the next call must not overtake them.
	<-p.prev[i]
	close(p.turn[i])
}
