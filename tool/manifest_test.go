package tool

import (
	"encoding/json"
	"testing"
)

// reference decodes the same fields with encoding/json, with exact keys.
func reference(data []byte) (manifestFields, bool) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return manifestFields{}, false
	}
	var f manifestFields
	str := func(key string) string {
		var s string
		if v, ok := m[key]; ok {
			_ = json.Unmarshal(v, &s)
		}
		return s
	}
	f.runID, f.actionID, f.toolCallID = str("run_id"), str("action_id"), str("tool_call_id")
	if v, ok := m["args"]; ok {
		f.args = v
	}
	return f, true
}

func same(a, b manifestFields) bool {
	ca, cb := compact(a.args), compact(b.args)
	return a.runID == b.runID && a.actionID == b.actionID && a.toolCallID == b.toolCallID && ca == cb
}

func compact(r json.RawMessage) string {
	if len(r) == 0 {
		return ""
	}
	var b []byte
	b, _ = json.Marshal(r)
	return string(b)
}

func seedManifests(f *testing.F) {
	for _, s := range []string{
		manifest,
		`{"type": "tool_call_manifest", "run_id": "r\u00e9", "action_id": "a\"b", "tool_call_id": "c\\d", "tool": "t", "args": {"s": "}{][\"", "n": [1, {"x": null}], "e": -1.5e3}}`,
		`  {"args": "noise {\"a\": 1} tail", "run_id": 7, "action_id": null, "args": [true, false]}  `,
		`{}`, `[]`, `"x"`, `{"run_id": "a", "run_id": "b"}`, `{"args":{}}`, `{"Run_ID": "x"}`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
}

// FuzzParseManifest: the reflection-free parser agrees with encoding/json
// on every input that is a JSON object, and rejects the rest.
func FuzzParseManifest(f *testing.F) {
	seedManifests(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := parseManifest(data)
		want, ok := reference(data)
		if !ok {
			if err == nil && json.Valid(data) {
				// Valid JSON that is not an object (or null): must be rejected.
				var v any
				json.Unmarshal(data, &v)
				if _, isObj := v.(map[string]any); !isObj && v != nil {
					t.Fatalf("accepted a non-object %q", data)
				}
			}
			return
		}
		if err != nil {
			if string(data) == "null" || len(data) > 0 && string(trimSpace(data)) == "null" {
				return // encoding/json reads null as an empty map
			}
			t.Fatalf("rejected %q: %v", data, err)
		}
		if !same(got, want) {
			t.Fatalf("%q: got %+v, want %+v", data, got, want)
		}
	})
}

func trimSpace(b []byte) []byte {
	i, j := 0, len(b)
	for i < j && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	for j > i && (b[j-1] == ' ' || b[j-1] == '\t' || b[j-1] == '\n' || b[j-1] == '\r') {
		j--
	}
	return b[i:j]
}

const manifest = `{"type": "tool_call_manifest", "run_id": "run_1", "action_id": "act_1", "tool_call_id": "call_1", "tool": "echo", "args": {"x": 1}}`

// BenchmarkParseCall: the worker's parse of a typical manifest.
//
//	go test ./tool -run '^$' -bench ParseCall -benchmem
func BenchmarkParseCall(b *testing.B) {
	body := []byte(manifest)
	for b.Loop() {
		if _, err := ParseCall("get_flight_times", body); err != nil {
			b.Fatal(err)
		}
	}
}

// A manifest made by EncodeManifest reads back whole, as a worker reads it.
func TestEncodeManifest(t *testing.T) {
	body := EncodeManifest("run_1", "act_1", "call_1", "echo", json.RawMessage(`{"x":"é"}`))
	c, err := ParseCall("echo", body)
	if err != nil || c.RunID != "run_1" || c.ActionID != "act_1" || c.ToolCallID != "call_1" || string(c.Args) != `{"x":"é"}` {
		t.Fatalf("ParseCall(%s) = %+v, %v", body, c, err)
	}
}
