package coresim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/core"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a simulator plus a core client and a run set up the way an
// application sets one up.
type fixture struct {
	sim *Sim
	c   *core.Client
	url string
	req core.CompletionRequest
}

func setup(t *testing.T, sc Scenario) *fixture {
	t.Helper()
	return setupWith(t, Config{Scenario: sc})
}

// setupWith is setup with a configuration of the simulator's own.
func setupWith(t *testing.T, cfg Config) *fixture {
	t.Helper()
	cfg.APIKey = "k"
	sim, srv := NewServer(cfg)
	t.Cleanup(srv.Close)
	c, err := core.New(core.Config{URL: srv.URL, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	asst, err := c.CreateAssistant(ctx, core.AssistantCreate{Name: "a", Model: "vllm/qwen", Tools: []core.FunctionTool{{Type: "function", Function: core.Function{Name: "get_weather"}}}})
	if err != nil {
		t.Fatal(err)
	}
	th, err := c.CreateThread(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := c.CreateMessage(ctx, th.ID, asst.ID, "What is the weather?")
	if err != nil {
		t.Fatal(err)
	}
	run, err := c.CreateRun(ctx, core.RunCreate{AssistantID: asst.ID, ThreadID: th.ID})
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != core.RunQueued {
		t.Fatalf("new run status %q", run.Status)
	}
	return &fixture{sim: sim, c: c, url: srv.URL, req: core.CompletionRequest{Model: "vllm/qwen", ThreadID: th.ID, MessageID: msg.ID, RunID: run.ID, AssistantID: asst.ID}}
}

// turn streams one turn and returns its manifests, content and end error.
func (f *fixture) turn(t *testing.T) (ms []*core.Manifest, content string, end error) {
	t.Helper()
	s, err := f.c.Stream(context.Background(), f.req)
	if err != nil {
		return nil, "", err
	}
	defer s.Close()
	for {
		c, err := s.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return ms, content, nil
			}
			return ms, content, err
		}
		switch c.Kind {
		case core.KindManifest:
			ms = append(ms, c.Manifest)
		case core.KindContent:
			content += c.Text
		case core.KindError:
			content += "ERROR:" + c.Text
		}
	}
}

// submit does what the SDK's execute_pending_action does for one call.
func (f *fixture) submit(t *testing.T, m *core.Manifest, result string, post bool) {
	t.Helper()
	ctx := context.Background()
	if _, err := f.c.UpdateAction(ctx, m.ActionID, core.ActionUpdate{Status: core.ActionProcessing}); err != nil {
		t.Fatal(err)
	}
	if post {
		if _, err := f.c.SubmitToolOutput(ctx, core.ToolOutput{Content: result, ThreadID: f.req.ThreadID, AssistantID: f.req.AssistantID, ToolID: m.ActionID, ToolCallID: m.ToolCallID}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.c.UpdateAction(ctx, m.ActionID, core.ActionUpdate{Status: core.ActionCompleted, Result: map[string]any{"ok": true}}); err != nil {
		t.Fatal(err)
	}
}

func threeCalls() Scenario {
	return Scenario{Name: "weather", Turns: []Turn{
		{Content: "Checking Paris.", Calls: []Call{
			{ID: "call_1a2b3c4d", Tool: "get_weather", ArgsJSON: `{"city": "Paris"}`},
			{ID: "call_5e6f7a8b", Tool: "get_time", ArgsJSON: `{"tz":"CET"}`},
			{ID: "call_9c0d1e2f", Tool: "get_weather", ArgsJSON: `{"city": "São Paulo", "units": "metric"}`},
		}},
		{Content: "Results: {{results}}"},
	}}
}

// TestScriptedRun drives a whole run with the core client alone: a 3-call
// batch, three outputs in call order, then the final answer. The contract
// log must stay empty; leaving one output out must record exactly that.
func TestScriptedRun(t *testing.T) {
	for _, skip := range []int{-1, 0, 1, 2} {
		name := "all outputs"
		if skip >= 0 {
			name = "output " + string(rune('1'+skip)) + " left out"
		}
		t.Run(name, func(t *testing.T) {
			f := setup(t, threeCalls())
			ms, _, err := f.turn(t)
			if err != nil || len(ms) != 3 {
				t.Fatalf("turn 1: %d manifests, %v", len(ms), err)
			}
			run, _ := f.c.GetRun(context.Background(), f.req.RunID)
			if run.Status != core.RunActionRequired {
				t.Errorf("run status after a tool turn %q, want action_required", run.Status)
			}
			for i, m := range ms {
				f.submit(t, m, "result "+m.ToolCallID, i != skip)
			}
			_, content, err := f.turn(t)
			if err != nil {
				t.Fatal(err)
			}
			v := f.sim.Violations()
			if skip < 0 {
				if len(v) != 0 {
					t.Fatalf("violations %v", v)
				}
				want := "Results: result call_1a2b3c4d\nresult call_5e6f7a8b\nresult call_9c0d1e2f"
				if content != want {
					t.Errorf("final content %q, want %q", content, want)
				}
				run, _ := f.c.GetRun(context.Background(), f.req.RunID)
				if run.Status != core.RunCompleted {
					t.Errorf("run status %q, want completed", run.Status)
				}
				return
			}
			// The Action was finalised with no output, then the next turn
			// was asked for: both are recorded, for that call only.
			if len(v) != 2 || v[0].Kind != ViolationFinalisedWithoutOutput || v[1].Kind != ViolationMissingOutput ||
				v[0].ToolCallID != ms[skip].ToolCallID || v[1].ToolCallID != ms[skip].ToolCallID {
				t.Fatalf("violations %v, want finalised_without_output and missing_output for %s", v, ms[skip].ToolCallID)
			}
		})
	}
}

// TestGoldenBatchTranscript compares the simulator's bytes for a 3-call
// batch with a transcript written by hand from core-protocol.md.
func TestGoldenBatchTranscript(t *testing.T) {
	f := setup(t, threeCalls())
	body, _ := json.Marshal(f.req)
	resp, err := http.Post(f.url+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	want, _ := os.ReadFile("testdata/batch3.sse")
	if !bytes.Equal(got, want) {
		t.Errorf("transcript differs:\n got:\n%s\nwant:\n%s", got, want)
	}
	for _, h := range []string{"Content-Type: text/event-stream", "Cache-Control: no-cache", "X-Accel-Buffering: no"} {
		k, v, _ := strings.Cut(h, ": ")
		if resp.Header.Get(k) != v {
			t.Errorf("header %s = %q, want %q", k, resp.Header.Get(k), v)
		}
	}
}

// TestListRuns: GET /v1/runs as Core answers it, through the client: a
// user's runs only, by creation time either way, limit bounds, has_more,
// and the status a cancel left.
func TestListRuns(t *testing.T) {
	sim, srv := NewServer(Config{PerKeyUsers: true})
	t.Cleanup(srv.Close)
	c, err := core.New(core.Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	alice, bob := core.AsCaller(context.Background(), "alice"), core.AsCaller(context.Background(), "bob")
	newRun := func(ctx context.Context) string {
		t.Helper()
		asst, err := c.CreateAssistant(ctx, core.AssistantCreate{Name: "a", Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		th, err := c.CreateThread(ctx)
		if err != nil {
			t.Fatal(err)
		}
		run, err := c.CreateRun(ctx, core.RunCreate{AssistantID: asst.ID, ThreadID: th.ID})
		if err != nil {
			t.Fatal(err)
		}
		return run.ID
	}
	var mine []string
	for i := range 3 {
		mine = append(mine, newRun(alice))
		if i == 0 {
			newRun(bob) // between alice's runs, and not hers
		}
	}
	sim.Cancel(mine[1])
	ids := func(l core.RunList) []string {
		var out []string
		for _, r := range l.Data {
			out = append(out, r.ID)
		}
		return out
	}

	newest, err := c.ListRuns(alice, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(newest); !slices.Equal(got, []string{mine[2], mine[1]}) || !newest.HasMore || newest.FirstID != mine[2] || newest.LastID != mine[1] {
		t.Errorf("newest 2: %v has_more %v first %q last %q; want %v, true", got, newest.HasMore, newest.FirstID, newest.LastID, []string{mine[2], mine[1]})
	}
	if newest.Data[1].Status != core.RunCancelled {
		t.Errorf("cancelled run listed as %q", newest.Data[1].Status)
	}
	oldest, err := c.ListRuns(alice, 100, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(oldest); !slices.Equal(got, mine) || oldest.HasMore {
		t.Errorf("oldest 100: %v has_more %v, want %v, false", got, oldest.HasMore, mine)
	}
	none, err := c.ListRuns(core.AsCaller(context.Background(), "carol"), 5, true)
	if err != nil || len(none.Data) != 0 || none.FirstID != "" {
		t.Errorf("a user with no runs: %+v, %v", none, err)
	}
	for _, limit := range []int{0, core.MaxRunList + 1} {
		if _, err := c.ListRuns(alice, limit, true); core.StatusCode(err) != http.StatusUnprocessableEntity {
			t.Errorf("limit %d: %v, want 422 as on Core", limit, err)
		}
	}
}
