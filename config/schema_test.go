package config

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "rewrite config.schema.json")

const schemaFile = "../config.schema.json"

// TestSchemaUpToDate: the committed schema is what the Config type gives.
func TestSchemaUpToDate(t *testing.T) {
	want, err := json.MarshalIndent(JSONSchema(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	if *update {
		if err := os.WriteFile(schemaFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(schemaFile)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("config.schema.json is out of date (%v): run go test ./config -run SchemaUpToDate -update", err)
	}
}

// TestSchemaAcceptsExamples: the example configurations validate, and a
// file with misspelt keys and wrong types does not, for the same keys the
// loader refuses.
func TestSchemaAcceptsExamples(t *testing.T) {
	c := jsonschema.NewCompiler()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(mustJSON(t, JSONSchema())))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource("config.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("config.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	validate := func(path string) error {
		var v any
		if err := yaml.Unmarshal(mustRead(t, path), &v); err != nil {
			t.Fatal(err)
		}
		inst, err := jsonschema.UnmarshalJSON(strings.NewReader(mustJSON(t, v)))
		if err != nil {
			t.Fatal(err)
		}
		return sch.Validate(inst)
	}
	for _, path := range []string{"../config.yaml", "testdata/good.yaml"} {
		if err := validate(path); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
	err = validate("testdata/many-problems.yaml")
	if err == nil {
		t.Fatal("many-problems.yaml validates")
	}
	for _, want := range []string{"timout", "max_paralel", "/core/timeout", "/tools/1/side_effects"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("schema errors lack %q:\n%v", want, err)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
