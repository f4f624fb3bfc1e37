package agentsup_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/agentssim"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/matrix"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

func TestMain(m *testing.M) {
	matrix.Main() // a tool of route exec, which a sidecar started
	goleak.VerifyTestMain(m)
}

// hosted is a sidecar with upstream.kind openai-agents on real parts: the
// Agents API simulator on a loopback server, the embedded NATS, tools on
// their routes; the application speaks plain HTTP to the sidecar.
type hosted struct {
	sim *agentssim.Sim
	env *testenv.Env
}

func startHosted(t *testing.T, cfg agentssim.Config, opts testenv.Options, tools ...testenv.Tool) *hosted {
	t.Helper()
	sim := agentssim.New(cfg)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	edit := opts.Config
	opts.Config = func(c *config.Config) {
		c.Upstream.Kind, c.Upstream.URL, c.Upstream.RetryBudget = config.UpstreamOpenAIAgents, srv.URL+"/v1", 10*time.Second
		if edit != nil {
			edit(c)
		}
	}
	env := testenv.Start(t, coresim.Scenario{}, opts, tools...)
	var live []string
	for _, tl := range tools {
		if tl.Handler != nil {
			live = append(live, tl.Config.Name)
		}
	}
	if len(live) > 0 {
		testenv.WaitLive(t, env.URL, live...)
	}
	return &hosted{sim: sim, env: env}
}

// appKey is the application's own credential, passed through.
const appKey = "sk-app"

// create makes a session through the sidecar, as an application's client
// does with its base URL at the sidecar, and returns its id.
func (h *hosted) create(t *testing.T, key, input string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"agent": map[string]any{"model": "gpt-sim"}, "environment": map[string]any{"type": "none"}, "input": input})
	status, data := h.call(t, http.MethodPost, "/v1/agents/sessions", key, body)
	if status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, data)
	}
	var s struct{ ID string }
	if err := json.Unmarshal(data, &s); err != nil || s.ID == "" {
		t.Fatalf("create: %s", data)
	}
	return s.ID
}

// call sends one request through the sidecar.
func (h *hosted) call(t *testing.T, method, path, key string, body []byte) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, h.env.URL+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("OpenAI-Beta", agentssim.Beta)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

// final waits until the session's turn ends, and returns the session.
func (h *hosted) final(t *testing.T, id string) agentssim.Session {
	t.Helper()
	var s agentssim.Session
	poll.Until(t, "session "+id+" to end its turn", func() bool {
		s, _ = h.sim.Session(id)
		return s.Status == "failed" || (s.Status == "idle" && s.Final != "")
	})
	return s
}

// script is a session's input that the simulator's model follows.
func script(rounds [][]map[string]any, answer string) string {
	b, _ := json.Marshal(map[string]any{"rounds": rounds, "answer": answer})
	return string(b)
}

// assertOnce checks that every call was answered once, each post held a
// whole batch, and nothing broke the contract.
func assertOnce(t *testing.T, h *hosted, s agentssim.Session, calls int, posts []int) {
	t.Helper()
	if len(s.Answers) != calls {
		t.Errorf("answers for %d calls, want %d: %v", len(s.Answers), calls, s.Answers)
	}
	for id, n := range s.Answers {
		if n != 1 {
			t.Errorf("call %s answered %d times", id, n)
		}
	}
	if !slices.Equal(s.Posts, posts) {
		t.Errorf("result posts %v, want %v", s.Posts, posts)
	}
	if v := h.sim.Violations(); len(v) > 0 {
		t.Errorf("contract violations: %v", v)
	}
}

// TestBatches: a 3-call and a 16-call block, on tools of two route kinds
// (nats and exec), are each answered in one post, every call once, and
// their executions overlap: every call of the block starts while the
// first of each tool is still held. The session reaches its final turn.
func TestBatches(t *testing.T) {
	for i, n := range []int{3, 16} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			routes := matrix.Routes(i)
			if !slices.Contains(routes, matrix.NATS) || !slices.Contains(routes, matrix.Exec) {
				routes = []string{matrix.NATS, matrix.Exec}
			}
			var served []*matrix.Served
			var tools []testenv.Tool
			for _, r := range routes {
				s := matrix.Serve(t, r, matrix.Tool{Name: "t_" + r, SideEffects: config.ReadOnly, Block: true, Echo: true})
				served = append(served, s)
				tools = append(tools, s.EnvTools(10*time.Second)...)
			}
			h := startHosted(t, agentssim.Config{}, testenv.Options{}, tools...)
			var round []map[string]any
			want := map[string]int32{}
			for k := range n {
				name := "t_" + routes[k%len(routes)]
				want[name]++
				round = append(round, map[string]any{"name": name, "arguments": map[string]any{"k": k}})
			}
			id := h.create(t, appKey, script([][]map[string]any{round}, "done "))
			poll.Until(t, "every call to start while the first of each tool is held", func() bool {
				for _, s := range served {
					name := "t_" + s.Route
					if s.Count(name) < want[name] {
						return false
					}
				}
				return true
			})
			for _, s := range served {
				if d := s.Done("t_" + s.Route); d >= s.Count("t_"+s.Route) {
					t.Fatalf("route %s: %d executions done of %d started: the first should be held", s.Route, d, s.Count("t_"+s.Route))
				}
			}
			if s, _ := h.sim.Session(id); len(s.Posts) != 0 {
				t.Fatalf("results posted before the batch was joined: %v", s.Posts)
			}
			for _, s := range served {
				s.Release()
			}
			s := h.final(t, id)
			if s.Status != "idle" || !bytes.Contains([]byte(s.Final), []byte(`"echo": {"k":0}`)) {
				t.Fatalf("session %+v", s)
			}
			assertOnce(t, h, s, n, []int{n})
		})
	}
}

// echoTools are two tools on route nats, a and b, answering at once.
func echoTools(t *testing.T) []testenv.Tool {
	s := matrix.Serve(t, matrix.NATS, matrix.Tool{Name: "a", SideEffects: config.ReadOnly, Echo: true}, matrix.Tool{Name: "b", SideEffects: config.ReadOnly, Echo: true})
	return s.EnvTools(10 * time.Second)
}

var threeCalls = [][]map[string]any{{{"name": "a", "arguments": map[string]any{"k": 0}}, {"name": "b", "arguments": map[string]any{"k": 1}},
	{"name": "a", "arguments": map[string]any{"k": 2}}}}

// TestMixedOwnership: a call of a tool the registry does not hold is left
// for the application, which answers it itself through the sidecar; the
// sidecar posts its two calls in one request and nothing for the third.
func TestMixedOwnership(t *testing.T) {
	h := startHosted(t, agentssim.Config{}, testenv.Options{}, echoTools(t)...)
	rounds := [][]map[string]any{{{"name": "a", "arguments": map[string]any{"k": 0}}, {"name": "app_lookup", "arguments": map[string]any{"q": "x"}},
		{"name": "b", "arguments": map[string]any{"k": 2}}}}
	id := h.create(t, appKey, script(rounds, "done "))
	poll.Until(t, "the sidecar's two results", func() bool { s, _ := h.sim.Session(id); return len(s.Posts) == 1 })
	status, data := h.call(t, http.MethodGet, "/v1/agents/sessions/"+id, appKey, nil)
	var snap struct {
		RequiredActions []struct {
			TurnID string `json:"turn_id"`
			CallID string `json:"call_id"`
			Name   string `json:"name"`
		} `json:"required_actions"`
	}
	if err := json.Unmarshal(data, &snap); status != http.StatusOK || err != nil || len(snap.RequiredActions) != 1 || snap.RequiredActions[0].Name != "app_lookup" {
		t.Fatalf("the application's view: %d %s", status, data)
	}
	a := snap.RequiredActions[0]
	body, _ := json.Marshal(map[string]any{"events": []any{map[string]any{"type": "agent.session.input.tool_result", "turn_id": a.TurnID,
		"call_id": a.CallID, "success": true, "output": "app answer"}}})
	if status, data := h.call(t, http.MethodPost, "/v1/agents/sessions/"+id+"/events", appKey, body); status != http.StatusAccepted {
		t.Fatalf("the application's answer: %d %s", status, data)
	}
	s := h.final(t, id)
	if !bytes.Contains([]byte(s.Final), []byte("app answer")) {
		t.Fatalf("final %q", s.Final)
	}
	assertOnce(t, h, s, 3, []int{2, 1})
}

// TestPendingCallRace: results refused as "Unknown pending tool call"
// (the call announced before the API lists it) are posted again, the same
// request, until taken.
func TestPendingCallRace(t *testing.T) {
	h := startHosted(t, agentssim.Config{RaceRejects: 2}, testenv.Options{}, echoTools(t)...)
	id := h.create(t, appKey, script(threeCalls, "done "))
	s := h.final(t, id)
	assertOnce(t, h, s, 3, []int{3})
	if n := h.sim.Requests(); n != 3 {
		t.Errorf("%d result posts, want 3 (two refused in the race)", n)
	}
}

// TestBackoff: a 429 with Retry-After and a 503 on the result post are
// waited out; the batch is still one accepted post.
func TestBackoff(t *testing.T) {
	h := startHosted(t, agentssim.Config{}, testenv.Options{}, echoTools(t)...)
	h.sim.Inject(agentssim.Fault{Status: http.StatusTooManyRequests, RetryAfter: "1"}, agentssim.Fault{Status: http.StatusServiceUnavailable})
	began := time.Now()
	id := h.create(t, appKey, script(threeCalls, "done "))
	s := h.final(t, id)
	assertOnce(t, h, s, 3, []int{3})
	if n := h.sim.Requests(); n != 3 {
		t.Errorf("%d result posts, want 3", n)
	}
	if took := time.Since(began); took < time.Second {
		t.Errorf("the batch was posted %v after the 429, before its Retry-After of 1s", took)
	}
}

// TestCutAndDuplicates: every event delivered twice and the watch's
// stream cut: the sidecar reopens it, reconciles from the session, and
// answers each call once, one post per block.
func TestCutAndDuplicates(t *testing.T) {
	h := startHosted(t, agentssim.Config{Duplicate: true}, testenv.Options{}, echoTools(t)...)
	h.sim.CutStream(1)
	rounds := append(slices.Clone(threeCalls), threeCalls[0])
	id := h.create(t, appKey, script(rounds, "done "))
	s := h.final(t, id)
	assertOnce(t, h, s, 6, []int{3, 3})
}

// TestSessionFails: a session that fails after its first block ends its
// watch; nothing more is posted.
func TestSessionFails(t *testing.T) {
	h := startHosted(t, agentssim.Config{}, testenv.Options{}, echoTools(t)...)
	b, _ := json.Marshal(map[string]any{"rounds": append(slices.Clone(threeCalls), threeCalls[0]), "fail_after": 1})
	id := h.create(t, appKey, string(b))
	s := h.final(t, id)
	if s.Status != "failed" {
		t.Fatalf("session %+v", s)
	}
	assertOnce(t, h, s, 3, []int{3})
}

// TestCancelWhileCallsRun: a turn the application cancels while its calls
// run gets no result afterwards; the session's next turn is answered.
func TestCancelWhileCallsRun(t *testing.T) {
	held := matrix.Serve(t, matrix.NATS, matrix.Tool{Name: "slow", SideEffects: config.ReadOnly, Block: true, Echo: true})
	h := startHosted(t, agentssim.Config{}, testenv.Options{}, append(held.EnvTools(10*time.Second), echoTools(t)...)...)
	rounds := [][]map[string]any{{{"name": "slow", "arguments": map[string]any{"k": 0}}, {"name": "a", "arguments": map[string]any{"k": 1}}}}
	id := h.create(t, appKey, script(rounds, "first "))
	poll.Until(t, "the held call to start", func() bool { return held.Count("slow") == 1 })
	body, _ := json.Marshal(map[string]any{"events": []any{map[string]any{"type": "agent.session.input.cancel"}}})
	if status, data := h.call(t, http.MethodPost, "/v1/agents/sessions/"+id+"/events", appKey, body); status != http.StatusAccepted {
		t.Fatalf("cancel: %d %s", status, data)
	}
	held.Release()
	time.Sleep(300 * time.Millisecond) // what a late post would need to arrive
	if s, _ := h.sim.Session(id); len(s.Posts) != 0 || s.Status != "idle" {
		t.Fatalf("after the cancel: %+v", s)
	}
	body, _ = json.Marshal(map[string]any{"events": []any{map[string]any{"type": "agent.session.input.message", "content": script(threeCalls, "second ")}}})
	if status, data := h.call(t, http.MethodPost, "/v1/agents/sessions/"+id+"/events", appKey, body); status != http.StatusAccepted {
		t.Fatalf("message: %d %s", status, data)
	}
	s := h.final(t, id)
	if !bytes.Contains([]byte(s.Final), []byte("second")) {
		t.Fatalf("final %q", s.Final)
	}
	assertOnce(t, h, s, 3, []int{3})
}
