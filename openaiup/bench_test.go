package openaiup_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/openaisim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// BenchmarkBatch streams chat completions whose first turn calls a tool
// that takes 200 ms, once or 16 times, then answers: the 16 calls run as
// one parallel batch, so a run of 16 should take about as long as a run
// of one. upstream=process serves the simulator from a process of its
// own, as a model server is; each run fails on any contract violation.
//
//	go test ./openaiup -run '^$' -bench BenchmarkBatch -benchtime 20x
func BenchmarkBatch(b *testing.B) {
	for _, process := range []bool{false, true} {
		for _, calls := range []int{1, 16} {
			name := fmt.Sprintf("calls=%d", calls)
			if process {
				name += "/upstream=process"
			}
			b.Run(name, func(b *testing.B) {
				slow := echoTool("echo", 200*time.Millisecond, nil)
				opts := testenv.Options{Executor: config.Executor{MaxParallel: 16}}
				var s *stack
				violations := func() []openaisim.Violation { return s.sim.Violations() }
				if process {
					url, v := testenv.OpenAIProcess(b, openaisim.Config{})
					s, violations = startOn(b, nil, url, opts, slow), v
				} else {
					s = start(b, openaisim.Config{}, opts, slow)
				}
				p := params(script(echoCalls(calls), ""))
				took := make([]time.Duration, b.N)
				b.ResetTimer()
				for i := range b.N {
					began := time.Now()
					got, err := s.streamChat(b, p)
					took[i] = time.Since(began)
					if err != nil || got.Choices[0].Message.Content != wantEchoes(calls) {
						b.Fatalf("run %d: %v %+v", i, err, got.Choices)
					}
				}
				b.StopTimer()
				if v := violations(); len(v) > 0 {
					b.Fatalf("contract violations: %v", v)
				}
				slices.Sort(took)
				b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/run")
				b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(took[len(took)-1].Microseconds())/1000, "max-ms")
			})
		}
	}
}
