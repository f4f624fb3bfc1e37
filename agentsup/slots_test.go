package agentsup_test

import (
	"net/http"
	"testing"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/agentssim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// TestIdleSessionsFreeTheirSlots: with upstream.max_sessions 2, two
// sessions that finished their turns and went idle give their slots up:
// a third session's calls run. The first, read again through the sidecar
// after its next message, is watched again and its next block answered.
// Every call is answered once, one post per block.
func TestIdleSessionsFreeTheirSlots(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		h := startHosted(t, kind, simConfig{}, testenv.Options{Config: func(c *config.Config) { c.Upstream.MaxSessions = 2 }}, echoTools(t)...)
		var ids []string
		for range 3 {
			id := h.create(t, appKey, script(threeCalls, "done "))
			assertOnce(t, h, h.final(t, id), 3, []int{3})
			ids = append(ids, id)
		}
		first := ids[0]
		h.message(t, first, script(threeCalls, "again "))
		path := "/v1/agents/sessions/" + first
		if kind == config.UpstreamAnthropicAgents {
			path = "/v1/sessions/" + first
		}
		if status, data := h.call(t, http.MethodGet, path, appKey, nil); status != http.StatusOK {
			t.Fatalf("reading %s: %d %s", first, status, data)
		}
		var s agentssim.Session
		poll.Until(t, "the first session's second block to be answered", func() bool {
			s = h.session(first)
			return len(s.Posts) == 2
		})
		assertOnce(t, h, s, 6, []int{3, 3})
	})
}
