package tool

import (
	"bytes"
	"encoding/json"
	"errors"
	"unicode/utf8"
)

// manifestFields are the fields a worker reads from a manifest.
type manifestFields struct {
	runID, actionID, toolCallID string
	args                        json.RawMessage
}

var errNotObject = errors.New("manifest is not a JSON object")

// parseManifest reads the manifest's fields without reflection: on the
// worker's hot path encoding/json's reflective decoding cost more than the
// whole sidecar side of a call. The input is checked with validJSON first,
// so the scan below may assume well-formed JSON. Keys match exactly (Core's
// keys are lowercase) and, as with encoding/json, the last duplicate wins.
// The three ids are cut from one string: one allocation, not three.
func parseManifest(data []byte) (manifestFields, error) {
	var f manifestFields
	if !validJSON(data) {
		return f, errors.New("manifest is not valid JSON")
	}
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return f, errNotObject
	}
	i++
	var ids [3][]byte // run_id, action_id, tool_call_id: their JSON values
	for {
		i = skipSpace(data, i)
		if data[i] == '}' {
			break
		}
		if data[i] == ',' {
			i = skipSpace(data, i+1)
		}
		keyEnd := skipValue(data, i)
		key := data[i:keyEnd]
		i = skipSpace(data, keyEnd)
		i = skipSpace(data, i+1) // the colon
		end := skipValue(data, i)
		value := data[i:end]
		switch string(key) {
		case `"run_id"`:
			ids[0] = value
		case `"action_id"`:
			ids[1] = value
		case `"tool_call_id"`:
			ids[2] = value
		case `"args"`:
			f.args = json.RawMessage(value)
		}
		i = end
	}
	var plain [3][]byte
	n := 0
	for k, v := range ids {
		if inner, ok := plainString(v); ok {
			plain[k] = inner
			n += len(inner)
		}
	}
	all := make([]byte, 0, n)
	for _, p := range plain {
		all = append(all, p...)
	}
	joined := string(all)
	out := [3]*string{&f.runID, &f.actionID, &f.toolCallID}
	at := 0
	for k, v := range ids {
		switch {
		case plain[k] != nil:
			*out[k] = joined[at : at+len(plain[k])]
			at += len(plain[k])
		case len(v) > 0:
			*out[k] = stringValue(v)
		}
	}
	return f, nil
}

// plainString is the inside of a JSON string that needs no decoding (no
// escapes, valid UTF-8), or false.
func plainString(v []byte) ([]byte, bool) {
	if len(v) < 2 || v[0] != '"' {
		return nil, false
	}
	inner := v[1 : len(v)-1]
	if bytes.IndexByte(inner, '\\') >= 0 || !utf8.Valid(inner) {
		return nil, false
	}
	return inner, true
}

// stringValue decodes a JSON string; any other value reads as "", as
// encoding/json would reject it for a string field.
func stringValue(v []byte) string {
	if inner, ok := plainString(v); ok {
		return string(inner)
	}
	if len(v) < 2 || v[0] != '"' {
		return ""
	}
	// Escapes or invalid UTF-8 (which encoding/json turns into U+FFFD).
	var s string
	_ = json.Unmarshal(v, &s)
	return s
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the well-formed JSON value starting at i.
func skipValue(data []byte, i int) int {
	switch data[i] {
	case '"':
		for i++; data[i] != '"'; i++ {
			if data[i] == '\\' {
				i++
			}
		}
		return i + 1
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch data[i] {
			case '"':
				i = skipValue(data, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	default: // number, true, false, null
		for i < len(data) && !bytes.ContainsRune([]byte(",}] \t\n\r"), rune(data[i])) {
			i++
		}
		return i
	}
}

// EncodeManifest is the request body a worker receives for a call: the
// worker protocol's manifest, as Core frames a tool_call_manifest. Core's
// own manifests reach workers as Core sent them; the executor makes the
// others' with it.
func EncodeManifest(runID, actionID, toolCallID, name string, args json.RawMessage) []byte {
	b, _ := json.Marshal(struct {
		Type       string          `json:"type"`
		RunID      string          `json:"run_id"`
		ActionID   string          `json:"action_id"`
		ToolCallID string          `json:"tool_call_id"`
		Tool       string          `json:"tool"`
		Args       json.RawMessage `json:"args"`
	}{"tool_call_manifest", runID, actionID, toolCallID, name, args})
	return b
}
