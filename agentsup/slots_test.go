package agentsup_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/agentsup"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/agentssim"
	"github.com/projectdavid/toolsidecar/testkit/matrix"
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

// TestFullTableSaid: with upstream.max_sessions 1 and the one session at
// work (its call held), a second session created through the sidecar is
// not watched, and the create's answer says so in Toolsidecar-Watch; the
// first's answer had no such header, and its call is answered once.
func TestFullTableSaid(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		held := matrix.Serve(t, matrix.NATS, matrix.Tool{Name: "a", SideEffects: config.ReadOnly, Block: true, Echo: true})
		h := startHosted(t, kind, simConfig{}, testenv.Options{Config: func(c *config.Config) { c.Upstream.MaxSessions = 1 }}, held.EnvTools(10*time.Second)...)
		one := script([][]map[string]any{{threeCalls[0][0]}}, "done ")
		first, firstHeader := h.createHeader(t, one)
		poll.Until(t, "the first session's call to start", func() bool { return held.Count("a") >= 1 })
		_, second := h.createHeader(t, one)
		if firstHeader != "" {
			t.Errorf("the first session, watched, was answered %s: %q", agentsup.WatchHeader, firstHeader)
		}
		if !strings.HasPrefix(second, "refused: ") || !strings.Contains(second, "too many sessions") {
			t.Errorf("the second session, past upstream.max_sessions, was answered %s: %q", agentsup.WatchHeader, second)
		}
		held.Release()
		assertOnce(t, h, h.final(t, first), 1, []int{1})
	})
}

// createHeader creates a session through the sidecar as create does, and
// returns its id and the answer's Toolsidecar-Watch header.
func (h *hosted) createHeader(t *testing.T, input string) (id, watch string) {
	t.Helper()
	var got http.Header
	h.onAnswer = func(resp *http.Response) { got = resp.Header }
	defer func() { h.onAnswer = nil }()
	id = h.create(t, appKey, input)
	return id, got.Get(agentsup.WatchHeader)
}
