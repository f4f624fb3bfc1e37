package agentsup_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/agentssim"
	"github.com/projectdavid/toolsidecar/testkit/matrix"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// TestRandomizedHostedSessions: on each hosted kind, rounds of sessions
// at once on one sidecar, each drawn at random: one to three blocks of
// one to eight calls, over two tools whose routes are drawn from every
// route kind; and faults drawn at random on the upstream: every event
// delivered twice, the watch's stream cut at some event, 429 and 5xx on
// result posts, OpenAI's pending-call race. Whatever was drawn, every
// session ends its turn, each call is answered exactly once, each block
// in one accepted post, and the contract log stays empty. The seed is
// logged: TSC_SEED=<n> draws the same again.
func TestRandomizedHostedSessions(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TSC_SEED"); s != "" {
		_, _ = fmt.Sscan(s, &seed)
	}
	t.Logf("seed %d (TSC_SEED=%d draws it again)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	each(t, func(t *testing.T, kind string) {
		for round := range 2 {
			t.Run(fmt.Sprint("round=", round), func(t *testing.T) {
				cfg := simConfig{Duplicate: rng.IntN(2) == 0}
				if kind == config.UpstreamOpenAIAgents {
					cfg.RaceRejects = rng.IntN(3)
				}
				var tools []testenv.Tool
				names := []string{"p", "q"}
				for _, name := range names {
					route := matrix.AllRoutes[rng.IntN(len(matrix.AllRoutes))]
					s := matrix.Serve(t, route, matrix.Tool{Name: name, SideEffects: config.ReadOnly, Echo: true})
					tools = append(tools, s.EnvTools(10*time.Second)...)
				}
				h := startHosted(t, kind, cfg, testenv.Options{}, tools...)
				if rng.IntN(2) == 0 {
					h.sim.CutStream(rng.IntN(6))
				}
				for range rng.IntN(3) {
					status := []int{429, 500, 503}[rng.IntN(3)]
					h.sim.Inject(agentssim.Fault{Status: status, RetryAfter: "0"})
				}
				sessions := 2 + rng.IntN(3)
				blocks := make([][]int, sessions)
				scripts := make([]string, sessions)
				for i := range sessions {
					var rounds [][]map[string]any
					for range 1 + rng.IntN(3) {
						n := 1 + rng.IntN(8)
						var calls []map[string]any
						for k := range n {
							calls = append(calls, map[string]any{"name": names[rng.IntN(2)], "arguments": map[string]any{"s": i, "k": k}})
						}
						rounds = append(rounds, calls)
						blocks[i] = append(blocks[i], n)
					}
					scripts[i] = script(rounds, "done ")
				}
				t.Logf("sim %+v, blocks %v", cfg, blocks)
				// Each create returns as the session starts: the sessions
				// run at once.
				ids := make([]string, sessions)
				for i := range sessions {
					ids[i] = h.create(t, appKey, scripts[i])
				}
				for i, id := range ids {
					s := h.final(t, id)
					if s.Status != "idle" {
						t.Fatalf("session %d (%s) ended %s", i, id, s.Status)
					}
					calls := 0
					for _, n := range blocks[i] {
						calls += n
					}
					assertOnce(t, h, s, calls, slices.Clone(blocks[i]))
				}
			})
		}
	})
}
