package agentsup_test

import (
	"slices"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/testkit/matrix"
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
