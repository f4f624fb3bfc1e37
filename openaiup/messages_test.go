package openaiup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/anthropicsim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// messagesStack is a sidecar with upstream.kind anthropic on real parts:
// the Messages simulator on a loopback server, the embedded NATS and a Go
// worker; the application is the official anthropic-sdk-go client.
type messagesStack struct {
	sim    *anthropicsim.Sim
	env    *testenv.Env
	client anthropic.Client
}

func startMessages(t testing.TB, simCfg anthropicsim.Config, opts testenv.Options, tools ...testenv.Tool) *messagesStack {
	t.Helper()
	sim := anthropicsim.New(simCfg)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	s := startMessagesOn(t, srv.URL, opts, tools...)
	s.sim = sim
	return s
}

// startMessagesOn is startMessages against the upstream at baseURL.
func startMessagesOn(t testing.TB, baseURL string, opts testenv.Options, tools ...testenv.Tool) *messagesStack {
	t.Helper()
	env, hc := startSidecar(t, config.UpstreamAnthropic, baseURL, opts, tools...)
	client := anthropic.NewClient(option.WithBaseURL(env.URL), option.WithAPIKey("app-key"), option.WithMaxRetries(0), option.WithHTTPClient(hc))
	return &messagesStack{env: env, client: client}
}

func (s *messagesStack) assertContract(t *testing.T) {
	t.Helper()
	assertClean(t, s.sim.Violations())
}

func messagesParams(thinking bool, msgs ...anthropic.MessageParam) anthropic.MessageNewParams {
	p := anthropic.MessageNewParams{Model: "sim-model", MaxTokens: 2048, Messages: msgs}
	if thinking {
		p.Thinking = anthropic.ThinkingConfigParamOfEnabled(1024)
	}
	return p
}

func userText(text string) anthropic.MessageParam {
	return anthropic.NewUserMessage(anthropic.NewTextBlock(text))
}

// accumulateMessage streams a request through anthropic-sdk-go's
// accumulator, which refuses blocks out of order or with gaps.
func (s *messagesStack) accumulate(t testing.TB, p anthropic.MessageNewParams, opts ...option.RequestOption) (anthropic.Message, error) {
	t.Helper()
	st := s.client.Messages.NewStreaming(context.Background(), p, opts...)
	defer func() { _ = st.Close() }() // anthropic-sdk-go does not close a stream an error event ends
	var msg anthropic.Message
	events := 0
	for st.Next() {
		events++
		if err := msg.Accumulate(st.Current()); err != nil {
			t.Fatalf("event %d refused by anthropic-sdk-go's accumulator: %v (%s)", events, err, st.Current().RawJSON())
		}
	}
	return msg, st.Err()
}

// textOf is a message's text blocks, joined.
func textOf(m anthropic.Message) string {
	var b strings.Builder
	for _, c := range m.Content {
		if c.Type == "text" {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// A parallel batch through the Messages API, with and without thinking,
// streamed and whole, and through the compatible servers' ways: calls
// sent whole in their block's start, and a server tool's blocks in the
// turn (replayed unchanged, never answered). The whole batch runs once,
// every call is answered in call order, the answer is one message the
// official client accumulates, and the upstream's contract log is empty.
func TestMessagesParallelBatch(t *testing.T) {
	cases := []struct {
		name               string
		cfg                anthropicsim.Config
		thinking, streamed bool
	}{
		{"streamed", anthropicsim.Config{}, false, true},
		{"whole", anthropicsim.Config{}, false, false},
		{"thinking, streamed", anthropicsim.Config{}, true, true},
		{"thinking, whole", anthropicsim.Config{}, true, false},
		{"calls whole in their start", anthropicsim.Config{WholeCalls: true}, false, true},
		{"a server tool's blocks, thinking", anthropicsim.Config{ServerTool: true}, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int64
			s := startMessages(t, tc.cfg, testenv.Options{}, echoTool("echo", 20*time.Millisecond, &runs))
			p := messagesParams(tc.thinking, userText(script(echoCalls(4), "")))
			var got *anthropic.Message
			var err error
			if tc.streamed {
				var m anthropic.Message
				m, err = s.accumulate(t, p)
				got = &m
			} else {
				got, err = s.client.Messages.New(context.Background(), p)
			}
			if err != nil {
				t.Fatal(err)
			}
			if textOf(*got) != wantEchoes(4) || got.StopReason != anthropic.StopReasonEndTurn || got.Role != "assistant" {
				t.Fatalf("answer %q (%s), want %q, end_turn", textOf(*got), got.StopReason, wantEchoes(4))
			}
			if !strings.HasPrefix(got.ID, "msg_") {
				t.Errorf("id %q, want the run's msg_ id", got.ID)
			}
			if runs.Load() != 4 || s.sim.Requests() != 2 {
				t.Fatalf("the tool ran %d times in %d turns, want 4 in 2", runs.Load(), s.sim.Requests())
			}
			if got.Usage.InputTokens != 10+30 || got.Usage.OutputTokens == 0 {
				t.Errorf("usage %+v: want both turns' input counts summed (10, then 30)", got.Usage)
			}
			if got.Usage.CacheCreationInputTokens != 100 || got.Usage.CacheReadInputTokens != 200 {
				t.Errorf("cache usage written %d, read %d: want the turns' counts summed (100 written, then 200 read)",
					got.Usage.CacheCreationInputTokens, got.Usage.CacheReadInputTokens)
			}
			s.assertContract(t)
		})
	}
}

// A call whose tool fails gets a tool_result flagged is_error, beside its
// siblings' results; a call of a tool nobody serves the same.
func TestMessagesErrorOutcomeIsFlagged(t *testing.T) {
	s := startMessages(t, anthropicsim.Config{}, testenv.Options{})
	round := [][]map[string]any{{{"name": "echo", "arguments": map[string]any{"i": 0}}, {"name": "nobody_serves_this", "arguments": map[string]any{}}}}
	got, err := s.accumulate(t, messagesParams(false, userText(script(round, ""))))
	if err != nil {
		t.Fatal(err)
	}
	text := textOf(got)
	first, second, ok := strings.Cut(strings.TrimPrefix(text, "results: "), " | ")
	if !ok || first != `{"echo": {"i":0}}` || !strings.HasPrefix(second, "error: ") || !strings.Contains(second, "nobody_serves_this") {
		t.Fatalf("answer %q: want the echo, then the unknown tool's result flagged as an error", text)
	}
	s.assertContract(t)
}

// Mixed ownership (§9.4): a turn calls a tool the application declared
// between two of the sidecar's. The application gets a tool_use stop with
// only its call; its follow-up carries the message as it saw it and its
// tool_result; the upstream gets the turn as the model made it (thinking
// and every call) with every result in call order.
func TestMessagesMixedOwnership(t *testing.T) {
	var runs atomic.Int64
	s := startMessages(t, anthropicsim.Config{}, testenv.Options{}, echoTool("echo", 0, &runs))
	round := [][]map[string]any{{
		{"name": "echo", "arguments": map[string]any{"i": 0}},
		{"name": "app_lookup", "arguments": map[string]any{"q": "x"}},
		{"name": "echo", "arguments": map[string]any{"i": 2}},
	}}
	user := userText(script(round, ""))
	p := messagesParams(true, user)
	p.Tools = []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{Name: "app_lookup", InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"q": map[string]any{"type": "string"}}}}}}
	first, err := s.accumulate(t, p)
	if err != nil {
		t.Fatal(err)
	}
	var calls []anthropic.ContentBlockUnion
	for _, b := range first.Content {
		if b.Type == "tool_use" {
			calls = append(calls, b)
		}
	}
	if first.StopReason != anthropic.StopReasonToolUse || len(calls) != 1 || calls[0].Name != "app_lookup" || string(calls[0].Input) != `{"q":"x"}` {
		t.Fatalf("first answer %s with calls %+v: want tool_use with app_lookup alone", first.StopReason, calls)
	}
	if runs.Load() != 2 {
		t.Fatalf("the sidecar's tool ran %d times, want 2", runs.Load())
	}
	p.Messages = append(p.Messages, first.ToParam(), anthropic.NewUserMessage(anthropic.NewToolResultBlock(calls[0].ID, "looked up", false)))
	got, err := s.client.Messages.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	want := `results: {"echo": {"i":0}} | looked up | {"echo": {"i":2}}`
	if textOf(*got) != want || got.StopReason != anthropic.StopReasonEndTurn {
		t.Fatalf("answer %q (%s), want %q", textOf(*got), got.StopReason, want)
	}
	if runs.Load() != 2 {
		t.Errorf("the sidecar's tool ran %d times, want 2: the restored turn's results are not run again", runs.Load())
	}
	s.assertContract(t)
}

// Requests the sidecar refuses are the API's errors, which the official
// client reads: an application tool named as one of the sidecar's, no
// messages, a body that is not JSON.
func TestMessagesRefusals(t *testing.T) {
	s := startMessages(t, anthropicsim.Config{}, testenv.Options{})
	p := messagesParams(false, userText("hi"))
	p.Tools = []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{Name: "echo", InputSchema: anthropic.ToolInputSchemaParam{}}}}
	_, err := s.client.Messages.New(context.Background(), p)
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(err.Error(), `tools.0: \"echo\" is a tool of the sidecar`) ||
		!strings.Contains(err.Error(), "invalid_request_error") {
		t.Fatalf("collision: %v, want a 400 invalid_request_error naming the tool", err)
	}
	for _, body := range []string{`{"model":"m","max_tokens":5,"messages":[]}`, `not json`} {
		resp, err := http.Post(s.env.URL+"/v1/messages", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type, Message string
			} `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || e.Type != "error" || e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
			t.Errorf("%s: %d %+v, want a 400 in the API's error shape", body, resp.StatusCode, e)
		}
	}
	if n := s.sim.Requests(); n != 0 {
		t.Errorf("%d requests reached the upstream", n)
	}
}

// The upstream's faults: a 529 with retry-after and a cut stream are
// retried within the budget, and the run ends whole, each call run once;
// an error event ends the run with the API's error event, after the calls
// it had handed over are joined.
func TestMessagesFaults(t *testing.T) {
	t.Run("529 and a cut, retried", func(t *testing.T) {
		var runs atomic.Int64
		s := startMessages(t, anthropicsim.Config{}, testenv.Options{}, echoTool("echo", 0, &runs))
		s.sim.Inject(anthropicsim.Fault{Status: 529, RetryAfter: "1"}, anthropicsim.Fault{CutAfter: 6})
		got, err := s.accumulate(t, messagesParams(true, userText(script(echoCalls(3), ""))))
		if err != nil {
			t.Fatal(err)
		}
		if textOf(got) != wantEchoes(3) || runs.Load() != 3 {
			t.Fatalf("answer %q after %d runs, want %q after 3", textOf(got), runs.Load(), wantEchoes(3))
		}
		s.assertContract(t)
	})
	t.Run("an error event", func(t *testing.T) {
		s := startMessages(t, anthropicsim.Config{}, testenv.Options{})
		s.sim.Inject(anthropicsim.Fault{ErrorAfter: 3, ErrorType: "overloaded_error"})
		_, err := s.accumulate(t, messagesParams(false, userText(script(echoCalls(2), ""))))
		if err == nil || !strings.Contains(err.Error(), "the upstream reported an error: overloaded_error") {
			t.Fatalf("%v, want the stream to end with the upstream's error", err)
		}
	})
}

// The official Node client (@anthropic-ai/sdk) takes the sidecar's
// stream, with thinking on, plain and when the answer ends on the
// application's own call: finalMessage() throws on an event before
// message_start, a delta of a block that did not start, or a stream
// without message_stop.
func TestMessagesNodeClientAccumulates(t *testing.T) {
	s := startMessages(t, anthropicsim.Config{}, testenv.Options{})
	run := nodeClient(t, "check-messages.mjs", "@anthropic-ai/sdk", s.env.URL)
	got := run(script(echoCalls(3), "ok. "), "[]")
	if got["text"] != "ok. "+wantEchoes(3) || got["stop_reason"] != "end_turn" || got["usage"] == nil {
		t.Fatalf("the Node client accumulated %v", got)
	}
	rounds := [][]map[string]any{{{"name": "echo", "arguments": map[string]any{"i": 0}}, {"name": "lookup", "arguments": map[string]any{"q": "x"}}}}
	got = run(script(rounds, ""), `[{"name":"lookup","input_schema":{"type":"object"}}]`)
	uses, _ := got["tool_uses"].([]any)
	if got["stop_reason"] != "tool_use" || len(uses) != 1 || !strings.Contains(fmt.Sprint(uses[0]), "lookup") || !strings.Contains(fmt.Sprint(uses[0]), "q:x") {
		t.Fatalf("the Node client accumulated %v, want the application's one call with its input", got)
	}
	s.assertContract(t)
}

// The application's anthropic-beta header (§7.1) goes upstream on every
// turn of its run, as it came; a run without one sends none; a value that
// is no list of feature names is a 400 in the API's shape, nothing goes
// upstream, and the sidecar stays ready.
func TestMessagesForwardsBetaHeader(t *testing.T) {
	const betas = "interleaved-thinking-2025-05-14, context-1m-2025-08-07"
	var mu sync.Mutex
	var seen []string
	model := func(r anthropicsim.Request) anthropicsim.Reply {
		mu.Lock()
		seen = append(seen, r.Betas)
		mu.Unlock()
		return anthropicsim.Scripted(r)
	}
	s := startMessages(t, anthropicsim.Config{Model: model}, testenv.Options{})
	user := userText(script(echoCalls(2), ""))
	for _, header := range []string{betas, ""} {
		seen = nil
		var opts []option.RequestOption
		if header != "" {
			opts = append(opts, option.WithHeader("anthropic-beta", header))
		}
		got, err := s.accumulate(t, messagesParams(false, user), opts...)
		if err != nil || textOf(got) != wantEchoes(2) {
			t.Fatalf("answer %q, %v", textOf(got), err)
		}
		mu.Lock()
		if len(seen) != 2 || seen[0] != header || seen[1] != header {
			t.Errorf("the turns carried anthropic-beta %q, want %q on both", seen, header)
		}
		mu.Unlock()
	}
	before := s.sim.Requests()
	for _, bad := range []string{"a;b=c", strings.Repeat("x", 1025)} {
		_, err := s.client.Messages.New(context.Background(), messagesParams(false, user), option.WithHeader("anthropic-beta", bad))
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(err.Error(), "invalid_request_error") ||
			!strings.Contains(err.Error(), "anthropic-beta") {
			t.Errorf("anthropic-beta %.20q: err %v, want a 400 invalid_request_error naming the header", bad, err)
		}
	}
	if n := s.sim.Requests(); n != before {
		t.Errorf("%d requests went upstream for refused headers", n-before)
	}
	testenv.WaitLive(t, s.env.URL, "echo") // the refusals left the sidecar ready
	s.assertContract(t)
}
