package openaiup_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/anthropicsim"
	"github.com/projectdavid/toolsidecar/sim/openaisim"
	"github.com/projectdavid/toolsidecar/sim/responsesim"
	"github.com/projectdavid/toolsidecar/testkit/matrix"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// TestOpenAIInvariantUnderFaults: runs of random width, with read-only
// calls of random latency and unsafe ones, against an upstream that cuts
// streams at random events, answers 429 with Retry-After and 5xx (529
// overloaded_error for Messages), and sends error events, through each of
// the three APIs, each tool on a route drawn at random from every kind.
// The application (the API's official client; Responses and Messages
// streamed through their accumulators) retries with its Idempotency-Key
// until it is answered. For every run: the answer is the one a run
// without faults gives, every unsafe call ran once and every read-only
// call at most twice, no delivered turn was asked again, and the
// upstream's contract log (every call answered once, in its place and
// order, the conversation replayed unchanged) is empty. SIGKILLs of the
// sidecar are TestOpenAISIGKILL's (cmd/toolsidecar), in a process of their
// own.
//
// PROPERTY_SEEDS sets the number of seeds (make soak runs many);
// PROPERTY_SEED replays one. A failure names its API and seed.
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
	for _, api := range []string{apiChat, apiMessages, apiResponses} {
		t.Run("api="+api, func(t *testing.T) {
			// Each tool is served on a route drawn at random from every
			// kind, and counts its runs by arguments.
			routes := rand.New(rand.NewPCG(first, uint64(len(api))))
			look := matrix.Serve(t, matrix.AllRoutes[routes.IntN(len(matrix.AllRoutes))], matrix.Tool{Name: "look", SideEffects: config.ReadOnly, Echo: true})
			pay := matrix.Serve(t, matrix.AllRoutes[routes.IntN(len(matrix.AllRoutes))], matrix.Tool{Name: "pay", SideEffects: config.Unsafe, Echo: true})
			t.Logf("look on route %s, pay on route %s", look.Route, pay.Route)
			served := map[string]*matrix.Served{"look": look, "pay": pay}
			s := startFaulty(t, api, testenv.Options{Config: func(c *config.Config) { c.Upstream.RetryBudget = 20 * time.Second }},
				append(look.EnvTools(30*time.Second), pay.EnvTools(30*time.Second)...)...)
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
						faults = append(faults, s.serverError)
					default:
						faults = append(faults, openaisim.Fault{ErrorAfter: 1 + rng.IntN(12), ErrorMessage: "overloaded", ErrorType: "overloaded_error"})
					}
				}
				s.sim.Inject(faults...)
				user := script([][]map[string]any{round}, "done. ")
				var answer string
				for try := 0; ; try++ {
					got, err := s.ask(t, user, fmt.Sprintf("seed-%d", seed))
					if err == nil {
						answer = got
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
				for _, c := range round {
					b, _ := json.Marshal(c["arguments"])
					name := c["name"].(string)
					n, limit := served[name].Runs(name, b), map[string]int{"look": 2, "pay": 1}[name]
					if n < 1 || n > limit {
						t.Errorf("seed %d: %s%s ran %d times, want 1 to %d", seed, name, b, n, limit)
					}
				}
				if n := s.sim.Repeats(); n != 0 {
					t.Fatalf("seed %d: %d delivered turns asked again", seed, n)
				}
				if v := s.sim.Violations(); len(v) > 0 {
					t.Fatalf("seed %d: contract log %+v", seed, v)
				}
			}
		})
	}
}

// faultySim is what the three simulators share: faults to inject, the
// turns asked again, the contract log.
type faultySim interface {
	Inject(...openaisim.Fault)
	Repeats() int
	Violations() []openaisim.Violation
}

// faultyStack is a sidecar in front of one API's simulator, and its
// application: ask sends user with the Idempotency-Key key and returns
// the answer's text.
type faultyStack struct {
	sim         faultySim
	serverError openaisim.Fault // the API's 5xx
	ask         func(t *testing.T, user, key string) (string, error)
}

func startFaulty(t *testing.T, api string, opts testenv.Options, tools ...testenv.Tool) faultyStack {
	switch api {
	case apiMessages:
		s := startMessages(t, anthropicsim.Config{}, opts, tools...)
		return faultyStack{sim: s.sim, serverError: openaisim.Fault{Status: 529, Type: "overloaded_error"},
			ask: func(t *testing.T, user, key string) (string, error) {
				got, err := s.accumulate(t, messagesParams(false, userText(user)), aoption.WithHeader("Idempotency-Key", key))
				return textOf(got), err
			}}
	case apiResponses:
		s := startResponses(t, responsesim.Config{}, opts, tools...)
		return faultyStack{sim: s.sim, serverError: openaisim.Fault{Status: 500},
			ask: func(t *testing.T, user, key string) (string, error) {
				got, err := s.accumulate(t, responsesParams(user, false), withKey(key))
				if err != nil {
					return "", err
				}
				return got.OutputText(), nil
			}}
	}
	s := start(t, openaisim.Config{}, opts, tools...)
	return faultyStack{sim: s.sim, serverError: openaisim.Fault{Status: 503},
		ask: func(_ *testing.T, user, key string) (string, error) {
			got, err := s.client.Chat.Completions.New(context.Background(), params(user), withKey(key))
			if err != nil {
				return "", err
			}
			return got.Choices[0].Message.Content, nil
		}}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
