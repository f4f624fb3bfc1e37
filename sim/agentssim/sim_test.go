package agentssim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

func do(t *testing.T, srv *httptest.Server, method, path string, body any, beta bool) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, srv.URL+path, rd)
	req.Header.Set("Authorization", "Bearer k")
	if beta {
		req.Header.Set("OpenAI-Beta", Beta)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

func result(turn, call string, out string) map[string]any {
	return map[string]any{"type": "agent.session.input.tool_result", "turn_id": turn, "call_id": call, "success": true, "output": out}
}

// TestContract: a session blocks on its round's calls; the contract log
// records a request without the beta header, a result of the wrong kind,
// one for a call that is not pending and a second different answer; a
// retry under the same Idempotency-Key is the first request's effect.
func TestContract(t *testing.T) {
	sim := New(Config{})
	srv := httptest.NewServer(sim)
	defer srv.Close()
	input := `{"rounds":[[{"name":"f","arguments":{"x":1}},{"name":"g","arguments":{}}]],"answer":"ok "}`
	status, data := do(t, srv, "POST", "/v1/agents/sessions", map[string]any{"agent": map[string]any{"model": "m"}, "environment": map[string]any{"type": "none"}, "input": input}, true)
	var s struct {
		ID              string   `json:"id"`
		Status          string   `json:"status"`
		RequiredActions []action `json:"required_actions"`
	}
	if err := json.Unmarshal(data, &s); status != http.StatusCreated || err != nil || s.Status != "requires_action" || len(s.RequiredActions) != 2 {
		t.Fatalf("create: %d %s", status, data)
	}
	a0, a1 := s.RequiredActions[0], s.RequiredActions[1]
	if status, _ := do(t, srv, "GET", "/v1/agents/sessions/"+s.ID, nil, false); status != http.StatusBadRequest {
		t.Errorf("without the beta header: %d", status)
	}
	post := func(key string, events ...any) int {
		b, _ := json.Marshal(map[string]any{"events": events})
		req, _ := http.NewRequest("POST", srv.URL+"/v1/agents/sessions/"+s.ID+"/events", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer k")
		req.Header.Set("OpenAI-Beta", Beta)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := post("", map[string]any{"type": "function_call_output", "call_id": a0.CallID}); st != http.StatusBadRequest {
		t.Errorf("wrong kind: %d", st)
	}
	if st := post("", result(a0.TurnID, "call_nope", "x")); st != http.StatusBadRequest {
		t.Errorf("unknown call: %d", st)
	}
	if st := post("k1", result(a0.TurnID, a0.CallID, "one")); st != http.StatusAccepted {
		t.Errorf("first answer: %d", st)
	}
	if st := post("k1", result(a0.TurnID, a0.CallID, "one")); st != http.StatusAccepted {
		t.Errorf("the same request again: %d", st)
	}
	if st := post("", result(a0.TurnID, a0.CallID, "two")); st != http.StatusConflict {
		t.Errorf("second answer: %d", st)
	}
	if st := post("", result(a1.TurnID, a1.CallID, "three")); st != http.StatusAccepted {
		t.Errorf("last answer: %d", st)
	}
	got, _ := sim.Session(s.ID)
	if got.Status != "idle" || got.Final != "ok results: one | three" || !slices.Equal(got.Posts, []int{1, 1}) {
		t.Errorf("session %+v", got)
	}
	codes := sim.ViolationCodes()
	if want := []string{"missing_beta_header", "wrong_result_kind", "unknown_call", "second_answer"}; !slices.Equal(codes, want) {
		t.Errorf("violations %v, want %v", codes, want)
	}
}
