package openaiup_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/projectdavid/toolsidecar/sim/openaisim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// toolMessages is a model that makes calls in its first turn and, once
// they are answered, says "done"; it keeps the tool messages it read.
type toolMessages struct {
	mu    sync.Mutex
	calls []openaisim.Call
	read  []string
}

func (m *toolMessages) model(req openaisim.Request) openaisim.Reply {
	m.mu.Lock()
	defer m.mu.Unlock()
	var last struct{ Role, Content string }
	_ = json.Unmarshal(req.Messages[len(req.Messages)-1], &last)
	if last.Role != "tool" {
		return openaisim.Reply{Calls: m.calls}
	}
	m.read = m.read[:0]
	for _, raw := range req.Messages {
		var msg struct{ Role, Content string }
		if json.Unmarshal(raw, &msg) == nil && msg.Role == "tool" {
			m.read = append(m.read, msg.Content)
		}
	}
	return openaisim.Reply{Content: "done"}
}

// TestHostileUpstream: what an upstream sends is bounded while it is read.
// A call whose argument fragments grow past executor.max_args_bytes keeps
// none of them and gets its own invalid_args outcome, while its siblings
// run; an event too long to read fails the run in the API's error shape,
// saying why, instead of being taken for a cut stream and asked for again.
// The sidecar stays ready either way.
func TestHostileUpstream(t *testing.T) {
	big := `{"blob": "` + strings.Repeat("z", 300<<10) + `"}` // over executor.max_args_bytes
	huge := `{"blob": "` + strings.Repeat("z", 10<<20) + `"}` // over the bound of a chunk that carries a turn's calls
	t.Run("arguments past the bound", func(t *testing.T) {
		var runs atomic.Int64
		m := &toolMessages{calls: []openaisim.Call{{Name: "echo", Args: `{"i": 0}`}, {Name: "echo", Args: big}, {Name: "echo", Args: `{"i": 2}`}}}
		s := start(t, openaisim.Config{Profile: openaisim.VLLM, Model: m.model}, testenv.Options{}, echoTool("echo", 0, &runs))
		got, err := s.streamChat(t, params("go"))
		if err != nil || got.Choices[0].Message.Content != "done" {
			t.Fatalf("answer %+v, err %v", got.Choices, err)
		}
		if runs.Load() != 2 {
			t.Errorf("the tool ran %d times, want 2 (not the huge call)", runs.Load())
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if len(m.read) != 3 || !strings.Contains(m.read[1], `"error_type":"invalid_args"`) || !strings.Contains(m.read[1], "exceed the limit") ||
			!strings.Contains(m.read[0], `"i":0`) || !strings.Contains(m.read[2], `"i":2`) {
			t.Errorf("the model read %q", m.read)
		}
		testenv.WaitLive(t, s.env.URL, "echo")
	})
	t.Run("an event past the bound", func(t *testing.T) {
		m := &toolMessages{calls: []openaisim.Call{{Name: "echo", Args: huge}}}
		s := start(t, openaisim.Config{Profile: openaisim.Ollama, Model: m.model}, testenv.Options{})
		_, err := s.client.Chat.Completions.New(context.Background(), params("go"))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadGateway || !strings.Contains(apiErr.Message, "over the limit") {
			t.Fatalf("err %v, want a 502 saying the event was over the limit", err)
		}
		if n := s.sim.Requests(); n != 1 {
			t.Errorf("%d requests upstream, want 1: an oversized event is not a cut stream", n)
		}
		testenv.WaitLive(t, s.env.URL, "echo")
	})
	t.Run("a body that is not UTF-8", func(t *testing.T) {
		s := start(t, openaisim.Config{}, testenv.Options{})
		body := []byte(`{"model": "m", "messages": [{"role": "user", "content": "` + "\xff\xfe" + `"}]}`)
		resp, err := http.Post(s.env.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || s.sim.Requests() != 0 {
			t.Errorf("%d, %d requests upstream; want 400 and none", resp.StatusCode, s.sim.Requests())
		}
	})
}
