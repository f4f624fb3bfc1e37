package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/projectdavid/toolsidecar/cmd/toolsidecar/internal/demo"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/sim/agentssim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// oneCall is a script of one get_flight_times call and an answer that
// quotes its result.
const oneCall = `name: one-call
turns:
  - calls: [{tool: get_flight_times, args: {departure: LHR, arrival: JFK}}]
  - content: "The flight takes {{results}}."
`

// startSim runs "toolsidecar sim KIND" as a process of its own and
// returns the URL its first line names for the sidecar.
func startSim(t *testing.T, kind string, extra ...string) string {
	t.Helper()
	addr := testenv.FreeAddr(t)
	cmd := exec.Command(os.Args[0], append([]string{"sim", kind, "--listen", addr}, extra...)...)
	cmd.Env = append(os.Environ(), "TSC_TEST_DAEMON=1")
	testenv.StartProcess(t, cmd, "sim "+kind+": serving http://"+addr)
	if kind == "openai" || kind == "responses" || kind == "openai-agents" {
		return "http://" + addr + "/v1"
	}
	return "http://" + addr
}

// TestSimDrivesOneCall: each "toolsidecar sim" kind, a process of its own
// playing a script file, drives one call through a sidecar process whose
// upstream it is, to a worker, and its answer quotes the worker's result.
// A hosted kind's session, created through the sidecar with a question,
// blocks on the call, which the sidecar answers; the session's answer is
// read from the simulator's own view of it.
func TestSimDrivesOneCall(t *testing.T) {
	script := filepath.Join(t.TempDir(), "one-call.yaml")
	if err := os.WriteFile(script, []byte(oneCall), 0o600); err != nil {
		t.Fatal(err)
	}
	asks := map[string]struct{ path, body string }{
		"openai":    {"/v1/chat/completions", `{"model": "m", "messages": [{"role": "user", "content": "How long to New York?"}]}`},
		"responses": {"/v1/responses", `{"model": "m", "input": "How long to New York?"}`},
		"anthropic": {"/v1/messages", `{"model": "m", "max_tokens": 1024, "messages": [{"role": "user", "content": "How long to New York?"}]}`},
	}
	for _, kind := range []string{"core", "openai", "responses", "anthropic", "openai-agents", "anthropic-agents"} {
		t.Run(kind, func(t *testing.T) {
			url := startSim(t, kind, "--script", script)
			upstream := ""
			if kind != "core" {
				upstream = "upstream: {kind: " + kind + ", url: " + url + "}\n"
			}
			p := newDaemonConfig(t, url, "  - {name: get_flight_times, parameters: {type: object}}\n", upstream)
			p.start(t)
			startWorker(t, p.natsURL, map[string]tool.Handler{"get_flight_times": func(_ context.Context, c *tool.Call) ([]byte, error) {
				var a struct{ Departure string }
				if err := json.Unmarshal(c.Args, &a); err != nil {
					return nil, err
				}
				return []byte("7h 5m from " + a.Departure), nil // text, not JSON: the answer quotes it as it is
			}})
			var answer string
			switch kind {
			case "openai-agents", "anthropic-agents":
				answer = hostedAnswer(t, kind, p.base, strings.TrimSuffix(url, "/v1"))
			case "core":
				run, msgID := newRun(t, url)
				res := <-p.drive(run, msgID)
				if res.err != nil || res.sum.Status != "completed" || len(res.sum.Calls) != 1 || !res.sum.Calls[0].OK {
					t.Fatalf("drive: %v %+v\n%s", res.err, res.sum, p.stderr.String())
				}
				answer = res.sum.Content
			default:
				resp, err := http.Post(p.base+asks[kind].path, "application/json", strings.NewReader(asks[kind].body))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				answer = string(b)
			}
			if !strings.Contains(answer, `The flight takes 7h 5m from LHR.`) {
				t.Errorf("answer %s\nsidecar log:\n%s", answer, p.stderr.String())
			}
		})
	}
}

// hostedAnswer creates a session through the sidecar at base, as the
// hosted API's client does, with a question rather than a script, and
// returns its answer once its turn has ended, from the simulator at sim.
func hostedAnswer(t *testing.T, kind, base, sim string) string {
	t.Helper()
	call := func(path, body string, want int) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		demo.HostedHeaders(req.Header, kind, "sk-app")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var o struct{ ID string }
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want || json.Unmarshal(b, &o) != nil || o.ID == "" {
			t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
		}
		return o.ID
	}
	var id string
	if kind == "anthropic-agents" {
		agent := call("/v1/agents", `{"name": "travel", "model": "m"}`, http.StatusOK)
		id = call("/v1/sessions", `{"agent": "`+agent+`", "environment_id": "env_1", "initial_events": [{"type": "user.message", "content": [{"type": "text", "text": "How long to New York?"}]}]}`, http.StatusOK)
	} else {
		id = call("/v1/agents/sessions", `{"agent": {"model": "m"}, "environment": {"type": "none"}, "input": "How long to New York?"}`, http.StatusCreated)
	}
	var s agentssim.Session // managedsim.Session too
	poll.Until(t, "session "+id+" to end its turn", func() bool {
		resp, err := http.Get(sim + "/_sim/sessions/" + id)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&s) == nil && s.Final != ""
	})
	return s.Final
}

// TestSimCoreFreshIDs: two starts of "toolsidecar sim core" issue
// different run ids, so that a sidecar never takes a new run for an old
// one.
func TestSimCoreFreshIDs(t *testing.T) {
	var ids []string
	for range 2 {
		url := startSim(t, "core")
		cc, _ := core.New(core.Config{URL: url, APIKey: "k"})
		ids = append(ids, testenv.SetUpRun(t, cc, nil).RunID)
	}
	if ids[0] == ids[1] || !core.Addressable(ids[0]) {
		t.Errorf("run ids %q: want two different ids", ids)
	}
}

// TestSimRefusals: an unknown kind is a usage error; a script whose turns
// only Core can play is refused for a model API, naming the turn.
func TestSimRefusals(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"sim", "gemini"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "core, openai, responses, anthropic") {
		t.Errorf("sim gemini: exit %d: %s", code, errOut.String())
	}
	script := filepath.Join(t.TempDir(), "core-only.yaml")
	os.WriteFile(script, []byte("turns:\n  - calls: [{tool: t}]\n  - error: model overloaded\n"), 0o600)
	errOut.Reset()
	if code := run([]string{"sim", "openai", "--listen", "127.0.0.1:0", "--script", script}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "turn 2") {
		t.Errorf("a Core-only script on openai: exit %d: %s", code, errOut.String())
	}
}
