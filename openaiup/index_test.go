package openaiup

import (
	"context"
	"fmt"
	"slices"
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
		r := u.Begin(fmt.Sprintf("chatcmpl-%d", i), key, true, nil, nil, nil)
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
