package coresim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/core"
)

// rawTurn posts a completions request and returns the raw body.
func (f *fixture) rawTurn(t *testing.T, req core.CompletionRequest) (int, string) {
	t.Helper()
	body, _ := json.Marshal(req)
	resp, err := http.Post(f.url+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestStreamQuirks(t *testing.T) {
	cases := []struct {
		name string
		turn Turn
		want string // exact body, with R for the run id
	}{
		{"in-band error then DONE", Turn{Error: "Stream error: boom"},
			"data: {\"type\": \"status\", \"status\": \"started\", \"run_id\": \"R\"}\n\ndata: {\"type\": \"error\", \"content\": \"Stream error: boom\", \"run_id\": \"R\"}\n\ndata: [DONE]\n\n"},
		{"router exception without DONE", Turn{Content: "partial", RouterError: "boom"},
			"data: {\"type\": \"status\", \"status\": \"started\", \"run_id\": \"R\"}\n\ndata: {\"type\": \"content\", \"content\": \"partial\", \"run_id\": \"R\"}\n\ndata: {\"type\": \"error\", \"run_id\": \"R\", \"message\": \"boom\"}\n\n"},
		{"dropped connection", Turn{Reasoning: "hmm", Content: "never", DropAfter: 2},
			"data: {\"type\": \"status\", \"status\": \"started\", \"run_id\": \"R\"}\n\ndata: {\"type\": \"reasoning\", \"content\": \"hmm\", \"run_id\": \"R\"}\n\n"},
		{"text turn", Turn{Content: "caf\u00e9 \U0001F600 <b>&"},
			"data: {\"type\": \"status\", \"status\": \"started\", \"run_id\": \"R\"}\n\ndata: {\"type\": \"content\", \"content\": \"caf\\u00e9 \\ud83d\\ude00 <b>&\", \"run_id\": \"R\"}\n\ndata: {\"type\": \"status\", \"status\": \"processing\", \"run_id\": \"R\"}\n\ndata: {\"type\": \"status\", \"status\": \"complete\", \"run_id\": \"R\"}\n\ndata: [DONE]\n\n"},
		{"non-JSON args coerced", Turn{FrameDelay: time.Millisecond, Calls: []Call{{ID: "call_1", Tool: "t", ArgsJSON: "not json"}}},
			"data: {\"type\": \"status\", \"status\": \"started\", \"run_id\": \"R\"}\n\ndata: {\"type\": \"tool_call\", \"content\": {\"name\": \"t\", \"arguments\": \"{\\\"raw\\\": \\\"not json\\\"}\"}, \"run_id\": \"R\"}\n\ndata: {\"type\": \"status\", \"status\": \"processing\", \"run_id\": \"R\"}\n\ndata: {\"type\": \"tool_call_manifest\", \"run_id\": \"R\", \"action_id\": \"act_0000000000000000000006\", \"tool_call_id\": \"call_1\", \"tool\": \"t\", \"args\": {\"raw\": \"not json\"}}\n\ndata: [DONE]\n\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t, Scenario{Turns: []Turn{tc.turn}})
			status, body := f.rawTurn(t, f.req)
			want := strings.ReplaceAll(tc.want, "\"R\"", "\""+f.req.RunID+"\"")
			if status != 200 || body != want {
				t.Errorf("status %d body:\n%s\nwant:\n%s", status, body, want)
			}
		})
	}
}

func TestCompletionsRejections(t *testing.T) {
	f := setup(t, Scenario{Turns: []Turn{{HTTPStatus: 503}}})
	bad := func(mut func(*core.CompletionRequest)) core.CompletionRequest {
		r := f.req
		mut(&r)
		return r
	}
	cases := []struct {
		name string
		req  core.CompletionRequest
		want int
		body string
	}{
		{"unknown run", bad(func(r *core.CompletionRequest) { r.RunID = "run_x" }), 404, "Run not found."},
		{"thread mismatch", bad(func(r *core.CompletionRequest) { r.ThreadID = "thread_x" }), 403, "Thread ID does not match the run."},
		{"assistant mismatch", bad(func(r *core.CompletionRequest) { r.AssistantID = "asst_x" }), 403, "Assistant ID does not match the run."},
		{"model prefix", bad(func(r *core.CompletionRequest) { r.Model = "gpt-4" }), 500, "Invalid or unknown model identifier prefix"},
		{"scripted status", f.req, 503, "scripted HTTP 503"},
	}
	for _, tc := range cases {
		status, body := f.rawTurn(t, tc.req)
		if status != tc.want || !strings.Contains(body, tc.body) {
			t.Errorf("%s: %d %s, want %d %s", tc.name, status, body, tc.want, tc.body)
		}
	}
	resp, _ := http.Post(f.url+"/v1/completions", "application/json", strings.NewReader("{"))
	resp.Body.Close()
	if resp.StatusCode != 422 {
		t.Errorf("malformed body: %d, want 422", resp.StatusCode)
	}
	// Past the end of the script: an in-band error, then [DONE].
	_, body := f.rawTurn(t, f.req)
	if !strings.Contains(body, "scenario has no turn 2") || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Errorf("exhausted scenario body %q", body)
	}
}

func TestAuthAndBodyLimit(t *testing.T) {
	sim, srv := NewServer(Config{APIKey: "k", Scenario: threeCalls(), MaxBodyBytes: 64})
	defer srv.Close()
	noKey, _ := core.New(core.Config{URL: srv.URL})
	if _, err := noKey.CreateThread(context.Background()); core.StatusCode(err) != 401 {
		t.Errorf("without key: %v, want 401", err)
	}
	c, _ := core.New(core.Config{URL: srv.URL, APIKey: "k"})
	_, err := c.CreateAssistant(context.Background(), core.AssistantCreate{Name: strings.Repeat("n", 100), Model: "vllm/x"})
	if core.StatusCode(err) != 413 {
		t.Errorf("large body: %v, want 413", err)
	}
	if n := sim.CountRequests("POST", "/v1/"); n != 2 {
		t.Errorf("recorded %d POSTs, want 2", n)
	}
}

func TestNotFoundAndCancel(t *testing.T) {
	f := setup(t, threeCalls())
	ctx := context.Background()
	checks := []struct {
		name string
		err  error
		want int
	}{}
	_, err := f.c.GetAssistant(ctx, "asst_x")
	checks = append(checks, struct {
		name string
		err  error
		want int
	}{"assistant", err, 404})
	_, err = f.c.GetRun(ctx, "run_x")
	checks = append(checks, struct {
		name string
		err  error
		want int
	}{"run", err, 404})
	_, err = f.c.CreateMessage(ctx, "thread_x", f.req.AssistantID, "hi")
	checks = append(checks, struct {
		name string
		err  error
		want int
	}{"message thread", err, 404})
	_, err = f.c.SubmitToolOutput(ctx, core.ToolOutput{ThreadID: "thread_x"})
	checks = append(checks, struct {
		name string
		err  error
		want int
	}{"tool output thread", err, 404})
	_, err = f.c.CreateRun(ctx, core.RunCreate{AssistantID: "asst_x", ThreadID: f.req.ThreadID})
	checks = append(checks, struct {
		name string
		err  error
		want int
	}{"run assistant", err, 404})
	_, err = f.c.CreateRun(ctx, core.RunCreate{AssistantID: f.req.AssistantID, ThreadID: "thread_x"})
	checks = append(checks, struct {
		name string
		err  error
		want int
	}{"run thread", err, 404})
	_, err = f.c.CancelRun(ctx, "run_x")
	checks = append(checks, struct {
		name string
		err  error
		want int
	}{"cancel", err, 404})
	for _, c := range checks {
		if core.StatusCode(c.err) != c.want {
			t.Errorf("%s: %v, want %d", c.name, c.err, c.want)
		}
	}
	a, err := f.c.GetAssistant(ctx, f.req.AssistantID)
	if err != nil || a.Model != "vllm/qwen" || len(a.Tools) != 1 {
		t.Errorf("assistant %+v %v", a, err)
	}
	r, err := f.c.CancelRun(ctx, f.req.RunID)
	if err != nil || r.Status != core.RunCancelled {
		t.Fatalf("cancel %+v %v", r, err)
	}
	if _, err := f.c.CancelRun(ctx, f.req.RunID); core.StatusCode(err) != 400 {
		t.Errorf("second cancel: %v, want 400 Run is already finished", err)
	}
}

// TestCancelDuringStream: the stream stops at the next frame and still ends
// with [DONE]; manifests not yet sent are never created.
func TestCancelDuringStream(t *testing.T) {
	sc := threeCalls()
	sc.Turns[0].FrameDelay = 150 * time.Millisecond
	f := setup(t, sc)
	s, err := f.c.Stream(context.Background(), f.req)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var manifests int
	for {
		c, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("stream ended with %v, want [DONE]", err)
		}
		if c.Kind == core.KindManifest {
			manifests++
			f.sim.Cancel(f.req.RunID)
		}
	}
	if manifests != 1 || len(f.sim.Actions(f.req.RunID)) != 1 {
		t.Errorf("manifests %d, actions %d; want 1 and 1", manifests, len(f.sim.Actions(f.req.RunID)))
	}
	r, _ := f.c.GetRun(context.Background(), f.req.RunID)
	if r.Status != core.RunCancelled {
		t.Errorf("status %q, want cancelled", r.Status)
	}
}

func TestBranchOnResults(t *testing.T) {
	sc := Scenario{Turns: []Turn{
		{Calls: []Call{{Tool: "lookup", Args: map[string]any{"q": "x"}}}},
		{Content: "plain", When: []Branch{{ResultContains: "error", Turn: Turn{Content: "recovering"}}}},
	}}
	for result, want := range map[string]string{`{"error": "down"}`: "recovering", `{"ok": 1}`: "plain"} {
		f := setup(t, sc)
		ms, _, _ := f.turn(t)
		f.submit(t, ms[0], result, true)
		if _, content, _ := f.turn(t); content != want {
			t.Errorf("result %s: content %q, want %q", result, content, want)
		}
	}
}

func TestScenarioFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "s.yaml")
	os.WriteFile(good, []byte("name: s\nturns:\n  - calls: [{tool: a, args: {x: 1}}]\n    frame_delay: 5ms\n  - content: done\n"), 0o600)
	sc, err := LoadScenario(good)
	if err != nil || len(sc.Turns) != 2 || sc.Turns[0].FrameDelay != 5*time.Millisecond || string(sc.Turns[0].Calls[0].argsJSON()) != `{"x":1}` {
		t.Fatalf("scenario %+v %v", sc, err)
	}
	js := filepath.Join(dir, "s.json")
	os.WriteFile(js, []byte(`{"name": "j", "turns": [{"content": "hi"}]}`), 0o600)
	if sc, err := LoadScenario(js); err != nil || sc.Turns[0].Content != "hi" {
		t.Fatalf("json scenario %+v %v", sc, err)
	}
	for name, data := range map[string]string{"unknown key": "turns: [{contnet: x}]", "no turns": "name: x", "not yaml": "[["} {
		if _, err := ParseScenario([]byte(data)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := LoadScenario(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("missing file accepted")
	}
	if d := DefaultScenario(); len(d.Turns) != 2 || len(d.Turns[0].Calls) != 3 {
		t.Errorf("default scenario %+v", d)
	}
	if got := string((Call{}).argsJSON()); got != "{}" {
		t.Errorf("empty args %s", got)
	}
}

func TestDumps(t *testing.T) {
	cases := map[string]any{
		`{"a": [1, 2.50, {"b": null}], "c": true, "d": "\u00e9\t\"\\"}`: json.RawMessage(`{"a":[1,2.50,{"b":null}],"c":true,"d":"é\t\"\\"}`),
		`"\u0001\b\f\r\u007f"`:   "\x01\b\f\r\x7f",
		`[{"n": 3, "f": false}]`: []object{{{"n", 3}, {"f", false}}},
		`null`:                   nil,
	}
	for want, in := range cases {
		if got := string(dumps(in)); got != want {
			t.Errorf("dumps(%v) = %s, want %s", in, got, want)
		}
	}
}

// TestShippedScenario keeps the example scenario file loadable and equal to
// the built-in default.
func TestShippedScenario(t *testing.T) {
	sc, err := LoadScenario("testdata/flights.yaml")
	if err != nil {
		t.Fatal(err)
	}
	def := DefaultScenario()
	if len(sc.Turns) != len(def.Turns) || sc.Turns[0].Calls[2].ArgsJSON != def.Turns[0].Calls[2].ArgsJSON || sc.Turns[1].Content != def.Turns[1].Content {
		t.Errorf("testdata/flights.yaml drifted from DefaultScenario")
	}
}

// TestScenarioFaults: faults declared in a scenario file are armed at
// start and spent by matching requests only.
func TestScenarioFaults(t *testing.T) {
	sc, err := ParseScenario([]byte("turns: [{content: hi}]\nfaults:\n  - {method: POST, path: /v1/threads, status: 503, times: 2, retry_after: \"1\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, srv := NewServer(Config{Scenario: sc})
	defer srv.Close()
	post := func(path string) *http.Response {
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(`{"meta_data": {}}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for i := range 2 {
		if r := post("/v1/threads"); r.StatusCode != 503 || r.Header.Get("Retry-After") != "1" {
			t.Fatalf("request %d: %d %q, want 503 with Retry-After", i, r.StatusCode, r.Header.Get("Retry-After"))
		}
	}
	if r := post("/v1/threads"); r.StatusCode != 200 {
		t.Errorf("third request: %d, want 200 (the fault is spent)", r.StatusCode)
	}
}
