package executor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/coresim"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/internal/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// BenchmarkBatch drives whole runs end to end (Core simulator over HTTP,
// embedded NATS, a Go worker whose tool takes 200 ms): one batch of N
// calls, then the final answer. The design target: N=16 within 1.10× of
// N=1. "sequential" runs the same batch one call at a time, as the legacy
// SDK loop does. Durable mode (the default) and not.
//
//	go test ./executor -run '^$' -bench BenchmarkBatch -benchtime 20x
func BenchmarkBatch(b *testing.B) {
	sleep200 := func(ctx context.Context, c *tool.Call) ([]byte, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		return []byte(`{"ok": true}`), nil
	}
	for _, bc := range []struct {
		name        string
		calls       int
		maxParallel int
		durable     bool
	}{{"calls=1", 1, 16, true}, {"calls=16", 16, 16, true}, {"calls=16/sequential", 16, 1, true},
		{"calls=1/not_durable", 1, 16, false}, {"calls=16/not_durable", 16, 16, false}} {
		b.Run(bc.name, func(b *testing.B) {
			specs := make([]string, bc.calls)
			for i := range specs {
				specs[i] = fmt.Sprintf(`slow {"i": "%d"}`, i)
			}
			sc := coresim.Scenario{Turns: []coresim.Turn{{Calls: calls(specs...)}, {Content: "done"}}}
			h := newHarnessWith(b, sc, testenv.Options{Executor: config.Executor{MaxParallel: bc.maxParallel},
				Config: func(c *config.Config) { c.Durability.Enabled = bc.durable }}, spec{config.Tool{Name: "slow"}, sleep200})
			reqs := make([]executor.Request, b.N)
			for i := range reqs {
				reqs[i] = h.setupRun()
			}
			b.ResetTimer()
			for i := range b.N {
				sum, err := h.exec.Drive(context.Background(), reqs[i], nil)
				if err != nil || sum.Status != executor.StatusCompleted || len(sum.Calls) != bc.calls {
					b.Fatalf("drive: %+v %v", sum, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/run")
		})
	}
}
