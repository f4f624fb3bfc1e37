package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/agentssim"
	"github.com/projectdavid/toolsidecar/sim/managedsim"
	"github.com/projectdavid/toolsidecar/sim/simserve"
)

// hostedSim is what the demo reads of a hosted-agent simulator.
type hostedSim interface {
	http.Handler
	Violations() []agentssim.Violation
	Session(id string) (agentssim.Session, bool)
}

// runHosted is a hosted part of the demo: the simulator of kind
// (openai-agents or anthropic-agents, as "toolsidecar sim" serves it: its
// sessions block on three get_flight_times calls), a sidecar in front of
// it with the demo's workers, and an application that creates a session
// through the sidecar with a question. The sidecar watches the session,
// runs the calls it blocks on as one batch and posts their results; the
// demo prints the calls answered, the session's answer and the
// simulator's contract log.
func runHosted(ctx context.Context, out io.Writer, passwordFile, password, heading, kind string) error {
	h, _, err := simserve.Handler(simserve.Options{Kind: kind})
	if err != nil {
		return err
	}
	sim, ok := h.(hostedSim)
	if !ok {
		return fmt.Errorf("demo: the %s simulator has no session view", kind)
	}
	base := ""
	if kind == config.UpstreamOpenAIAgents {
		base = "/v1"
	}
	s, stop, err := inFront(ctx, sim, kind, base, passwordFile, password)
	if err != nil {
		return err
	}
	defer stop()

	sidecarURL := "http://" + s.Addr()
	const appKey = "sk-demo-app"
	post := func(path, body string) (map[string]any, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, sidecarURL+path, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		HostedHeaders(req.Header, kind, appKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var o map[string]any
		if resp.StatusCode/100 != 2 || json.Unmarshal(b, &o) != nil {
			return nil, fmt.Errorf("demo: POST %s answered %d: %s", path, resp.StatusCode, b)
		}
		return o, nil
	}
	question := "Flight times, please."
	path, body := "/v1/agents/sessions", `{"agent": {"model": "gpt-demo"}, "environment": {"type": "none"}, "input": "`+question+`"}`
	fmt.Fprintf(out, "\n%s\n", heading)
	if kind == config.UpstreamAnthropicAgents {
		agent, err := post("/v1/agents", `{"name": "travel", "model": "claude-demo"}`)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "POST %s/v1/agents: agent %v\n", sidecarURL, agent["id"])
		path, body = "/v1/sessions", fmt.Sprintf(`{"agent": %q, "environment_id": "env_demo", "initial_events": [{"type": "user.message", "content": [{"type": "text", "text": %q}]}]}`,
			agent["id"], question)
	}
	t0 := time.Now()
	created, err := post(path, body)
	if err != nil {
		return err
	}
	id, _ := created["id"].(string)
	fmt.Fprintf(out, "POST %s%s: session %s, status %v\n", sidecarURL, path, id, created["status"])

	// The session's turn ends once the sidecar has posted the results.
	var sess agentssim.Session
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		sess, _ = sim.Session(id)
		if sess.Final != "" || sess.Status == "failed" || sess.Status == "terminated" {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("demo: the %s session %s did not end its turn: %+v", kind, id, sess)
		}
	}
	answered := 0
	for _, n := range sess.Answers {
		answered += n
	}
	fmt.Fprintf(out, "[%7s] session %s: %d call(s) answered in %d post(s)\n", ms(time.Since(t0)), sess.Status, answered, len(sess.Posts))
	run, err := boardRun(ctx, sidecarURL, id, func(h http.Header) { HostedHeaders(h, kind, appKey) })
	if err != nil {
		return err
	}
	for _, c := range run.Calls {
		fmt.Fprintf(out, "  %-17s %s  %s  %s\n", c.Tool, c.ToolCallID, c.Outcome, c.Preview)
	}
	fmt.Fprintf(out, "answer: %s\n", sess.Final)
	if err := contractLog(out, sim.Violations()); err != nil {
		return err
	}
	if sess.Final == "" || answered != 3 || len(sess.Posts) != 1 || len(run.Calls) != 3 {
		return fmt.Errorf("demo: the %s session %s: %+v, the sidecar's run %+v", kind, id, sess, run)
	}
	return nil
}

// HostedHeaders sets the headers the hosted API of kind wants of its
// clients (the beta, the version, the caller's key), as its official
// client sends them through the sidecar.
func HostedHeaders(h http.Header, kind, key string) {
	if kind == config.UpstreamAnthropicAgents {
		h.Set("X-Api-Key", key)
		h.Set("anthropic-version", managedsim.Version)
		h.Set("anthropic-beta", managedsim.Beta)
		return
	}
	h.Set("Authorization", "Bearer "+key)
	h.Set("OpenAI-Beta", agentssim.Beta)
}

// hostedCall is a call of a watched session, as the sidecar's board has it.
type hostedCall struct {
	ToolCallID string `json:"tool_call_id"`
	Tool       string `json:"tool"`
	Outcome    string `json:"outcome"`
	Preview    string `json:"preview"`
}

// hostedRun is the sidecar's record of a session: the calls of its turns.
type hostedRun struct {
	Status string
	Calls  []hostedCall
}

// boardRun is the sidecar's record of the session id once it completed,
// read with the headers auth sets: the live view shows a caller its own
// runs only, so the demo reads as the application that made the session.
func boardRun(ctx context.Context, sidecarURL, id string, auth func(http.Header)) (run hostedRun, err error) {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var got struct {
			Status string
			Turns  []struct {
				Calls []hostedCall
			}
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, sidecarURL+"/v1/sidecar/runs/"+id, nil)
		auth(req.Header)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && json.Unmarshal(b, &got) == nil && got.Status == "completed" {
				run.Status = got.Status
				for _, t := range got.Turns {
					run.Calls = append(run.Calls, t.Calls...)
				}
				return run, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return run, fmt.Errorf("demo: the sidecar has no completed run for session %s", id)
		}
	}
}
