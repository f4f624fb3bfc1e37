package batch

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestTurnsInIndexOrder: calls finish their work out of order, yet their
// ordered steps run in index order, and call 0's runs while call 2 still
// works. synctest.Wait makes "every goroutine is blocked" an exact point.
func TestTurnsInIndexOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := []chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
		var mu sync.Mutex
		var order []int
		b := New(0)
		for i := range 3 {
			b.Go(func(p *Place) error {
				<-release[i]
				p.InOrder(func() {
					mu.Lock()
					order = append(order, p.Index)
					mu.Unlock()
				})
				return nil
			})
		}
		close(release[1])
		synctest.Wait()
		mu.Lock()
		if len(order) != 0 {
			t.Errorf("ran %v before call 0's turn", order)
		}
		mu.Unlock()
		close(release[0])
		synctest.Wait() // call 2 still works: 0 and 1 did not wait for it
		mu.Lock()
		if got := slices.Clone(order); !slices.Equal(got, []int{0, 1}) {
			t.Errorf("while call 2 works, turns = %v, want [0 1]", got)
		}
		mu.Unlock()
		close(release[2])
		if err := b.Wait(); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(order, []int{0, 1, 2}) {
			t.Errorf("turns = %v", order)
		}
	})
}

// TestSkippedTurnKeepsOrder: a call that returns without taking its turn
// does not let the call after it overtake the call before it.
func TestSkippedTurnKeepsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		first := make(chan struct{})
		var mu sync.Mutex
		var order []int
		b := New(0)
		b.Go(func(p *Place) error {
			<-first
			p.InOrder(func() { mu.Lock(); order = append(order, 0); mu.Unlock() })
			return nil
		})
		b.Go(func(p *Place) error { return nil }) // ends at once, no turn taken
		b.Go(func(p *Place) error {
			p.InOrder(func() { mu.Lock(); order = append(order, 2); mu.Unlock() })
			return nil
		})
		synctest.Wait()
		mu.Lock()
		if len(order) != 0 {
			t.Errorf("call 2 took its turn before call 0: %v", order)
		}
		mu.Unlock()
		close(first)
		if err := b.Wait(); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(order, []int{0, 2}) {
			t.Errorf("turns = %v, want [0 2]", order)
		}
	})
}

// TestSlotsBoundTheWork: at most limit calls hold a slot at once, and a
// call waiting for its turn holds none, so a batch wider than its limit
// whose calls end in reverse order still finishes.
func TestSlotsBoundTheWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit, n = 2, 7
		var holding, most atomic.Int32
		gates := make([]chan struct{}, n)
		for i := range gates {
			gates[i] = make(chan struct{})
		}
		b := New(limit)
		for range n {
			b.Go(func(p *Place) error {
				release, err := p.Slot(context.Background())
				if err != nil {
					return err
				}
				h := holding.Add(1)
				for {
					m := most.Load()
					if h <= m || most.CompareAndSwap(m, h) {
						break
					}
				}
				<-gates[p.Index]
				holding.Add(-1)
				release()
				p.InOrder(func() {})
				return nil
			})
		}
		for i := n - 1; i >= 0; i-- {
			synctest.Wait()
			close(gates[i])
		}
		if err := b.Wait(); err != nil {
			t.Fatal(err)
		}
		if most.Load() != limit {
			t.Errorf("at most %d calls held a slot, want %d", most.Load(), limit)
		}
	})
}

// TestSlotEndsWithContext: a call waiting for a slot stops when its
// context ends, with the context's cause.
func TestSlotEndsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cause := errors.New("run cancelled")
		ctx, cancel := context.WithCancelCause(context.Background())
		hold := make(chan struct{})
		b := New(1)
		b.Go(func(p *Place) error {
			release, _ := p.Slot(ctx)
			<-hold
			release()
			return nil
		})
		synctest.Wait() // the first call holds the only slot
		var got error
		b.Go(func(p *Place) error {
			_, got = p.Slot(ctx)
			return nil
		})
		synctest.Wait()
		cancel(cause)
		synctest.Wait()
		close(hold)
		if err := b.Wait(); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(got, cause) {
			t.Errorf("Slot = %v, want the context's cause", got)
		}
	})
}

// TestWaitReturnsAnError: a call's error is Wait's, after every call ended.
func TestWaitReturnsAnError(t *testing.T) {
	boom := errors.New("boom")
	var ended atomic.Int32
	b := New(4)
	for i := range 5 {
		b.Go(func(p *Place) error {
			defer ended.Add(1)
			if i == 3 {
				return boom
			}
			return nil
		})
	}
	if err := b.Wait(); !errors.Is(err, boom) {
		t.Errorf("Wait = %v, want boom", err)
	}
	if ended.Load() != 5 || b.Len() != 5 {
		t.Errorf("ended %d of %d calls", ended.Load(), b.Len())
	}
}

// TestSecondTurnOverlapsTheNextFirst: call 0's second ordered step may
// run while call 1 takes its first; call 1's second waits for call 0's.
func TestSecondTurnOverlapsTheNextFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		var mu sync.Mutex
		var order []string
		note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
		b := New(0)
		b.Go(func(p *Place) error {
			p.InOrder(func() { note("0 first") })
			p.ThenInOrder(func() { <-hold; note("0 second") })
			return nil
		})
		b.Go(func(p *Place) error {
			p.InOrder(func() { note("1 first") })
			p.ThenInOrder(func() { note("1 second") })
			return nil
		})
		synctest.Wait() // call 0 holds its second turn
		mu.Lock()
		if got := slices.Clone(order); !slices.Equal(got, []string{"0 first", "1 first"}) {
			t.Errorf("while call 0's second step runs: %v, want [0 first 1 first]", got)
		}
		mu.Unlock()
		close(hold)
		if err := b.Wait(); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(order, []string{"0 first", "1 first", "0 second", "1 second"}) {
			t.Errorf("steps %v", order)
		}
	})
}

// TestArriveBeforeInOrder: the arrival turns run in index order, and a
// call's InOrder turn waits for no later call's arrival; a call still in
// its arrival turn holds back the arrivals after it, not the work of the
// calls before it.
func TestArriveBeforeInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		var mu sync.Mutex
		var log []string
		note := func(s string) { mu.Lock(); log = append(log, s); mu.Unlock() }
		b := New(0)
		for i := range 3 {
			b.Go(func(p *Place) error {
				p.Arrive(func() {
					if i == 1 {
						<-hold
					}
					note("arrive" + string(rune('0'+i)))
				})
				p.InOrder(func() { note("order" + string(rune('0'+i))) })
				return nil
			})
		}
		synctest.Wait()
		mu.Lock()
		if got := slices.Clone(log); !slices.Equal(got, []string{"arrive0", "order0"}) {
			t.Errorf("while call 1 arrives: %v, want call 0 through and call 2 waiting", got)
		}
		mu.Unlock()
		close(hold)
		if err := b.Wait(); err != nil {
			t.Fatal(err)
		}
		if want := []string{"arrive0", "order0", "arrive1", "order1", "arrive2", "order2"}; !slices.Equal(log, want) &&
			!slices.Equal(log, []string{"arrive0", "order0", "arrive1", "arrive2", "order1", "order2"}) {
			t.Errorf("log %v", log)
		}
	})
}
