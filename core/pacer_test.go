package core

import (
	"context"
	"errors"
	"math"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeNow is a clock a test moves by hand.
type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeNow) now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeNow) add(d time.Duration) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t = f.t.Add(d)
	return f.t
}

// TestPacerCutAndRecovery: no request waits until a refusal; a refusal
// cuts the rate below the rate requests were sent at, a refusal of a
// request sent before that cut does not cut again, one sent after it
// does; successes raise the rate back along CUBIC's curve, to the rate
// of the last cut some ten seconds on and past it later, until the pacer
// stands aside.
func TestPacerCutAndRecovery(t *testing.T) {
	clk := &fakeNow{t: time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)}
	p := newPacer(clk.now)
	t0 := clk.now()
	for range 20 {
		if _, d := p.reserve(t0); d != 0 {
			t.Fatalf("a request waits %s before any refusal", d)
		}
	}
	if r := p.rate(); r != 0 {
		t.Fatalf("paced at %v before any refusal", r)
	}
	clk.add(10 * time.Millisecond)
	p.answered(t0, http.StatusServiceUnavailable, 0)
	first := p.rate()
	if sent := 20 / 1.01; first <= 0 || first >= sent {
		t.Fatalf("after a refusal the rate is %v, want below the %v a second sent", first, sent)
	}
	p.answered(t0, http.StatusServiceUnavailable, 0) // sent before the cut
	if r := p.rate(); r != first {
		t.Errorf("a refusal of the same round cut the rate again: %v, then %v", first, r)
	}
	sent := clk.add(time.Second)
	clk.add(10 * time.Millisecond)
	p.answered(sent, http.StatusTooManyRequests, 0)
	second := p.rate()
	if math.Abs(second-paceBeta*first) > 1e-9 {
		t.Errorf("a refusal of a request sent after the cut: rate %v, want %v × %v", second, paceBeta, first)
	}
	if n3, n5 := p.refusals(http.StatusTooManyRequests), p.refusals(http.StatusServiceUnavailable); n3 != 1 || n5 != 2 {
		t.Errorf("refusals counted 429: %d, 503: %d, want 1 and 2", n3, n5)
	}
	k := math.Cbrt(first * (1 - paceBeta) / paceCubic)
	clk.add(time.Duration(k * float64(time.Second)))
	p.answered(clk.now(), http.StatusOK, 0)
	if r := p.rate(); math.Abs(r-first) > 1e-6 {
		t.Errorf("%.1f s after the cut the rate is %v, want back to %v", k, r, first)
	}
	clk.add(5 * time.Second)
	p.answered(clk.now(), http.StatusOK, 0)
	if r := p.rate(); r <= first {
		t.Errorf("past K the rate is %v, want above %v", r, first)
	}
	clk.add(time.Minute)
	p.answered(clk.now(), http.StatusOK, 0)
	if r := p.rate(); r != 0 {
		t.Errorf("a minute without a refusal the rate is %v, want the pacer aside (0)", r)
	}
	if _, d := p.reserve(clk.now()); d != 0 {
		t.Errorf("a request waits %s once the pacer stands aside", d)
	}
}

// TestPacerShared: once paced, requests from many goroutines at the same
// instant leave one after another at the paced rate.
func TestPacerShared(t *testing.T) {
	clk := &fakeNow{t: time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)}
	p := newPacer(clk.now)
	p.answered(clk.now(), http.StatusServiceUnavailable, 0) // nothing sent: the floor
	r := p.rate()
	now := clk.now()
	delays := make([]time.Duration, 16)
	var wg sync.WaitGroup
	for i := range delays {
		wg.Go(func() { _, delays[i] = p.reserve(now) })
	}
	wg.Wait()
	slices.Sort(delays)
	gap := time.Duration(float64(time.Second) / r)
	for i, d := range delays {
		if want := time.Duration(i) * gap; (d - want).Abs() > time.Millisecond {
			t.Errorf("request %d of 16 at once waits %s, want %s (one every %s, at %v a second)", i, d, want, gap, r)
		}
	}
}

// TestPacerRetryAfter: a Retry-After holds every request until it has
// passed, then they take their turns.
func TestPacerRetryAfter(t *testing.T) {
	clk := &fakeNow{t: time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)}
	p := newPacer(clk.now)
	p.answered(clk.now(), http.StatusTooManyRequests, 5*time.Second)
	clk.add(time.Second)
	if res, d := p.reserve(clk.now()); res != nil || d != 4*time.Second {
		t.Errorf("a second into a Retry-After of 5 s: wait %s (reservation %v), want 4s", d, res != nil)
	}
	clk.add(4 * time.Second)
	if res, d := p.reserve(clk.now()); res == nil || d != 0 {
		t.Errorf("after the Retry-After: wait %s (reservation %v), want a turn at once", d, res != nil)
	}
}

// TestPacerWithdrawn: a request waiting for its turn is withdrawn or
// ends with its context, never sent, and gives its turn back.
func TestPacerWithdrawn(t *testing.T) {
	clk := &fakeNow{t: time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)}
	p := newPacer(clk.now)
	p.answered(clk.now(), http.StatusServiceUnavailable, 0)
	if _, err := p.wait(context.Background(), nil); err != nil { // takes the one token
		t.Fatal(err)
	}
	withdraw := make(chan struct{})
	close(withdraw)
	if _, err := p.wait(context.Background(), withdraw); !errors.Is(err, ErrWithdrawn) {
		t.Errorf("a withdrawn request waiting its turn: %v, want ErrWithdrawn", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.wait(ctx, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("a request whose context ended waiting its turn: %v, want context.Canceled", err)
	}
	if _, d := p.reserve(clk.now()); d != time.Duration(float64(time.Second)/p.rate()) {
		t.Errorf("the next request waits %s, want one gap (%v a second): the withdrawn ones gave their turns back", d, p.rate())
	}
}
