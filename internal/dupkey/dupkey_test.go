package dupkey

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func TestFind(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		depth     int
		want      *Error // nil: none
	}{
		{"approval", `{"decision": "deny", "decision": "approve"}`, 0, &Error{Key: "decision"}},
		{"none", `{"a": 1, "b": {"a": 2}, "c": [{"a": 3}, {"a": 4}]}`, 0, nil},
		{"nested", `{"messages": [{"role": "user"}, {"role": "tool", "content": "x", "role": "user"}]}`, 0, &Error{Path: "/messages/1", Key: "role"}},
		{"nested, top only", `{"messages": [{"role": "tool", "role": "user"}]}`, 1, nil},
		{"top, top only", `{"messages": [], "model": "a", "messages": [{}]}`, 1, &Error{Key: "messages"}},
		{"second level", `{"a": {"b": 1, "b": 2}}`, 2, &Error{Path: "/a", Key: "b"}},
		{"third level, two", `{"a": {"b": {"c": 1, "c": 2}}}`, 2, nil},
		{"escaped", `{"a\u0062": 1, "ab": 2}`, 0, &Error{Key: "ab"}},
		{"pointer", `{"a/b": {"c~d": {"k": 1, "k": 2}}}`, 0, &Error{Path: "/a~1b/c~0d", Key: "k"}},
		{"empty key", `{"": 1, "": 2}`, 0, &Error{Key: ""}},
		{"scalar", `"decision"`, 0, nil},
		{"array", `[{"a": 1, "a": 1}]`, 0, &Error{Path: "/0", Key: "a"}},
		{"not JSON", `{"a": 1,`, 0, nil},
		{"not JSON after", `{"a": 1, "a": 2, nonsense`, 0, &Error{Key: "a"}},
		{"empty", ``, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Find([]byte(tc.doc), tc.depth)
			if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	if msg := (&Error{Path: "/messages/1", Key: "role"}).Error(); !strings.Contains(msg, `"role"`) || !strings.Contains(msg, "/messages/1") {
		t.Errorf("the message %q names neither the key nor where", msg)
	}
}

// FuzzFind: Find never panics, and a document with a duplicate at the top
// level has one at every level.
func FuzzFind(f *testing.F) {
	for _, s := range []string{`{"a":1,"a":2}`, `{"a":[{"b":1,"b":2}]}`, `[1,{"":{}}]`, `{"a":`, `"x"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if top, every := Find(data, 1), Find(data, 0); top != nil && every == nil {
			t.Fatalf("top level: %v; every level: none", top)
		}
	})
}

// chatBody is a chat request of about size bytes: a long conversation
// with tool calls and results, as an application sends on every turn.
func chatBody(size int) []byte {
	var msgs []map[string]any
	for i := 0; ; i++ {
		msgs = append(msgs,
			map[string]any{"role": "user", "content": strings.Repeat("What is the weather like? ", 20)},
			map[string]any{"role": "assistant", "tool_calls": []map[string]any{{"id": fmt.Sprint("call_", i), "type": "function",
				"function": map[string]any{"name": "get_weather", "arguments": `{"city": "Paris", "days": 3}`}}}},
			map[string]any{"role": "tool", "tool_call_id": fmt.Sprint("call_", i), "content": `{"forecast": [{"day": 1, "t": 21}, {"day": 2, "t": 19}]}`})
		if b, _ := json.Marshal(msgs); len(b) >= size {
			break
		}
	}
	b, _ := json.Marshal(map[string]any{"model": "gpt-4o", "messages": msgs, "stream": true})
	return b
}

// BenchmarkFind: a 1 MiB chat request (the server's default body limit),
// walked at every level, at the top level only, and, for scale, decoded
// by encoding/json as the model-API endpoint does.
func BenchmarkFind(b *testing.B) {
	body := chatBody(1 << 20)
	for _, bc := range []struct {
		name  string
		depth int
	}{{"every level", 0}, {"top level", 1}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if Find(body, bc.depth) != nil {
					b.Fatal("a duplicate")
				}
			}
		})
	}
	b.Run("json.Unmarshal", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			var v map[string]json.RawMessage
			if err := json.Unmarshal(body, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
}
