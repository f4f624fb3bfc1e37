package openaiup_test

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/projectdavid/toolsidecar/anthropicsim"
	"github.com/projectdavid/toolsidecar/responsesim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// TestHostileArgumentsOtherAPIs is TestHostileUpstream's first case
// through the Responses and Messages APIs: a call whose arguments grow
// past executor.max_args_bytes gets its own invalid_args outcome while
// its siblings run, the upstream's contract log stays empty, and the
// sidecar stays ready.
func TestHostileArgumentsOtherAPIs(t *testing.T) {
	user := script([][]map[string]any{{
		{"name": "echo", "arguments": map[string]any{"i": 0}},
		{"name": "echo", "arguments": map[string]any{"i": 1, "blob": strings.Repeat("z", 300<<10)}},
		{"name": "echo", "arguments": map[string]any{"i": 2}},
	}}, "")
	check := func(t *testing.T, runs *atomic.Int64, text string, err error, url string) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		parts := strings.Split(text, " | ")
		if len(parts) != 3 || !strings.Contains(parts[0], `"i":0`) || !strings.Contains(parts[1], "invalid_args") || !strings.Contains(parts[2], `"i":2`) {
			t.Errorf("the answer %.300q, want the three outputs in call order, the second invalid_args", text)
		}
		if runs.Load() != 2 {
			t.Errorf("the tool ran %d times, want 2 (not the huge call)", runs.Load())
		}
		testenv.WaitLive(t, url, "echo")
	}
	t.Run("responses", func(t *testing.T) {
		var runs atomic.Int64
		s := startResponses(t, responsesim.Config{}, testenv.Options{}, echoTool("echo", 0, &runs))
		got, err := s.accumulate(t, responsesParams(user, false))
		text := ""
		if got != nil {
			text = got.OutputText()
		}
		check(t, &runs, text, err, s.env.URL)
		s.assertContract(t)
	})
	t.Run("messages", func(t *testing.T) {
		var runs atomic.Int64
		s := startMessages(t, anthropicsim.Config{}, testenv.Options{}, echoTool("echo", 0, &runs))
		got, err := s.accumulate(t, messagesParams(false, userText(user)))
		check(t, &runs, textOf(got), err, s.env.URL)
		s.assertContract(t)
	})
}
