package agentsup_test

import (
	"context"
	"encoding/json"
	"github.com/projectdavid/toolsidecar/tool"
	"strings"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// TestLargeEventInHistory: an Anthropic session whose history holds a
// user message larger than the bound of a read (a document: 1.5 MiB,
// the bound about 1 MiB at max_args_bytes 1 KiB) is served: the history
// is read for the event types the sidecar needs only. Every call answered
// once, in one post.
func TestLargeEventInHistory(t *testing.T) {
	h := startHosted(t, config.UpstreamAnthropicAgents, simConfig{}, testenv.Options{MaxBodyBytes: 4 << 20,
		Executor: config.Executor{MaxArgsBytes: 1 << 10}}, echoTools(t)...)
	var in map[string]any
	if err := json.Unmarshal([]byte(script(threeCalls, "done ")), &in); err != nil {
		t.Fatal(err)
	}
	in["document"] = strings.Repeat("d", 3<<19)
	b, _ := json.Marshal(in)
	id := h.create(t, appKey, string(b))
	assertOnce(t, h, h.final(t, id), 3, []int{3})
}

// TestLargeResultsInHistory: an Anthropic session whose history holds
// results that together pass the bound of a read (three of 400 KiB under
// about 1 MiB), its stream then cut: the history is read again in
// smaller pages, and the next block is answered. Every call once, one
// post per block.
func TestLargeResultsInHistory(t *testing.T) {
	big := testenv.Tool{Config: config.Tool{Name: "big", SideEffects: config.ReadOnly, Timeout: 5 * time.Second},
		Handler: func(context.Context, *tool.Call) ([]byte, error) {
			return json.Marshal(map[string]string{"doc": strings.Repeat("r", 400<<10)})
		}}
	h := startHosted(t, config.UpstreamAnthropicAgents, simConfig{}, testenv.Options{Executor: config.Executor{MaxArgsBytes: 1 << 10}},
		append(echoTools(t), big)...)
	h.sim.CutStream(6) // reopened, the stream is reconciled from the history, large results and all
	rounds := [][]map[string]any{{{"name": "big", "arguments": map[string]any{"k": 0}}, {"name": "big", "arguments": map[string]any{"k": 1}},
		{"name": "big", "arguments": map[string]any{"k": 2}}}, {{"name": "a", "arguments": map[string]any{"k": 3}}}}
	id := h.create(t, appKey, script(rounds, "done "))
	assertOnce(t, h, h.final(t, id), 4, []int{3, 1})
}
