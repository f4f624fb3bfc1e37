package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	sse "github.com/tmaxmax/go-sse"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/server"
	"github.com/projectdavid/toolsidecar/sim/agentssim"
	"github.com/projectdavid/toolsidecar/sim/anthropicsim"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/sim/managedsim"
	"github.com/projectdavid/toolsidecar/sim/openaisim"
	"github.com/projectdavid/toolsidecar/sim/responsesim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// apiSpec is server/openapi.json, compiled schema by schema on demand.
type apiSpec struct {
	doc map[string]any
	c   *jsonschema.Compiler
	mu  sync.Mutex
}

func loadSpec(t *testing.T) *apiSpec {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(server.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(server.OpenAPI))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("openapi.json", inst); err != nil {
		t.Fatal(err)
	}
	return &apiSpec{doc: doc, c: c}
}

// pointer escapes a path for a JSON pointer.
func pointer(parts ...string) string {
	r := strings.NewReplacer("~", "~0", "/", "~1")
	for i, p := range parts {
		parts[i] = r.Replace(p)
	}
	return "/" + strings.Join(parts, "/")
}

// at walks the document along a JSON pointer.
func (s *apiSpec) at(ptr string) any {
	var v any = s.doc
	r := strings.NewReplacer("~1", "/", "~0", "~")
	for _, p := range strings.Split(strings.TrimPrefix(ptr, "/"), "/") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[r.Replace(p)]
	}
	return v
}

// validate checks a JSON body against the schema at ptr.
func (s *apiSpec) validate(t *testing.T, ptr string, body []byte) {
	t.Helper()
	s.mu.Lock()
	sch, err := s.c.Compile("openapi.json#" + ptr)
	s.mu.Unlock()
	if err != nil {
		t.Fatalf("schema %s: %v", ptr, err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("body is not JSON (%v): %s", err, body)
	}
	if err := sch.Validate(inst); err != nil {
		t.Errorf("body does not match %s: %v\n%s", ptr, err, body)
	}
}

// check asserts that the answer to method path (the spec's path template)
// is documented: its status, its content type, its body (each SSE event's
// type and data).
func (s *apiSpec) check(t *testing.T, method, path string, resp *http.Response) {
	t.Helper()
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	code := strconv.Itoa(resp.StatusCode)
	respPtr := pointer("paths", path, strings.ToLower(method), "responses", code)
	r, ok := s.at(respPtr).(map[string]any)
	if !ok {
		t.Errorf("%s %s answered %s, which the spec does not document:\n%s", method, path, code, body)
		return
	}
	if ref, ok := r["$ref"].(string); ok {
		respPtr = strings.TrimPrefix(ref, "#")
		r = s.at(respPtr).(map[string]any)
	}
	ctype, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";")
	content, _ := r["content"].(map[string]any)
	if _, ok := content[ctype]; !ok {
		t.Errorf("%s %s %s: content type %q not documented", method, path, code, ctype)
		return
	}
	schemaPtr := respPtr + pointer("content", ctype, "schema")
	switch ctype {
	case "application/json":
		s.validate(t, schemaPtr, body)
	case "text/event-stream":
		events := respPtr + pointer("content", ctype, "x-events")
		if _, typed := s.at(events).(map[string]any); !typed {
			break // a stream of another protocol's frames (OpenAI's chunks): its own tests read them
		}
		for ev, err := range sse.Read(bytes.NewReader(body), nil) {
			if err != nil {
				t.Fatal(err)
			}
			ref, ok := s.at(events + pointer(ev.Type)).(map[string]any)
			if !ok {
				t.Errorf("SSE event %q is not documented", ev.Type)
				continue
			}
			s.validate(t, strings.TrimPrefix(ref["$ref"].(string), "#"), []byte(ev.Data))
		}
	}
}

// do sends a JSON request to the sidecar, with header's name-value pairs.
func (sc *sidecar) do(t *testing.T, ctx context.Context, method, url, body string, header ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, method, sc.url+url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestOpenAPIConformance exercises every route and the drive's statuses,
// and checks each real answer against server/openapi.json.
func TestOpenAPIConformance(t *testing.T) {
	spec := loadSpec(t)
	progress := func(ctx context.Context, c *tool.Call) ([]byte, error) {
		if err := c.Progress(); err != nil {
			return nil, err
		}
		return testenv.Echo(ctx, c)
	}
	sc := newSidecar(t, threeCalls(), "", testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: progress}, standardTools()[1])
	do := func(method, url, body string, header ...string) *http.Response {
		return sc.do(t, context.Background(), method, url, body, header...)
	}
	const drive = "/v1/runs/{run_id}/drive"
	r := sc.env.NewRun()
	spec.check(t, "POST", drive, do("POST", "/v1/runs/"+r.RunID+"/drive", sc.driveBody(r), "Accept", "text/event-stream"))
	r2 := sc.env.NewRun()
	spec.check(t, "POST", drive, do("POST", "/v1/runs/"+r2.RunID+"/drive", sc.driveBody(r2)))
	other := r2
	other.ThreadID = "thread_x"
	for _, c := range []struct{ url, body string }{
		{"/v1/runs/" + r2.RunID + "/drive", sc.driveBody(other)},                              // 409
		{"/v1/runs/run_missing/drive", sc.driveBody(r2)},                                      // 404
		{"/v1/runs/" + r2.RunID + "/drive", `{"thread_id": "x"}`},                             // 400
		{"/v1/runs/" + r2.RunID + "/drive", `{"model": "` + strings.Repeat("m", 5000) + `"}`}, // 413
	} {
		spec.check(t, "POST", drive, do("POST", c.url, c.body))
	}
	r3 := sc.env.NewRun()
	sc.env.Sim.AddFault(coresim.Fault{Method: "POST", Path: "/v1/completions", Status: 500, Times: 100})
	spec.check(t, "POST", drive, do("POST", "/v1/runs/"+r3.RunID+"/drive", sc.driveBody(r3))) // 502
	sc.env.Sim.ClearFaults()
	for _, p := range []string{"/v1/tools", "/healthz", "/readyz", "/metrics", "/openapi.json"} {
		spec.check(t, "GET", p, do("GET", p, ""))
	}
	spec.check(t, "GET", "/readyz", do("GET", "/readyz?live=1", ""))
	spec.check(t, "GET", "/v1/sidecar/runs", do("GET", "/v1/sidecar/runs", ""))
	for _, id := range []string{r.RunID, "run_missing", "bad%20id"} { // 200, 404, 400
		spec.check(t, "GET", "/v1/sidecar/runs/{run_id}", do("GET", "/v1/sidecar/runs/"+id, ""))
	}

	// With a token: 401 on the API, health still open.
	auth := newSidecar(t, threeCalls(), "s3cret", standardTools()...)
	for _, p := range []string{"/v1/tools", "/metrics", "/openapi.json"} {
		resp, err := http.Get(auth.url + p)
		if err != nil {
			t.Fatal(err)
		}
		spec.check(t, "GET", p, resp)
	}
	if t.Failed() {
		t.Log("server/openapi.json and the server disagree: fix whichever is wrong")
	}
}

// TestOpenAPIApprovals checks the approval routes, a drive whose stream
// announces an approval, and the live view's page and stream against
// server/openapi.json.
func TestOpenAPIApprovals(t *testing.T) {
	spec := loadSpec(t)
	sc := newSidecar(t, coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: "pay", ArgsJSON: `{"amount": 3}`}, {Tool: "pay", ArgsJSON: `{"amount": 4}`}}},
		{Content: "{{results}}"}}}, "", testenv.Tool{Config: config.Tool{Name: "pay", Approval: config.ApprovalRequired}, Handler: testenv.Echo})
	do := func(ctx context.Context, method, url, body string, header ...string) *http.Response {
		return sc.do(t, ctx, method, url, body, header...)
	}
	ctx := context.Background()
	r := sc.env.NewRun()
	driven := make(chan *http.Response, 1)
	go func() {
		driven <- do(ctx, "POST", "/v1/runs/"+r.RunID+"/drive", sc.driveBody(r), "Accept", "text/event-stream")
	}()
	var list struct {
		Approvals []struct {
			ActionID string `json:"action_id"`
		}
	}
	poll.Until(t, "two pending approvals", func() bool {
		resp := do(ctx, "GET", "/v1/approvals", "")
		defer resp.Body.Close()
		_ = json.NewDecoder(resp.Body).Decode(&list)
		return len(list.Approvals) == 2
	})
	spec.check(t, "GET", "/v1/approvals", do(ctx, "GET", "/v1/approvals", ""))
	// The live view's stream, read for a moment.
	sctx, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	spec.check(t, "GET", "/ui/events", do(sctx, "GET", "/ui/events", ""))
	spec.check(t, "GET", "/ui", do(ctx, "GET", "/ui", ""))
	const decide = "/v1/approvals/{action_id}"
	first, second := "/v1/approvals/"+list.Approvals[0].ActionID, "/v1/approvals/"+list.Approvals[1].ActionID
	spec.check(t, "POST", decide, do(ctx, "POST", first, `{"decision": "perhaps"}`))                                          // 400
	spec.check(t, "POST", decide, do(ctx, "POST", "/v1/approvals/act_none", `{"decision": "approve"}`))                       // 404
	spec.check(t, "POST", decide, do(ctx, "POST", first, `{"decision": "approve", "approver": "ana"}`))                       // 200
	spec.check(t, "POST", decide, do(ctx, "POST", first, `{"decision": "deny"}`))                                             // 409
	spec.check(t, "POST", decide, do(ctx, "POST", second, `{"decision": "deny", "reason": "`+strings.Repeat("r", 5000)+`"}`)) // 413
	// A body giving the decision twice decides nothing: 400, and the
	// approval is still pending for the deny that follows (before, the
	// last key won and this approved).
	twice := do(ctx, "POST", second, `{"decision": "deny", "decision": "approve"}`)
	if twice.StatusCode != http.StatusBadRequest {
		t.Errorf("a decision given twice: HTTP %d, want 400", twice.StatusCode)
	}
	spec.check(t, "POST", decide, twice)
	denied := do(ctx, "POST", second, `{"decision": "deny", "reason": "no"}`)
	if denied.StatusCode != http.StatusOK {
		t.Errorf("the deny after a refused body: HTTP %d, want 200 (the approval was decided)", denied.StatusCode)
	}
	spec.check(t, "POST", decide, denied)
	spec.check(t, "POST", "/v1/runs/{run_id}/drive", <-driven)
	if t.Failed() {
		t.Log("server/openapi.json and the server disagree: fix whichever is wrong")
	}
}

// TestOpenAPIChatCompletionsAndMCP checks the OpenAI-compatible endpoint
// (upstream.kind openai, the simulator in process) and /mcp against
// server/openapi.json.
func TestOpenAPIChatCompletionsAndMCP(t *testing.T) {
	spec := loadSpec(t)
	sc, body := modelSidecar(t, openaisim.New(openaisim.Config{}), config.UpstreamOpenAI, "/v1", "")
	ctx := context.Background()
	const chat = "/v1/chat/completions"
	spec.check(t, "POST", chat, sc.do(t, ctx, "POST", chat, body("")))                                       // 200 JSON
	spec.check(t, "POST", chat, sc.do(t, ctx, "POST", chat, body(`, "stream": true`)))                       // 200 SSE
	spec.check(t, "POST", chat, sc.do(t, ctx, "POST", chat, body(`, "n": 2`)))                               // 400
	spec.check(t, "POST", chat, sc.do(t, ctx, "POST", chat, body(`, "x": "`+strings.Repeat("x", 5000)+`"`))) // 413
	spec.check(t, "POST", "/mcp", sc.do(t, ctx, "POST", "/mcp", `{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}`,
		"Accept", "application/json, text/event-stream"))
	if t.Failed() {
		t.Log("server/openapi.json and the server disagree: fix whichever is wrong")
	}
}

// TestOpenAPIMessages checks the Messages endpoint (upstream.kind
// anthropic, the simulator in process) against server/openapi.json.
func TestOpenAPIMessages(t *testing.T) {
	spec := loadSpec(t)
	sc, body := modelSidecar(t, anthropicsim.New(anthropicsim.Config{}), config.UpstreamAnthropic, "", `"max_tokens": 100, `)
	ctx := context.Background()
	const path = "/v1/messages"
	spec.check(t, "POST", path, sc.do(t, ctx, "POST", path, body("")))                                       // 200 JSON
	spec.check(t, "POST", path, sc.do(t, ctx, "POST", path, body(`, "stream": true`)))                       // 200 SSE
	spec.check(t, "POST", path, sc.do(t, ctx, "POST", path, body(`, "tools": [{"name": "echo"}]`)))          // 400
	spec.check(t, "POST", path, sc.do(t, ctx, "POST", path, body(`, "x": "`+strings.Repeat("x", 5000)+`"`))) // 413
	if t.Failed() {
		t.Log("server/openapi.json and the server disagree: fix whichever is wrong")
	}
}

// TestOpenAPIResponses checks the Responses endpoint (upstream.kind
// responses, the simulator in process) against server/openapi.json.
func TestOpenAPIResponses(t *testing.T) {
	spec := loadSpec(t)
	sc, _ := modelSidecar(t, responsesim.New(responsesim.Config{}), config.UpstreamResponses, "/v1", "")
	ctx := context.Background()
	const path = "/v1/responses"
	script := `{\"rounds\": [[{\"name\": \"echo\", \"arguments\": {\"q\": 1}}]], \"answer\": \"done\"}`
	body := func(extra string) string { return `{"model": "m", "input": "` + script + `"` + extra + `}` }
	spec.check(t, "POST", path, sc.do(t, ctx, "POST", path, body("")))                                       // 200 JSON
	spec.check(t, "POST", path, sc.do(t, ctx, "POST", path, body(`, "stream": true`)))                       // 200 SSE
	spec.check(t, "POST", path, sc.do(t, ctx, "POST", path, body(`, "previous_response_id": "resp_1"`)))     // 400
	spec.check(t, "POST", path, sc.do(t, ctx, "POST", path, body(`, "x": "`+strings.Repeat("x", 5000)+`"`))) // 413
	if t.Failed() {
		t.Log("server/openapi.json and the server disagree: fix whichever is wrong")
	}
}

// modelSidecar starts a sidecar with upstream.kind kind in front of sim
// (its API under path), serving an echo tool, MCP and bodies up to 4 KiB;
// body makes a request whose scripted model calls echo once, then
// answers (head opens the request's fields, extra closes them).
func modelSidecar(t *testing.T, sim http.Handler, kind, path, head string) (*sidecar, func(extra string) string) {
	t.Helper()
	up := httptest.NewServer(sim)
	t.Cleanup(up.Close)
	env := testenv.Start(t, coresim.Scenario{}, testenv.Options{MaxBodyBytes: 4096, Config: func(c *config.Config) {
		c.Upstream.Kind, c.Upstream.URL, c.Upstream.RetryBudget = kind, up.URL+path, 5*time.Second
		c.Server.MCP = true
	}}, testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo})
	testenv.WaitLive(t, env.URL, "echo")
	script := `{\"rounds\": [[{\"name\": \"echo\", \"arguments\": {\"q\": 1}}]], \"answer\": \"done\"}`
	return &sidecar{env: env, url: env.URL}, func(extra string) string {
		return `{"model": "m", ` + head + `"messages": [{"role": "user", "content": "` + script + `"}]` + extra + `}`
	}
}

// route is one route of server/openapi.json: an operation (method and
// path), or a pass-through subtree (method "*", its path as
// http.ServeMux takes it, under x-toolsidecar-passthrough).
type route struct{ method, path string }

// routes are the document's routes, each with whether it is exempt from
// the token (security: []).
func (s *apiSpec) routes() map[route]bool {
	all := map[route]bool{}
	for path, ops := range s.doc["paths"].(map[string]any) {
		for method, op := range ops.(map[string]any) {
			sec, ok := op.(map[string]any)["security"].([]any)
			all[route{strings.ToUpper(method), path}] = ok && len(sec) == 0
		}
	}
	pass, _ := s.doc["x-toolsidecar-passthrough"].(map[string]any)
	for path := range pass {
		all[route{"*", path}] = false
	}
	return all
}

// described returns the document's routes that serve an http.ServeMux
// pattern: the operation of a pattern with a method; every operation of a
// pattern's path without one (/mcp takes each method MCP uses), or its
// pass-through subtree.
func (s *apiSpec) described(pattern string) []route {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		method, path = "", pattern
	}
	path = strings.Replace(path, "{$}", "", 1) // GET /ui/{$}: exactly /ui/
	var got []route
	for r := range s.routes() {
		if r.path == path && (r.method == method || method == "" && r.method != "*") {
			got = append(got, r)
		}
	}
	pass, _ := s.doc["x-toolsidecar-passthrough"].(map[string]any)
	if _, ok := pass[path]; ok && method == "" && len(got) == 0 {
		got = append(got, route{"*", path})
	}
	return got
}

// routeSidecar starts a sidecar of upstream.kind kind, with every route
// that kind can serve on: the live view and approvals, MCP, proxy mode
// (core), a webhook secret (the hosted kinds), an API token.
func routeSidecar(t *testing.T, kind string) *sidecar {
	t.Helper()
	var up http.Handler
	path := "/v1"
	switch kind {
	case config.UpstreamOpenAI:
		up = openaisim.New(openaisim.Config{})
	case config.UpstreamResponses:
		up = responsesim.New(responsesim.Config{})
	case config.UpstreamAnthropic:
		up, path = anthropicsim.New(anthropicsim.Config{}), ""
	case config.UpstreamOpenAIAgents:
		up = agentssim.New(agentssim.Config{})
	case config.UpstreamAnthropicAgents:
		up, path = managedsim.New(managedsim.Config{}), ""
	}
	dir := t.TempDir()
	secretFile, keyFile := filepath.Join(dir, "secret"), filepath.Join(dir, "key")
	if os.WriteFile(secretFile, []byte("whsec_"+base64.StdEncoding.EncodeToString([]byte("a secret"))), 0o600) != nil ||
		os.WriteFile(keyFile, []byte("sk-test"), 0o600) != nil {
		t.Fatal("writing the secrets")
	}
	env := testenv.Start(t, coresim.Scenario{}, testenv.Options{Token: "s3cret", Config: func(c *config.Config) {
		c.Server.MCP, c.Server.UI, c.Server.Proxy = true, true, kind == config.UpstreamCore
		if up != nil {
			srv := httptest.NewServer(up)
			t.Cleanup(srv.Close)
			c.Upstream.Kind, c.Upstream.URL = kind, srv.URL+path
		}
		if c.Upstream.Hosted() {
			c.Upstream.WebhookSecretFile, c.Upstream.APIKeyFile = secretFile, keyFile
		}
	}}, testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo})
	return &sidecar{env: env, url: env.URL}
}

// TestOpenAPIEveryRoute: for each upstream kind (each of which a drive's
// Summary names), every route a real sidecar serves (server.Server's Patterns) is in server/openapi.json, as
// an operation or a pass-through subtree; every route there is served by
// some kind; and the document's security is the server's: without the
// token, each route the document does not exempt (security: []) answers
// the sidecar's 401, and the exempt ones do not.
func TestOpenAPIEveryRoute(t *testing.T) {
	spec := loadSpec(t)
	var doc struct {
		Servers    []struct{ URL string }
		Components struct {
			SecuritySchemes map[string]struct{ Type, Scheme string } `json:"securitySchemes"`
		}
		Passthrough map[string]struct{ Kinds []string } `json:"x-toolsidecar-passthrough"`
	}
	if err := json.Unmarshal(server.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Servers) != 1 || doc.Servers[0].URL != "http://127.0.0.1:8741" || doc.Components.SecuritySchemes["bearerToken"].Scheme != "bearer" {
		t.Fatalf("servers %+v, schemes %+v", doc.Servers, doc.Components.SecuritySchemes)
	}
	exempt := spec.routes()
	served := map[route]bool{}
	kinds, _ := spec.at("/components/schemas/Summary/properties/upstream/enum").([]any)
	for _, kind := range config.UpstreamKinds {
		if !slices.Contains(kinds, any(kind)) {
			t.Errorf("Summary's upstream does not list kind %s", kind)
		}
		t.Run(kind, func(t *testing.T) {
			sc := routeSidecar(t, kind)
			for _, p := range sc.env.Sidecar.Routes() {
				rs := spec.described(p)
				if len(rs) == 0 {
					t.Errorf("the sidecar serves %q, which server/openapi.json does not describe", p)
				}
				for _, r := range rs {
					served[r] = true
					if r.method == "*" && !slices.Contains(doc.Passthrough[r.path].Kinds, kind) {
						t.Errorf("x-toolsidecar-passthrough %q does not list kind %s, which serves it", r.path, kind)
					}
					method, url := r.method, strings.NewReplacer("{run_id}", "run_1", "{action_id}", "act_1").Replace(r.path)
					if method == "*" {
						method = "GET"
					}
					if strings.HasSuffix(url, "/") && r.path != "/ui/" {
						url += "x" // a path within the subtree
					}
					resp := sc.do(t, context.Background(), method, url, "{}")
					resp.Body.Close()
					tokenAsked := resp.StatusCode == http.StatusUnauthorized && strings.Contains(resp.Header.Get("WWW-Authenticate"), `realm="toolsidecar"`)
					if tokenAsked == exempt[r] {
						t.Errorf("%s %s without the token: %d; the document says exempt=%v", method, r.path, resp.StatusCode, exempt[r])
					}
				}
			}
		})
	}
	for r := range exempt {
		if !served[r] {
			t.Errorf("server/openapi.json describes %s %s, which no upstream kind serves", r.method, r.path)
		}
	}
	if t.Failed() {
		t.Log("server/openapi.json and the server disagree: fix whichever is wrong")
	}
}
