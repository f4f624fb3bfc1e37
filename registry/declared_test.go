package registry

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/tool"
)

// TestDeclaredTools: how a worker's declaration and the file's entry of
// the same tool combine. The file's settings stay in force; what it leaves
// out or to its defaults is the declaration's; a schema both give must be
// the same; a tool only declared gets an entry's defaults.
func TestDeclaredTools(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	os.WriteFile(path, []byte(`nats: {subject_prefix: p}
tools:
  - { name: policied, retries: 3 }
  - { name: timed, timeout: 9s, side_effects: unsafe }
  - { name: same, parameters: { type: object, properties: { n: { type: integer } } } }
  - { name: plain }
`), 0o600)
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	schema := json.RawMessage(`{"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}`)
	by := []string{"go worker W1"}
	decl := tool.Declaration{Description: "declared", Parameters: schema, SideEffects: tool.ReadOnly, Timeout: "2s", Retries: 1}
	reg, err := New(context.Background(), cfg, Base(nil),
		Declared{Name: "policied", Declaration: decl, By: by},
		Declared{Name: "timed", Declaration: decl, By: by},
		Declared{Name: "same", Declaration: tool.Declaration{Parameters: json.RawMessage(`{"properties":{"n":{"type":"integer"}},"type":"object"}`)}, By: by},
		Declared{Name: "only", Declaration: decl, By: by})
	if err != nil {
		t.Fatal(err)
	}
	check := func(name, source, desc, sideEffects string, timeout time.Duration, retries int) {
		t.Helper()
		tl, ok := reg.Lookup(name)
		if !ok || tl.Source != source || tl.Description != desc || tl.SideEffects != sideEffects || tl.Timeout != timeout || tl.Retries != retries {
			t.Errorf("%s: %+v", name, tl)
		}
	}
	check("policied", SourceConfigAndWorker, "declared", tool.ReadOnly, 2*time.Second, 3) // the file's retries; the rest declared
	check("timed", SourceConfigAndWorker, "declared", tool.Unsafe, 9*time.Second, 1)      // the file's timeout and side effects
	check("same", SourceConfigAndWorker, "", tool.Unsafe, tool.DefaultTimeout, 0)
	check("plain", SourceConfig, "", tool.Unsafe, tool.DefaultTimeout, 0)
	check("only", SourceWorker, "declared", tool.ReadOnly, 2*time.Second, 1)
	if tl, _ := reg.Lookup("policied"); tl.Validate(json.RawMessage(`{"city": "Oslo"}`)) != nil || tl.Validate(json.RawMessage(`{}`)) == nil {
		t.Error("policied does not validate against the declared schema")
	}
	if names := reg.Names(); strings.Join(names, ",") != "policied,timed,same,plain,only" {
		t.Errorf("names %v: the file's order, then the declared tools", names)
	}

	// Without the declarations, a tool only declared is gone; the file's
	// entries are as the file says.
	bare, err := reg.Redeclare(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := bare.Lookup("only"); ok {
		t.Error("a tool no worker declares any more is still served")
	}
	if tl, _ := bare.Lookup("policied"); tl.Source != SourceConfig || tl.Description != "" || tl.Timeout != tool.DefaultTimeout {
		t.Errorf("policied without its declaration: %+v", tl)
	}

	// A declaration that does not compile is an error naming its worker.
	_, err = reg.Redeclare([]Declared{{Name: "new", Declaration: tool.Declaration{Parameters: json.RawMessage(`{"type": 12}`)}, By: by}})
	var de *DeclarationError
	if !errors.As(err, &de) || !errors.Is(err, ErrInvalidTool) || len(DeclarationErrors(err)) != 1 || de.Tool != "new" || !strings.Contains(err.Error(), "go worker W1") {
		t.Errorf("bad: %v", err)
	}
	// One that contradicts the file is no error: the file's entry stays in
	// force, and the conflict names both sources and both schemas.
	conflicting, err := reg.Redeclare([]Declared{{Name: "same", Declaration: tool.Declaration{Parameters: schema}, By: by}})
	if err != nil {
		t.Fatal(err)
	}
	if tl, _ := conflicting.Lookup("same"); tl.Source != SourceConfig || tl.Validate(json.RawMessage(`{"n": 1}`)) != nil {
		t.Errorf("same, contradicted: %+v, want the file's entry", tl)
	}
	if cs := conflicting.Conflicts(); len(cs) != 1 || cs[0].Key != "tools[2]" || !strings.Contains(cs[0].Error(), "go worker W1") ||
		!strings.Contains(cs[0].Error(), `"n"`) || !strings.Contains(cs[0].Error(), `"city"`) {
		t.Errorf("the schema conflict does not show both sources and schemas: %v", cs)
	}
}

// TestReloadKeepsDeclarations: a reload of the file puts its entries in
// force with the declarations in force; an entry that contradicts one is
// put in force as a start puts it, the declaration left out.
func TestReloadKeepsDeclarations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	os.WriteFile(path, []byte("tools:\n  - { name: a }\n"), 0o600)
	cfg, _ := config.Load(path, nil)
	d := Declared{Name: "w", Declaration: tool.Declaration{Parameters: json.RawMessage(`{"type":"object","properties":{"x":{"type":"string"}}}`)}, By: []string{"node worker N"}}
	reg, err := New(context.Background(), cfg, Base(nil), d)
	if err != nil {
		t.Fatal(err)
	}
	live := NewLive(reg)
	r := NewReloader(path, nil, cfg, live, prometheus.NewRegistry(), nil)
	os.WriteFile(path, []byte("tools:\n  - { name: a }\n  - { name: w, retries: 2 }\n"), 0o600)
	if err := r.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if tl, ok := live.Load().Lookup("w"); !ok || tl.Source != SourceConfigAndWorker || tl.Retries != 2 {
		t.Errorf("w after the reload: %+v", tl)
	}
	os.WriteFile(path, []byte("tools:\n  - { name: w, parameters: { type: object } }\n"), 0o600)
	if err := r.Reload(context.Background()); err != nil {
		t.Fatalf("a file contradicting a declaration: %v", err)
	}
	if tl, ok := live.Load().Lookup("w"); !ok || tl.Source != SourceConfig {
		t.Errorf("w after the contradicting reload: %+v, want the file's", tl)
	}
	if cs := live.Load().Conflicts(); len(cs) != 1 || !strings.Contains(cs[0].Error(), "node worker N") {
		t.Errorf("conflicts %v", cs)
	}
}
