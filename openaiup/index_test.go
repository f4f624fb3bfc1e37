package openaiup

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/executor"
)

// indexed reads the runs the index of digest lists, and its revision.
func indexed(t *testing.T, j Journal, digest string) ([]string, uint64) {
	t.Helper()
	var ix runIndex
	rev, _, err := getJSON(context.Background(), j, indexKey(digest), &ix)
	if err != nil {
		t.Fatal(err)
	}
	return ix.Runs, rev
}

// The index of a request lists its runs newest last, keeps the newest
// maxIndexed, and loses a run only when it is removed; removing a run it
// does not list writes nothing.
func TestRunIndex(t *testing.T) {
	ctx := context.Background()
	j := NewMemoryJournal(time.Minute, 1<<20)
	var want []string
	for i := range maxIndexed + 2 {
		id := fmt.Sprintf("chatcmpl-%d", i)
		if err := index(ctx, j, "d", id); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	want = want[2:]
	if got, _ := indexed(t, j, "d"); !slices.Equal(got, want) {
		t.Fatalf("index %v, want the newest %d: %v", got, maxIndexed, want)
	}
	if err := unindex(ctx, j, "d", "chatcmpl-5"); err != nil {
		t.Fatal(err)
	}
	want = slices.DeleteFunc(want, func(id string) bool { return id == "chatcmpl-5" })
	got, rev := indexed(t, j, "d")
	if !slices.Equal(got, want) {
		t.Fatalf("index %v after removing chatcmpl-5, want %v", got, want)
	}
	for _, id := range []string{"chatcmpl-5", "chatcmpl-0"} {
		if err := unindex(ctx, j, "d", id); err != nil {
			t.Fatal(err)
		}
	}
	if _, after := indexed(t, j, "d"); after != rev {
		t.Fatalf("removing runs the index does not list rewrote it (revision %d, then %d)", rev, after)
	}
	if err := unindex(ctx, j, "other", "chatcmpl-1"); err != nil {
		t.Fatal(err)
	}
	if got, rev := indexed(t, j, "other"); got != nil || rev != 0 {
		t.Fatalf("removing a run from an absent index wrote %v", got)
	}
}

// A run without the application's key leaves its request's index when its
// end is journaled; the other runs of the request stay in it.
func TestEndedRunLeavesItsIndex(t *testing.T) {
	ctx := context.Background()
	j := NewMemoryJournal(time.Minute, 1<<20)
	u, err := New(Config{URL: "http://127.0.0.1:1", Journal: j, RetryBudget: time.Second, IdleTimeout: time.Second, MaxResponseBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	key := runKey{digest: "d"}
	var runs []*run
	for i := range 2 {
		r := u.Begin(runRef{id: fmt.Sprintf("chatcmpl-%d", i), fresh: true}, &request{key: key}, nil)
		if err := u.journalTurn(ctx, r, 1, turnRecord{Calls: []journaledCall{{ActionID: "a", ToolCallID: "call_1", Tool: "echo"}}}); err != nil {
			t.Fatal(err)
		}
		runs = append(runs, r)
	}
	if got, _ := indexed(t, j, "d"); !slices.Equal(got, []string{"chatcmpl-0", "chatcmpl-1"}) {
		t.Fatalf("index %v, want both runs", got)
	}
	u.journalEnd(ctx, runs[0], executor.Summary{Status: executor.StatusCompleted})
	if got, _ := indexed(t, j, "d"); !slices.Equal(got, []string{"chatcmpl-1"}) {
		t.Fatalf("index %v after the first run ended, want only the second", got)
	}
	if end, _, _ := j.Get(ctx, endKey("chatcmpl-0")); end == nil {
		t.Fatal("the ended run has no end record")
	}
}

// gatedJournal holds the Put of one key until gate is closed, and lists
// the keys in the order they were written.
type gatedJournal struct {
	Journal
	key  string
	gate chan struct{}

	mu      sync.Mutex
	written []string
}

func (g *gatedJournal) Put(ctx context.Context, key string, value []byte) error {
	if key == g.key {
		<-g.gate
	}
	err := g.Journal.Put(ctx, key, value)
	g.mu.Lock()
	g.written = append(g.written, key)
	g.mu.Unlock()
	return err
}

func (g *gatedJournal) order() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.written)
}

// A run without the application's key answers without waiting for its
// last turn's record, still being written; its end is journaled after that
// record, which carries the turn before's outputs (no record of their own).
func TestKeylessAnswerLeavesItsRecordsForLater(t *testing.T) {
	ctx := context.Background()
	j := &gatedJournal{Journal: NewMemoryJournal(time.Minute, 1<<20), key: turnKey("chatcmpl-1", 2), gate: make(chan struct{})}
	u, err := New(Config{URL: "http://127.0.0.1:1", Journal: j, RetryBudget: time.Second, IdleTimeout: time.Second, MaxResponseBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	r := u.Begin(runRef{id: "chatcmpl-1", fresh: true}, &request{key: runKey{digest: "d"}}, nil)
	if err := u.journalTurn(ctx, r, 1, turnRecord{Calls: []journaledCall{{ActionID: "act_1", ToolCallID: "call_1", Tool: "echo"}}}); err != nil {
		t.Fatal(err)
	}
	// Turn 2, the answer, is being written (as turn.end begins it), with
	// turn 1's output riding on it.
	p := newPendingTurn()
	p.written = make(chan struct{})
	r.mu.Lock()
	r.local, r.turn, r.pending = true, 2, p
	r.prev = &turnOutputs{n: 1, outs: map[string]string{"act_1": `{"echo":1}`}}
	r.mu.Unlock()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer func() {
		select {
		case <-j.gate:
		default:
			close(j.gate) // a failed test does not leave the write blocked
		}
	}()
	wg.Go(func() {
		defer close(p.written)
		if err := u.journalTurn(ctx, r, 2, turnRecord{Content: "answer"}); err != nil {
			t.Error(err)
		}
	})
	ended := make(chan struct{})
	wg.Go(func() { defer close(ended); u.End(ctx, r, true) })
	select {
	case <-ended:
	case <-time.After(journalTimeout + time.Second):
		t.Fatal("the answer waited for its last turn's record")
	}
	journaled := make(chan struct{})
	wg.Go(func() {
		defer close(journaled)
		u.journalEnd(ctx, r, executor.Summary{Status: executor.StatusCompleted})
	})
	select {
	case <-journaled: // the memory journal takes a moment: an end that did not wait is written by now
		t.Fatal("the run's end was journaled while its last turn's record was still being written")
	case <-time.After(200 * time.Millisecond):
	}
	close(j.gate)
	<-journaled
	want := []string{turnKey("chatcmpl-1", 1), turnKey("chatcmpl-1", 2), endKey("chatcmpl-1")}
	if got := j.order(); !slices.Equal(got, want) {
		t.Fatalf("records written %v, want %v: the last turn (with turn 1's outputs), then the end", got, want)
	}
	var rec turnRecord
	if _, _, err := getJSON(ctx, j, turnKey("chatcmpl-1", 2), &rec); err != nil || rec.Previous["act_1"] != `{"echo":1}` {
		t.Fatalf("turn 2's record %+v (%v), want turn 1's output in it", rec, err)
	}
}
