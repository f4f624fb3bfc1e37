package anthropicsim_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/projectdavid/toolsidecar/sim/anthropicsim"
)

// script is a user message that the scripted model follows: a turn with
// a call with arguments and one without, then the answer.
const script = `{"rounds": [[{"name": "look", "arguments": {"q": "é✓"}}, {"name": "ping"}]], "answer": "done. "}`

func start(t *testing.T, cfg anthropicsim.Config) (*anthropicsim.Sim, anthropic.Client) {
	t.Helper()
	sim := anthropicsim.New(cfg)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	return sim, anthropic.NewClient(option.WithBaseURL(srv.URL), option.WithAPIKey("k"), option.WithMaxRetries(0))
}

func params(thinking bool, msgs ...anthropic.MessageParam) anthropic.MessageNewParams {
	p := anthropic.MessageNewParams{Model: "sim-model", MaxTokens: 2048, Messages: msgs}
	if thinking {
		p.Thinking = anthropic.ThinkingConfigParamOfEnabled(1024)
	}
	return p
}

// accumulate streams a request through anthropic-sdk-go's accumulator.
func accumulate(t *testing.T, c anthropic.Client, p anthropic.MessageNewParams) (anthropic.Message, error) {
	t.Helper()
	s := c.Messages.NewStreaming(context.Background(), p)
	var msg anthropic.Message
	for s.Next() {
		if err := msg.Accumulate(s.Current()); err != nil {
			t.Fatalf("anthropic-sdk-go's accumulator refused an event: %v", err)
		}
	}
	return msg, s.Err()
}

// results answers every tool_use of msg, in order: "<name> ok", the
// second as an error.
func results(msg anthropic.Message) anthropic.MessageParam {
	var blocks []anthropic.ContentBlockParamUnion
	for _, b := range msg.Content {
		if b.Type == "tool_use" {
			blocks = append(blocks, anthropic.NewToolResultBlock(b.ID, b.Name+" ok", len(blocks) == 1))
		}
	}
	return anthropic.NewUserMessage(blocks...)
}

// TestLoopThroughTheSDK: a tool turn streamed and accumulated by the
// official Go client (with and without thinking), answered with its
// tool_result blocks, then the answer: the calls and their inputs as
// written (a call without arguments has input {}), the thinking block
// with its signature, the results in the answer, and an empty contract
// log.
func TestLoopThroughTheSDK(t *testing.T) {
	for _, thinking := range []bool{false, true} {
		sim, c := start(t, anthropicsim.Config{})
		user := anthropic.NewUserMessage(anthropic.NewTextBlock(script))
		turn, err := accumulate(t, c, params(thinking, user))
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, b := range turn.Content {
			kinds = append(kinds, string(b.Type))
		}
		want := "tool_use tool_use"
		if thinking {
			want = "thinking " + want
		}
		if got := strings.Join(kinds, " "); got != want || turn.StopReason != anthropic.StopReasonToolUse {
			t.Fatalf("thinking=%v: blocks %q, stop %q; want %q, tool_use", thinking, got, turn.StopReason, want)
		}
		calls := turn.Content[len(turn.Content)-2:]
		if string(calls[0].Input) != `{"q":"é✓"}` || string(calls[1].Input) != `{}` || calls[0].Name != "look" {
			t.Errorf("inputs %s and %s", calls[0].Input, calls[1].Input)
		}
		if thinking && (turn.Content[0].Signature == "" || turn.Content[0].Thinking == "") {
			t.Errorf("thinking block %+v, want its text and signature", turn.Content[0])
		}
		answer, err := c.Messages.New(context.Background(), params(thinking, user, turn.ToParam(), results(turn)))
		if err != nil {
			t.Fatal(err)
		}
		last := answer.Content[len(answer.Content)-1]
		if last.Text != "done. results: look ok | error: ping ok" || answer.StopReason != anthropic.StopReasonEndTurn {
			t.Errorf("answer %q (%s)", last.Text, answer.StopReason)
		}
		if v := sim.Violations(); len(v) > 0 || sim.Requests() != 2 || sim.Repeats() != 0 {
			t.Errorf("violations %+v, %d requests, %d repeats", v, sim.Requests(), sim.Repeats())
		}
	}
}

// TestContractRefusals: follow-ups the API refuses, each a 400
// invalid_request_error with the API's message, and a violation logged.
func TestContractRefusals(t *testing.T) {
	_, c := start(t, anthropicsim.Config{})
	user := anthropic.NewUserMessage(anthropic.NewTextBlock(script))
	turn, err := accumulate(t, c, params(true, user))
	if err != nil {
		t.Fatal(err)
	}
	first := turn.Content[1].ID
	blocks := turn.ToParam().OfAssistant.Content
	edited := anthropic.NewAssistantMessage(append([]anthropic.ContentBlockParamUnion{anthropic.NewThinkingBlock(turn.Content[0].Signature, "something else")}, blocks[1:]...)...)
	noThinking := anthropic.NewAssistantMessage(blocks[1:]...)
	for _, c2 := range []struct {
		name, code, msg string
		p               anthropic.MessageNewParams
	}{
		{"no results", "missing_tool_result", "`tool_use` ids were found without `tool_result` blocks immediately after",
			params(true, user, turn.ToParam(), anthropic.NewUserMessage(anthropic.NewTextBlock("go on")))},
		{"text before the results", "missing_tool_result", "`tool_use` ids were found without `tool_result` blocks immediately after",
			params(true, user, turn.ToParam(), anthropic.NewUserMessage(append([]anthropic.ContentBlockParamUnion{anthropic.NewTextBlock("here:")}, results(turn).OfUser.Content...)...))},
		{"one result of two", "missing_tool_result", "Did not find 1 tool_result block(s) at the beginning of this message",
			params(true, user, turn.ToParam(), anthropic.NewUserMessage(anthropic.NewToolResultBlock(first, "x", false)))},
		{"an unknown id", "unexpected_tool_result", "unexpected `tool_use_id` found in `tool_result` blocks: toolu_other",
			params(true, user, turn.ToParam(), anthropic.NewUserMessage(append(results(turn).OfUser.Content, anthropic.NewToolResultBlock("toolu_other", "x", false))...))},
		{"thinking edited", "thinking_modified", "cannot be modified", params(true, user, edited, results(turn))},
		{"thinking dropped", "thinking_missing", "Expected `thinking` or `redacted_thinking`, but found `tool_use`", params(true, user, noThinking, results(turn))},
	} {
		sim, c := start(t, anthropicsim.Config{})
		// The same first turn, said by this simulator too.
		if _, err := accumulate(t, c, params(true, user)); err != nil {
			t.Fatal(err)
		}
		_, err := c.Messages.New(context.Background(), c2.p)
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(err.Error(), c2.msg) || !strings.Contains(err.Error(), "invalid_request_error") {
			t.Errorf("%s: %v, want a 400 saying %q", c2.name, err, c2.msg)
		}
		if v := sim.Violations(); len(v) == 0 || v[0].Code != c2.code {
			t.Errorf("%s: violations %+v, want %s first", c2.name, v, c2.code)
		}
	}
}

// TestFaults: a 529 overloaded_error with Retry-After before the stream;
// an error event inside a 200 stream; a connection cut mid-stream (an
// unexpected EOF); a response that ends cleanly before message_stop (the
// official client ends it without an error, as a finished one: only the
// missing stop reason tells).
func TestFaults(t *testing.T) {
	sim, c := start(t, anthropicsim.Config{})
	sim.Inject(anthropicsim.Fault{Status: 529, RetryAfter: "1"}, anthropicsim.Fault{ErrorAfter: 4}, anthropicsim.Fault{CutAfter: 5}, anthropicsim.Fault{EndAfter: 5})
	p := params(false, anthropic.NewUserMessage(anthropic.NewTextBlock(script)))
	_, err := c.Messages.New(context.Background(), p)
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 529 || apiErr.Response.Header.Get("Retry-After") != "1" || !strings.Contains(err.Error(), "overloaded_error") {
		t.Errorf("529: %v", err)
	}
	if _, err := accumulate(t, c, p); err == nil || !strings.Contains(err.Error(), "overloaded_error") {
		t.Errorf("error event: %v, want the stream to end with overloaded_error", err)
	}
	if cut, err := accumulate(t, c, p); !errors.Is(err, io.ErrUnexpectedEOF) || cut.StopReason != "" {
		t.Errorf("cut stream: %v, stop reason %q; want an unexpected EOF", err, cut.StopReason)
	}
	ended, err := accumulate(t, c, p)
	if err != nil || ended.StopReason != "" || len(ended.Content) == 0 {
		t.Errorf("stream ended early: %v, stop reason %q, %d blocks; want no error, some blocks, no stop reason", err, ended.StopReason, len(ended.Content))
	}
	whole, err := accumulate(t, c, p)
	if err != nil || whole.StopReason != anthropic.StopReasonToolUse || sim.Requests() != 5 {
		t.Errorf("after the faults: %v %q, %d requests", err, whole.StopReason, sim.Requests())
	}
	if n := sim.Repeats(); n != 0 {
		t.Errorf("%d turns delivered twice: the faulted ones were not delivered", n)
	}
}
