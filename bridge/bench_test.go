package bridge_test

import (
	"context"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/ledger"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/workerproc"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

// The overhead benchmarks compare, in one run on one server, a raw NATS
// request-reply round trip (nats.go Request to a bare responder) with a
// sidecar dispatch (Client.Dispatch to a Worker: headers, deadline,
// progress-aware wait, manifest parsing on the worker). Both echo the
// manifest, so tool time is zero.
//
//	go test ./bridge -run '^$' -bench 'Raw|Dispatch' -benchtime 20000x

// echoClient starts a Worker that echoes the manifest and returns a Client
// dispatching to it.
func echoClient(b *testing.B, concurrency int) *bridge.Client {
	b.Helper()
	side, work := natstest.Connect(b)
	natstest.Worker(b, work, map[string]tool.Handler{"echo": func(ctx context.Context, c *tool.Call) ([]byte, error) { return c.Manifest, nil }},
		worker.WithConcurrency(concurrency))
	return open(b, side)
}

// durableClient is echoClient in durable mode: a JetStream server, the
// outcome ledger written before each send, replies captured by a stream.
func durableClient(b *testing.B, concurrency int) *bridge.Client {
	b.Helper()
	side, work := natstest.ConnectJetStream(b)
	natstest.Worker(b, work, map[string]tool.Handler{"echo": func(ctx context.Context, c *tool.Call) ([]byte, error) { return c.Manifest, nil }},
		worker.WithConcurrency(concurrency))
	l, err := ledger.Open(context.Background(), side, ledger.Config{Prefix: natstest.Prefix, Instance: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	c, err := bridge.Open(side, natstest.Prefix, bridge.WithInbox(l.Inbox()), bridge.WithLedger(l))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// reportLatency adds p50 and p99 in microseconds.
func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

func BenchmarkRawRequest(b *testing.B) {
	side, work := natstest.Connect(b)
	sub, _ := work.Subscribe("raw.echo", func(m *nats.Msg) { m.Respond(m.Data) })
	defer sub.Unsubscribe()
	work.Flush()
	body := []byte(natstest.Manifest)
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if _, err := side.Request("raw.echo", body, time.Second); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(start)
	}
	b.StopTimer()
	reportLatency(b, lat)
}

func BenchmarkDispatch(b *testing.B) {
	sequential(b, echoClient(b, 64), natstest.Request("echo", time.Second))
}

// BenchmarkDispatchSidecarSide is BenchmarkDispatch with the worker in a
// process of its own: -benchmem then counts only what the sidecar's
// process allocates per call (its dispatch, its NATS connection and the
// embedded server routing the request and the reply).
func BenchmarkDispatchSidecarSide(b *testing.B) {
	c, r := workerProcess(b)
	sequential(b, c, r)
}

// workerProcess starts a server and an echo worker in a process of its
// own, and returns a client and a request that the worker answers.
func workerProcess(b *testing.B) (*bridge.Client, tool.Request) {
	url := natstest.Start(b)
	workerproc.Start(b, workerproc.Config{URLs: url, Prefix: natstest.Prefix, ExecLog: filepath.Join(b.TempDir(), "exec.log")})
	c := open(b, natstest.Dial(b, url))
	r := natstest.Request(workerproc.Echo, time.Second)
	poll.Until(b, "the worker process to answer", func() bool { return c.Dispatch(context.Background(), r).Err == nil })
	return c, r
}

// BenchmarkDispatchDurable: the same calls in durable mode (read-only).
func BenchmarkDispatchDurable(b *testing.B) {
	sequential(b, durableClient(b, 64), natstest.Request("echo", time.Second))
}

// BenchmarkDispatchDurableUnsafe: durable mode for an unsafe tool, whose
// ledger entry is written synchronously before the send.
func BenchmarkDispatchDurableUnsafe(b *testing.B) {
	r := natstest.Request("echo", time.Second)
	r.Unsafe = true
	sequential(b, durableClient(b, 64), r)
}

// sequential dispatches r b.N times, one after another, and reports the
// latency percentiles.
func sequential(b *testing.B, c *bridge.Client, r tool.Request) {
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if rep := c.Dispatch(context.Background(), r); rep.Err != nil {
			b.Fatal(rep.Err)
		}
		lat[i] = time.Since(start)
	}
	b.StopTimer()
	reportLatency(b, lat)
}

// parallel runs call from 32 goroutines per CPU until b.N calls are done.
func parallel(b *testing.B, call func() error) {
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := call(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// dispatch adapts Dispatch to parallel.
func dispatch(c *bridge.Client, r tool.Request) func() error {
	return func() error {
		if rep := c.Dispatch(context.Background(), r); rep.Err != nil {
			return rep.Err
		}
		return nil
	}
}

// The throughput pair: many calls in flight at once. Both report the
// write syscalls of the answering side's connection per call.
func BenchmarkRawRequestParallel(b *testing.B) {
	url := natstest.Start(b)
	side := natstest.Dial(b, url)
	work, writes := natstest.DialCounting(b, url)
	sub, _ := work.Subscribe("raw.echo", func(m *nats.Msg) { m.Respond(m.Data) })
	defer sub.Unsubscribe()
	work.Flush()
	body := []byte(natstest.Manifest)
	countWrites(b, writes, func() {
		parallel(b, func() error { _, err := side.Request("raw.echo", body, 5*time.Second); return err })
	})
}

func BenchmarkDispatchParallel(b *testing.B) {
	url := natstest.Start(b)
	side := natstest.Dial(b, url)
	work, writes := natstest.DialCounting(b, url)
	natstest.Worker(b, work, map[string]tool.Handler{"echo": func(ctx context.Context, c *tool.Call) ([]byte, error) { return c.Manifest, nil }},
		worker.WithConcurrency(256))
	c := open(b, side)
	countWrites(b, writes, func() { parallel(b, dispatch(c, natstest.Request("echo", 5*time.Second))) })
}

// countWrites runs bench and reports the writes counted meanwhile per call.
func countWrites(b *testing.B, writes *atomic.Int64, bench func()) {
	before := writes.Load()
	bench()
	b.ReportMetric(float64(writes.Load()-before)/float64(b.N), "responder-writes/op")
}

func BenchmarkDispatchDurableParallel(b *testing.B) {
	parallel(b, dispatch(durableClient(b, 256), natstest.Request("echo", 5*time.Second)))
}

// BenchmarkDispatchBareResponderParallel isolates the sidecar side: the
// sidecar's Dispatch against a bare responder (no worker library).
func BenchmarkDispatchBareResponderParallel(b *testing.B) {
	side, work := natstest.Connect(b)
	sub, _ := work.Subscribe("t.echo", func(m *nats.Msg) { m.Respond(m.Data) })
	defer sub.Unsubscribe()
	work.Flush()
	parallel(b, dispatch(open(b, side), natstest.Request("echo", 5*time.Second)))
}
