package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectdavid/toolsidecar/ledger"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/promtest"
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

// follow follows a run's lease from ls, once subscribed; the function it
// returns waits until the lease is free and returns the events followed.
func follow(t *testing.T, ls *ledger.Leases, runID string) func() []string {
	t.Helper()
	var got []string
	followed := make(chan error, 1)
	go func() {
		followed <- ls.Follow(context.Background(), runID, func(ev []byte) bool { got = append(got, string(ev)); return false })
	}()
	time.Sleep(200 * time.Millisecond) // let the follower subscribe
	return func() []string {
		t.Helper()
		select {
		case err := <-followed:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Follow did not return when the lease was released")
		}
		return got
	}
}

// TestLeaseOneHolder: while pod-a holds a run's lease, pod-b cannot take
// it, learns who holds it, and follows the events pod-a publishes until
// pod-a releases the lease; pod-b then takes it. pod-a's lease reads
// followed once pod-b follows, and its other run's does not.
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
	other, _, err := a.Acquire(ctx, "run_2")
	if other == nil || err != nil {
		t.Fatalf("pod-a, run_2: %v %v", other, err)
	}
	defer other.Release()
	if la.Followed() {
		t.Fatal("the lease reads followed before anyone follows the run")
	}
	followed := follow(t, b, "run_1")
	poll.Until(t, "pod-a to hear that run_1 is followed", la.Followed)
	if other.Followed() {
		t.Error("run_2 reads followed: only run_1 is")
	}
	la.Publish([]byte("e1"))
	la.Publish([]byte("e2"))
	la.Release()
	if got := followed(); len(got) != 2 || got[0] != "e1" || got[1] != "e2" {
		t.Errorf("followed events %q, want e1 e2", got)
	}
	lb, _, err := b.Acquire(ctx, "run_1")
	if lb == nil || err != nil {
		t.Fatalf("pod-b after release: %v %v", lb, err)
	}
	lb.Release()
}

// TestLeaseReleasedLater: a lease released off the caller's path keeps
// the order of Release (the follower gets every event, then the lease is
// free for pod-b), stops being renewed at once, and Close waits for its
// key to be gone; after Close it is released at once.
func TestLeaseReleasedLater(t *testing.T) {
	conn := server(t)
	a, b := leases(t, conn, "pod-a", 5*time.Second), leases(t, conn, "pod-b", 5*time.Second)
	defer b.Close()
	ctx := context.Background()
	la, _, err := a.Acquire(ctx, "run_1")
	if la == nil || err != nil {
		t.Fatalf("pod-a: lease %v err %v", la, err)
	}
	followed := follow(t, b, "run_1")
	for _, ev := range []string{"e1", "e2", "e3"} {
		la.Publish([]byte(ev))
	}
	la.ReleaseLater()
	a.Close() // waits for the release
	if driven, err := b.Driven(ctx, "run_1"); driven || err != nil {
		t.Fatalf("after pod-a's Close the run reads driven=%v (err %v), want free", driven, err)
	}
	if got := followed(); strings.Join(got, " ") != "e1 e2 e3" {
		t.Errorf("followed events %q, want e1 e2 e3", got)
	}
	lb, _, err := b.Acquire(ctx, "run_1")
	if lb == nil || err != nil {
		t.Fatalf("pod-b after the release: %v %v", lb, err)
	}
	lb.ReleaseLater()
	b.Close()
	c := leases(t, conn, "pod-c", 5*time.Second)
	defer c.Close()
	if driven, err := c.Driven(ctx, "run_1"); driven || err != nil {
		t.Fatalf("a lease released later before Close reads driven=%v (err %v), want free", driven, err)
	}
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

// TestLeaseOfARestartedSidecar: a sidecar restarted under its instance ID
// writes a new incarnation into its key, which frees the leases of its
// earlier life for every sidecar at once, long before the TTL.
func TestLeaseOfARestartedSidecar(t *testing.T) {
	conn := server(t)
	a := leases(t, conn, "pod-a", time.Minute)
	b := leases(t, conn, "pod-b", time.Minute)
	defer b.Close()
	ctx := context.Background()
	if l, _, err := a.Acquire(ctx, "run_1"); l == nil || err != nil {
		t.Fatal(l, err)
	}
	a.Close() // pod-a dies
	if l, holder, _ := b.Acquire(ctx, "run_1"); l != nil || holder != "pod-a" {
		t.Fatalf("before pod-a restarts: lease %v holder %q, want pod-a's until its key lapses", l, holder)
	}
	a2 := leases(t, conn, "pod-a", time.Minute)
	defer a2.Close()
	lb, holder, err := b.Acquire(ctx, "run_1")
	if lb == nil || err != nil {
		t.Fatalf("pod-b after pod-a restarted: lease %v holder %q err %v; want the earlier life's lease taken over", lb, holder, err)
	}
	lb.Release()
}

// TestLeaseLost: when another pod took the lease over (this one's key
// lapsed while it was cut off), the renewal that writes the key again
// fences the run keys, finds this one moved and reports the lease lost.
func TestLeaseLost(t *testing.T) {
	conn := server(t)
	ttl := time.Second
	a, b := leases(t, conn, "pod-a", ttl), leases(t, conn, "pod-b", ttl)
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	la, _, _ := a.Acquire(ctx, "run_1")
	// pod-b's view after pod-a's key lapsed: simulated by deleting the
	// key directly.
	alive, _ := jetstreamKV(t, conn(), "T_SIDECARS")
	alive.Delete(ctx, "pod-a")
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

// expiredUnderHolder returns pod-a's lease of run_1, taken while pod-a's
// key has expired under it (its renewals stopped), pod-a, pod-b, and
// pod-a's metrics.
func expiredUnderHolder(t *testing.T) (*ledger.Lease, *ledger.Leases, *ledger.Leases, *prometheus.Registry) {
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
	kv, _ := jetstreamKV(t, conn(), "T_SIDECARS")
	poll.Until(t, "pod-a's key to expire", func() bool { _, err := kv.Get(ctx, "pod-a"); return errors.Is(err, jetstream.ErrKeyNotFound) })
	return la, a, b, reg
}

// TestLeaseExpiredTakenBack: when its key expired while the sidecar still
// drives (its renewals fell behind, or it was cut off for a while), it
// takes no lease; the next renewal writes the key again and takes back
// each lease nobody took over, instead of reporting it lost.
func TestLeaseExpiredTakenBack(t *testing.T) {
	la, a, b, reg := expiredUnderHolder(t)
	defer la.Release()
	ctx := context.Background()
	if l, _, err := a.Acquire(ctx, "run_2"); l != nil || err == nil {
		t.Fatalf("pod-a took a lease while its key had lapsed: %v %v", l, err)
	}
	ledger.BeatNow(a)
	ledger.UpkeepNow(a)
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
// key expires, pod-b takes the run over and releases it. pod-a finds a
// release it did not make: another sidecar may have driven the run, so the
// lease is lost, not taken back.
func TestLeaseTakenAndReleasedMeanwhile(t *testing.T) {
	la, a, b, reg := expiredUnderHolder(t)
	defer la.Release()
	ctx := context.Background()
	lb, _, err := b.Acquire(ctx, "run_1")
	if lb == nil || err != nil {
		t.Fatal(lb, err)
	}
	lb.Release()
	ledger.BeatNow(a)
	ledger.UpkeepNow(a)
	select {
	case <-la.Lost():
	default:
		t.Fatal("pod-a kept a lease pod-b had taken and released meanwhile")
	}
	if lost := promtest.Value(t, reg, "toolsidecar_leases_expired_total", "outcome=lost"); lost != 1 {
		t.Errorf("toolsidecar_leases_expired_total{outcome=lost} %v, want 1", lost)
	}
}

// TestLeaseRenewalThatLandedLate: a write whose answer was lost (it timed
// out, yet the update landed) leaves the sidecar with a stale revision of
// its key, or of a run key; the next write finds its own value at the
// newer revision and goes on from there, without a lapse.
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
	// The writes pod-a never heard back from.
	landLate := func(bucket, key string) jetstream.KeyValueEntry {
		kv, _ := jetstreamKV(t, conn(), bucket)
		e, err := kv.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Update(ctx, key, e.Value(), e.Revision()); err != nil {
			t.Fatal(err)
		}
		return e
	}
	self := landLate("T_SIDECARS", "pod-a")
	run := landLate("T_DRIVES", "run_1")
	la.KeepNow()
	time.Sleep(ttl) // three renewals
	select {
	case <-la.Lost():
		t.Fatal("the lease was reported lost after writes that landed late")
	default:
	}
	for _, k := range []struct {
		bucket, key string
		before      jetstream.KeyValueEntry
	}{{"T_SIDECARS", "pod-a", self}, {"T_DRIVES", "run_1", run}} {
		kv, _ := jetstreamKV(t, conn(), k.bucket)
		if e, err := kv.Get(ctx, k.key); err != nil || e.Revision() <= k.before.Revision()+1 || string(e.Value()) != string(k.before.Value()) {
			t.Errorf("%s after the writes: %v, want pod-a's value written past revision %d", k.key, err, k.before.Revision()+1)
		}
	}
	if renewals, expired := promtest.Value(t, reg, "toolsidecar_lease_renewal_seconds"), promtest.Value(t, reg, "toolsidecar_leases_expired_total", "outcome=taken_back"); renewals < 2 || expired != 0 {
		t.Errorf("%v renewals observed, %v leases taken back; want at least 2 renewals and none taken back (the key never lapsed)", renewals, expired)
	}
}

// TestLeaseWritesDoNotGrowWithRuns: a sidecar holding many leases writes
// its own key every TTL/3 and each run key once; nothing per run while
// they are held. The stream sequence of each bucket counts every write.
func TestLeaseWritesDoNotGrowWithRuns(t *testing.T) {
	conn := server(t)
	ttl := 600 * time.Millisecond
	a := leases(t, conn, "pod-a", ttl)
	defer a.Close()
	ctx := context.Background()
	const runs = 100
	for i := range runs {
		l, _, err := a.Acquire(ctx, fmt.Sprintf("run_%d", i))
		if l == nil || err != nil {
			t.Fatal(l, err)
		}
		defer l.Release()
	}
	nc := conn()
	writes := func(stream string) uint64 { return streamState(t, nc, stream).LastSeq }
	held, selfBefore := writes("KV_T_DRIVES"), writes("KV_T_SIDECARS")
	time.Sleep(4 * ttl) // about 12 renewals
	if got := writes("KV_T_DRIVES"); got != held || held != runs {
		t.Errorf("run keys: %d writes to take %d leases, %d after 4 TTLs; want %d and no more", held, runs, got, runs)
	}
	if beats := writes("KV_T_SIDECARS") - selfBefore; beats < 4 || beats > 16 {
		t.Errorf("the sidecar's key was written %d times in 4 TTLs, want about 12", beats)
	}
}

// streamState is the state of a JetStream stream: its sequence counts
// every write, its messages what is kept.
func streamState(t *testing.T, nc *nats.Conn, stream string) jetstream.StreamState {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State
}

// TestReleasedLeasesLeaveNothing: a released lease's marker goes after
// the TTL, so that one drive after another does not pile markers up in
// the bucket for the hold TTL (an hour).
func TestReleasedLeasesLeaveNothing(t *testing.T) {
	conn := server(t)
	ttl := time.Second
	a := leases(t, conn, "pod-a", ttl)
	defer a.Close()
	ctx := context.Background()
	for i := range 50 {
		l, _, err := a.Acquire(ctx, fmt.Sprintf("run_%d", i))
		if l == nil || err != nil {
			t.Fatal(l, err)
		}
		l.Release()
	}
	nc := conn()
	if kept := streamState(t, nc, "KV_T_DRIVES").Msgs; kept != 50 {
		t.Fatalf("%d entries right after 50 releases, want their 50 markers", kept)
	}
	poll.Until(t, "the markers to go", func() bool { return streamState(t, nc, "KV_T_DRIVES").Msgs == 0 })
	if l, _, err := a.Acquire(ctx, "run_7"); l == nil || err != nil {
		t.Fatalf("a released run after its marker went: %v %v", l, err)
	}
}

// TestLeaseLostWhenCutOff: a sidecar whose connection to NATS is gone
// cannot renew its key; once the TTL has passed, each of its leases is
// reported lost (another sidecar may take the run over) and counted once.
func TestLeaseLostWhenCutOff(t *testing.T) {
	conn := server(t)
	ttl := time.Second
	nc := conn()
	reg := prometheus.NewRegistry()
	a, err := ledger.OpenLeases(context.Background(), nc, ledger.LeaseConfig{Prefix: "t", Instance: "pod-a", TTL: ttl, Metrics: reg},
		slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()
	la, _, _ := a.Acquire(ctx, "run_1")
	lb, _, _ := a.Acquire(ctx, "run_2")
	nc.Close()
	cut := time.Now()
	for _, l := range []*ledger.Lease{la, lb} {
		select {
		case <-l.Lost():
		case <-time.After(3 * ttl):
			t.Fatal("a lease of a sidecar cut off from NATS was not reported lost")
		}
	}
	if since := time.Since(cut); since < ttl*2/3 {
		t.Errorf("leases reported lost %s after the cut, before the key could lapse (TTL %s)", since, ttl)
	}
	time.Sleep(ttl) // more failed renewals
	if lost := promtest.Value(t, reg, "toolsidecar_leases_expired_total", "outcome=lost"); lost != 2 {
		t.Errorf("toolsidecar_leases_expired_total{outcome=lost} %v, want 2", lost)
	}
}

// TestRenewalOrder: the upkeep writes the longest unwritten run key first,
// so that a pass slower than its period still writes each key in turn.
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
	held[0].KeepNow()
	if got := strings.Join(ledger.RenewalOrder(a), " "); got != "run_2 run_3 run_1" {
		t.Errorf("renewal order %q, want \"run_2 run_3 run_1\" (run_1 was written last)", got)
	}
}

// TestLeaseNotTakenOnAStaleRead: a replica that lags says a live
// sidecar's key is not there. A KV Get, a direct get that any replica
// may answer, believed it, and a live holder's run was taken over (in
// TestClusterNodeLoss, during a node loss). Here the subject of that
// direct get is mapped to a responder that answers "not found", as such a
// replica would; pod-b still finds pod-a holding the run, because it
// reads pod-a's key from the stream's leader.
func TestLeaseNotTakenOnAStaleRead(t *testing.T) {
	ns, conn, b := podAHoldsRun1(t)
	ctx := context.Background()
	laggingReplica(t, ns, conn(), "$JS.API.DIRECT.GET.KV_T_SIDECARS.$KV.T_SIDECARS.pod-a")
	js, err := jetstream.New(conn())
	if err != nil {
		t.Fatal(err)
	}
	sidecars, err := js.KeyValue(ctx, "T_SIDECARS")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sidecars.Get(ctx, "pod-a"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a direct get of pod-a's key: %v, want the lagging replica's not found (the mapping is not in place)", err)
	}

	if lb, holder, err := b.Acquire(ctx, "run_1"); lb != nil || holder != "pod-a" || err != nil {
		t.Fatalf("pod-b while pod-a holds, a replica saying pod-a's key is gone: lease %v holder %q err %v; want pod-a named", lb, holder, err)
	}
}

// podAHoldsRun1 starts a server whose subjects a test can map, with
// pod-a holding run_1's lease and pod-b open beside it.
func podAHoldsRun1(t *testing.T) (*natsserver.Server, func() *nats.Conn, *ledger.Leases) {
	t.Helper()
	ns, conn := mappableServer(t)
	a, b := leases(t, conn, "pod-a", 5*time.Second), leases(t, conn, "pod-b", 5*time.Second)
	t.Cleanup(b.Close)
	t.Cleanup(a.Close)
	la, _, err := a.Acquire(context.Background(), "run_1")
	if la == nil || err != nil {
		t.Fatalf("pod-a: lease %v err %v", la, err)
	}
	t.Cleanup(la.Release)
	return ns, conn, b
}

// mappableServer is a JetStream server whose global account a test can
// give subject mappings, and a way to connect to it.
func mappableServer(t *testing.T) (*natsserver.Server, func() *nats.Conn) {
	t.Helper()
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS not ready")
	}
	return ns, func() *nats.Conn {
		nc, err := nats.Connect(ns.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}

// laggingReplica maps a direct get's subject to a responder on nc that
// answers "not found", as a replica that has not stored the key would.
func laggingReplica(t *testing.T, ns *natsserver.Server, nc *nats.Conn, directGet string) {
	t.Helper()
	sub, err := nc.Subscribe("lagging.replica", func(m *nats.Msg) {
		m.RespondMsg(&nats.Msg{Header: nats.Header{"Status": []string{"404"}, "Description": []string{"Message Not Found"}}})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	nc.Flush()
	if err := ns.GlobalAccount().AddMapping(directGet, "lagging.replica"); err != nil {
		t.Fatal(err)
	}
}

// TestAcquireAgainstAStaleRunKey: a replica keeps answering that a run's
// key is not there while pod-a holds it. pod-b's Acquire, whose create
// finds the key and whose read does not, tries a bounded number of times
// and says so, instead of recursing until its context ends.
func TestAcquireAgainstAStaleRunKey(t *testing.T) {
	ns, conn, b := podAHoldsRun1(t)
	laggingReplica(t, ns, conn(), "$JS.API.DIRECT.GET.KV_T_DRIVES.$KV.T_DRIVES.run_1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lb, holder, err := b.Acquire(ctx, "run_1")
	if lb != nil || holder != "" || err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "times while it was being taken") {
		t.Fatalf("pod-b: lease %v holder %q err %v; want the bounded rounds' error", lb, holder, err)
	}
}
