package agentsup_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/agentssim"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/matrix"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/promtest"
	"github.com/projectdavid/toolsidecar/testkit/syncbuf"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// rawAgents is an Agents API whose one session (sess_h) blocks on the
// required actions it is given, verbatim: what the simulator never sends.
// Each result post it accepts is kept, and answers the block.
type rawAgents struct {
	mu      sync.Mutex
	status  string
	actions []map[string]any
	posts   [][]byte
	// hold, when set, decides per result post (n from 1) whether to fail
	// it: its status, 0 to accept it, hang to answer it never.
	hold func(n int) int
	n    int
}

// hang is rawAgents.hold's answer for a post never answered.
const hang = -1

func (u *rawAgents) snapshot() []byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	b, _ := json.Marshal(map[string]any{"id": "sess_h", "object": "agent.session", "status": u.status, "required_actions": u.actions})
	return b
}

func (u *rawAgents) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/agents/sessions":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(u.snapshot())
	case r.Method == http.MethodGet && r.URL.Path == "/v1/agents/sessions/sess_h":
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(u.snapshot())
	case r.Method == http.MethodGet && r.URL.Path == "/v1/agents/sessions/sess_h/events":
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	case r.Method == http.MethodPost && r.URL.Path == "/v1/agents/sessions/sess_h/events":
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.n++
		fail := 0
		if u.hold != nil {
			fail = u.hold(u.n)
		}
		if fail == 0 {
			u.posts = append(u.posts, b)
			u.status, u.actions = "idle", nil
		}
		u.mu.Unlock()
		if fail == hang {
			<-r.Context().Done() // until the sidecar gives up on it
			return
		}
		if fail != 0 {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(fail)
			_, _ = io.WriteString(w, `{"error":{"message":"later"}}`)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	default:
		http.NotFound(w, r)
	}
}

// accepted are the result posts accepted, each as its events.
func (u *rawAgents) accepted(t *testing.T) [][]map[string]any {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out [][]map[string]any
	for _, p := range u.posts {
		var body struct{ Events []map[string]any }
		if err := json.Unmarshal(p, &body); err != nil {
			t.Errorf("result post %s: %v", p, err)
		}
		out = append(out, body.Events)
	}
	return out
}

// startRaw starts a sidecar on u and creates its session through it.
func startRaw(t *testing.T, u *rawAgents, opts testenv.Options, tools ...testenv.Tool) {
	t.Helper()
	srv := httptest.NewServer(u)
	t.Cleanup(srv.Close)
	edit := opts.Config
	opts.Config = func(c *config.Config) {
		c.Upstream.Kind, c.Upstream.URL, c.Upstream.RetryBudget = config.UpstreamOpenAIAgents, srv.URL+"/v1", 2*time.Second
		if edit != nil {
			edit(c)
		}
	}
	env := testenv.Start(t, coresim.Scenario{}, opts, tools...)
	testenv.WaitLive(t, env.URL, "a")
	req, _ := http.NewRequest(http.MethodPost, env.URL+"/v1/agents/sessions", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+appKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d", resp.StatusCode)
	}
}

func functionCall(turn, call, name, args string) map[string]any {
	return map[string]any{"type": "function_call", "turn_id": turn, "call_id": call, "name": name, "arguments": json.RawMessage(args)}
}

// TestDuplicateCallIdentity: a block that lists one (turn_id, call_id)
// twice, with other arguments the second time, is answered: one post,
// the call once, with the first listing's arguments, run once.
func TestDuplicateCallIdentity(t *testing.T) {
	served := matrix.Serve(t, matrix.NATS, matrix.Tool{Name: "a", SideEffects: config.ReadOnly, Echo: true})
	u := &rawAgents{status: "requires_action", actions: []map[string]any{
		functionCall("turn_1", "call_1", "a", `{"k":1}`), functionCall("turn_1", "call_1", "a", `{"k":2}`)}}
	startRaw(t, u, testenv.Options{}, served.EnvTools(5*time.Second)...)
	poll.Until(t, "the block to be answered", func() bool { return len(u.accepted(t)) > 0 })
	posts := u.accepted(t)
	if len(posts) != 1 || len(posts[0]) != 1 || posts[0][0]["call_id"] != "call_1" {
		t.Fatalf("result posts %v, want one answering call_1 once", posts)
	}
	if out, _ := posts[0][0]["output"].(string); !strings.Contains(out, `"k":1`) {
		t.Errorf("output %q, want the first listing's arguments", out)
	}
	if n := served.Count("a"); n != 1 {
		t.Errorf("a ran %d times, want 1", n)
	}
}

// TestPostPastBudget: a result post that fails past the retry budget (a
// 429 whose Retry-After is an hour, or a post never answered) is posted
// again, though no new block comes to start a drive: every call
// answered once, in one accepted post, nothing against the contract.
func TestPostPastBudget(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		h := startHosted(t, kind, simConfig{}, testenv.Options{Config: func(c *config.Config) { c.Upstream.RetryBudget = time.Second }}, echoTools(t)...)
		h.sim.Inject(agentssim.Fault{Status: http.StatusTooManyRequests, RetryAfter: "3600"})
		id := h.create(t, appKey, script(threeCalls, "done "))
		s := h.final(t, id)
		assertOnce(t, h, s, 3, []int{3})
	})
	t.Run("hung", func(t *testing.T) {
		served := matrix.Serve(t, matrix.NATS, matrix.Tool{Name: "a", SideEffects: config.ReadOnly, Echo: true})
		u := &rawAgents{status: "requires_action", actions: []map[string]any{functionCall("turn_1", "call_1", "a", `{}`)},
			hold: func(n int) int {
				if n == 1 {
					return hang
				}
				return 0
			}}
		startRaw(t, u, testenv.Options{}, served.EnvTools(5*time.Second)...)
		poll.Until(t, "the results to be posted again", func() bool { return len(u.accepted(t)) > 0 })
		if posts := u.accepted(t); len(posts) != 1 || len(posts[0]) != 1 || posts[0][0]["call_id"] != "call_1" {
			t.Fatalf("result posts %v, want one answering call_1", posts)
		}
	})
}

// TestForgedWebhooks: anyone may post to the webhook route. 300 refused
// webhooks (100 under a forged secret, 100 an hour old, 100 unsigned) are
// each refused with 401 and counted by reason in
// toolsidecar_webhooks_refused_total, and logged in one WARN line that
// counts them. Before, each one wrote a WARN line: 300 in 1.4 s.
func TestForgedWebhooks(t *testing.T) {
	secret, secretFile, keyFile := webhookSecrets(t)
	var logs syncbuf.Buffer
	h := startHosted(t, config.UpstreamOpenAIAgents, simConfig{}, testenv.Options{
		Config:  func(c *config.Config) { c.Upstream.WebhookSecretFile, c.Upstream.APIKeyFile = secretFile, keyFile },
		Sidecar: []sidecar.Option{sidecar.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))}})
	const each = 100
	for i := range each {
		id := fmt.Sprintf("sess_%d", i)
		if st := webhook(t, h.env.URL, h.kind, id, []byte("a forged secret"), time.Now()); st != http.StatusUnauthorized {
			t.Fatalf("a forged signature: %d", st)
		}
		if st := webhook(t, h.env.URL, h.kind, id, secret, time.Now().Add(-time.Hour)); st != http.StatusUnauthorized {
			t.Fatalf("an hour-old signature: %d", st)
		}
		resp, err := http.Post(h.env.URL+"/v1/sidecar/webhooks/"+h.kind, "application/json", strings.NewReader(`{"type":"agent.session.action_required","data":{"id":"`+id+`"}}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("an unsigned webhook: %d", resp.StatusCode)
		}
	}
	for _, reason := range []string{"signature", "timestamp", "unsigned"} {
		if n, _ := promtest.Sum(t, h.env.Sidecar.Metrics(), "toolsidecar_webhooks_refused_total", "reason="+reason); n != each {
			t.Errorf("%v webhooks refused for %s counted: want %d", n, reason, each)
		}
	}
	var refused []string
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "refused") {
			refused = append(refused, line)
		}
	}
	if len(refused) != 1 || !strings.Contains(refused[0], "count=1 ") {
		t.Errorf("%d WARN lines of refused webhooks: want one, the first, which counts it alone:\n%s", len(refused), strings.Join(refused[:min(len(refused), 3)], ""))
	}
}
