package demo

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	MaybeServeMCP() // the demo's MCP server: this test binary again
	goleak.VerifyTestMain(m)
}

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
		"get_flight_times: declared in the code of go worker ",
		"invalid_args: invalid arguments for tool \"get_flight_times\":",
		"not_found: unknown tool \"get_weather\"",
		"tool_error: no seats left on UA 512",
		"batch of turn 1: 8 calls (5 ok, 3 error outcomes), all submitted in call order",
		"hold_room         call_0000000c waits for approval",
		"approved by the demo operator: POST /v1/approvals/",
		`"confirmation": "PLZ-7731"`,
		`{"amount": 386.40, "currency": "EUR"}`,
		"contract log: 0 violations",
		`"hotels": ["The Plaza", "Pod 51"]`,
		"completed after 2 turns",
		"part 2: the same tools behind an OpenAI-compatible upstream",
		"finish_reason [stop], [DONE] 1 time(s)",
		"part 3: the same tools behind an Anthropic Messages upstream",
		"content block(s) with dense indexes (true), stop_reason end_turn, message_stop 1",
		`- (is_error) {"error":"no seats left on UA 512"`,
		"part 4: the same tools behind an OpenAI Responses upstream",
		"sequence_numbers in order (true), response.created 1,",
		"at dense indexes (true), response.completed (status completed)",
		"part 5: a hosted agent session on the OpenAI Agents API",
		"/v1/agents/sessions: session sess_1, status requires_action",
		"part 6: a hosted agent session on Anthropic Managed Agents",
		"/v1/sessions: session sesn_2, status idle",
		`get_flight_times  call_turn_1_0_2  ok  {"route":"SEA-BOS"`,
		`get_flight_times  sevt_7  ok  {"route":"SEA-BOS"`,
		`answer: Here are the flight times: {"route":"LAX-JFK"`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("transcript lacks %q:\n%s", want, s)
		}
	}
	if n := strings.Count(s, "upstream contract log: 0 violations"); n != 5 {
		t.Errorf("%d empty upstream contract logs, want one per model API and per hosted API:\n%s", n, s)
	}
	// Each hosted session's three calls were answered by the sidecar in
	// one post.
	if n := strings.Count(s, "session idle: 3 call(s) answered in 1 post(s)"); n != 2 {
		t.Errorf("%d hosted sessions answered whole, want one per hosted API:\n%s", n, s)
	}
	// Each problem of the invalid call is a line of its own under it.
	if !regexp.MustCompile(`invalid_args: invalid arguments for tool "get_flight_times":\n {20,}- at `).MatchString(s) {
		t.Errorf("the invalid call's problems are not each on an indented line under it:\n%s", s)
	}
	// The hotel search outlives its 1s timeout thanks to progress.
	m := regexp.MustCompile(`← search_hotels\s+\S+\s+(\d+)ms attempts=1  ok`).FindStringSubmatch(s)
	if m == nil || len(m[1]) < 4 {
		t.Errorf("search_hotels did not succeed past its timeout:\n%s", s)
	}
}

// TestDashboardAndAlertMetricsExist: every toolsidecar metric that the
// Grafana dashboard and the alert rules query is served after a demo run,
// so that neither can refer to a metric that was renamed or never existed.
func TestDashboardAndAlertMetricsExist(t *testing.T) {
	var out bytes.Buffer
	g, err := run(context.Background(), &out)
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for _, f := range fams {
		served[f.GetName()] = true
	}
	metric := regexp.MustCompile(`toolsidecar_[a-z0-9_]+`)
	for _, file := range []string{"../../../../deploy/helm/toolsidecar/files/dashboard.json", "../../../../deploy/helm/toolsidecar/files/alerts.yaml"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		names := metric.FindAllString(string(b), -1)
		if len(names) < 5 {
			t.Fatalf("%s queries %d metrics", file, len(names))
		}
		for _, n := range names {
			base := n
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				if s, ok := strings.CutSuffix(n, suffix); ok && served[s] {
					base = s
				}
			}
			if !served[base] {
				t.Errorf("%s queries %s, which /metrics does not serve", file, n)
			}
		}
	}
}
