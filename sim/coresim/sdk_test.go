package coresim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/projectdavid/toolsidecar/core"
)

// sdkSchemas are the JSON Schemas of the response models the Project David
// SDK (projectdavid 1.97.0) validates on the consumer-tool path, generated
// from its pydantic models: an answer that fails one makes the SDK raise.
func sdkSchemas(t *testing.T) map[string]*jsonschema.Resolved {
	t.Helper()
	raw, err := os.ReadFile("testdata/sdk-response-schemas.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Models map[string]*jsonschema.Schema `json:"models"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]*jsonschema.Resolved{}
	for name, s := range doc.Models {
		r, err := s.Resolve(nil)
		if err != nil {
			t.Fatalf("schema %s: %v", name, err)
		}
		out[name] = r
	}
	return out
}

// sdkClient sends the SDK's requests, with the SDK's bodies, and checks
// each JSON answer against the models the SDK reads it with.
type sdkClient struct {
	t       *testing.T
	url     string
	schemas map[string]*jsonschema.Resolved
}

// do sends one request and validates the answer against every named model
// (several where the SDK reads one route with more than one model); a
// list answer is validated element by element. It returns the answer.
func (c *sdkClient) do(method, path, body string, models ...string) any {
	c.t.Helper()
	req, err := http.NewRequest(method, c.url+path, bytes.NewBufferString(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("X-API-Key", "k")
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var v any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		c.t.Fatalf("%s %s: %d %v", method, path, resp.StatusCode, v)
	}
	items := []any{v}
	if list, ok := v.([]any); ok {
		items = list
	}
	for _, m := range models {
		for _, it := range items {
			if err := c.schemas[m].Validate(it); err != nil {
				c.t.Errorf("%s %s: answer is no %s: %v\n%v", method, path, m, err, it)
			}
		}
	}
	return v
}

func (c *sdkClient) id(v any) string {
	c.t.Helper()
	id, _ := v.(map[string]any)["id"].(string)
	if id == "" {
		c.t.Fatalf("no id in %v", v)
	}
	return id
}

// TestSDKReadsEveryAnswer drives the simulator over HTTP through every
// route the SDK calls on the consumer-tool path (sdk-protocol §5 to §7),
// with the SDK's own request bodies, and validates each JSON answer
// against the SDK's response model: the unmodified SDK in front of `sim
// core` must not raise on any of them.
func TestSDKReadsEveryAnswer(t *testing.T) {
	_, srv := NewServer(Config{APIKey: "k", Scenario: threeCalls()})
	t.Cleanup(srv.Close)
	c := &sdkClient{t: t, url: srv.URL, schemas: sdkSchemas(t)}

	asst := c.id(c.do("POST", "/v1/assistants", `{"name": "a", "model": "vllm/qwen", "instructions": "be brief", "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]}`, "AssistantRead"))
	c.do("GET", "/v1/assistants/"+asst, "", "AssistantRead")
	thread := c.id(c.do("POST", "/v1/threads", `{"meta_data": {}}`, "ThreadRead"))
	msg := c.id(c.do("POST", "/v1/messages", `{"content": "What is the weather in Paris?", "thread_id": "`+thread+`", "sender_id": null, "assistant_id": "`+asst+`", "role": "user", "tool_id": null, "tool_call_id": null, "meta_data": {}, "is_last_chunk": false, "attachments": []}`, "MessageRead"))
	run := c.id(c.do("POST", "/v1/runs", `{"id": "run_client", "assistant_id": "`+asst+`", "created_at": 1700000000, "expires_at": 1700003600, "instructions": "", "max_completion_tokens": 1000, "max_prompt_tokens": 500, "meta_data": {}, "model": "gpt-4", "object": "run", "parallel_tool_calls": false, "response_format": "text", "status": "pending", "thread_id": "`+thread+`", "tool_choice": "none", "temperature": 1.0, "top_p": 1.0, "tool_resources": {}}`, "Run"))
	c.do("GET", "/v1/runs/"+run, "", "Run", "RunReadDetailed")

	// The turn's stream is SSE, not a model: the core client reads it.
	cl, err := core.New(core.Config{URL: srv.URL, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{c: cl, req: core.CompletionRequest{Model: "vllm/qwen", ThreadID: thread, MessageID: msg, RunID: run, AssistantID: asst}}
	ms, _, err := f.turn(t)
	if err != nil || len(ms) != 3 {
		t.Fatalf("turn 1: %d manifests, %v", len(ms), err)
	}
	c.do("GET", "/v1/runs/"+run, "", "Run", "RunReadDetailed")
	c.do("GET", "/v1/actions/pending/"+run, "")
	c.do("GET", "/v1/runs/"+run+"/actions/status?status=pending", "", "ActionRead")
	for _, m := range ms {
		c.do("PUT", "/v1/actions/"+m.ActionID, `{"status": "processing"}`, "ActionRead")
		c.do("POST", "/v1/messages/tools", `{"content": "{\"temp_c\": 21}", "thread_id": "`+thread+`", "sender_id": null, "assistant_id": "`+asst+`", "role": "tool", "tool_id": "`+m.ActionID+`", "tool_call_id": "`+m.ToolCallID+`", "meta_data": {}, "is_last_chunk": false, "attachments": []}`, "MessageRead")
		c.do("PUT", "/v1/actions/"+m.ActionID, `{"status": "completed"}`, "ActionRead")
		c.do("GET", "/v1/actions/"+m.ActionID, "", "ActionRead")
	}
	if _, _, err := f.turn(t); err != nil {
		t.Fatalf("turn 2: %v", err)
	}
	c.do("GET", "/v1/runs/"+run, "", "Run", "RunReadDetailed")
	c.do("GET", "/v1/threads/"+thread+"/messages?limit=10&order=asc", "", "MessagesList")

	// A second run, cancelled before it ends.
	other := c.id(c.do("POST", "/v1/runs", `{"assistant_id": "`+asst+`", "thread_id": "`+thread+`", "instructions": "", "meta_data": {}}`, "Run"))
	c.do("POST", "/v1/runs/"+other+"/cancel", "", "Run")
	c.do("GET", "/v1/runs/"+other, "", "Run", "RunReadDetailed")
}
