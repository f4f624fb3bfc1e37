package openaiup_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/anthropicsim"
	"github.com/projectdavid/toolsidecar/sim/openaisim"
	"github.com/projectdavid/toolsidecar/sim/responsesim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// TestHostileArgumentsOtherAPIs is TestHostileUpstream's first case
// through the Responses and Messages APIs: a call whose arguments grow
// past executor.max_args_bytes gets its own invalid_args outcome while
// its siblings run, the upstream's contract log stays empty, and the
// sidecar stays ready.
func TestHostileArgumentsOtherAPIs(t *testing.T) {
	user := script([][]map[string]any{{
		{"name": "echo", "arguments": map[string]any{"i": 0}},
		{"name": "echo", "arguments": map[string]any{"i": 1, "blob": strings.Repeat("z", 300<<10)}},
		{"name": "echo", "arguments": map[string]any{"i": 2}},
	}}, "")
	check := func(t *testing.T, runs *atomic.Int64, text string, err error, url string) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		parts := strings.Split(text, " | ")
		if len(parts) != 3 || !strings.Contains(parts[0], `"i":0`) || !strings.Contains(parts[1], "invalid_args") || !strings.Contains(parts[2], `"i":2`) {
			t.Errorf("the answer %.300q, want the three outputs in call order, the second invalid_args", text)
		}
		if runs.Load() != 2 {
			t.Errorf("the tool ran %d times, want 2 (not the huge call)", runs.Load())
		}
		testenv.WaitLive(t, url, "echo")
	}
	t.Run("responses", func(t *testing.T) {
		var runs atomic.Int64
		s := startResponses(t, responsesim.Config{}, testenv.Options{}, echoTool("echo", 0, &runs))
		got, err := s.accumulate(t, responsesParams(user, false))
		text := ""
		if got != nil {
			text = got.OutputText()
		}
		check(t, &runs, text, err, s.env.URL)
		s.assertContract(t)
	})
	t.Run("messages", func(t *testing.T) {
		var runs atomic.Int64
		s := startMessages(t, anthropicsim.Config{}, testenv.Options{}, echoTool("echo", 0, &runs))
		got, err := s.accumulate(t, messagesParams(false, userText(user)))
		check(t, &runs, textOf(got), err, s.env.URL)
		s.assertContract(t)
	})
}

// TestLargeTurn: a turn whose calls are each within
// executor.max_args_bytes but together larger than the bound of an event
// that carries one call, through the two APIs where one event can carry
// them all: Chat Completions from Ollama, which sends every call of a turn
// in one chunk, and Responses, whose terminal event repeats every item.
// The turn is read, its calls run once each and the run is answered,
// journaled or not. (Before those events got a turn's bound, the run
// failed: "an event of 164578 bytes, over the limit of 131072".)
func TestLargeTurn(t *testing.T) {
	const calls, maxArgs = 5, 32 << 10 // each call's arguments under maxArgs, the five over 2*maxArgs+64 KiB
	var large []openaisim.Call
	for k := range calls {
		large = append(large, openaisim.Call{Name: "take", Args: fmt.Sprintf(`{"i": %d, "blob": "%s"}`, k, strings.Repeat("z", maxArgs-100))})
	}
	for _, tc := range []struct {
		api     string
		durable bool
	}{{apiChat, false}, {apiResponses, false}, {apiResponses, true}} {
		t.Run(fmt.Sprintf("api=%s/durable=%v", tc.api, tc.durable), func(t *testing.T) {
			var runs atomic.Int64
			take := testenv.Tool{Config: config.Tool{Name: "take", Description: "takes a blob"},
				Handler: func(context.Context, *tool.Call) ([]byte, error) {
					runs.Add(1)
					return []byte(`"taken"`), nil
				}}
			opts := testenv.Options{Executor: config.Executor{MaxArgsBytes: maxArgs}, Config: func(c *config.Config) { c.Durability.Enabled = tc.durable }}
			var text string
			var err error
			var contract func() []openaisim.Violation
			if tc.api == apiChat {
				m := &toolMessages{calls: large}
				s := start(t, openaisim.Config{Profile: openaisim.Ollama, Model: m.model}, opts, take)
				var got openai.ChatCompletion
				if got, err = s.streamChat(t, params("go")); err == nil {
					text = got.Choices[0].Message.Content
				}
				contract = s.sim.Violations
			} else {
				model := func(r responsesim.Request) responsesim.Reply {
					for _, it := range r.Items {
						if strings.Contains(string(it), `"function_call_output"`) {
							return responsesim.Reply{Content: "done"}
						}
					}
					return responsesim.Reply{Calls: large}
				}
				s := startResponses(t, responsesim.Config{Model: model}, opts, take)
				var got *responses.Response
				if got, err = s.accumulate(t, responsesParams("go", false)); err == nil {
					text = got.OutputText()
				}
				contract = s.sim.Violations
			}
			if err != nil {
				t.Fatal(err)
			}
			if text != "done" || runs.Load() != calls {
				t.Fatalf("answer %q after %d runs, want done after %d", text, runs.Load(), calls)
			}
			assertClean(t, contract())
		})
	}
}
