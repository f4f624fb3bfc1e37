package sidecar

import (
	"fmt"
	"strings"
	"testing"

	"github.com/projectdavid/toolsidecar/discovery"
	"github.com/projectdavid/toolsidecar/wire"
)

func service(id, lang string, decls map[string]string) discovery.ServiceInfo {
	info := discovery.ServiceInfo{ID: id, Metadata: map[string]string{"language": lang}}
	for name, d := range decls {
		info.Endpoints = append(info.Endpoints, discovery.Endpoint{Name: name, Subject: "p." + name, Metadata: map[string]string{wire.ToolMetadataKey: d}})
	}
	return info
}

// TestDeclarationsFromTheBus: what workers publish is read as any input
// from the bus: a declaration that does not parse is left out and named,
// a worker's language and ID that are not tokens are not repeated, one
// tool declared two ways is served as most workers declare it, and the
// bus cannot declare more tools than the bound.
func TestDeclarationsFromTheBus(t *testing.T) {
	a := `{"description":"A","parameters":{"type":"object"}}`
	aSpaced := `{"parameters": {"type": "object"}, "description": "A"}`
	b := `{"description":"B","parameters":{"type":"object"}}`
	infos := []discovery.ServiceInfo{
		service("W1", "go", map[string]string{"t": a, "broken": `{"description": 1}`, "odd": `{"side_effects": "sometimes"}`}),
		service("W2", "node", map[string]string{"t": aSpaced}),
		service("W3", "python", map[string]string{"t": b}),
		service("evil\nid", strings.Repeat("x", 100), map[string]string{"u": a}),
		{ID: "W4", Endpoints: []discovery.Endpoint{{Subject: "other.t", Metadata: map[string]string{wire.ToolMetadataKey: b}}, {Subject: "p.plain"}}},
	}
	decls, problems := declarations(infos, "p")
	if len(decls) != 2 || decls[0].Name != "t" || decls[1].Name != "u" {
		t.Fatalf("declared %+v", decls)
	}
	if decls[0].Declaration.Description != "A" || strings.Join(decls[0].By, ",") != "go worker W1,node worker W2" {
		t.Errorf("t served as %+v: want the declaration of two workers over one", decls[0])
	}
	if strings.Join(decls[1].By, ",") != "a worker without an ID" {
		t.Errorf("u declared by %q: the bus's ID and language are not tokens", decls[1].By)
	}
	all := strings.Join(problems, "\n")
	for _, want := range []string{"tool broken declared by go worker W1 is left out", `side_effects "sometimes"`, "python worker W3 declare it otherwise than go worker W1, node worker W2"} {
		if !strings.Contains(all, want) {
			t.Errorf("problems %q: want %q", all, want)
		}
	}

	many := map[string]string{}
	for i := range maxDeclaredTools + 5 {
		many[fmt.Sprintf("t%04d", i)] = a
	}
	decls, problems = declarations([]discovery.ServiceInfo{service("W", "go", many)}, "p")
	if len(decls) != maxDeclaredTools || len(problems) != 5 || !strings.Contains(problems[0], "more than 1000 tools") {
		t.Errorf("%d declared, problems %d %q", len(decls), len(problems), problems[:min(1, len(problems))])
	}
}
