package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/sim/agentssim"
	"github.com/projectdavid/toolsidecar/sim/managedsim"
	"github.com/projectdavid/toolsidecar/testkit/matrix"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// TestHostedSIGKILL: the sidecar (upstream.kind openai-agents or
// anthropic-agents, durable)
// is killed with SIGKILL while a session's calls run (a read-only look and
// an unsafe pay), or just after it posted a block's results, then started
// again; the application reads its session through the new process, which
// watches it again and reconciles from the session and the journal. The
// unsafe tool ran once (its reply from the ledger, or "interrupted" when
// it ran in the dead process), every call was answered once, no answer
// twice, and the session reaches its final turn.
func TestHostedSIGKILL(t *testing.T) {
	for _, kind := range []string{"openai-agents", "anthropic-agents"} {
		for _, after := range []bool{false, true} {
			for _, route := range []string{matrix.NATS, matrix.Exec} {
				name := "calls in flight"
				if after {
					name = "after a post"
				}
				t.Run(fmt.Sprintf("%s/%s/route=%s", kind, name, route), func(t *testing.T) { hostedKill(t, kind, route, after) })
			}
		}
	}
}

// hostedSim is either hosted simulator, as the kill test reads it.
type hostedSim interface {
	http.Handler
	Violations() []agentssim.Violation
}

func hostedKill(t *testing.T, kind, route string, afterPost bool) {
	var sim hostedSim
	var session func(id string) agentssim.Session
	base := "/v1"
	if kind == "openai-agents" {
		s := agentssim.New(agentssim.Config{})
		sim, session = s, func(id string) agentssim.Session { v, _ := s.Session(id); return v }
	} else {
		s := managedsim.New(managedsim.Config{})
		sim, session, base = s, func(id string) agentssim.Session { v, _ := s.Session(id); return v }, ""
	}
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close) // after the daemon's end: its stream is open till then
	tools := matrix.Serve(t, route, matrix.Tool{Name: "look", SideEffects: "read_only", Block: !afterPost},
		matrix.Tool{Name: "pay", SideEffects: "unsafe", Block: !afterPost}, matrix.Tool{Name: "wait", SideEffects: "read_only", Block: true})
	p := newDaemonConfig(t, srv.URL, tools.Config("10s"),
		fmt.Sprintf("upstream: {kind: %s, url: %q, retry_budget: 10s}\n", kind, srv.URL+base))
	p.start(t)
	defer func() {
		if t.Failed() {
			t.Logf("the daemon's log:\n%s", p.stderr.String())
		}
	}()
	var nc *nats.Conn
	if hs := tools.Handlers(); hs != nil {
		nc = startWorker(t, p.natsURL, hs)
		testenv.WaitLive(t, p.base, "look", "pay", "wait")
	}
	app := func(method, path string, body any) (int, []byte) {
		var b []byte
		if body != nil {
			b, _ = json.Marshal(body)
		}
		req, _ := http.NewRequest(method, p.base+path, bytes.NewReader(b))
		if kind == "openai-agents" {
			req.Header.Set("Authorization", "Bearer app-key")
			req.Header.Set("OpenAI-Beta", agentssim.Beta)
		} else {
			req.Header.Set("X-Api-Key", "app-key")
			req.Header.Set("anthropic-version", managedsim.Version)
			req.Header.Set("anthropic-beta", managedsim.Beta)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, data
	}
	round := []map[string]any{{"name": "look", "arguments": map[string]any{}}, {"name": "pay", "arguments": map[string]any{}}}
	rounds := [][]map[string]any{round}
	if afterPost {
		rounds = append(rounds, []map[string]any{{"name": "wait", "arguments": map[string]any{}}})
	}
	input, _ := json.Marshal(map[string]any{"rounds": rounds, "answer": "done "})
	sessions, created := "/v1/agents/sessions", http.StatusCreated
	body := map[string]any{"agent": map[string]any{"model": "m"}, "environment": map[string]any{"type": "none"}, "input": string(input)}
	if kind != "openai-agents" {
		_, data := app("POST", "/v1/agents", map[string]any{"name": "a", "model": "m"})
		var agent struct{ ID string }
		_ = json.Unmarshal(data, &agent)
		sessions, created = "/v1/sessions", http.StatusOK
		body = map[string]any{"agent": agent.ID, "initial_events": []any{map[string]any{"type": "user.message",
			"content": []any{map[string]any{"type": "text", "text": string(input)}}}}}
	}
	status, data := app("POST", sessions, body)
	var sess struct{ ID string }
	if err := json.Unmarshal(data, &sess); status != created || err != nil {
		t.Fatalf("create: %d %s", status, data)
	}
	if afterPost {
		poll.Until(t, "the first block's results to be posted, and the second block's call to run", func() bool {
			s := session(sess.ID)
			return len(s.Posts) == 1 && tools.Count("wait") == 1
		})
	} else {
		poll.Until(t, "both calls to run", func() bool { return tools.Count("look") == 1 && tools.Count("pay") == 1 })
		p.settled(t, tools, "look", "pay")
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	if nc != nil {
		poll.Until(t, "the worker to see the server gone", func() bool { return !nc.IsConnected() })
	}
	tools.Release()
	p.start(t)
	if nc != nil {
		testenv.WaitLive(t, p.base, "look", "pay", "wait")
		if err := nc.Flush(); err != nil { // the replies buffered while the sidecar was away have reached the server
			t.Fatal(err)
		}
	}
	if status, data := app("GET", sessions+"/"+sess.ID, nil); status != http.StatusOK {
		t.Fatalf("reading the session again: %d %s", status, data)
	}
	var s agentssim.Session
	poll.Until(t, "the session's final turn", func() bool { s = session(sess.ID); return s.Final != "" || s.Status == "failed" })
	if s.Status != "idle" {
		t.Fatalf("session %+v\n%s", s, p.stderr.String())
	}

	if pays := tools.Count("pay"); pays != 1 {
		t.Errorf("pay ran %d times, want once", pays)
	}
	if !afterPost && tools.InProcess() && !strings.Contains(s.Final, "interrupted") {
		t.Errorf("pay died with the process that ran it, yet the answer %q does not say interrupted", s.Final)
	}
	calls := 2
	if afterPost {
		calls = 3
	}
	if len(s.Answers) != calls {
		t.Errorf("%d calls answered, want %d: %v", len(s.Answers), calls, s.Answers)
	}
	for id, n := range s.Answers {
		if n != 1 {
			t.Errorf("call %s answered %d times", id, n)
		}
	}
	if v := sim.Violations(); len(v) > 0 {
		t.Errorf("the upstream's contract log: %+v", v)
	}
}
