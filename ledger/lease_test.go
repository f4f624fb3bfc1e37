package ledger_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectdavid/toolsidecar/internal/poll"
	"github.com/projectdavid/toolsidecar/internal/promtest"
	"github.com/projectdavid/toolsidecar/ledger"
)

// leases opens the lease bucket as one sidecar instance, on its own
// connection (as another pod would have).
func leases(t *testing.T, conn func() *nats.Conn, instance string, ttl time.Duration) *ledger.Leases {
	t.Helper()
	ls, _ := leasesWithMetrics(t, conn, instance, ttl)
	return ls
}

// leasesWithMetrics is leases with the instance's metrics on a registry
// of its own.
func leasesWithMetrics(t *testing.T, conn func() *nats.Conn, instance string, ttl time.Duration) (*ledger.Leases, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	ls, err := ledger.OpenLeases(context.Background(), conn(), ledger.LeaseConfig{Prefix: "t", Instance: instance, TTL: ttl, Metrics: reg},
		slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return ls, reg
}

// TestLeaseOneHolder: while pod-a holds a run's lease, pod-b cannot take
// it, learns who holds it, and follows the events pod-a publishes until
// pod-a releases the lease; pod-b then takes it.
func TestLeaseOneHolder(t *testing.T) {
	conn := server(t)
	a, b := leases(t, conn, "pod-a", 5*time.Second), leases(t, conn, "pod-b", 5*time.Second)
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	la, holder, err := a.Acquire(ctx, "run_1")
	if la == nil || err != nil {
		t.Fatalf("pod-a: lease %v holder %q err %v", la, holder, err)
	}
	if lb, holder, err := b.Acquire(ctx, "run_1"); lb != nil || holder != "pod-a" || err != nil {
		t.Fatalf("pod-b while pod-a holds: lease %v holder %q err %v; want pod-a named", lb, holder, err)
	}
	var got []string
	followed := make(chan error, 1)
	go func() {
		followed <- b.Follow(ctx, "run_1", func(ev []byte) bool { got = append(got, string(ev)); return false })
	}()
	time.Sleep(200 * time.Millisecond) // let the follower subscribe
	la.Publish([]byte("e1"))
	la.Publish([]byte("e2"))
	la.Release()
	select {
	case err := <-followed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Follow did not return when the lease was released")
	}
	if len(got) != 2 || got[0] != "e1" || got[1] != "e2" {
		t.Errorf("followed events %q, want e1 e2", got)
	}
	lb, _, err := b.Acquire(ctx, "run_1")
	if lb == nil || err != nil {
		t.Fatalf("pod-b after release: %v %v", lb, err)
	}
	lb.Release()
}

// TestLeaseExpiresWhenHolderDies: a holder that stops renewing (its
// process died) frees the lease after the TTL and no sooner; another pod
// then takes it, and the dead holder's next life takes its own lease back
// at once.
func TestLeaseExpiresWhenHolderDies(t *testing.T) {
	conn := server(t)
	ttl := 1500 * time.Millisecond
	a := leases(t, conn, "pod-a", ttl)
	b := leases(t, conn, "pod-b", ttl)
	defer b.Close()
	ctx := context.Background()
	if l, _, err := a.Acquire(ctx, "run_1"); l == nil || err != nil {
		t.Fatal(l, err)
	}
	if l, _, err := a.Acquire(ctx, "run_2"); l == nil || err != nil {
		t.Fatal(l, err)
	}
	// Renewed while pod-a lives: still held after twice the TTL.
	time.Sleep(2 * ttl)
	if l, holder, _ := b.Acquire(ctx, "run_1"); l != nil || holder != "pod-a" {
		t.Fatalf("after 2×TTL of renewals: lease %v holder %q, want pod-a's", l, holder)
	}
	a.Close() // pod-a dies: no renewal, no release
	start := time.Now()
	if err := b.Follow(ctx, "run_1", func([]byte) bool { return false }); err != nil {
		t.Fatal(err)
	}
	waited := time.Since(start)
	l, _, err := b.Acquire(ctx, "run_1")
	if l == nil || err != nil {
		t.Fatalf("pod-b after expiry: %v %v", l, err)
	}
	defer l.Release()
	if waited > 3*ttl {
		t.Errorf("the lease was free only after %s (TTL %s)", waited, ttl)
	}
	// pod-a restarted (same instance name) takes run_2 back without waiting.
	a2 := leases(t, conn, "pod-a", ttl)
	defer a2.Close()
	l2, holder, err := a2.Acquire(ctx, "run_2")
	if l2 == nil || err != nil {
		t.Fatalf("pod-a's next life: lease %v holder %q err %v", l2, holder, err)
	}
	l2.Release()
}

// TestLeaseLost: when another pod took the lease (this one's expired while
// it was cut off), the next renewal finds the revision moved and reports
// the lease lost.
func TestLeaseLost(t *testing.T) {
	conn := server(t)
	ttl := time.Second
	a, b := leases(t, conn, "pod-a", ttl), leases(t, conn, "pod-b", ttl)
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	la, _, _ := a.Acquire(ctx, "run_1")
	// pod-b's view after pod-a's lease expired: the key was gone and
	// pod-b created it. Simulated by removing pod-a's key directly.
	js, _ := jetstreamKV(t, conn(), "T_RUNS")
	js.Delete(ctx, "run_1")
	lb, _, err := b.Acquire(ctx, "run_1")
	if lb == nil || err != nil {
		t.Fatal(lb, err)
	}
	defer lb.Release()
	select {
	case <-la.Lost():
	case <-time.After(3 * ttl):
		t.Fatal("pod-a's lease was not reported lost")
	}
	la.Release() // must not free pod-b's lease
	if l, holder, _ := a.Acquire(ctx, "run_1"); l != nil || holder != "pod-b" {
		t.Errorf("after pod-a's release of a lost lease: lease %v holder %q, want pod-b's", l, holder)
	}
}

func jetstreamKV(t *testing.T, nc *nats.Conn, bucket string) (jetstream.KeyValue, error) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js.KeyValue(context.Background(), bucket)
}

// expiredUnderHolder returns pod-a's lease of run_1, whose key has expired
// while pod-a still holds it (its renewal loop stopped), pod-b, and pod-a's
// metrics.
func expiredUnderHolder(t *testing.T) (*ledger.Lease, *ledger.Leases, *prometheus.Registry) {
	t.Helper()
	conn := server(t)
	ttl := time.Second
	a, reg := leasesWithMetrics(t, conn, "pod-a", ttl)
	b := leases(t, conn, "pod-b", ttl)
	t.Cleanup(b.Close)
	ctx := context.Background()
	la, _, err := a.Acquire(ctx, "run_1")
	if err != nil {
		t.Fatal(err)
	}
	a.Close() // the renewals stop; the lease is still held in pod-a
	kv, _ := jetstreamKV(t, conn(), "T_RUNS")
	poll.Until(t, "the key to expire", func() bool { _, err := kv.Get(ctx, "run_1"); return errors.Is(err, jetstream.ErrKeyNotFound) })
	return la, b, reg
}

// TestLeaseExpiredTakenBack: a lease whose key expired while its holder
// still drives (its renewals fell behind, say, under load), and that nobody
// wrote since, is taken back by the next renewal instead of being reported
// lost: nobody else drives the run.
func TestLeaseExpiredTakenBack(t *testing.T) {
	la, b, reg := expiredUnderHolder(t)
	defer la.Release()
	ctx := context.Background()
	la.RenewNow()
	select {
	case <-la.Lost():
		t.Fatal("the lease was reported lost although nobody else took it")
	default:
	}
	if got, lost := promtest.Value(t, reg, "toolsidecar_leases_expired_total", "outcome=taken_back"), promtest.Value(t, reg, "toolsidecar_leases_expired_total", "outcome=lost"); got != 1 || lost != 0 {
		t.Errorf("toolsidecar_leases_expired_total: taken_back %v, lost %v; want 1 and 0", got, lost)
	}
	if l, holder, _ := b.Acquire(ctx, "run_1"); l != nil || holder != "pod-a" {
		t.Fatalf("pod-b: lease %v holder %q, want pod-a's, taken back", l, holder)
	}
}

// TestLeaseTakenAndReleasedMeanwhile: while pod-a's renewals lag, its
// lease expires, pod-b takes the run over and releases it. pod-a finds a
// release it did not make: another sidecar may have driven the run, so the
// lease is lost, not taken back.
func TestLeaseTakenAndReleasedMeanwhile(t *testing.T) {
	la, b, reg := expiredUnderHolder(t)
	defer la.Release()
	ctx := context.Background()
	lb, _, err := b.Acquire(ctx, "run_1")
	if lb == nil || err != nil {
		t.Fatal(lb, err)
	}
	lb.Release()
	la.RenewNow()
	select {
	case <-la.Lost():
	default:
		t.Fatal("pod-a kept a lease pod-b had taken and released meanwhile")
	}
	if lost := promtest.Value(t, reg, "toolsidecar_leases_expired_total", "outcome=lost"); lost != 1 {
		t.Errorf("toolsidecar_leases_expired_total{outcome=lost} %v, want 1", lost)
	}
}

// TestLeaseRenewalThatLandedLate: a renewal whose answer was lost (it timed
// out, yet the update landed) leaves the holder with a stale revision; the
// next renewal finds its own lease at the newer one and goes on with it.
func TestLeaseRenewalThatLandedLate(t *testing.T) {
	conn := server(t)
	ttl := time.Second
	a, reg := leasesWithMetrics(t, conn, "pod-a", ttl)
	defer a.Close()
	ctx := context.Background()
	la, _, _ := a.Acquire(ctx, "run_1")
	defer la.Release()
	if held := promtest.Value(t, reg, "toolsidecar_leases_held"); held != 1 {
		t.Errorf("toolsidecar_leases_held %v, want 1", held)
	}
	kv, _ := jetstreamKV(t, conn(), "T_RUNS")
	e, err := kv.Get(ctx, "run_1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Update(ctx, "run_1", e.Value(), e.Revision()); err != nil { // the renewal pod-a never heard back from
		t.Fatal(err)
	}
	time.Sleep(ttl) // three renewal periods
	select {
	case <-la.Lost():
		t.Fatal("the lease was reported lost after a renewal that landed late")
	default:
	}
	if e2, err := kv.Get(ctx, "run_1"); err != nil || e2.Revision() <= e.Revision()+1 || string(e2.Value()) != string(e.Value()) {
		t.Errorf("key after renewals: %v (revision %d), want pod-a's value renewed past revision %d", err, e2.Revision(), e.Revision()+1)
	}
	if passes, expired := promtest.Value(t, reg, "toolsidecar_lease_renewal_pass_seconds"), promtest.Value(t, reg, "toolsidecar_leases_expired_total", "outcome=taken_back"); passes < 2 || expired != 0 {
		t.Errorf("%v renewal passes observed, %v leases taken back; want at least 2 passes and none taken back (the key never expired)", passes, expired)
	}
}

// TestRenewalOrder: a pass renews the longest unrenewed lease first, so
// that a pass slower than TTL/3 still renews each lease once per pass.
func TestRenewalOrder(t *testing.T) {
	conn := server(t)
	a := leases(t, conn, "pod-a", time.Minute) // no pass during the test
	defer a.Close()
	ctx := context.Background()
	var held []*ledger.Lease
	for _, id := range []string{"run_1", "run_2", "run_3"} {
		l, _, err := a.Acquire(ctx, id)
		if l == nil || err != nil {
			t.Fatal(l, err)
		}
		defer l.Release()
		held = append(held, l)
	}
	held[0].RenewNow()
	if got := strings.Join(ledger.RenewalOrder(a), " "); got != "run_2 run_3 run_1" {
		t.Errorf("renewal order %q, want \"run_2 run_3 run_1\" (run_1 was renewed last)", got)
	}
}
