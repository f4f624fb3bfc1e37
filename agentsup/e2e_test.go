package agentsup_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/agentssim"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/sim/managedsim"
	"github.com/projectdavid/toolsidecar/testkit/matrix"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/syncbuf"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

func TestMain(m *testing.M) {
	matrix.Main()        // a tool of route exec, which a sidecar started
	testenv.MaybeServe() // a simulator in a process of its own
	goleak.VerifyTestMain(m)
}

// upstreamSim is either simulator: their faults and violations are one
// type (the simulators' shared leaf).
type upstreamSim interface {
	http.Handler
	Inject(f ...agentssim.Fault)
	Violations() []agentssim.Violation
	Requests() int
	CutStream(n int)
}

// kinds are the hosted upstream kinds every test runs on.
var kinds = []string{config.UpstreamOpenAIAgents, config.UpstreamAnthropicAgents}

// hosted is a sidecar with a hosted upstream kind on real parts: the
// API's simulator on a loopback server, the embedded NATS, tools on their
// routes; the application speaks plain HTTP to the sidecar.
type hosted struct {
	kind       string
	sim        upstreamSim // nil when the simulator runs in a process of its own
	session    func(id string) agentssim.Session
	violations func() []agentssim.Violation
	env        *testenv.Env
	simURL     string
	// base is where the application's requests go: the sidecar, unless a
	// test speaks to the API directly.
	base string
	// onAnswer, when set, sees each answer call reads.
	onAnswer func(*http.Response)
	// readBase, when set, is where answerOwn reads the session to find
	// the application's call (the API itself: a read the sidecar does not
	// see); its answer still goes to base.
	readBase string
	// extra, when set, is added to every request call sends (a header
	// the API does not read).
	extra http.Header
}

// simConfig configures either simulator.
type simConfig struct {
	RaceRejects int // OpenAI's only
	Duplicate   bool
}

func startHosted(t testing.TB, kind string, cfg simConfig, opts testenv.Options, tools ...testenv.Tool) *hosted {
	t.Helper()
	h := newSim(t, kind, cfg)
	return h.start(t, opts, tools...)
}

// newSim serves kind's simulator on a loopback server of this process.
func newSim(t testing.TB, kind string, cfg simConfig) *hosted {
	h := &hosted{kind: kind}
	switch kind {
	case config.UpstreamOpenAIAgents:
		sim := agentssim.New(agentssim.Config{RaceRejects: cfg.RaceRejects, Duplicate: cfg.Duplicate})
		h.sim, h.session = sim, func(id string) agentssim.Session { s, _ := sim.Session(id); return s }
	default:
		sim := managedsim.New(managedsim.Config{Duplicate: cfg.Duplicate})
		h.sim, h.session = sim, func(id string) agentssim.Session { s, _ := sim.Session(id); return s }
	}
	h.violations = h.sim.Violations
	srv := httptest.NewServer(h.sim)
	t.Cleanup(srv.Close)
	h.simURL, h.base = srv.URL, srv.URL
	return h
}

// apart serves kind's simulator in a process of its own.
func apart(t testing.TB, kind string) *hosted {
	h := &hosted{kind: kind}
	if kind == config.UpstreamOpenAIAgents {
		h.simURL, h.violations, h.session = testenv.AgentsProcess(t, agentssim.Config{})
	} else {
		h.simURL, h.violations, h.session = testenv.ManagedProcess(t, managedsim.Config{})
	}
	h.base = h.simURL
	return h
}

// start starts the sidecar on the simulator.
func (h *hosted) start(t testing.TB, opts testenv.Options, tools ...testenv.Tool) *hosted {
	t.Helper()
	base := "/v1"
	if h.kind == config.UpstreamAnthropicAgents {
		base = ""
	}
	edit := opts.Config
	opts.Config = func(c *config.Config) {
		c.Upstream.Kind, c.Upstream.URL, c.Upstream.RetryBudget = h.kind, h.simURL+base, 10*time.Second
		if edit != nil {
			edit(c)
		}
	}
	h.env = testenv.Start(t, coresim.Scenario{}, opts, tools...)
	h.base = h.env.URL
	var live []string
	for _, tl := range tools {
		if tl.Handler != nil {
			live = append(live, tl.Config.Name)
		}
	}
	if len(live) > 0 {
		testenv.WaitLive(t, h.env.URL, live...)
	}
	return h
}

// appKey is the application's own credential, passed through.
const appKey = "sk-app"

// create makes a session through the sidecar, as an application's client
// does with its base URL at the sidecar, and returns its id. On
// Anthropic, the agent first, and the calls on threads (their
// session_thread_id must be echoed).
func (h *hosted) create(t testing.TB, key, input string) string {
	t.Helper()
	path := "/v1/agents/sessions"
	body := map[string]any{"agent": map[string]any{"model": "gpt-sim"}, "environment": map[string]any{"type": "none"}, "input": input}
	want := http.StatusCreated
	if h.kind == config.UpstreamAnthropicAgents {
		agent := h.post(t, "/v1/agents", key, map[string]any{"name": "a", "model": "claude-sim", "tools": []any{map[string]any{"type": "custom", "name": "a"}}}, http.StatusOK)
		threaded := []byte(input) // a script: its calls on threads
		if in := map[string]any{}; json.Unmarshal([]byte(input), &in) == nil {
			in["threads"] = true
			threaded, _ = json.Marshal(in)
		}
		path, want = "/v1/sessions", http.StatusOK
		body = map[string]any{"agent": agent, "environment_id": "env_1",
			"initial_events": []any{map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": string(threaded)}}}}}
	}
	return h.post(t, path, key, body, want)
}

// post posts body through the sidecar, wants the status, and returns the
// answer's id.
func (h *hosted) post(t testing.TB, path, key string, body any, want int) string {
	t.Helper()
	b, _ := json.Marshal(body)
	status, data := h.call(t, http.MethodPost, path, key, b)
	if status != want {
		t.Fatalf("POST %s: %d %s", path, status, data)
	}
	var s struct{ ID string }
	_ = json.Unmarshal(data, &s)
	return s.ID
}

// call sends one request through the sidecar, with the API's headers.
func (h *hosted) call(t testing.TB, method, path, key string, body []byte) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, h.base+path, bytes.NewReader(body))
	h.headers(req, key)
	maps.Copy(req.Header, h.extra)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if h.onAnswer != nil {
		h.onAnswer(resp)
	}
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

// headers are the API's headers with the caller's key.
func (h *hosted) headers(req *http.Request, key string) {
	if h.kind == config.UpstreamAnthropicAgents {
		req.Header.Set("X-Api-Key", key)
		req.Header.Set("anthropic-version", managedsim.Version)
		req.Header.Set("anthropic-beta", managedsim.Beta)
		return
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("OpenAI-Beta", agentssim.Beta)
}

// send posts the application's own events to the session through the
// sidecar.
func (h *hosted) send(t testing.TB, id string, events ...any) {
	t.Helper()
	path := "/v1/agents/sessions/" + id + "/events"
	want := http.StatusAccepted
	if h.kind == config.UpstreamAnthropicAgents {
		path, want = "/v1/sessions/"+id+"/events", http.StatusOK
	}
	h.post(t, path, appKey, map[string]any{"events": events}, want)
}

// interrupt cancels the session's turn, as the application does.
func (h *hosted) interrupt(t testing.TB, id string) {
	t.Helper()
	typ := "agent.session.input.cancel"
	if h.kind == config.UpstreamAnthropicAgents {
		typ = "user.interrupt"
	}
	h.send(t, id, map[string]any{"type": typ})
}

// message starts the session's next turn with text.
func (h *hosted) message(t testing.TB, id, text string) {
	t.Helper()
	if h.kind == config.UpstreamAnthropicAgents {
		h.send(t, id, map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": text}}})
		return
	}
	h.send(t, id, map[string]any{"type": "agent.session.input.message", "content": text})
}

// answerOwn answers, as the application, its own pending call of tool.
func (h *hosted) answerOwn(t testing.TB, id, tool, output string) {
	t.Helper()
	if h.kind == config.UpstreamAnthropicAgents {
		status, data := h.read(t, "/v1/sessions/"+id+"/events?limit=100")
		var list struct {
			Data []struct {
				ID, Type, Name string
				Thread         string `json:"session_thread_id"`
			}
		}
		if err := json.Unmarshal(data, &list); status != http.StatusOK || err != nil {
			t.Fatalf("the application's view: %d %s", status, data)
		}
		for _, e := range list.Data {
			if e.Type == "agent.custom_tool_use" && e.Name == tool {
				h.send(t, id, map[string]any{"type": "user.custom_tool_result", "custom_tool_use_id": e.ID, "session_thread_id": e.Thread,
					"content": []any{map[string]any{"type": "text", "text": output}}})
				return
			}
		}
		t.Fatalf("no call of %s in %s", tool, data)
	}
	status, data := h.read(t, "/v1/agents/sessions/"+id)
	var snap struct {
		RequiredActions []struct {
			TurnID string `json:"turn_id"`
			CallID string `json:"call_id"`
			Name   string `json:"name"`
		} `json:"required_actions"`
	}
	if err := json.Unmarshal(data, &snap); status != http.StatusOK || err != nil || len(snap.RequiredActions) != 1 || snap.RequiredActions[0].Name != tool {
		t.Fatalf("the application's view: %d %s", status, data)
	}
	a := snap.RequiredActions[0]
	h.send(t, id, map[string]any{"type": "agent.session.input.tool_result", "turn_id": a.TurnID, "call_id": a.CallID, "success": true, "output": output})
}

// read GETs path as the application, at readBase when it is set.
func (h *hosted) read(t testing.TB, path string) (int, []byte) {
	t.Helper()
	if h.readBase == "" {
		return h.call(t, http.MethodGet, path, appKey, nil)
	}
	base := h.base
	h.base = h.readBase
	defer func() { h.base = base }()
	return h.call(t, http.MethodGet, path, appKey, nil)
}

// final waits until the session's turn ends, and returns the session.
func (h *hosted) final(t testing.TB, id string) agentssim.Session {
	t.Helper()
	var s agentssim.Session
	poll.Until(t, "session "+id+" to end its turn", func() bool {
		s = h.session(id)
		return s.Status == "failed" || s.Status == "terminated" || (s.Status == "idle" && s.Final != "")
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
	if v := h.violations(); len(v) > 0 {
		t.Errorf("contract violations: %v", v)
	}
}

// TestBatches: a 3-call and a 16-call block, on tools of two route kinds
// (nats and exec), are each answered in one post, every call once, and
// their executions overlap: every call of the block starts while the
// first of each tool is still held. The session reaches its final turn.
func TestBatches(t *testing.T) {
	for _, kind := range kinds {
		for i, n := range []int{3, 16} {
			t.Run(fmt.Sprint(kind, "/", n), func(t *testing.T) {
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
				h := startHosted(t, kind, simConfig{}, testenv.Options{}, tools...)
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
						if s.Count("t_"+s.Route) < want["t_"+s.Route] {
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
				if s := h.session(id); len(s.Posts) != 0 {
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
}

// echoTools are two tools on route nats, a and b, answering at once.
func echoTools(t *testing.T) []testenv.Tool {
	s := matrix.Serve(t, matrix.NATS, matrix.Tool{Name: "a", SideEffects: config.ReadOnly, Echo: true}, matrix.Tool{Name: "b", SideEffects: config.ReadOnly, Echo: true})
	return s.EnvTools(10 * time.Second)
}

var threeCalls = [][]map[string]any{{{"name": "a", "arguments": map[string]any{"k": 0}}, {"name": "b", "arguments": map[string]any{"k": 1}},
	{"name": "a", "arguments": map[string]any{"k": 2}}}}

// each runs a test on every hosted kind.
func each(t *testing.T, test func(t *testing.T, kind string)) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) { test(t, kind) })
	}
}

// TestMixedOwnership: a call of a tool the registry does not hold is left
// for the application, which answers it itself through the sidecar; the
// sidecar posts its two calls in one request and nothing for the third
// (on Anthropic a partial answer, which re-emits the idle event with the
// application's call alone).
func TestMixedOwnership(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		h := startHosted(t, kind, simConfig{}, testenv.Options{}, echoTools(t)...)
		rounds := [][]map[string]any{{{"name": "a", "arguments": map[string]any{"k": 0}}, {"name": "app_lookup", "arguments": map[string]any{"q": "x"}},
			{"name": "b", "arguments": map[string]any{"k": 2}}}}
		id := h.create(t, appKey, script(rounds, "done "))
		poll.Until(t, "the sidecar's two results", func() bool { return len(h.session(id).Posts) == 1 })
		h.answerOwn(t, id, "app_lookup", "app answer")
		s := h.final(t, id)
		if !bytes.Contains([]byte(s.Final), []byte("app answer")) {
			t.Fatalf("final %q", s.Final)
		}
		assertOnce(t, h, s, 3, []int{2, 1})
	})
}

// TestPendingCallRace: results refused as "Unknown pending tool call"
// (the call announced before the API lists it) are posted again, the same
// request, until taken (OpenAI's race).
func TestPendingCallRace(t *testing.T) {
	h := startHosted(t, config.UpstreamOpenAIAgents, simConfig{RaceRejects: 2}, testenv.Options{}, echoTools(t)...)
	id := h.create(t, appKey, script(threeCalls, "done "))
	s := h.final(t, id)
	assertOnce(t, h, s, 3, []int{3})
	if n := h.sim.Requests(); n != 3 {
		t.Errorf("%d result posts, want 3 (two refused in the race)", n)
	}
}

// TestBackoff: a 429 with Retry-After and a 5xx (503; Anthropic's 529)
// on the result post are waited out; the batch is still one accepted
// post, each call answered once (on Anthropic, which has no idempotency
// key, the history is read before the post after the 529 is sent again).
func TestBackoff(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		h := startHosted(t, kind, simConfig{}, testenv.Options{}, echoTools(t)...)
		overloaded := http.StatusServiceUnavailable
		if kind == config.UpstreamAnthropicAgents {
			overloaded = 529
		}
		h.sim.Inject(agentssim.Fault{Status: http.StatusTooManyRequests, RetryAfter: "1"}, agentssim.Fault{Status: overloaded})
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
	})
}

// TestCutAndDuplicates: every event delivered twice and the watch's
// stream cut at three points of a two-block turn (before its first event,
// within the second block's events, after its post): the sidecar reopens
// it, reconciles from the session, and answers
// each call once, one post per block.
func TestCutAndDuplicates(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		for _, cut := range []int{0, 2, 5} {
			t.Run(fmt.Sprint("cut=", cut), func(t *testing.T) {
				h := startHosted(t, kind, simConfig{Duplicate: true}, testenv.Options{}, echoTools(t)...)
				h.sim.CutStream(cut)
				rounds := append(slices.Clone(threeCalls), threeCalls[0])
				id := h.create(t, appKey, script(rounds, "done "))
				s := h.final(t, id)
				assertOnce(t, h, s, 6, []int{3, 3})
			})
		}
	})
}

// TestSessionFails: a session that fails (OpenAI) or terminates
// (Anthropic) after its first block ends its watch; nothing more is
// posted.
func TestSessionFails(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		h := startHosted(t, kind, simConfig{}, testenv.Options{}, echoTools(t)...)
		b, _ := json.Marshal(map[string]any{"rounds": append(slices.Clone(threeCalls), threeCalls[0]), "fail_after": 1})
		id := h.create(t, appKey, string(b))
		s := h.final(t, id)
		if s.Status != "failed" && s.Status != "terminated" {
			t.Fatalf("session %+v", s)
		}
		assertOnce(t, h, s, 3, []int{3})
	})
}

// TestCancelWhileCallsRun: a turn the application cancels (OpenAI) or
// interrupts (Anthropic) while its calls run gets no result afterwards;
// the session's next turn is answered.
func TestCancelWhileCallsRun(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		held := matrix.Serve(t, matrix.NATS, matrix.Tool{Name: "slow", SideEffects: config.ReadOnly, Block: true, Echo: true})
		h := startHosted(t, kind, simConfig{}, testenv.Options{}, append(held.EnvTools(10*time.Second), echoTools(t)...)...)
		rounds := [][]map[string]any{{{"name": "slow", "arguments": map[string]any{"k": 0}}, {"name": "a", "arguments": map[string]any{"k": 1}}}}
		id := h.create(t, appKey, script(rounds, "first "))
		poll.Until(t, "the held call to start", func() bool { return held.Count("slow") == 1 })
		h.interrupt(t, id)
		held.Release()
		time.Sleep(300 * time.Millisecond) // what a late post would need to arrive
		if s := h.session(id); len(s.Posts) != 0 || s.Status != "idle" {
			t.Fatalf("after the cancel: %+v", s)
		}
		h.message(t, id, script(threeCalls, "second "))
		s := h.final(t, id)
		if !bytes.Contains([]byte(s.Final), []byte("second")) {
			t.Fatalf("final %q", s.Final)
		}
		assertOnce(t, h, s, 3, []int{3})
	})
}

// TestWebhooks: a session the sidecar was never shown is taken up by a
// webhook signed per Standard Webhooks (the secret from a file; the
// session read with the sidecar's own key, from a file, and no stream
// opened): its calls run and are answered once. A forged signature, and a replayed old one, are
// refused and change nothing.
func TestWebhooks(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		secret, secretFile, keyFile := webhookSecrets(t)
		h := startHosted(t, kind, simConfig{}, testenv.Options{Config: func(c *config.Config) {
			c.Upstream.WebhookSecretFile, c.Upstream.APIKeyFile = secretFile, keyFile
		}}, echoTools(t)...)
		h.base = h.simURL // the application creates its session at the API itself
		id := h.create(t, appKey, script(append(slices.Clone(threeCalls), threeCalls[0]), "done "))
		h.base = h.env.URL
		send := func(key []byte, at time.Time) int { return webhook(t, h.env.URL, kind, id, key, at) }
		if st := send([]byte("a forged secret"), time.Now()); st != http.StatusUnauthorized {
			t.Fatalf("a forged signature: %d", st)
		}
		if st := send(secret, time.Now().Add(-time.Hour)); st != http.StatusUnauthorized {
			t.Fatalf("an hour-old signature: %d", st)
		}
		time.Sleep(200 * time.Millisecond)
		if s := h.session(id); len(s.Posts) != 0 {
			t.Fatalf("a refused webhook made the sidecar answer: %+v", s)
		}
		if st := send(secret, time.Now()); st != http.StatusNoContent {
			t.Fatalf("a signed webhook: %d", st)
		}
		s := h.final(t, id)
		assertOnce(t, h, s, 6, []int{3, 3})
		if s.Streams != 0 {
			t.Errorf("a session taken up by a webhook had %d streams opened: it is read, not streamed", s.Streams)
		}
	})
}

// TestAnotherCallersSession: a caller with another credential cannot read
// a session through the sidecar (the upstream answers 404 to its own
// credential), nor its events; the session stays its owner's, and is
// answered.
func TestAnotherCallersSession(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		h := startHosted(t, kind, simConfig{}, testenv.Options{}, echoTools(t)...)
		id := h.create(t, appKey, script(threeCalls, "done "))
		paths := []string{"/v1/agents/sessions/" + id, "/v1/agents/sessions/" + id + "/events"}
		if kind == config.UpstreamAnthropicAgents {
			paths = []string{"/v1/sessions/" + id, "/v1/sessions/" + id + "/events", "/v1/sessions/" + id + "/events/stream"}
		}
		for _, p := range paths {
			if status, data := h.call(t, http.MethodGet, p, "sk-other", nil); status != http.StatusNotFound {
				t.Errorf("another caller's GET %s: %d %s", p, status, data)
			}
		}
		s := h.final(t, id)
		assertOnce(t, h, s, 3, []int{3})
	})
}

// TestApplicationStreamShowsResults: the application's own stream of the
// session through the sidecar shows, beside the API's events, one
// toolsidecar.tool_result event per call the sidecar answered, with the
// call's identity and output.
func TestApplicationStreamShowsResults(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		held := matrix.Serve(t, matrix.NATS, matrix.Tool{Name: "a", SideEffects: config.ReadOnly, Block: true, Echo: true},
			matrix.Tool{Name: "b", SideEffects: config.ReadOnly, Echo: true})
		h := startHosted(t, kind, simConfig{}, testenv.Options{}, held.EnvTools(10*time.Second)...)
		id := h.create(t, appKey, script(threeCalls, "done "))
		poll.Until(t, "the held call to start", func() bool { return held.Count("a") >= 1 })
		path := "/v1/agents/sessions/" + id + "/events"
		if kind == config.UpstreamAnthropicAgents {
			path = "/v1/sessions/" + id + "/events/stream"
		}
		req, _ := http.NewRequest(http.MethodGet, h.env.URL+path, nil)
		h.headers(req, appKey)
		req.Header.Set("Accept", "text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("the application's stream: %v %v", resp, err)
		}
		told := make(chan map[string]any, 16)
		var wg sync.WaitGroup
		wg.Go(func() {
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				data, ok := strings.CutPrefix(sc.Text(), "data: ")
				var ev map[string]any
				if ok && json.Unmarshal([]byte(data), &ev) == nil && ev["type"] == "toolsidecar.tool_result" {
					told <- ev
				}
			}
		})
		held.Release()
		calls := map[string]bool{}
		for len(calls) < 3 {
			select {
			case ev := <-told:
				call, _ := ev["call_id"].(string)
				if kind == config.UpstreamAnthropicAgents {
					call, _ = ev["custom_tool_use_id"].(string)
				}
				out, _ := ev["output"].(string)
				if calls[call] || !strings.Contains(out, "echo") {
					t.Fatalf("told %v (calls so far %v)", ev, calls)
				}
				calls[call] = true
			case <-time.After(poll.Timeout):
				t.Fatalf("told %d results of 3", len(calls))
			}
		}
		s := h.final(t, id)
		resp.Body.Close()
		wg.Wait()
		assertOnce(t, h, s, 3, []int{3})
	})
}

// webhook sends the API's webhook that session id requires action to the
// sidecar at base, signed per Standard Webhooks with key at time at, and
// returns the status.
func webhook(t *testing.T, base, kind, id string, key []byte, at time.Time) int {
	t.Helper()
	body := fmt.Sprintf(`{"type":"agent.session.action_required","data":{"id":%q,"required_action":{"type":"function_call"}}}`, id)
	if kind == config.UpstreamAnthropicAgents {
		body = fmt.Sprintf(`{"type":"event","id":"wh_1","created_at":"2026-12-07T00:00:00Z","data":{"type":"session.requires_action","id":%q}}`, id)
	}
	ts := strconv.FormatInt(at.Unix(), 10)
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "msg_1.%s.%s", ts, body)
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/sidecar/webhooks/"+kind, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", "msg_1")
	req.Header.Set("webhook-timestamp", ts)
	req.Header.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// webhookSecrets writes the webhook's secret and the sidecar's own key to
// files, and returns the secret and the files.
func webhookSecrets(t *testing.T) (secret []byte, secretFile, keyFile string) {
	dir := t.TempDir()
	secret = []byte("a webhook secret of the test")
	secretFile, keyFile = filepath.Join(dir, "secret"), filepath.Join(dir, "key")
	if os.WriteFile(secretFile, []byte("whsec_"+base64.StdEncoding.EncodeToString(secret)), 0o600) != nil ||
		os.WriteFile(keyFile, []byte(appKey), 0o600) != nil {
		t.Fatal("writing the secrets")
	}
	return secret, secretFile, keyFile
}

// TestTwoSidecarsOneSession: two sidecars on one NATS (durable), each
// behind the webhook, both told that the same session requires action:
// the run's lease lets one of them drive the block, the other finds the
// answers journaled and the session moved on. Each call runs once (the
// unsafe one too) and is answered once.
func TestTwoSidecarsOneSession(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		ns, err := embedded.Start(embedded.Config{Listen: "127.0.0.1:-1", AllowAnonymous: true, StoreDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ns.Shutdown)
		h := newSim(t, kind, simConfig{})
		base := "/v1"
		if kind == config.UpstreamAnthropicAgents {
			base = ""
		}
		served := matrix.Serve(t, matrix.NATS, matrix.Tool{Name: "a", SideEffects: config.ReadOnly, Echo: true},
			matrix.Tool{Name: "pay", SideEffects: config.Unsafe, Echo: true})
		secret, secretFile, keyFile := webhookSecrets(t)
		var urls []string
		for _, name := range []string{"sc-a", "sc-b"} {
			cfg, _ := testenv.Config(t, h.simURL, testenv.Options{}, served.EnvTools(10*time.Second))
			cfg.NATS.URL, cfg.InstanceID = ns.ClientURL(), name
			cfg.Upstream.Kind, cfg.Upstream.URL, cfg.Upstream.RetryBudget = kind, h.simURL+base, 10*time.Second
			cfg.Upstream.WebhookSecretFile, cfg.Upstream.APIKeyFile = secretFile, keyFile
			sc, err := sidecar.Start(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- sc.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })
			urls = append(urls, "http://"+sc.Addr())
		}
		nc, err := nats.Connect(ns.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		natstest.WorkerOn(t, nc, testenv.Prefix, served.Handlers())
		for _, u := range urls {
			testenv.WaitLive(t, u, "a", "pay")
		}
		// The calls take 200 ms, so that both sidecars have the session
		// while they run.
		rounds := [][]map[string]any{{{"name": "a", "arguments": map[string]any{"k": 0, "ms": 200}}, {"name": "pay", "arguments": map[string]any{"k": 1, "ms": 200}},
			{"name": "a", "arguments": map[string]any{"k": 2, "ms": 200}}}}
		id := h.create(t, appKey, script(rounds, "done "))
		var wg sync.WaitGroup
		for _, u := range urls {
			wg.Go(func() {
				if st := webhook(t, u, kind, id, secret, time.Now()); st != http.StatusNoContent {
					t.Errorf("webhook to %s: %d", u, st)
				}
			})
		}
		wg.Wait()
		s := h.final(t, id)
		assertOnce(t, h, s, 3, []int{3})
		if n := served.Count("pay"); n != 1 {
			t.Errorf("pay ran %d times", n)
		}
	})
}

// TestSimulatorApart: the simulator of each API in a process of its own,
// the sidecar meeting it over a loopback connection to another process: a
// 16-call block is answered in one post, each call once.
func TestSimulatorApart(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		h := apart(t, kind).start(t, testenv.Options{}, echoTools(t)...)
		testenv.WaitLive(t, h.env.URL, "a", "b")
		var round []map[string]any
		for k := range 16 {
			round = append(round, map[string]any{"name": []string{"a", "b"}[k%2], "arguments": map[string]any{"k": k}})
		}
		id := h.create(t, appKey, script([][]map[string]any{round}, "done "))
		s := h.final(t, id)
		assertOnce(t, h, s, 16, []int{16})
	})
}

// TestLiveViewShowsSessions: the live view's runs API (what `toolsidecar
// runs list/show` reads) shows a hosted session to its caller as a run,
// each block a turn with its batch; to another caller, and to a request
// with no credential, neither GET /v1/sidecar/runs nor /ui/events lists
// it, and its id reads 404. Before, every request read it.
func TestLiveViewShowsSessions(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		h := startHosted(t, kind, simConfig{}, testenv.Options{Server: func(s *config.Server) { s.UI = true }}, echoTools(t)...)
		id := h.create(t, appKey, script(append(slices.Clone(threeCalls), threeCalls[0]), "done "))
		h.final(t, id)
		var run struct {
			ID     string
			Status string
			Calls  int
			Turns  []struct {
				Calls []json.RawMessage
			}
		}
		as := func(key string) http.Header {
			req, _ := http.NewRequest(http.MethodGet, "/", nil)
			if key != "" {
				h.headers(req, key)
			}
			return req.Header
		}
		poll.Until(t, "the session's run on the board", func() bool {
			return testenv.BoardGet(t, h.env.URL+"/v1/sidecar/runs/"+id, as(appKey), &run) == http.StatusOK && run.Status == "completed"
		})
		for _, key := range []string{"sk-other", ""} {
			if status := testenv.BoardGet(t, h.env.URL+"/v1/sidecar/runs/"+id, as(key), nil); status != http.StatusNotFound {
				t.Errorf("caller %q reading the session's run: %d, want 404", key, status)
			}
			if listed, streamed := testenv.Board(t, h.env.URL, as(key)); len(listed) != 0 || len(streamed) != 0 {
				t.Errorf("caller %q sees runs %v and %v, want none", key, listed, streamed)
			}
		}
		var batches []int
		for _, tr := range run.Turns {
			if len(tr.Calls) > 0 {
				batches = append(batches, len(tr.Calls))
			}
		}
		if run.ID != id || run.Calls != 6 || !slices.Equal(batches, []int{3, 3}) {
			t.Fatalf("the board's run %+v, batches %v", run, batches)
		}
	})
}

// TestHostileSession: what a hosted upstream could send that must not
// become a path, a key or a run: a call whose arguments pass
// max_args_bytes gets an invalid_args answer (its siblings still run), and
// the session completes.
func TestHostileSession(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		h := startHosted(t, kind, simConfig{}, testenv.Options{Executor: config.Executor{MaxArgsBytes: 1 << 10}}, echoTools(t)...)
		rounds := [][]map[string]any{{{"name": "a", "arguments": map[string]any{"k": 0}}, {"name": "b", "arguments": map[string]any{"big": strings.Repeat("x", 4<<10)}}}}
		id := h.create(t, appKey, script(rounds, "done "))
		s := h.final(t, id)
		if !strings.Contains(s.Final, `"echo": {"k":0}`) || !strings.Contains(s.Final, "exceed the limit") {
			t.Fatalf("final %q", s.Final)
		}
		assertOnce(t, h, s, 2, []int{2})
	})
}

// TestConfirmationsThroughApprovals: with upstream.confirmations:
// approval, an Anthropic server call whose permission evaluated to ask
// becomes an approval of the approval API; the sidecar answers its own
// call of the block (a partial answer), then posts the person's decision
// as user.tool_confirmation, and the session goes on. A denial carries
// its reason as the deny_message.
func TestConfirmationsThroughApprovals(t *testing.T) {
	for _, decision := range []string{"approve", "deny"} {
		t.Run(decision, func(t *testing.T) {
			h := startHosted(t, config.UpstreamAnthropicAgents, simConfig{}, testenv.Options{Config: func(c *config.Config) {
				c.Upstream.Confirmations = config.ConfirmByApproval
			}}, echoTools(t)...)
			rounds := [][]map[string]any{{{"name": "a", "arguments": map[string]any{"k": 0}}, {"name": "server:web_fetch", "arguments": map[string]any{"url": "https://example.com"}}}}
			id := h.create(t, appKey, script(rounds, "done "))
			var pending struct {
				Approvals []struct {
					ActionID string `json:"action_id"`
					Tool     string `json:"tool"`
				} `json:"approvals"`
			}
			// The approval is the session's owner's: it lists and decides it.
			owner := func(method, url string, body []byte) (*http.Response, error) {
				req, _ := http.NewRequest(method, url, bytes.NewReader(body))
				h.headers(req, appKey)
				req.Header.Set("Content-Type", "application/json")
				return http.DefaultClient.Do(req)
			}
			poll.Until(t, "the server call's approval", func() bool {
				resp, err := owner(http.MethodGet, h.env.URL+"/v1/approvals", nil)
				if err != nil {
					return false
				}
				defer resp.Body.Close()
				return json.NewDecoder(resp.Body).Decode(&pending) == nil && len(pending.Approvals) == 1
			})
			if pending.Approvals[0].Tool != "web_fetch" {
				t.Fatalf("approvals %+v", pending)
			}
			poll.Until(t, "the sidecar's own call answered", func() bool { return len(h.session(id).Posts) == 1 })
			body, _ := json.Marshal(map[string]string{"decision": decision, "reason": "not that site"})
			resp, err := owner(http.MethodPost, h.env.URL+"/v1/approvals/"+pending.Approvals[0].ActionID, body)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("deciding: %v %v", resp, err)
			}
			resp.Body.Close()
			s := h.final(t, id)
			want := "allow"
			if decision == "deny" {
				want = "deny: not that site"
			}
			if !strings.Contains(s.Final, want) {
				t.Fatalf("final %q, want %q in it", s.Final, want)
			}
			assertOnce(t, h, s, 2, []int{1, 1})
		})
	}
}

// TestStreamedCreate: a session created with stream: true (201 and the
// session's events) is watched from the first event that names it, as
// the stream passes to the application unchanged; its calls are answered.
func TestStreamedCreate(t *testing.T) {
	h := startHosted(t, config.UpstreamOpenAIAgents, simConfig{}, testenv.Options{}, echoTools(t)...)
	body, _ := json.Marshal(map[string]any{"agent": map[string]any{"model": "gpt-sim"}, "environment": map[string]any{"type": "none"},
		"input": script(threeCalls, "done "), "stream": true})
	status, data := h.call(t, http.MethodPost, "/v1/agents/sessions", appKey, body)
	if status != http.StatusCreated || !bytes.Contains(data, []byte("agent.session.requires_action")) {
		t.Fatalf("the streamed create: %d %s", status, data)
	}
	var first struct {
		Session struct{ ID string }
	}
	line, _, _ := strings.Cut(string(data), "\n")
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &first); err != nil || first.Session.ID == "" {
		t.Fatalf("the stream's first event %q: %v", line, err)
	}
	s := h.final(t, first.Session.ID)
	assertOnce(t, h, s, 3, []int{3})
}

// TestOfficialAnthropicClient: @anthropic-ai/sdk (the version openaiup's
// Node checks lock, which has client.beta.agents and .sessions) as the
// application, its base URL at the sidecar: it creates the agent and the
// session, follows the session's stream (which shows the sidecar's
// toolsidecar.tool_result events, passed on by the client as any event),
// and reads the answer from the history.
func TestOfficialAnthropicClient(t *testing.T) {
	var got struct {
		Session string
		Types   []string
		Told    []map[string]any
		Answer  string
	}
	h := officialClient(t, config.UpstreamAnthropicAgents, "check-managed.mjs", "@anthropic-ai/sdk", &got)
	if len(got.Told) != 1 || !strings.Contains(got.Answer, `"echo": {"k":0}`) {
		t.Fatalf("the client saw %+v", got)
	}
	assertOnce(t, h, h.session(got.Session), 1, []int{1})
}

// TestOfficialOpenAIClient: the official openai Node client (7.60.0, the
// first release line with the Agents API, installed as openai7 beside
// the 6.x that openaiup's tests use) is the application of a hosted
// session through the sidecar, unmodified but for its base URL. Its
// session's one call runs on the sidecar's worker and is answered once;
// the client's own stream of the session shows the sidecar's
// toolsidecar.tool_result event, and the client reads the session idle.
func TestOfficialOpenAIClient(t *testing.T) {
	var got struct {
		Session string
		Types   []string
		Told    []map[string]any
		Status  string
	}
	h := officialClient(t, config.UpstreamOpenAIAgents, "check-agents.mjs", "openai7", &got)
	if len(got.Told) != 1 || got.Status != "idle" {
		t.Fatalf("the client saw %d results of the sidecar and the session %q, want 1 and idle: %+v", len(got.Told), got.Status, got)
	}
	assertOnce(t, h, h.session(got.Session), 1, []int{1})
}

// officialClient runs the Node script checker (in openaiup's Node checks,
// where pkg is installed) as the application of a session of kind with
// one call, and decodes what it printed into got. The call is held until
// the client says its stream is open: the sidecar adds its results to a
// stream from the moment it opened, and no stream replays.
func officialClient(t *testing.T, kind, checker, pkg string, got any) *hosted {
	t.Helper()
	checker, _ = filepath.Abs(filepath.Join("../openaiup/testdata/node", checker))
	if _, err := os.Stat(filepath.Join(filepath.Dir(checker), "node_modules", pkg)); err != nil {
		t.Fatalf("the %s Node package is missing: make openai-node installs it (%v)", pkg, err)
	}
	held := matrix.Serve(t, matrix.NATS, matrix.Tool{Name: "a", SideEffects: config.ReadOnly, Block: true, Echo: true})
	h := startHosted(t, kind, simConfig{}, testenv.Options{}, held.EnvTools(10*time.Second)...)
	var out []byte
	var runErr error
	var stderr syncbuf.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), poll.Timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "node", checker, h.env.URL, script([][]map[string]any{{threeCalls[0][0]}}, "done "))
		cmd.Stderr = io.MultiWriter(os.Stderr, &stderr)
		out, runErr = cmd.Output()
	}()
	poll.Until(t, "the client's stream and the held call", func() bool {
		select {
		case <-done: // the client ended early: its error says why
			return true
		default:
		}
		// Once the client has its stream's headers, the sidecar has
		// subscribed it to the session's results.
		return held.Count("a") >= 1 && strings.Contains(stderr.String(), "stream open")
	})
	held.Release()
	<-done
	if runErr != nil {
		t.Logf("violations %v", h.violations())
		t.Fatalf("node: %v", runErr)
	}
	if err := json.Unmarshal(out, got); err != nil {
		t.Fatalf("node printed %q: %v", out, err)
	}
	return h
}
