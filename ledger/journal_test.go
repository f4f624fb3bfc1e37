package ledger_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/projectdavid/toolsidecar/runstore"
)

// The journal bucket is a runstore.Journal as it is: its conditional
// writes fail with runstore's errors, and of two requests that claim one
// run at once in JetStream, one takes it over.
func TestJournalIsARunStore(t *testing.T) {
	l, _ := open(t)
	ctx := context.Background()
	j := l.Journal()
	if v, rev, err := j.Get(ctx, "run.r"); v != nil || rev != 0 || err != nil {
		t.Fatalf("missing record: %q %d %v", v, rev, err)
	}
	rev, err := j.Create(ctx, "run.r", []byte(`{"request":"d","created":1,"claims":0}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Create(ctx, "run.r", []byte(`{}`)); !errors.Is(err, runstore.ErrExists) {
		t.Fatalf("second create: %v, want runstore.ErrExists", err)
	}
	if _, err := j.Update(ctx, "run.r", []byte(`{}`), rev+1); !errors.Is(err, runstore.ErrChanged) {
		t.Fatalf("update at another revision: %v, want runstore.ErrChanged", err)
	}
	s := runstore.New(j)
	var wins [8]bool
	var wg sync.WaitGroup
	for i := range wins {
		wg.Go(func() {
			_, ok, err := s.Claim(ctx, "r")
			if err != nil {
				t.Error(err)
			}
			wins[i] = ok
		})
	}
	wg.Wait()
	won := 0
	for _, w := range wins {
		if w {
			won++
		}
	}
	h, _, err := s.Header(ctx, "r")
	if err != nil || won == 0 || h.Claims != won {
		t.Fatalf("%d claims won and the header counts %d (%v): want every win counted once", won, h.Claims, err)
	}
}
