package executor_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sim/coresim"
)

// TestPacedUnderShippedLimit: behind a front that limits the sidecar's
// address as Core's shipped nginx does (30 requests a minute, burst 20,
// nodelay, 503 without Retry-After), a 16-call run completes with one
// output per call and every Action final, and the requests the front
// refused stay under half those it let through. The time the run took is
// reported beside the time the limit allows for its requests (those past
// the burst, at the limit's rate). With a submit budget the limit cannot
// meet, the run ends interrupted, its outcomes kept.
func TestPacedUnderShippedLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("about a minute and a half: the shipped limit lets one request through every 2 s")
	}
	lim := coresim.ShippedLimit
	batch := calls(slices.Repeat([]string{"echo"}, 16)...)
	t.Run("completes", func(t *testing.T) {
		h := newHarness(t, twoTurns(batch...), config.Executor{}, spec{config.Tool{Name: "echo"}, echo})
		h.sim.SetRateLimit(lim) // the application's set-up is done
		start := time.Now()
		sum, err := h.drive(context.Background())
		took := time.Since(start)
		accepted, refused := h.sim.LimitCounts()
		allowed := time.Duration(float64(max(0, accepted-int(lim.Burst)-1)) / (lim.PerMinute / 60) * float64(time.Second))
		t.Logf("%d requests accepted (%.2f per call), %d refused; the run took %s, the limit allows %s for its requests (%.2f ×)",
			accepted, float64(accepted)/16, refused, took.Round(100*time.Millisecond), allowed, took.Seconds()/allowed.Seconds())
		if err != nil || sum.Status != executor.StatusCompleted {
			t.Fatalf("the run ended %s: %s (err %v)", sum.Status, sum.Error, err)
		}
		h.assertWholeBatches(16)
		if 2*refused >= accepted {
			t.Errorf("the front refused %d requests and let %d through: the sidecar hammered it (want fewer than half refused)", refused, accepted)
		}
	})
	t.Run("budget cannot be met", func(t *testing.T) {
		h := newHarness(t, twoTurns(batch...), config.Executor{SubmitBudget: 3 * time.Second}, spec{config.Tool{Name: "echo"}, echo})
		h.sim.SetRateLimit(lim)
		sum, err := h.drive(context.Background())
		if sum.Status != executor.StatusInterrupted {
			t.Fatalf("the run ended %s: %s (err %v), want interrupted", sum.Status, sum.Error, err)
		}
	})
}
