package managedsim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

type client struct {
	t   *testing.T
	srv *httptest.Server
}

func (c client) do(method, path string, body any, beta bool) (int, []byte) {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, c.srv.URL+path, rd)
	req.Header.Set("x-api-key", "k")
	req.Header.Set("anthropic-version", Version)
	if beta {
		req.Header.Set("anthropic-beta", Beta)
	}
	resp, err := c.srv.Client().Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

func result(id, thread, text string) map[string]any {
	return map[string]any{"type": "user.custom_tool_result", "custom_tool_use_id": id, "session_thread_id": thread,
		"content": []any{map[string]any{"type": "text", "text": text}}}
}

// TestContract: a session blocks on its custom calls (idle with
// requires_action and their ids); a partial answer re-emits the idle
// event with the rest; the contract log records a missing beta header,
// user.tool_result for a custom call, a result for an unknown call, a
// thread not echoed and a second answer.
func TestContract(t *testing.T) {
	sim := New(Config{})
	c := client{t, httptest.NewServer(sim)}
	defer c.srv.Close()
	_, data := c.do("POST", "/v1/agents", map[string]any{"name": "a", "model": "m"}, true)
	var agent struct{ ID string }
	_ = json.Unmarshal(data, &agent)
	input := `{"rounds":[[{"name":"f","arguments":{"x":1}},{"name":"g","arguments":{}}]],"answer":"ok ","threads":true}`
	status, data := c.do("POST", "/v1/sessions", map[string]any{"agent": agent.ID, "initial_events": []any{
		map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": input}}}}}, true)
	var s struct{ ID string }
	if err := json.Unmarshal(data, &s); status != http.StatusOK || err != nil || s.ID == "" {
		t.Fatalf("create: %d %s", status, data)
	}
	if status, _ := c.do("GET", "/v1/sessions/"+s.ID, nil, false); status != http.StatusBadRequest {
		t.Errorf("without the beta header: %d", status)
	}
	_, data = c.do("GET", "/v1/sessions/"+s.ID+"/events?limit=100", nil, true)
	var list struct {
		Data []struct {
			ID, Type   string
			Thread     string `json:"session_thread_id"`
			StopReason *struct {
				Type     string   `json:"type"`
				EventIDs []string `json:"event_ids"`
			} `json:"stop_reason"`
		}
	}
	_ = json.Unmarshal(data, &list)
	var uses, threads []string
	for _, e := range list.Data {
		if e.Type == "agent.custom_tool_use" {
			uses, threads = append(uses, e.ID), append(threads, e.Thread)
		}
	}
	last := list.Data[len(list.Data)-1]
	if len(uses) != 2 || last.Type != "session.status_idle" || last.StopReason == nil || !slices.Equal(last.StopReason.EventIDs, uses) {
		t.Fatalf("history %s", data)
	}
	post := func(events ...any) int {
		status, _ := c.do("POST", "/v1/sessions/"+s.ID+"/events", map[string]any{"events": events}, true)
		return status
	}
	if st := post(map[string]any{"type": "user.tool_result", "tool_use_id": uses[0]}); st != http.StatusOK {
		t.Errorf("wrong kind: %d", st)
	}
	if st := post(result("sevt_nope", "", "x")); st != http.StatusBadRequest {
		t.Errorf("unknown call: %d", st)
	}
	if st := post(result(uses[0], "", "one")); st != http.StatusOK { // thread not echoed: logged, taken
		t.Errorf("first answer: %d", st)
	}
	if got, _ := sim.Session(s.ID); !slices.Equal(got.Pending, uses[1:]) {
		t.Errorf("after a partial answer, pending %v", got.Pending)
	}
	if st := post(result(uses[0], threads[0], "two")); st != http.StatusBadRequest {
		t.Errorf("second answer: %d", st)
	}
	if st := post(result(uses[1], threads[1], "three")); st != http.StatusOK {
		t.Errorf("last answer: %d", st)
	}
	got, _ := sim.Session(s.ID)
	if got.Status != "idle" || got.Final != "ok results: one | three" || !slices.Equal(got.Posts, []int{1, 1}) {
		t.Errorf("session %+v", got)
	}
	codes := sim.ViolationCodes()
	if want := []string{"missing_beta_header", "wrong_result_kind", "unknown_call", "thread_not_echoed", "second_answer"}; !slices.Equal(codes, want) {
		t.Errorf("violations %v, want %v", codes, want)
	}
}
