package openaiup_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/openaisim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// TestOpenAIInvariantUnderFaults: runs of random width, with read-only
// calls of random latency and unsafe ones, against an upstream that cuts
// streams at random chunks, answers 429 with Retry-After and 503, and
// sends error events. The application retries with its Idempotency-Key
// until it is answered. For every run: the answer is the one a run without
// faults gives, every unsafe call ran once and every read-only call at
// most twice, no delivered turn was asked again, and the upstream's
// contract log (every tool_call_id answered once, roles in order, the
// conversation replayed unchanged) is empty. SIGKILLs of the sidecar are
// TestOpenAISIGKILL's (cmd/toolsidecar), in a process of their own.
//
// PROPERTY_SEEDS sets the number of seeds (make soak runs many);
// PROPERTY_SEED replays one. A failure names its seed.
func TestOpenAIInvariantUnderFaults(t *testing.T) {
	seeds, first := 3, uint64(time.Now().UnixNano())
	if s := os.Getenv("PROPERTY_SEEDS"); s != "" {
		seeds, _ = strconv.Atoi(s)
	}
	if s := os.Getenv("PROPERTY_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		first, seeds = v, 1
	}
	var mu sync.Mutex
	ran := map[string]int{} // by tool and arguments
	counted := func(ctx context.Context, c *tool.Call) ([]byte, error) {
		mu.Lock()
		ran[c.Tool+string(c.Args)]++
		mu.Unlock()
		var a struct{ Ms int }
		_ = json.Unmarshal(c.Args, &a)
		select {
		case <-time.After(time.Duration(a.Ms) * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return testenv.Echo(ctx, c)
	}
	s := start(t, openaisim.Config{}, testenv.Options{Config: func(c *config.Config) { c.Upstream.RetryBudget = 20 * time.Second }},
		testenv.Tool{Config: config.Tool{Name: "look", Description: "reads", SideEffects: config.ReadOnly}, Handler: counted},
		testenv.Tool{Config: config.Tool{Name: "pay", Description: "pays", SideEffects: config.Unsafe}, Handler: counted})
	for i := range seeds {
		seed := first + uint64(i)
		rng := rand.New(rand.NewPCG(seed, seed))
		var round []map[string]any
		for k := range 1 + rng.IntN(6) {
			name := []string{"look", "pay"}[rng.IntN(2)]
			round = append(round, map[string]any{"name": name, "arguments": map[string]any{"seed": strconv.FormatUint(seed, 10), "k": k, "ms": rng.IntN(30)}})
		}
		var faults []openaisim.Fault
		for range rng.IntN(4) {
			switch rng.IntN(4) {
			case 0:
				faults = append(faults, openaisim.Fault{CutAfter: 1 + rng.IntN(12)})
			case 1:
				faults = append(faults, openaisim.Fault{Status: 429, RetryAfter: "0"})
			case 2:
				faults = append(faults, openaisim.Fault{Status: 503})
			default:
				faults = append(faults, openaisim.Fault{ErrorAfter: 1 + rng.IntN(12), ErrorMessage: "overloaded"})
			}
		}
		s.sim.Inject(faults...)
		user := script([][]map[string]any{round}, "done. ")
		var answer string
		for try := 0; ; try++ {
			got, err := s.client.Chat.Completions.New(context.Background(), params(user), withKey(fmt.Sprintf("seed-%d", seed)))
			if err == nil {
				answer = got.Choices[0].Message.Content
				break
			}
			if try == 5 {
				t.Fatalf("seed %d: still failing after %d retries: %v", seed, try, err)
			}
		}
		var parts []string
		for _, c := range round {
			parts = append(parts, fmt.Sprintf(`{"echo": %s}`, mustJSON(c["arguments"])))
		}
		if want := "done. results: " + strings.Join(parts, " | "); answer != want {
			t.Fatalf("seed %d: answer %q, want %q", seed, answer, want)
		}
		mu.Lock()
		for _, c := range round {
			b, _ := json.Marshal(c["arguments"])
			n, limit := ran[c["name"].(string)+string(b)], map[string]int{"look": 2, "pay": 1}[c["name"].(string)]
			if n < 1 || n > limit {
				t.Errorf("seed %d: %s%s ran %d times, want 1 to %d", seed, c["name"], b, n, limit)
			}
		}
		mu.Unlock()
		if n := s.sim.Repeats(); n != 0 {
			t.Fatalf("seed %d: %d delivered turns asked again", seed, n)
		}
		if v := s.sim.Violations(); len(v) > 0 {
			t.Fatalf("seed %d: contract log %+v", seed, v)
		}
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
