package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	sse "github.com/tmaxmax/go-sse"
	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/server"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/promtest"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sidecar is a whole sidecar (package sidecar, through testenv) and the
// base URL of its HTTP API.
type sidecar struct {
	env *testenv.Env
	url string
}

func newSidecar(t *testing.T, sc coresim.Scenario, token string, tools ...testenv.Tool) *sidecar {
	t.Helper()
	env := testenv.Start(t, sc, testenv.Options{Token: token, MaxBodyBytes: 4096}, tools...)
	return &sidecar{env: env, url: env.URL}
}

func threeCalls() coresim.Scenario {
	return coresim.Scenario{Turns: []coresim.Turn{
		{Content: "Checking.", Calls: []coresim.Call{
			{Tool: "echo", ArgsJSON: `{"q": "a"}`},
			{Tool: "fail", ArgsJSON: `{}`},
			{Tool: "echo", ArgsJSON: `{"q": "b"}`},
		}},
		{Content: "Answer: {{results}}"},
	}}
}

func standardTools() []testenv.Tool {
	return []testenv.Tool{
		{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo},
		{Config: config.Tool{Name: "fail"}, Handler: func(context.Context, *tool.Call) ([]byte, error) {
			return nil, errors.New("upstream down")
		}},
		{Config: config.Tool{Name: "idle"}}, // registered, but no worker serves it
	}
}

const wantAnswer = "Answer: {\"echo\": {\"q\": \"a\"}}\n{\"error\":\"upstream down\",\"error_type\":\"tool_error\",\"tool\":\"fail\"}\n{\"echo\": {\"q\": \"b\"}}"

// sdk is a test client that follows the Python SDK's wire behaviour
// (sdk-protocol.md sections 1-5): X-API-Key on every call, its SSE line
// rules, and its continuation loop.
type sdk struct {
	t    *testing.T
	base string
	key  string
}

func (c sdk) call(method, path string, body any, out any) {
	c.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, c.base+path, r)
	req.Header.Set("X-API-Key", c.key)
	req.Header.Set("Accept", "*/*")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(resp.Body)
		c.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	if out != nil {
		json.NewDecoder(resp.Body).Decode(out)
	}
}

// streamEvents is SynchronousInferenceStream.stream_events: it returns the
// content seen and the manifests (ToolCallRequestEvents) it would yield.
func (c sdk) streamEvents(payload map[string]any) (content string, manifests []map[string]any, requests int) {
	// One request: the SDK's generator ends at the end of the stream, and a
	// manifest that reached it would fail the test.
	requests++
	b, _ := json.Marshal(payload)
	req, _ := http.NewRequest("POST", c.base+"/v1/completions", bytes.NewReader(b))
	req.Header.Set("X-API-Key", c.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 { // raise_for_status, swallowed: the turn ends
		return
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || !strings.HasPrefix(line, "data:") {
			continue
		}
		data := strings.TrimSpace(line[len("data:"):])
		if data == "[DONE]" {
			break
		}
		var v any
		if json.Unmarshal([]byte(data), &v) != nil {
			continue
		}
		chunk, ok := v.(map[string]any)
		if !ok {
			break // chunk["run_id"] = … raises TypeError: the turn ends
		}
		switch chunk["type"] {
		case "tool_call_manifest":
			manifests = append(manifests, chunk)
		case "content":
			s, _ := chunk["content"].(string)
			content += s
		}
	}
	return
}

// TestProxyModeWithSDKClient: an unmodified SDK whose base URL is the
// sidecar gets the final content of a 2-turn, 3-call run; no tool call
// reaches it, and set-up calls are proxied to Core.
func TestProxyModeWithSDKClient(t *testing.T) {
	sc := newSidecar(t, threeCalls(), "", standardTools()...)
	c := sdk{t: t, base: sc.url, key: testenv.APIKey}
	var asst, th, msg, run struct{ ID string }
	c.call("POST", "/v1/assistants", map[string]any{"name": "a", "model": "vllm/x", "tools": sc.env.Registry.FunctionTools()}, &asst)
	c.call("POST", "/v1/threads", map[string]any{"meta_data": map[string]any{}}, &th)
	c.call("POST", "/v1/messages", map[string]any{"content": "hi", "thread_id": th.ID, "assistant_id": asst.ID, "role": "user"}, &msg)
	c.call("POST", "/v1/runs", map[string]any{"assistant_id": asst.ID, "thread_id": th.ID, "instructions": ""}, &run)
	var got struct {
		Tools []core.FunctionTool `json:"tools"`
	}
	c.call("GET", "/v1/assistants/"+asst.ID, nil, &got)
	if len(got.Tools) != 3 {
		t.Fatalf("assistant through the proxy: %+v", got)
	}
	content, manifests, requests := c.streamEvents(map[string]any{"model": "vllm/x", "api_key": nil, "thread_id": th.ID,
		"message_id": msg.ID, "run_id": run.ID, "assistant_id": asst.ID, "stream": true})
	if len(manifests) != 0 {
		t.Fatalf("a tool call reached the SDK: %v", manifests)
	}
	if requests != 1 || sc.env.Sim.CountRequests("POST", "/v1/completions") != 2 {
		t.Errorf("SDK made %d requests, Core saw %d; want 1 and 2", requests, sc.env.Sim.CountRequests("POST", "/v1/completions"))
	}
	if content != "Checking."+wantAnswer {
		t.Errorf("content %q", content)
	}
	sc.env.AssertWholeBatches(testenv.Run{RunID: run.ID, ThreadID: th.ID}, 3)
}

// TestProxyFraming: the bytes are Core's: data lines, no manifest, one
// [DONE] at the very end; a pre-stream error is Core's own answer.
func TestProxyFraming(t *testing.T) {
	sc := newSidecar(t, threeCalls(), "", standardTools()...)
	r := sc.env.NewRun()
	body := completionBody(r)
	resp, err := http.Post(sc.url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	s := string(raw)
	if resp.Header.Get("Content-Type") != "text/event-stream" || strings.Count(s, "data: [DONE]\n\n") != 1 || !strings.HasSuffix(s, "data: [DONE]\n\n") {
		t.Errorf("framing: %q", s)
	}
	if strings.Contains(s, "tool_call_manifest") {
		t.Error("a handled manifest was forwarded")
	}
	for _, frame := range strings.Split(strings.TrimSuffix(s, "\n\n"), "\n\n") {
		if !strings.HasPrefix(frame, "data: ") {
			t.Errorf("frame %q is not a data line", frame)
		}
	}
	if !strings.Contains(s, `data: {"type": "content", "content": "Checking.", "run_id": "`+r.RunID+`"}`) {
		t.Errorf("Core's own content frame is not passed verbatim: %q", s)
	}
	// A run that stops short of an answer ends with an error frame, then [DONE].
	r2 := sc.env.NewRun()
	sc.env.Core.CancelRun(context.Background(), r2.RunID)
	resp, _ = http.Post(sc.url+"/v1/completions", "application/json", strings.NewReader(completionBody(r2)))
	raw, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `"message":"toolsidecar: run cancelled: the run had already ended upstream (status cancelled)`; !strings.Contains(string(raw), want) || !strings.HasSuffix(string(raw), "data: [DONE]\n\n") {
		t.Errorf("cancelled run: %q", raw)
	}
	bad := strings.Replace(body, r.RunID, "run_missing", 1)
	resp, _ = http.Post(sc.url+"/v1/completions", "application/json", strings.NewReader(bad))
	raw, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(raw), "Run not found") {
		t.Errorf("unknown run: %d %s", resp.StatusCode, raw)
	}
}

// completionBody is the SDK's POST /v1/completions body for a run.
func completionBody(r testenv.Run) string {
	return `{"model": "vllm/x", "api_key": null, "thread_id": "` + r.ThreadID + `", "message_id": "` + r.MessageID +
		`", "run_id": "` + r.RunID + `", "assistant_id": "` + r.AssistantID + `", "stream": true}`
}

func (sc *sidecar) driveBody(r testenv.Run) string {
	b, _ := json.Marshal(executor.Request{ThreadID: r.ThreadID, AssistantID: r.AssistantID, MessageID: r.MessageID, Model: r.Model})
	return string(b)
}

func TestDriveJSON(t *testing.T) {
	sc := newSidecar(t, threeCalls(), "", standardTools()...)
	r := sc.env.NewRun()
	resp, err := http.Post(sc.url+"/v1/runs/"+r.RunID+"/drive", "application/json", strings.NewReader(sc.driveBody(r)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum executor.Summary
	json.NewDecoder(resp.Body).Decode(&sum)
	if resp.StatusCode != 200 || sum.Status != "completed" || sum.Turns != 2 || len(sum.Calls) != 3 || sum.Content != wantAnswer {
		t.Fatalf("%d %+v", resp.StatusCode, sum)
	}
	acts := sc.env.AssertWholeBatches(r, 3)
	c := sum.Calls[1]
	if c.OK || c.ErrorType != "tool_error" || c.ToolCallID != acts[1].ToolCallID || c.ActionID != acts[1].ID || c.Attempts != 1 {
		t.Errorf("call summary %+v", c)
	}

	// /metrics matches the run: 3 calls, 1 error outcome, 2 turns.
	mresp, err := http.Get(sc.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer mresp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(mresp.Body)
	if err != nil {
		t.Fatal(err)
	}
	sumOf := func(name string, labels map[string]string) float64 {
		var total float64
		for _, m := range fams[name].GetMetric() {
			match := true
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					match = false
				}
			}
			if !match {
				continue
			}
			switch {
			case m.Counter != nil:
				total += m.Counter.GetValue()
			case m.Histogram != nil:
				total += m.Histogram.GetSampleSum()
			case m.Gauge != nil:
				total += m.Gauge.GetValue()
			}
		}
		return total
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"toolsidecar_calls_total", nil, 3},
		{"toolsidecar_calls_total", map[string]string{"outcome": "tool_error", "tool": "fail"}, 1},
		{"toolsidecar_calls_total", map[string]string{"outcome": "ok", "tool": "echo"}, 2},
		{"toolsidecar_run_turns", nil, 2},
		{"toolsidecar_runs_total", map[string]string{"status": "completed"}, 1},
		{"toolsidecar_batch_size", nil, 3},
		{"toolsidecar_runs_in_flight", nil, 0},
		{"toolsidecar_calls_in_flight", nil, 0},
	}
	for _, c := range checks {
		if got := sumOf(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	var toolPosts uint64
	for _, m := range fams["toolsidecar_core_request_duration_seconds"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "endpoint" && l.GetValue() == "messages_tools" {
				toolPosts += m.Histogram.GetSampleCount()
			}
		}
	}
	if toolPosts != 3 {
		t.Errorf("core request series count %d tool outputs, want 3", toolPosts)
	}
	if fams["toolsidecar_core_stream_idle_gap_seconds"].GetMetric()[0].Histogram.GetSampleCount() == 0 {
		t.Error("no stream gaps observed")
	}
}

// sseLog is what an SSE drive delivered.
type sseLog struct {
	types          []string
	done           executor.Summary
	calls, results []executor.CallResult
}

// openSSE starts an SSE drive of the run; the response is open as soon as
// the sidecar answers, before any event.
func (sc *sidecar) openSSE(t *testing.T, r testenv.Run) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", sc.url+"/v1/runs/"+r.RunID+"/drive", strings.NewReader(sc.driveBody(r)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// readSSE reads an SSE drive to its end.
func readSSE(t *testing.T, resp *http.Response) sseLog {
	t.Helper()
	var l sseLog
	for ev, err := range sse.Read(resp.Body, nil) {
		if err != nil {
			t.Fatal(err)
		}
		l.types = append(l.types, ev.Type)
		switch ev.Type {
		case "done":
			json.Unmarshal([]byte(ev.Data), &l.done)
		case "tool_call", "tool_result":
			var c executor.CallResult
			json.Unmarshal([]byte(ev.Data), &c)
			if ev.Type == "tool_call" {
				l.calls = append(l.calls, c)
			} else {
				l.results = append(l.results, c)
			}
		}
	}
	return l
}

func TestDriveSSE(t *testing.T) {
	sc := newSidecar(t, threeCalls(), "", standardTools()...)
	r := sc.env.NewRun()
	log := readSSE(t, sc.openSSE(t, r))
	types, done, calls, results := log.types, log.done, log.calls, log.results
	// The design promises per call: its tool_call before its tool_result,
	// and results in call order. A result may come before a later call is
	// announced (it is submitted as soon as the calls before it are in).
	got := strings.Join(types, " ")
	if !strings.HasPrefix(got, "turn content tool_") || !strings.HasSuffix(got, "tool_result turn content done") ||
		strings.Count(got, "tool_call") != 3 || strings.Count(got, "tool_result") != 3 {
		t.Errorf("events %s", got)
	}
	acts := sc.env.AssertWholeBatches(r, 3)
	seen := map[string]bool{}
	for _, ev := range types {
		switch ev {
		case "tool_call":
			seen[calls[0].ToolCallID] = true
			calls = calls[1:]
		case "tool_result":
			n := len(acts) - len(results)
			c := results[0]
			results = results[1:]
			if !seen[c.ToolCallID] {
				t.Errorf("tool_result of %s before its tool_call", c.ToolCallID)
			}
			if c.ToolCallID != acts[n].ToolCallID || !c.Submitted {
				t.Errorf("result %d %+v, want call %s submitted", n, c, acts[n].ToolCallID)
			}
		}
	}
	if done.Status != "completed" || done.Content != wantAnswer {
		t.Errorf("done %+v", done)
	}
}

// TestClientDisconnectCancels: a client that goes away mid-batch cancels
// its drive: calls cancelled, Actions cancelled, no further turn.
func TestClientDisconnectCancels(t *testing.T) {
	started := make(chan struct{}, 1)
	sc := newSidecar(t, coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: "slow"}}}, {Content: "never"}}}, "",
		testenv.Tool{Config: config.Tool{Name: "slow", Timeout: time.Minute}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
			started <- struct{}{}
			return testenv.Hang(ctx, c)
		}})
	r := sc.env.NewRun()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", sc.url+"/v1/runs/"+r.RunID+"/drive", strings.NewReader(sc.driveBody(r)))
	req.Header.Set("Content-Type", "application/json")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-started
	cancel()
	<-errc
	poll.Until(t, "the action to be cancelled", func() bool {
		acts := sc.env.Sim.Actions(r.RunID)
		return len(acts) == 1 && acts[0].Status == core.ActionCancelled
	})
	if n := sc.env.Sim.CountRequests("POST", "/v1/completions"); n != 1 {
		t.Errorf("%d completions requests after a disconnect, want 1", n)
	}
}

func TestAuthLimitsAndTools(t *testing.T) {
	sc := newSidecar(t, threeCalls(), "s3cret", standardTools()...)
	do := func(method, path, token, body string) (int, string) {
		req, _ := http.NewRequest(method, sc.url+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, _ := do("GET", path, "", ""); code != 200 {
			t.Errorf("%s without token: %d", path, code)
		}
	}
	for _, path := range []string{"/metrics", "/v1/tools", "/v1/threads"} {
		if code, _ := do("GET", path, "", ""); code != 401 {
			t.Errorf("%s without token: %d, want 401", path, code)
		}
		if code, _ := do("GET", path, "wrong", ""); code != 401 {
			t.Errorf("%s with a wrong token: %d, want 401", path, code)
		}
	}
	code, body := do("GET", "/readyz?live=1", "", "")
	if code != 200 || !strings.Contains(body, `"tools_live":["echo","fail"]`) || !strings.Contains(body, `"tools_without_worker":["idle"]`) {
		t.Errorf("readyz?live=1: %d %s", code, body)
	}
	code, body = do("GET", "/v1/tools", "s3cret", "")
	var tools []core.FunctionTool
	json.Unmarshal([]byte(body), &tools)
	if code != 200 || len(tools) != 3 {
		t.Errorf("tools %d %s", code, body)
	}
	code, body = do("GET", "/v1/tools?live=1", "s3cret", "")
	tools = nil
	json.Unmarshal([]byte(body), &tools)
	if code != 200 || len(tools) != 2 || tools[0].Function.Name != "echo" || tools[1].Function.Name != "fail" {
		t.Errorf("live tools %d %s (idle has no worker)", code, body)
	}
	if code, body := do("POST", "/v1/runs/run_x/drive", "s3cret", `{"model": "vllm/x"}`); code != 400 || !strings.Contains(body, "missing fields: assistant_id, message_id, thread_id") {
		t.Errorf("bad drive body: %d %s", code, body)
	}
	if code, _ := do("POST", "/v1/runs/run_x/drive", "s3cret", `{"thread_id": "`+strings.Repeat("x", 5000)+`"}`); code != 413 {
		t.Errorf("oversized body: %d, want 413", code)
	}
	if code, body := do("POST", "/v1/runs/run_x/drive", "s3cret", `{"thread_id": "t", "extra": 1}`); code != 400 || !strings.Contains(body, "extra") {
		t.Errorf("unknown field: %d %s", code, body)
	}
}

func TestReadiness(t *testing.T) {
	down := errors.New("NATS not connected")
	srv, err := server.New(server.Config{Ready: func(context.Context) error { return down }}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest("GET", "http://127.0.0.1/readyz", nil))
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), "NATS not connected") {
		t.Errorf("readyz %d %s", rec.Code, rec.Body)
	}
}

// TestLiveness: /healthz answers 503 with Live's error, on the API and the
// ops listener, and without the API token: a sidecar that can no longer
// dispatch (its NATS connection closed for good) is restarted.
func TestLiveness(t *testing.T) {
	var lost atomic.Pointer[error]
	srv, err := server.New(server.Config{Token: "secret", Live: func() error {
		if e := lost.Load(); e != nil {
			return *e
		}
		return nil
	}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []http.Handler{srv, srv.Ops()} {
		ts := httptest.NewServer(h)
		lost.Store(nil)
		resp, err := http.Get(ts.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("healthz before: %d", resp.StatusCode)
		}
		gone := errors.New("the NATS connection closed for good: nats: Authorization Violation")
		lost.Store(&gone)
		resp, err = http.Get(ts.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || !strings.Contains(string(b), "closed for good") {
			t.Errorf("healthz after: %d %s", resp.StatusCode, b)
		}
		ts.Close()
	}
}

// TestDriveAttachAndUnknownRun: a second drive of a run in progress, here
// with SSE, attaches to it: it receives the events from then on and the
// same done summary as the first (JSON) drive, and Core sees one
// completions request per turn. A run Core does not know answers 404.
func TestDriveAttachAndUnknownRun(t *testing.T) {
	started := make(chan struct{}, 3)
	release := make(chan struct{})
	sc := newSidecar(t, threeCalls(), "",
		testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
			started <- struct{}{}
			<-release
			return testenv.Echo(ctx, c)
		}},
		testenv.Tool{Config: config.Tool{Name: "fail"}, Handler: func(context.Context, *tool.Call) ([]byte, error) {
			return nil, errors.New("upstream down")
		}})
	r := sc.env.NewRun()
	first := make(chan executor.Summary, 1)
	go func() {
		resp, err := http.Post(sc.url+"/v1/runs/"+r.RunID+"/drive", "application/json", strings.NewReader(sc.driveBody(r)))
		if err != nil {
			t.Error(err)
			first <- executor.Summary{}
			return
		}
		defer resp.Body.Close()
		var s executor.Summary
		json.NewDecoder(resp.Body).Decode(&s)
		first <- s
	}()
	<-started
	<-started // both echo calls run: the drive is in its first batch
	resp := sc.openSSE(t, r)
	// The answer's head comes before the attach, which first reads the run
	// in Core: released before it, the drive could reach its last turn
	// unseen.
	poll.Until(t, "the second drive to attach", func() bool {
		n, _ := promtest.Sum(t, sc.env.Sidecar.Metrics(), "toolsidecar_drives_attached_total")
		return n == 1
	})
	close(release)
	log := readSSE(t, resp)
	types, done := log.types, log.done
	sum := <-first
	if sum.Status != executor.StatusCompleted || done.Status != sum.Status || done.Content != sum.Content || len(done.Calls) != 3 ||
		!done.Calls[0].OK || !done.Calls[2].OK {
		t.Errorf("attached done %+v, first drive %+v", done, sum)
	}
	if got := strings.Join(types, " "); !strings.HasSuffix(got, "turn content done") || strings.HasPrefix(got, "turn content tool_call") {
		t.Errorf("attached events %s: want those from the attach on, ending with the last turn", got)
	}
	if n := sc.env.Sim.CountRequests("POST", "/v1/completions"); n != 2 {
		t.Errorf("%d completions requests, want 2", n)
	}
	resp2, err := http.Post(sc.url+"/v1/runs/run_missing/drive", "application/json", strings.NewReader(sc.driveBody(r)))
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusNotFound {
		t.Errorf("unknown run: %d, want 404", resp2.StatusCode)
	}
}

// TestDriveStatusCodes: a drive answers 409 when the request names another
// thread than the run's (nothing is driven), and 502 when the run failed
// upstream; the summary is the body either way.
func TestDriveStatusCodes(t *testing.T) {
	sc := newSidecar(t, threeCalls(), "", standardTools()...)
	post := func(r testenv.Run, body string) (int, executor.Summary) {
		resp, err := http.Post(sc.url+"/v1/runs/"+r.RunID+"/drive", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var s executor.Summary
		json.NewDecoder(resp.Body).Decode(&s)
		return resp.StatusCode, s
	}
	r := sc.env.NewRun()
	other := r
	other.ThreadID = "thread_someone_else"
	if code, s := post(r, sc.driveBody(other)); code != http.StatusConflict || s.Status != executor.StatusFailed || !strings.Contains(s.Error, "belongs to thread "+r.ThreadID) {
		t.Errorf("mismatched thread: %d %+v, want 409 naming the run's thread", code, s)
	}
	if n := sc.env.Sim.CountRequests("POST", "/v1/completions"); n != 0 {
		t.Errorf("%d completions requests after a conflict, want 0", n)
	}
	sc.env.Sim.AddFault(coresim.Fault{Method: "POST", Path: "/v1/completions", Status: 500, Times: 100})
	if code, s := post(r, sc.driveBody(r)); code != http.StatusBadGateway || s.Status != executor.StatusFailed {
		t.Errorf("Core failing: %d %+v, want 502 with a failed summary", code, s)
	}
}

// TestSSEKeepaliveAndProgress: a quiet SSE drive sends keepalive comments;
// a worker's progress messages reach the caller as progress events; and
// tool_call events carry the call, not outcome fields it does not have yet.
func TestSSEKeepaliveAndProgress(t *testing.T) {
	sc := coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: "slow", ArgsJSON: `{}`}}}, {Content: "done"}}}
	env := testenv.Start(t, sc, testenv.Options{Server: func(s *config.Server) { s.SSEKeepalive = 30 * time.Millisecond }},
		testenv.Tool{Config: config.Tool{Name: "slow"}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
			for range 2 {
				time.Sleep(50 * time.Millisecond)
				if err := c.Progress(); err != nil {
					return nil, err
				}
			}
			time.Sleep(150 * time.Millisecond)
			return []byte(`"ok"`), nil
		}})
	side := &sidecar{env: env, url: env.URL}
	resp := side.openSSE(t, env.NewRun())
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	body := string(raw)
	if n := strings.Count(body, ": keepalive\n"); n < 1 {
		t.Errorf("no keepalive comment in a drive quiet for 150 ms:\n%s", body)
	}
	if n := strings.Count(body, "event: progress\n"); n != 2 {
		t.Errorf("%d progress events, want 2:\n%s", n, body)
	}
	for ev, err := range sse.Read(strings.NewReader(body), nil) {
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == "tool_call" || ev.Type == "progress" {
			var fields map[string]any
			json.Unmarshal([]byte(ev.Data), &fields)
			if _, has := fields["ok"]; has || fields["tool"] != "slow" || fields["tool_call_id"] == "" {
				t.Errorf("%s event %s: want the call's ids and no outcome fields", ev.Type, ev.Data)
			}
		}
	}
}

// TestPprofOnOpsOnly: with Pprof, Go's profiles are served on the ops
// handler and never on the API's; without it, nowhere.
func TestPprofOnOpsOnly(t *testing.T) {
	for _, on := range []bool{true, false} {
		srv, err := server.New(server.Config{Pprof: on}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		for name, h := range map[string]http.Handler{"ops": srv.Ops(), "api": srv} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", "http://localhost/debug/pprof/heap", nil))
			want := 404
			if on && name == "ops" {
				want = 200
			}
			if rec.Code != want {
				t.Errorf("pprof %v, %s handler: %d, want %d", on, name, rec.Code, want)
			}
		}
	}
}

// TestJSONOnEveryUnknownPathAndMethod: a path no route serves and a method
// a route does not take are answered in JSON, on the API and on the ops
// listener, in the shape of the route family the path falls under (an
// OpenAI client reads {"error": {"message", "type"}} under
// /v1/chat/completions), with Allow on a 405; never the mux's text/plain.
func TestJSONOnEveryUnknownPathAndMethod(t *testing.T) {
	openAIShape := func(w http.ResponseWriter, status int, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error"}})
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	srv, err := server.New(server.Config{Routes: []server.Route{{Pattern: "POST /v1/chat/completions", Handler: ok, Errors: openAIShape}}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		h                    http.Handler
		method, path         string
		status               int
		allow, shape, phrase string
	}{
		{srv, "GET", "/nope", 404, "", "sidecar", "no route GET /nope"},
		{srv, "POST", "/v1/nope", 404, "", "sidecar", "no route POST /v1/nope"},
		{srv, "POST", "/v1/tools", 405, "GET, HEAD", "sidecar", "method POST is not allowed on /v1/tools"},
		{srv, "GET", "/v1/chat/completions", 405, "POST", "openai", "method GET is not allowed on /v1/chat/completions"},
		{srv, "POST", "/v1/chat/completions/x", 404, "", "openai", "no route POST /v1/chat/completions/x"},
		{srv.Ops(), "GET", "/nope", 404, "", "sidecar", "no route GET /nope"},
		{srv.Ops(), "POST", "/metrics", 405, "GET, HEAD", "sidecar", "method POST is not allowed on /metrics"},
	} {
		rec := httptest.NewRecorder()
		tc.h.ServeHTTP(rec, httptest.NewRequest(tc.method, "http://127.0.0.1"+tc.path, strings.NewReader("{}")))
		var body struct {
			Error json.RawMessage `json:"error"`
		}
		name := tc.method + " " + tc.path
		if rec.Code != tc.status || rec.Header().Get("Content-Type") != "application/json" || json.Unmarshal(rec.Body.Bytes(), &body) != nil {
			t.Errorf("%s: %d %q %s", name, rec.Code, rec.Header().Get("Content-Type"), rec.Body)
			continue
		}
		var msg string
		if tc.shape == "openai" {
			var e struct{ Message, Type string }
			json.Unmarshal(body.Error, &e)
			msg = e.Message
			if e.Type != "invalid_request_error" {
				t.Errorf("%s: not in OpenAI's shape: %s", name, rec.Body)
			}
		} else if json.Unmarshal(body.Error, &msg) != nil {
			t.Errorf("%s: not in the sidecar's shape: %s", name, rec.Body)
		}
		if !strings.HasPrefix(msg, tc.phrase) || rec.Header().Get("Allow") != tc.allow {
			t.Errorf("%s: message %q, Allow %q", name, msg, rec.Header().Get("Allow"))
		}
	}
}
