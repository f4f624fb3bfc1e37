package agentsup_test

import (
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/testkit/matrix"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// BenchmarkHostedBlock: a block of 16 calls of a 200 ms tool against a
// block of one, from the block's announcement to its results posted, as
// the simulator (in a process of its own) saw both; each session's first
// block (one quick call) starts its watch, and its second is measured.
// Reported: the p50 of each width, the slowest 16-call block, and their
// ratios to the one-call p50 (the target: 16 calls within 1.10 × one,
// every block).
func BenchmarkHostedBlock(b *testing.B) {
	for _, kind := range kinds {
		b.Run(kind, func(b *testing.B) {
			served := matrix.Serve(b, matrix.NATS, matrix.Tool{Name: "w", SideEffects: config.ReadOnly, Echo: true})
			h := apart(b, kind).start(b, testenv.Options{}, served.EnvTools(10*time.Second)...)
			took := map[int][]time.Duration{}
			for b.Loop() {
				for _, n := range []int{1, 16} {
					var block []map[string]any
					for k := range n {
						block = append(block, map[string]any{"name": "w", "arguments": map[string]any{"k": k, "ms": 200}})
					}
					rounds := [][]map[string]any{{{"name": "w", "arguments": map[string]any{"warm": true}}}, block}
					id := h.create(b, appKey, script(rounds, "done "))
					s := h.final(b, id)
					if len(s.BlockedAt) != 2 || len(s.PostedAt) != 2 {
						b.Fatalf("session %+v", s)
					}
					took[n] = append(took[n], s.PostedAt[1].Sub(s.BlockedAt[1]))
				}
			}
			p50 := func(d []time.Duration) time.Duration { d = slices.Sorted(slices.Values(d)); return d[len(d)/2] }
			worst := func(d []time.Duration) time.Duration { return slices.Max(d) }
			b.ReportMetric(float64(p50(took[1]).Milliseconds()), "p50-1call-ms")
			b.ReportMetric(float64(p50(took[16]).Milliseconds()), "p50-16calls-ms")
			b.ReportMetric(float64(worst(took[16]).Milliseconds()), "worst-16calls-ms")
			b.ReportMetric(float64(p50(took[16]))/float64(p50(took[1])), "p50-ratio")
			b.ReportMetric(float64(worst(took[16]))/float64(p50(took[1])), "worst16-per-p50-1")
		})
	}
}

// BenchmarkWatchedSessions: 1,000 sessions created through one sidecar
// (in this process; the simulator in its own), each then idle and
// watched (its stream open): the heap in use and the goroutines each
// watch adds, and the CPU time the process spends per session per
// second while they wait.
func BenchmarkWatchedSessions(b *testing.B) {
	const sessions = 1000
	for _, kind := range kinds {
		b.Run(kind, func(b *testing.B) {
			served := matrix.Serve(b, matrix.NATS, matrix.Tool{Name: "w", SideEffects: config.ReadOnly, Echo: true})
			h := apart(b, kind).start(b, testenv.Options{Config: func(c *config.Config) { c.Upstream.MaxSessions = 2 * sessions }},
				served.EnvTools(10*time.Second)...)
			for b.Loop() {
				heap0, goroutines0 := inUse()
				ids := make(chan string, sessions)
				var wg sync.WaitGroup
				for range 8 {
					wg.Go(func() {
						for range sessions / 8 {
							ids <- h.create(b, appKey, "hello")
						}
					})
				}
				wg.Wait()
				close(ids)
				for id := range ids {
					poll.Until(b, "the watch of "+id, func() bool { return h.session(id).Streams == 1 })
				}
				heap1, goroutines1 := inUse()
				cpu0 := cpuTime()
				time.Sleep(5 * time.Second)
				cpu := cpuTime() - cpu0
				b.ReportMetric(float64(heap1-heap0)/sessions/1024, "heap-KiB/session")
				b.ReportMetric(float64(goroutines1-goroutines0)/sessions, "goroutines/session")
				b.ReportMetric(float64(cpu.Microseconds())/5/sessions, "cpu-us/session/s")
			}
		})
	}
}

// inUse is the heap in use after a collection, and the goroutines.
func inUse() (uint64, int) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse, runtime.NumGoroutine()
}

// cpuTime is the CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
