package executor

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/tool"
)

// TestDedupeKey: the key ignores key order and spacing of the arguments,
// and tells runs, tools and values apart; arguments that are not JSON have
// no key.
func TestDedupeKey(t *testing.T) {
	key := func(run, tool, args string) string {
		k, ok := dedupeKey(&ToolCall{RunID: run, Tool: tool, Args: []byte(args)})
		if !ok {
			return "none"
		}
		return k
	}
	base := key("r1", "search", `{"q": "x", "n": 1, "f": {"b": 2, "a": [1, 2]}}`)
	if same := key("r1", "search", `{"f":{"a":[1,2],"b":2},"n":1,"q":"x"}`); same != base {
		t.Error("key order or spacing changed the key")
	}
	for _, other := range []string{key("r2", "search", `{"q": "x", "n": 1, "f": {"b": 2, "a": [1, 2]}}`),
		key("r1", "lookup", `{"q": "x", "n": 1, "f": {"b": 2, "a": [1, 2]}}`), key("r1", "search", `{"q": "x", "n": 2, "f": {"b": 2, "a": [1, 2]}}`),
		key("r1", "search", `{"q": "x", "n": 1, "f": {"b": 2, "a": [2, 1]}}`)} {
		if other == base {
			t.Error("a different run, tool or argument gave the same key")
		}
	}
	if key("r1", "search", `{"q": `) != "none" {
		t.Error("broken arguments got a key")
	}
}

// TestMemMemoBounded: the memo in memory drops its oldest entries beyond
// its byte bound, and expired ones as it goes; a result larger than the
// bound is not kept.
func TestMemMemoBounded(t *testing.T) {
	ctx := context.Background()
	m := newMemMemo(10)
	later := time.Now().Add(time.Hour)
	m.Remember(ctx, "a", MemoEntry{Content: "aaaa", Expires: later})
	m.Remember(ctx, "b", MemoEntry{Content: "bbbb", Expires: later})
	m.Remember(ctx, "c", MemoEntry{Content: "cccc", Expires: later}) // 12 bytes: a goes
	if _, ok := m.Recall(ctx, "a"); ok {
		t.Error("the oldest entry outlived the byte bound")
	}
	if e, ok := m.Recall(ctx, "c"); !ok || e.Content != "cccc" {
		t.Errorf("newest entry %+v %v", e, ok)
	}
	m.Remember(ctx, "huge", MemoEntry{Content: strings.Repeat("x", 11), Expires: later})
	if _, ok := m.Recall(ctx, "huge"); ok || m.entries.Bytes() > 10 {
		t.Errorf("an entry over the bound was kept (%d bytes held)", m.entries.Bytes())
	}
	m.Remember(ctx, "old", MemoEntry{Content: "o", Expires: time.Now().Add(-time.Second)})
	m.Remember(ctx, "d", MemoEntry{Content: "d", Expires: later})
	if _, ok := m.Recall(ctx, "b"); !ok {
		t.Error("an unexpired entry within the bound was dropped")
	}
}

// TestFailedOutput: the executor's own account of a failure reads as
// failed, and a tool's output that only looks like one does not.
func TestFailedOutput(t *testing.T) {
	own := errorContent("look", tool.NewError(tool.ToolFailed, "it broke: %s", `"quoted"`))
	for content, want := range map[string]bool{
		own:             true,
		`{"error":"x"}`: false, // a tool's own error field
		`{"error":"x","error_type":"tool_failed","tool":"look","extra":1}`: false,
		own + " trailing": false,
		"plain text":      false,
		"":                false,
	} {
		if got := FailedOutput(content); got != want {
			t.Errorf("FailedOutput(%q) = %v, want %v", content, got, want)
		}
	}
}
