package server_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/projectdavid/toolsidecar/server"
)

var updateDocs = flag.Bool("update", false, "rewrite docs/http-api.md")

const apiDocFile = "../docs/http-api.md"

// apiDoc writes the HTTP API's reference from its OpenAPI description:
// each route with its parameters, body and answers, then each schema.
func apiDoc(doc map[string]any) string {
	var b strings.Builder
	info := doc["info"].(map[string]any)
	fmt.Fprintf(&b, "# HTTP API\n\nGenerated from `server/openapi.json` (served at `GET /openapi.json`) by `go test ./server -run APIDocUpToDate -update`; a test fails when it is out of date, and another drives the real server through every route and checks its answers against that description. %v\n", info["description"])
	b.WriteString("\nThe model APIs' routes (`POST /v1/chat/completions`, `POST /v1/responses`, `POST /v1/messages`, with `upstream.kind` `openai`, `responses`, `anthropic`) answer as those APIs do, the hosted kinds (`openai-agents`, `anthropic-agents`) pass their API's routes through (see [Passed through](#passed-through)), and `/mcp` (with `server.mcp: true`) speaks the Model Context Protocol: see [applications.md](applications.md) and [tools.md](tools.md). A test lists the routes a real sidecar of each upstream kind serves and checks that this document names each one.\n")
	for _, srv := range doc["servers"].([]any) {
		sv := srv.(map[string]any)
		fmt.Fprintf(&b, "\nServer: `%v`. %v\n", sv["url"], sv["description"])
	}
	schemes := doc["components"].(map[string]any)["securitySchemes"].(map[string]any)
	for _, name := range slices.Sorted(maps.Keys(schemes)) {
		sc := schemes[name].(map[string]any)
		fmt.Fprintf(&b, "\nAuthentication `%s`: %v %v. %v\n", name, sc["type"], sc["scheme"], sc["description"])
	}
	paths := doc["paths"].(map[string]any)
	for _, path := range slices.Sorted(maps.Keys(paths)) {
		ops := paths[path].(map[string]any)
		for _, method := range slices.Sorted(maps.Keys(ops)) {
			op, ok := ops[method].(map[string]any)
			if !ok {
				continue
			}
			fmt.Fprintf(&b, "\n## `%s %s`\n\n", strings.ToUpper(method), path)
			if s, ok := op["summary"].(string); ok {
				b.WriteString("**" + s + ".** ")
			}
			if d, ok := op["description"].(string); ok {
				b.WriteString(d)
			}
			b.WriteString("\n")
			if params, ok := op["parameters"].([]any); ok && len(params) > 0 {
				b.WriteString("\n| parameter | in | required | description |\n|---|---|---|---|\n")
				for _, p := range params {
					pm := p.(map[string]any)
					fmt.Fprintf(&b, "| `%v` | %v | %v | %v |\n", pm["name"], pm["in"], pm["required"] == true, cell(pm["description"]))
				}
			}
			if body, ok := op["requestBody"].(map[string]any); ok {
				fmt.Fprintf(&b, "\nBody: %s\n", contentOf(body))
			}
			if resps, ok := op["responses"].(map[string]any); ok {
				b.WriteString("\n| status | meaning | body |\n|---|---|---|\n")
				for _, code := range slices.Sorted(maps.Keys(resps)) {
					r := resps[code].(map[string]any)
					if ref, ok := r["$ref"].(string); ok { // a shared answer
						r = doc["components"].(map[string]any)["responses"].(map[string]any)[ref[strings.LastIndex(ref, "/")+1:]].(map[string]any)
					}
					fmt.Fprintf(&b, "| %s | %s | %s |\n", code, cell(r["description"]), contentOf(r))
				}
			}
		}
	}
	if pass, ok := doc["x-toolsidecar-passthrough"].(map[string]any); ok {
		b.WriteString("\n## Passed through\n\nSubtrees of paths (`x-toolsidecar-passthrough`, as Go's `http.ServeMux` matches a pattern: a path ending in `/` takes every path under it), any method, answered by the upstream as it answers them.\n\n| path | upstream kinds | what |\n|---|---|---|\n")
		for _, path := range slices.Sorted(maps.Keys(pass)) {
			p := pass[path].(map[string]any)
			var kinds []string
			for _, k := range p["kinds"].([]any) {
				kinds = append(kinds, fmt.Sprintf("`%v`", k))
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", path, strings.Join(kinds, ", "), cell(p["description"]))
		}
	}
	b.WriteString("\n## Schemas\n")
	schemas := doc["components"].(map[string]any)["schemas"].(map[string]any)
	for _, name := range slices.Sorted(maps.Keys(schemas)) {
		s := schemas[name].(map[string]any)
		fmt.Fprintf(&b, "\n### %s\n\n", name)
		if d, ok := s["description"].(string); ok {
			b.WriteString(d + "\n\n")
		}
		props, ok := s["properties"].(map[string]any)
		if !ok {
			fmt.Fprintf(&b, "Type: %s.\n", typeOf(s))
			continue
		}
		required := map[string]bool{}
		if req, ok := s["required"].([]any); ok {
			for _, r := range req {
				required[r.(string)] = true
			}
		}
		b.WriteString("| field | type | required | description |\n|---|---|---|---|\n")
		for _, f := range slices.Sorted(maps.Keys(props)) {
			p := props[f].(map[string]any)
			fmt.Fprintf(&b, "| `%s` | %s | %v | %s |\n", f, typeOf(p), required[f], cell(p["description"]))
		}
	}
	return b.String()
}

func cell(v any) string {
	s, _ := v.(string)
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", "\\|"), "\n", " ")
}

// contentOf names the media types of a body or answer and their schemas.
func contentOf(m map[string]any) string {
	content, ok := m["content"].(map[string]any)
	if !ok {
		return ""
	}
	var parts []string
	for _, mt := range slices.Sorted(maps.Keys(content)) {
		c, _ := content[mt].(map[string]any)
		s, _ := c["schema"].(map[string]any)
		parts = append(parts, fmt.Sprintf("`%s` %s", mt, typeOf(s)))
	}
	return strings.Join(parts, ", ")
}

// typeOf says a schema's type in a few words: a reference by its name.
func typeOf(s map[string]any) string {
	if s == nil {
		return ""
	}
	if ref, ok := s["$ref"].(string); ok {
		name := ref[strings.LastIndex(ref, "/")+1:]
		return "[" + name + "](#" + strings.ToLower(name) + ")"
	}
	if e, ok := s["enum"].([]any); ok {
		var vs []string
		for _, v := range e {
			vs = append(vs, fmt.Sprintf("`%v`", v))
		}
		return strings.Join(vs, " \\| ")
	}
	t, _ := s["type"].(string)
	if t == "array" {
		items, _ := s["items"].(map[string]any)
		return "list of " + typeOf(items)
	}
	return t
}

// TestAPIDocUpToDate: docs/http-api.md is what openapi.json says.
func TestAPIDocUpToDate(t *testing.T) {
	var doc map[string]any
	if err := json.Unmarshal(server.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	want := apiDoc(doc)
	if *updateDocs {
		if err := os.WriteFile(apiDocFile, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := os.ReadFile(apiDocFile); err != nil || string(got) != want {
		t.Fatalf("%s is out of date (%v): run go test ./server -run APIDocUpToDate -update", apiDocFile, err)
	}
	for _, route := range []string{"`POST /v1/runs/{run_id}/drive`", "`GET /v1/tools`", "### Summary", "`POST /v1/sidecar/webhooks/openai-agents`", "| `/v1/agents/` |"} {
		if !strings.Contains(want, route) {
			t.Errorf("the API doc lacks %s", route)
		}
	}
}
