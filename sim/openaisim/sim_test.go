package openaisim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// post sends a chat completion request and returns the status and the
// data of each SSE event (or the body, when it is not a stream).
func post(t *testing.T, url string, body any) (int, []string) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, []string{string(data)}
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, d)
		}
	}
	return resp.StatusCode, events
}

func msgs(m ...string) []json.RawMessage {
	out := make([]json.RawMessage, len(m))
	for i, s := range m {
		out[i] = json.RawMessage(s)
	}
	return out
}

const user = `{"role":"user","content":"{\"rounds\":[[{\"name\":\"f\",\"arguments\":{\"x\":1}},{\"name\":\"g\",\"arguments\":{}}]]}"}`

// turn asks the first turn and returns the assistant message a client
// would replay, rebuilt from the stream's fragments by index and id.
func turn(t *testing.T, url string) string {
	t.Helper()
	status, events := post(t, url, map[string]any{"model": "m", "stream": true, "messages": msgs(user)})
	if status != http.StatusOK || events[len(events)-1] != "[DONE]" {
		t.Fatalf("status %d, events %v", status, events)
	}
	var calls []*toolCall
	for _, e := range events[:len(events)-1] {
		var c struct {
			Choices []struct {
				Delta struct {
					ToolCalls []struct {
						Index int `json:"index"`
						toolCall
					} `json:"tool_calls"`
				} `json:"delta"`
			} `json:"choices"`
		}
		_ = json.Unmarshal([]byte(e), &c)
		for _, ch := range c.Choices {
			for _, d := range ch.Delta.ToolCalls {
				for len(calls) <= d.Index {
					calls = append(calls, &toolCall{Type: "function"})
				}
				k := calls[d.Index]
				if d.ID != "" {
					k.ID = d.ID
				}
				k.Function.Name += d.Function.Name
				k.Function.Arguments += d.Function.Arguments
			}
		}
	}
	b, _ := json.Marshal(map[string]any{"role": "assistant", "content": nil, "tool_calls": calls})
	return string(b)
}

func TestContractChecks(t *testing.T) {
	cases := []struct {
		name  string
		reply func(assistant string) []json.RawMessage
		code  string // the violation, "" for none
	}{
		{"every call answered", func(a string) []json.RawMessage {
			return msgs(user, a, `{"role":"tool","tool_call_id":"call_1_0","content":"1"}`, `{"role":"tool","tool_call_id":"call_1_1","content":"2"}`)
		}, ""},
		{"a call unanswered", func(a string) []json.RawMessage {
			return msgs(user, a, `{"role":"tool","tool_call_id":"call_1_0","content":"1"}`)
		}, "missing_tool_result"},
		{"a call answered twice", func(a string) []json.RawMessage {
			return msgs(user, a, `{"role":"tool","tool_call_id":"call_1_0","content":"1"}`, `{"role":"tool","tool_call_id":"call_1_0","content":"1"}`,
				`{"role":"tool","tool_call_id":"call_1_1","content":"2"}`)
		}, "duplicate_tool_result"},
		{"an answer to no call", func(a string) []json.RawMessage {
			return msgs(user, a, `{"role":"tool","tool_call_id":"call_1_0","content":"1"}`, `{"role":"tool","tool_call_id":"call_1_1","content":"2"}`,
				`{"role":"tool","tool_call_id":"call_9","content":"3"}`)
		}, "orphan_tool_message"},
		{"a tool message without a call", func(a string) []json.RawMessage {
			return msgs(user, `{"role":"tool","tool_call_id":"x","content":"1"}`)
		}, "orphan_tool_message"},
		{"arguments changed on replay", func(a string) []json.RawMessage {
			a = strings.Replace(a, `{\"x\":1}`, `{\"x\":2}`, 1)
			return msgs(user, a, `{"role":"tool","tool_call_id":"call_1_0","content":"1"}`, `{"role":"tool","tool_call_id":"call_1_1","content":"2"}`)
		}, "replay_changed"},
		{"a turn the model never made", func(a string) []json.RawMessage {
			return msgs(`{"role":"user","content":"other"}`, a, `{"role":"tool","tool_call_id":"call_1_0","content":"1"}`, `{"role":"tool","tool_call_id":"call_1_1","content":"2"}`)
		}, "unknown_turn"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sim := New(Config{})
			srv := httptest.NewServer(sim)
			defer srv.Close()
			a := turn(t, srv.URL)
			status, events := post(t, srv.URL, map[string]any{"model": "m", "stream": true, "messages": tc.reply(a)})
			v := sim.Violations()
			if tc.code == "" {
				if len(v) > 0 || status != http.StatusOK || !strings.Contains(strings.Join(events, ""), ` 1 | 2`) {
					t.Fatalf("violations %v, status %d, events %v", v, status, events)
				}
				return
			}
			if len(v) == 0 || v[0].Code != tc.code || status != http.StatusBadRequest {
				t.Fatalf("violations %v, status %d: want %s and a 400", v, status, tc.code)
			}
		})
	}
}

func TestFaults(t *testing.T) {
	sim := New(Config{})
	srv := httptest.NewServer(sim)
	defer srv.Close()
	sim.Inject(Fault{Status: http.StatusTooManyRequests, RetryAfter: "2"}, Fault{CutAfter: 2})
	b, _ := json.Marshal(map[string]any{"model": "m", "stream": true, "messages": msgs(`{"role":"user","content":"hello there"}`)})
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("status %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	_, events := post(t, srv.URL, map[string]any{"model": "m", "stream": true, "messages": msgs(`{"role":"user","content":"hello there"}`)})
	if len(events) != 2 {
		t.Fatalf("a stream cut after 2 chunks gave %d events: %v", len(events), events)
	}
	_, events = post(t, srv.URL, map[string]any{"model": "m", "stream": true, "messages": msgs(`{"role":"user","content":"hello there"}`)})
	if got := strings.Join(events, ""); !strings.Contains(got, `"finish_reason":"stop"`) || events[len(events)-1] != "[DONE]" || sim.Requests() != 3 {
		t.Fatalf("the third request was not answered whole: %v", events)
	}
	if len(sim.Finished()) != 1 {
		t.Fatalf("%d finish chunks recorded, want 1", len(sim.Finished()))
	}
}

// Each profile streams the calls its server's way.
func TestProfiles(t *testing.T) {
	for _, p := range Profiles {
		t.Run(string(p), func(t *testing.T) {
			sim := New(Config{Profile: p})
			srv := httptest.NewServer(sim)
			defer srv.Close()
			_, events := post(t, srv.URL, map[string]any{"model": "m", "stream": true, "stream_options": map[string]bool{"include_usage": true}, "messages": msgs(user)})
			all := strings.Join(events, "\n")
			ids := strings.Count(all, `"id":"call_1_0"`)
			switch p {
			case Ollama:
				if len(events) != 5 || strings.Count(all, `"index":0,"type":"function"`) != 2 { // role, calls, finish, usage, [DONE]
					t.Fatalf("want both calls whole, at index 0, in one chunk: %s", all)
				}
			case LiteLLM:
				if ids < 3 || !strings.Contains(all, `"id":"chatcmpl-sim1-1"`) {
					t.Fatalf("want the call's id on every fragment and a chunk id per chunk: %s", all)
				}
			case VLLM:
				if strings.Contains(all, `"arguments":""`) {
					t.Fatalf("vLLM's first delta has no arguments key: %s", all)
				}
			case LlamaCpp:
				i0, i1 := strings.Index(all, `"name":"g"`), strings.LastIndex(all, `{"arguments":"1}"`)
				if i0 < 0 || i1 < i0 {
					t.Fatalf("want call 1 begun before call 0 ends: %s", all)
				}
			}
			if !strings.Contains(events[len(events)-2], `"usage":{`) || !strings.Contains(all, `"finish_reason":"tool_calls"`) {
				t.Fatalf("want a finish chunk and the usage chunk last: %s", all)
			}
		})
	}
}

func TestScripted(t *testing.T) {
	for in, want := range map[string]string{
		"hello": "echo: hello",
		`{"rounds":[[{"name":"f"}]],"answer":"ok "}`: "f()",
	} {
		r := Scripted(Request{Messages: msgs(fmt.Sprintf(`{"role":"user","content":%q}`, in))})
		got := r.Content
		if len(r.Calls) > 0 {
			got = r.Calls[0].Name + "(" + strings.Trim(r.Calls[0].Args, "{}") + ")"
		}
		if got != want {
			t.Errorf("Scripted(%s) = %q, want %q", in, got, want)
		}
	}
}
