package executor

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// TestReadToolResultScopedToRun: a handle reads only within the run that
// stored it; another run's call with the same handle finds nothing, and an
// offset past the end is an invalid_args error. Pages end on a rune
// boundary (an offset inside a character moves on to the next), and
// next_offset is null at the end.
func TestReadToolResultScopedToRun(t *testing.T) {
	e := &Executor{cfg: Config{ReadPageBytes: 5}, results: memResults{newMemMemo(1 << 10)}}
	ctx := context.Background()
	if err := e.results.PutResult(ctx, resultName("run_a", "call_1"), []byte("héllo wörld")); err != nil {
		t.Fatal(err)
	}
	read := func(run, args string) tool.Outcome {
		body := `{"type": "tool_call_manifest", "run_id": "` + run + `", "action_id": "act", "tool_call_id": "c", "tool": "read_tool_result", "args": ` + args + `}`
		return builtin{e}.Dispatch(ctx, tool.Request{Tool: registry.ReadToolResult, Body: []byte(body)})
	}
	out := read("run_a", `{"handle": "call_1", "offset": 0, "length": 3}`)
	var p page
	if out.Err != nil || json.Unmarshal(out.Data, &p) != nil || p.Data != "hé" || p.Length != 3 || p.NextOffset == nil || *p.NextOffset != 3 {
		t.Errorf("first page %s %v: want \"hé\" (3 bytes), next 3", out.Data, out.Err)
	}
	out = read("run_a", `{"handle": "call_1", "offset": 4, "length": 5}`) // "lo wö" is 6 bytes: the ö is left for the next page
	if out.Err != nil || json.Unmarshal(out.Data, &p) != nil || p.Data != "lo w" || p.NextOffset == nil || *p.NextOffset != 8 {
		t.Errorf("middle page %s %v: want \"lo w\", next 8", out.Data, out.Err)
	}
	out = read("run_a", `{"handle": "call_1", "offset": 9, "length": 5}`) // inside the ö
	if out.Err != nil || json.Unmarshal(out.Data, &p) != nil || p.Data != "rld" || p.Offset != 10 || p.NextOffset != nil {
		t.Errorf("last page %s %v: want \"rld\" from offset 10, no next", out.Data, out.Err)
	}
	if out := read("run_b", `{"handle": "call_1"}`); out.Err == nil || out.Err.Type != tool.NotFound {
		t.Errorf("another run read the handle: %s %v", out.Data, out.Err)
	}
	if out := read("run_a", `{"handle": "call_1", "offset": 99}`); out.Err == nil || out.Err.Type != tool.InvalidArgs || !strings.Contains(out.Err.Message, "13 bytes") {
		t.Errorf("offset past the end: %v", out.Err)
	}
}
