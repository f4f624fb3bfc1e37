package executor

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
)

// TestDriveLogResumes: a caller that resumes gets the events after the one
// it names, from the drive's bounded log; one that names an event the log
// no longer holds, or another drive's, gets every event held; one that
// names none gets none of the past.
func TestDriveLogResumes(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	d := &drive{id: "abc", ctx: ctx, cancel: cancel, done: make(chan struct{}), subs: map[*subscriber]struct{}{}}
	const emitted = 3000
	for i := range emitted {
		d.emit(Event{Type: EventContent, Text: strconv.Itoa(i + 1)})
	}
	held := len(d.log)
	if held > maxDriveLog || held < maxDriveLog*3/4 {
		t.Fatalf("the log holds %d events, want between %d and %d", held, maxDriveLog*3/4, maxDriveLog)
	}
	oldest := emitted - held + 1
	for _, c := range []struct {
		after      string
		want, from int // events and the first one's number
	}{
		{"abc-2500", 500, 2501},
		{"abc-2999", 1, 3000},
		{"abc-3000", 0, 0},
		{"abc-" + strconv.Itoa(oldest), held - 1, oldest + 1},
		{"abc-" + strconv.Itoa(oldest-1), held, oldest}, // dropped: all held
		{"abc-3001", held, oldest},                      // not yet emitted: not this drive's
		{"xyz-2500", held, oldest},                      // another drive of the run
		{"", 0, 0},
	} {
		got := d.since(c.after)
		if len(got) != c.want {
			t.Errorf("after %q: %d events, want %d", c.after, len(got), c.want)
			continue
		}
		for i, e := range got {
			if n := c.from + i; e.ID != "abc-"+strconv.Itoa(n) || e.Text != strconv.Itoa(n) {
				t.Errorf("after %q: event %d is %s %q, want abc-%d", c.after, i, e.ID, e.Text, n)
				break
			}
		}
	}
}

// TestFreshRunsLease: Request.Leased waits for a fresh run's lease and
// says why it could not be taken; the loop's check reads a lease being
// taken as neither held nor lost, a failed one as gone, and Leased is nil
// at once for a drive that took its lease before its loop (none pending).
func TestFreshRunsLease(t *testing.T) {
	if err := (Request{}).Leased(context.Background()); err != nil {
		t.Fatalf("Leased without a pending lease: %v", err)
	}
	p := &pendingLease{done: make(chan struct{})}
	ctx := context.Background()
	req := Request{pending: p}
	if err := req.leaseGone(); err != nil {
		t.Fatalf("a lease being taken reads gone: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- req.Leased(ctx) }()
	select {
	case err := <-got:
		t.Fatalf("Leased returned %v before the lease was taken", err)
	default:
	}
	p.err = errors.New("no JetStream")
	close(p.done)
	if err := <-got; err == nil || !strings.Contains(err.Error(), "no JetStream") {
		t.Fatalf("Leased after a failed take: %v", err)
	}
	if err := req.leaseGone(); err == nil || !strings.Contains(err.Error(), "taking the run's lease") {
		t.Fatalf("the loop's check after a failed take: %v", err)
	}
	cancelled, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("drive over"))
	if err := (Request{pending: &pendingLease{done: make(chan struct{})}}).Leased(cancelled); err == nil || err.Error() != "drive over" {
		t.Fatalf("Leased on a cancelled drive: %v", err)
	}
}
