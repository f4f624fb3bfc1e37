package agentsup_test

import (
	"encoding/json"
	"strings"
	"testing"

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
