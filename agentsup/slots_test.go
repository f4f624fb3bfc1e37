package agentsup_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/agentsup"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/agentssim"
	"github.com/projectdavid/toolsidecar/testkit/matrix"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// TestIdleSessionsFreeTheirSlots: with upstream.max_sessions 2, two
// sessions that finished their turns and went idle give their slots up:
// a third session's calls run. The first, read again through the sidecar
// after its next message, is watched again and its next block answered.
// Every call is answered once, one post per block.
func TestIdleSessionsFreeTheirSlots(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		h := startHosted(t, kind, simConfig{}, testenv.Options{Config: func(c *config.Config) {
			// The table, not one caller's share of it (TestSlotsPerOwner):
			// one caller may hold both slots here.
			c.Upstream.MaxSessions, c.Upstream.MaxSessionsPerOwner = 2, 2
		}}, echoTools(t)...)
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
		first, firstHeader := h.createHeader(t, appKey, one)
		poll.Until(t, "the first session's call to start", func() bool { return held.Count("a") >= 1 })
		_, second := h.createHeader(t, appKey, one)
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
func (h *hosted) createHeader(t *testing.T, key, input string) (id, watch string) {
	t.Helper()
	var got http.Header
	h.onAnswer = func(resp *http.Response) { got = resp.Header }
	defer func() { h.onAnswer = nil }()
	id = h.create(t, key, input)
	return id, got.Get(agentsup.WatchHeader)
}

// TestApplicationOnlySessionsFreeTheirSlots: with upstream.max_sessions
// 3, caller B's three sessions wait on a call of the application's own
// tool, which the registry does not hold; caller A's new session is
// watched all the same (one of B's gives its slot up), and its calls are
// answered once, in one post. B then answers its own call through the
// sidecar, having read the session from the API itself: that post
// watches the session again, and the call of the registry's tool that
// follows is answered. Before, A's create was answered "Toolsidecar-Watch:
// refused" and its calls were left pending.
func TestApplicationOnlySessionsFreeTheirSlots(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		h := startHosted(t, kind, simConfig{}, testenv.Options{Config: func(c *config.Config) {
			c.Upstream.MaxSessions, c.Upstream.MaxSessionsPerOwner = 3, 3
		}}, echoTools(t)...)
		parked := script([][]map[string]any{{{"name": "app_lookup", "arguments": map[string]any{"q": "x"}}}, {threeCalls[0][0]}}, "done ")
		var ids []string
		for range 3 {
			id, watch := h.createHeader(t, appKey, parked)
			if watch != "" {
				t.Fatalf("caller B's session %s: %s %q", id, agentsup.WatchHeader, watch)
			}
			poll.Until(t, "the session to wait on the application's call", func() bool { return len(h.session(id).Pending) == 1 })
			ids = append(ids, id)
		}
		// The sidecar may not have seen B's last block yet: then A's
		// create is refused, and A reads its session again, which the
		// sidecar watches once it has.
		a, watch := h.createHeader(t, "sk-caller-a", script(threeCalls, "done "))
		if watch != "" {
			poll.Until(t, "caller A's session to be watched, B's three waiting on the application only", func() bool {
				return h.readHeader(t, "sk-caller-a", a) == ""
			})
		}
		assertOnce(t, h, h.final(t, a), 3, []int{3})
		h.readBase = h.simURL
		h.answerOwn(t, ids[0], "app_lookup", "app answer")
		h.readBase = ""
		s := h.final(t, ids[0])
		if len(s.Posts) != 2 || s.Posts[1] != 1 {
			t.Errorf("B's session after its own answer: posts %v, want the application's, then the sidecar's one call", s.Posts)
		}
	})
}

// TestSlotsPerOwner: with upstream.max_sessions 4 and the default per
// caller (half of it: 2), caller B's two sessions at work (their calls
// held) take its share: its third is answered "Toolsidecar-Watch:
// refused", while caller A's session is watched and answered. Before, B's
// third took a slot like any other.
func TestSlotsPerOwner(t *testing.T) {
	each(t, func(t *testing.T, kind string) { slotsPerOwner(t, kind, nil) })
}

// TestSlotsPerOwnerNotEvadedByHeaders: as TestSlotsPerOwner, but caller B,
// with its one key, sends each session's create with another value of
// the header the API does not authenticate with (X-Api-Key for OpenAI's,
// Authorization for Anthropic's): its third session is refused all the
// same, and A's is watched. B still sees its sessions on the board, with
// its key alone or with the header it created one with. Before, each new
// value named another owner: B's four sessions took every slot, and A's
// was refused "too many sessions watched (4, none resting)".
func TestSlotsPerOwnerNotEvadedByHeaders(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		ignored := "X-Api-Key"
		if kind == config.UpstreamAnthropicAgents {
			ignored = "Authorization"
		}
		junk := func(i int) http.Header { return http.Header{ignored: {fmt.Sprintf("Bearer junk-%d", i)}} }
		h, ids := slotsPerOwner(t, kind, junk)
		for _, extra := range []http.Header{nil, junk(0)} {
			req, _ := http.NewRequest(http.MethodGet, "/", nil)
			h.headers(req, appKey)
			maps.Copy(req.Header, extra)
			poll.Until(t, fmt.Sprintf("caller B to read its session's run, adding %v", extra), func() bool {
				return testenv.BoardGet(t, h.env.URL+"/v1/sidecar/runs/"+ids[0], req.Header, nil) == http.StatusOK
			})
		}
	})
}

// slotsPerOwner runs TestSlotsPerOwner's sessions, caller B's create i
// with the headers extra(i) adds (nil: none), and returns the sidecar and
// B's sessions.
func slotsPerOwner(t *testing.T, kind string, extra func(i int) http.Header) (*hosted, []string) {
	t.Helper()
	release := make(chan struct{})
	hold := testenv.Tool{Config: config.Tool{Name: "hold"}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return []byte(`"held"`), nil
	}}
	h := startHosted(t, kind, simConfig{}, testenv.Options{Config: func(c *config.Config) { c.Upstream.MaxSessions = 4 },
		Server: func(s *config.Server) { s.UI = true }}, append(echoTools(t), hold)...)
	held := script([][]map[string]any{{{"name": "hold", "arguments": map[string]any{}}}}, "done ")
	var ids []string
	for i := range 3 {
		if extra != nil {
			h.extra = extra(i)
		}
		id, watch := h.createHeader(t, appKey, held)
		switch {
		case i < 2 && watch != "":
			t.Fatalf("caller B's session %d: %s %q", i, agentsup.WatchHeader, watch)
		case i == 2 && (!strings.HasPrefix(watch, "refused: ") || !strings.Contains(watch, "max_sessions_per_owner")):
			t.Errorf("caller B's third session, past its share: %s %q", agentsup.WatchHeader, watch)
		}
		ids = append(ids, id)
	}
	h.extra = nil
	a, watch := h.createHeader(t, "sk-caller-a", script(threeCalls, "done "))
	if watch != "" {
		t.Errorf("caller A's session: %s %q", agentsup.WatchHeader, watch)
	}
	assertOnce(t, h, h.final(t, a), 3, []int{3})
	close(release)
	for _, id := range ids[:2] {
		if s := h.final(t, id); len(s.Posts) != 1 {
			t.Errorf("B's session %s: posts %v", id, s.Posts)
		}
	}
	return h, ids
}

// readHeader reads a session through the sidecar as key, and returns the
// answer's Toolsidecar-Watch header.
func (h *hosted) readHeader(t *testing.T, key, id string) string {
	t.Helper()
	path := "/v1/agents/sessions/" + id
	if h.kind == config.UpstreamAnthropicAgents {
		path = "/v1/sessions/" + id
	}
	var got http.Header
	h.onAnswer = func(resp *http.Response) { got = resp.Header }
	defer func() { h.onAnswer = nil }()
	if status, data := h.call(t, http.MethodGet, path, key, nil); status != http.StatusOK {
		t.Fatalf("reading %s: %d %s", id, status, data)
	}
	return got.Get(agentsup.WatchHeader)
}

// TestSharedSessionsNotBoundedPerOwner: with the sidecar's API token and
// an upstream key of its own, the API sees that key alone, so callers
// are not told apart: upstream.max_sessions_per_owner (default 2 of
// max_sessions 4) does not bound their sessions, and a third session at
// work is watched. Before, every caller presenting the token was one
// owner, and the sidecar watched half of max_sessions at most.
func TestSharedSessionsNotBoundedPerOwner(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		keyFile := filepath.Join(t.TempDir(), "key")
		if err := os.WriteFile(keyFile, []byte(ownUpstreamKey), 0o600); err != nil {
			t.Fatal(err)
		}
		held := matrix.Serve(t, matrix.NATS, matrix.Tool{Name: "a", SideEffects: config.ReadOnly, Block: true, Echo: true})
		h := startHosted(t, kind, simConfig{}, testenv.Options{Token: sidecarToken, Config: func(c *config.Config) {
			c.Upstream.MaxSessions, c.Upstream.APIKeyFile = 4, keyFile
		}}, held.EnvTools(10*time.Second)...)
		key := sidecarToken // OpenAI's key header carries the token
		if kind == config.UpstreamAnthropicAgents {
			key, h.extra = "sk-ignored", http.Header{"Authorization": {"Bearer " + sidecarToken}}
		}
		one := script([][]map[string]any{{threeCalls[0][0]}}, "done ")
		for i := range 3 {
			if id, watch := h.createHeader(t, key, one); watch != "" {
				t.Errorf("session %d %s: %s %q", i, id, agentsup.WatchHeader, watch)
			}
		}
	})
}
