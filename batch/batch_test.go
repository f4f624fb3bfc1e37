package batch

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestOrderAndPipelining: tasks finish out of order, yet submissions go
// out in index order; and results 0 and 1 are submitted while task 2 still
// runs. synctest.Wait makes "every goroutine is blocked" an exact point.
func TestOrderAndPipelining(t *testing.T) { synctest.Test(t, testOrderAndPipelining) }

func testOrderAndPipelining(t *testing.T) {
	release := []chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
	var mu sync.Mutex
	var submitted []int
	firstSubmitted := make(chan struct{})
	b := New(context.Background(), 0, func(i int, v string) error {
		mu.Lock()
		submitted = append(submitted, i)
		mu.Unlock()
		if v != fmt.Sprint("r", i) {
			t.Errorf("result %d = %q", i, v)
		}
		if i == 0 {
			close(firstSubmitted)
		}
		return nil
	})
	for i := range 3 {
		b.Go(func(ctx context.Context) string {
			<-release[i]
			return fmt.Sprint("r", i)
		})
	}
	close(release[1])
	synctest.Wait() // task 1 is done; its result waits for result 0
	mu.Lock()
	if len(submitted) != 0 {
		t.Errorf("submitted %v before result 0 was in", submitted)
	}
	mu.Unlock()
	close(release[0])
	<-firstSubmitted
	synctest.Wait() // task 2 has not finished: submission is pipelined
	mu.Lock()
	got := slices.Clone(submitted)
	mu.Unlock()
	if !slices.Equal(got, []int{0, 1}) {
		t.Errorf("submitted before task 2 finished: %v, want [0 1]", got)
	}
	close(release[2])
	res, err := b.Wait()
	if err != nil || !slices.Equal(res, []string{"r0", "r1", "r2"}) || !slices.Equal(submitted, []int{0, 1, 2}) {
		t.Fatalf("results %v submitted %v err %v", res, submitted, err)
	}
}

// TestLimit runs in a synctest bubble: the tasks' sleeps pass on the
// bubble's clock, so they overlap exactly and the peak is exact.
func TestLimit(t *testing.T) { synctest.Test(t, testLimit) }

func testLimit(t *testing.T) {
	for _, limit := range []int{1, 3, 8} {
		var cur, peak atomic.Int32
		b := New(context.Background(), limit, func(int, int) error { return nil })
		for range 8 {
			b.Go(func(ctx context.Context) int {
				n := cur.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(100 * time.Millisecond)
				cur.Add(-1)
				return 0
			})
		}
		b.Wait()
		if int(peak.Load()) != limit {
			t.Errorf("limit %d: peak %d", limit, peak.Load())
		}
	}
}

// TestManySmallTasks: tasks that finish while others are being added never
// strand a queued task (the slot handover is under one lock), and their
// results, submitted from whichever task completes the prefix, go out one
// at a time and in order.
func TestManySmallTasks(t *testing.T) {
	for _, limit := range []int{0, 1, 2, 3} {
		var sum atomic.Int64
		var inSubmit atomic.Int32
		next := 0 // only touched inside submit, which must never overlap itself
		b := New(context.Background(), limit, func(i int, v int) error {
			if inSubmit.Add(1) != 1 {
				t.Errorf("limit %d: submit %d runs beside another", limit, i)
			}
			defer inSubmit.Add(-1)
			if i != next {
				t.Errorf("limit %d: submitted %d, want %d", limit, i, next)
			}
			next = i + 1
			sum.Add(int64(v))
			return nil
		})
		for i := range 2000 {
			b.Go(func(context.Context) int { return i })
		}
		res, err := b.Wait()
		if err != nil || len(res) != 2000 || sum.Load() != 1999*2000/2 {
			t.Fatalf("limit %d: %d results, sum %d, %v", limit, len(res), sum.Load(), err)
		}
	}
}

// TestNoGoroutineOfItsOwn: an open batch holds no goroutine besides its
// running tasks, so a run waiting on its calls costs only their goroutines.
func TestNoGoroutineOfItsOwn(t *testing.T) {
	before := goleak.IgnoreCurrent()
	b := New(context.Background(), 4, func(int, int) error { return nil })
	if err := goleak.Find(before); err != nil {
		t.Errorf("an empty open batch keeps a goroutine: %v", err)
	}
	release := make(chan struct{})
	b.Go(func(context.Context) int { <-release; return 1 })
	close(release)
	if res, err := b.Wait(); err != nil || !slices.Equal(res, []int{1}) {
		t.Fatalf("%v %v", res, err)
	}
}

// TestSubmitErrorsKeepGoing: a failed submission is reported, and the
// results after it are still submitted.
func TestSubmitErrorsKeepGoing(t *testing.T) {
	var submitted atomic.Int32
	boom := errors.New("core 500")
	b := New(context.Background(), 2, func(i int, v int) error {
		submitted.Add(1)
		if i == 1 {
			return boom
		}
		return nil
	})
	for i := range 4 {
		b.Go(func(context.Context) int { return i })
	}
	_, err := b.Wait()
	if !errors.Is(err, boom) || submitted.Load() != 4 {
		t.Fatalf("err %v, submitted %d", err, submitted.Load())
	}
}

func TestEmptyBatchAndContext(t *testing.T) {
	b := New(context.Background(), 4, func(int, int) error { t.Error("nothing to submit"); return nil })
	if res, err := b.Wait(); len(res) != 0 || err != nil {
		t.Fatalf("%v %v", res, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b2 := New(ctx, 1, func(int, error) error { return nil })
	b2.Go(func(ctx context.Context) error { return ctx.Err() })
	if b2.Len() != 1 {
		t.Error("Len")
	}
	res, _ := b2.Wait()
	if !errors.Is(res[0], context.Canceled) {
		t.Errorf("task did not see the batch context: %v", res[0])
	}
	select {
	case <-b2.Done():
	default:
		t.Error("Done not closed after Wait")
	}
	defer func() {
		if recover() == nil {
			t.Error("Go after Wait did not panic")
		}
	}()
	b2.Go(func(context.Context) error { return nil })
}

// Example shows a batch whose tasks finish out of order and whose results
// are still submitted in call order.
func Example() {
	b := New(context.Background(), 16, func(i int, v string) error {
		fmt.Println("submit", i, v)
		return nil
	})
	for i, d := range []time.Duration{30, 10, 20} {
		b.Go(func(ctx context.Context) string {
			time.Sleep(d * time.Millisecond)
			return fmt.Sprint("call ", i)
		})
	}
	b.Wait()
	// Output:
	// submit 0 call 0
	// submit 1 call 1
	// submit 2 call 2
}

// TestGoAfter: a task added with GoAfter starts only once its predecessor
// has finished, and holds no slot while it waits: with a limit of 2, task 0
// running and task 1 waiting for it, task 2 (independent) still runs.
// Results are submitted in index order. In a synctest bubble, "started" is
// exact.
func TestGoAfter(t *testing.T) { synctest.Test(t, testGoAfter) }

func testGoAfter(t *testing.T) {
	var started [4]atomic.Bool
	release0, release2 := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var submitted []int
	b := New(context.Background(), 2, func(i int, v int) error {
		mu.Lock()
		submitted = append(submitted, v)
		mu.Unlock()
		return nil
	})
	task := func(i int, release chan struct{}) func(context.Context) int {
		return func(context.Context) int {
			started[i].Store(true)
			if release != nil {
				<-release
			}
			return i
		}
	}
	b.Go(task(0, release0))
	b.GoAfter(0, task(1, nil))
	b.Go(task(2, release2))
	b.GoAfter(1, task(3, nil)) // a chain: 0, 1, 3
	synctest.Wait()
	if !started[0].Load() || started[1].Load() || !started[2].Load() || started[3].Load() {
		t.Fatalf("started %v %v %v %v: want 0 and 2 running, 1 and 3 waiting for their predecessor", started[0].Load(), started[1].Load(),
			started[2].Load(), started[3].Load())
	}
	close(release0)
	synctest.Wait()
	if !started[1].Load() || !started[3].Load() {
		t.Fatal("the chain did not run once task 0 finished")
	}
	close(release2)
	if _, err := b.Wait(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(submitted, []int{0, 1, 2, 3}) {
		t.Errorf("submitted %v, want index order", submitted)
	}
}

// TestStartHoldsSlotNotGoroutine: a task that reports through a callback
// holds its slot of the limit until it reports, but no goroutine while it
// waits; the callback may come from any goroutine, and only once.
func TestStartHoldsSlotNotGoroutine(t *testing.T) { synctest.Test(t, testStartHoldsSlot) }

func testStartHoldsSlot(t *testing.T) {
	var mu sync.Mutex
	var started []int
	dones := map[int]func(int){}
	b := New(context.Background(), 2, func(int, int) error { return nil })
	for i := range 5 {
		b.StartAfter(-1, func(_ context.Context, done func(int)) {
			mu.Lock()
			started = append(started, i)
			dones[i] = done
			mu.Unlock()
		})
	}
	startedNow := func() []int {
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		return slices.Sorted(slices.Values(started))
	}
	if got := startedNow(); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("started %v, want [0 1]: the limit is 2", got)
	}
	buf := make([]byte, 1<<16)
	if st := string(buf[:runtime.Stack(buf, true)]); strings.Contains(st, "batch.(*Batch") {
		t.Errorf("a goroutine holds a waiting task:\n%s", st)
	}
	report := func(i int) {
		mu.Lock()
		done := dones[i]
		mu.Unlock()
		go done(i * 10) // a callback's own goroutine
	}
	report(1)
	if got := startedNow(); !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("started %v after task 1 reported, want [0 1 2]", got)
	}
	for _, i := range []int{0, 2, 3, 4} {
		report(i)
		startedNow()
	}
	res, err := b.Wait()
	if err != nil || !slices.Equal(res, []int{0, 10, 20, 30, 40}) {
		t.Fatalf("results %v, %v", res, err)
	}
	defer func() {
		if recover() == nil {
			t.Error("a task reported twice without a panic")
		}
	}()
	dones[0](1)
}

// TestSubmitThen: a submission that reports later holds no goroutine,
// the next one starts only from its callback (one at a time, in index
// order), an error is collected while the rest are still submitted, and
// a second report panics.
func TestSubmitThen(t *testing.T) { synctest.Test(t, testSubmitThen) }

func testSubmitThen(t *testing.T) {
	var mu sync.Mutex
	var order []int
	dones := map[int]func(error){}
	b := NewThen(context.Background(), 0, func(i int, v int, done func(error)) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, i)
		dones[i] = done
	})
	for i := range 4 {
		b.Go(func(context.Context) int { return i })
	}
	b.Close()
	submittedNow := func() []int {
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(order)
	}
	if got := submittedNow(); !slices.Equal(got, []int{0}) {
		t.Fatalf("submissions started %v, want [0]: one at a time", got)
	}
	buf := make([]byte, 1<<16)
	if st := string(buf[:runtime.Stack(buf, true)]); strings.Contains(st, "batch.(*Batch") {
		t.Errorf("a goroutine holds the waiting submission:\n%s", st)
	}
	report := func(i int, err error) {
		mu.Lock()
		done := dones[i]
		mu.Unlock()
		go done(err)
	}
	boom := errors.New("core 500")
	for i := range 4 {
		var err error
		if i == 2 {
			err = boom
		}
		report(i, err)
		want := min(i+2, 4)
		if got := submittedNow(); len(got) != want {
			t.Fatalf("after result %d reported, submissions started %v, want %d of them", i, got, want)
		}
		select {
		case <-b.Done():
			if i < 3 {
				t.Fatalf("done after result %d of 4", i)
			}
		default:
			if i == 3 {
				t.Fatal("not done after every result reported")
			}
		}
	}
	res, err := b.Wait()
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "result 2") || !slices.Equal(res, []int{0, 1, 2, 3}) || !slices.Equal(order, []int{0, 1, 2, 3}) {
		t.Fatalf("results %v, order %v, err %v", res, order, err)
	}
	defer func() {
		if recover() == nil {
			t.Error("a submission reported twice without a panic")
		}
	}()
	dones[1](nil)
}

// TestSubmitThenInlineDoesNotRecurse: 2,000 results ready at once, each
// submission reporting before it returns: the loop goes on in place, so
// the stack stays as deep as for the first.
func TestSubmitThenInlineDoesNotRecurse(t *testing.T) {
	var depth []int
	b := NewThen(context.Background(), 0, func(i int, v int, done func(error)) {
		depth = append(depth, runtime.Callers(0, make([]uintptr, 4096)))
		done(nil)
	})
	var first func(int)
	b.StartAfter(-1, func(_ context.Context, done func(int)) { first = done })
	for i := 1; i < 2000; i++ {
		b.Go(func(context.Context) int { return i })
	}
	for ready := 0; ready < 1999; { // every other task has run: the loop runs here
		time.Sleep(time.Millisecond)
		b.mu.Lock()
		ready = 0
		for _, f := range b.finished {
			if f {
				ready++
			}
		}
		b.mu.Unlock()
	}
	first(0) // completes the prefix: every result is submitted from here
	if _, err := b.Wait(); err != nil {
		t.Fatal(err)
	}
	if len(depth) != 2000 || slices.Max(depth) != depth[0] {
		t.Errorf("%d submissions, stack depth from %d to %d: want 2000, all as deep as the first", len(depth), depth[0], slices.Max(depth))
	}
}
