package demo

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDemo runs the whole demo in process and checks the transcript says
// what the README promises.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	if err := Run(context.Background(), &out); err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{
		"turn 1", "turn 2",
		"invalid_args: invalid arguments for tool \"get_flight_times\":",
		"not_found: unknown tool \"get_weather\"",
		"tool_error: no seats left on UA 512",
		"batch of turn 1: 6 calls (3 ok, 3 error outcomes), all submitted in call order",
		"contract log: 0 violations",
		`"hotels": ["The Plaza", "Pod 51"]`,
		"completed after 2 turns",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("transcript lacks %q:\n%s", want, s)
		}
	}
	// The hotel search outlives its 1s timeout thanks to progress.
	m := regexp.MustCompile(`← search_hotels\s+\S+\s+(\d+)ms attempts=1  ok`).FindStringSubmatch(s)
	if m == nil || len(m[1]) < 4 {
		t.Errorf("search_hotels did not succeed past its timeout:\n%s", s)
	}
}
