package modelapi

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	sse "github.com/tmaxmax/go-sse"
)

// joined makes a turn's calls whole from their fragments the plainest
// way, by index: the first id and name, the arguments appended (or
// replaced by whole ones). openaiup's assembler adds the compatible
// servers' rules to this, and is tested there.
type joined struct {
	order []int
	calls map[int]*Call
}

func (j *joined) add(ds []CallDelta) {
	for _, d := range ds {
		c := j.calls[*d.Index]
		if c == nil {
			c = &Call{ID: d.ID, Name: d.Function.Name}
			j.calls[*d.Index], j.order = c, append(j.order, *d.Index)
		}
		if a := d.Function.Arguments; a != nil && d.Whole {
			c.Args = *a
		} else if a != nil {
			c.Args += *a
		}
	}
}

func (j *joined) done() []Call {
	out := make([]Call, len(j.order))
	for i, at := range j.order {
		out[i] = *j.calls[at]
	}
	return out
}

// parseMessages reads a Messages stream written as "name data" lines,
// one event each, as the turn does: the pieces' text and fragments, the
// finish, the errors, and the assistant message the turn would replay.
func parseMessages(t *testing.T, events ...string) (text, finish string, errs []error, assistant map[string]any) {
	t.Helper()
	p := messagesCodec{}.NewParser()
	j := joined{calls: map[int]*Call{}}
	var b strings.Builder
	for _, e := range events {
		name, data, _ := strings.Cut(e, " ")
		pc, err := p.Take(sse.Event{Type: name, Data: data})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		b.WriteString(pc.Text)
		j.add(pc.Calls)
		if pc.Finish != "" {
			finish = pc.Finish
		}
	}
	raw, err := p.Assistant(b.String(), j.done())
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &assistant); err != nil {
		t.Fatal(err)
	}
	return b.String(), finish, errs, assistant
}

func blocksJSON(m map[string]any) string {
	out, _ := json.Marshal(m["content"])
	return string(out)
}

// The content is rebuilt as the API streamed it, whatever the servers'
// ways: deltas of two open calls interleaved by index, a call with no
// fragment ({}), a call whose input came whole in its start, an empty
// text block (left out: the API refuses one), a redacted thinking block
// and a thinking block with its signature, replayed as they came.
func TestMessagesParserRebuildsTheContent(t *testing.T) {
	_, finish, errs, m := parseMessages(t,
		`message_start {"type":"message_start","message":{"model":"m","usage":{"input_tokens":7}}}`,
		`content_block_start {"index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
		`content_block_delta {"index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}`,
		`content_block_delta {"index":0,"delta":{"type":"signature_delta","signature":"sig"}}`,
		`content_block_stop {"index":0}`,
		`content_block_start {"index":1,"content_block":{"type":"redacted_thinking","data":"opaque"}}`,
		`content_block_stop {"index":1}`,
		`content_block_start {"index":2,"content_block":{"type":"text","text":""}}`,
		`content_block_stop {"index":2}`,
		`content_block_start {"index":3,"content_block":{"type":"tool_use","id":"t1","name":"a","input":{}}}`,
		`content_block_start {"index":4,"content_block":{"type":"tool_use","id":"t2","name":"b","input":{}}}`,
		`content_block_delta {"index":4,"delta":{"type":"input_json_delta","partial_json":"{\"y\":"}}`,
		`content_block_delta {"index":3,"delta":{"type":"input_json_delta","partial_json":"{\"x\":"}}`,
		`ping {"type":"ping"}`,
		`content_block_delta {"index":3,"delta":{"type":"input_json_delta","partial_json":"1}"}}`,
		`content_block_delta {"index":4,"delta":{"type":"input_json_delta","partial_json":"2}"}}`,
		`content_block_stop {"index":3}`,
		`content_block_stop {"index":4}`,
		`content_block_start {"index":5,"content_block":{"type":"tool_use","id":"t3","name":"c","input":{}}}`,
		`content_block_delta {"index":5,"delta":{"type":"input_json_delta","partial_json":""}}`,
		`content_block_stop {"index":5}`,
		`content_block_start {"index":6,"content_block":{"type":"tool_use","id":"t4","name":"d","input":{"z":3}}}`,
		`content_block_stop {"index":6}`,
		`some_later_event {"type":"some_later_event"}`,
		`message_delta {"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":9}}`,
		`message_stop {"type":"message_stop"}`,
	)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	want := `[{"signature":"sig","thinking":"hm","type":"thinking"},{"data":"opaque","type":"redacted_thinking"},` +
		`{"id":"t1","input":{"x":1},"name":"a","type":"tool_use"},{"id":"t2","input":{"y":2},"name":"b","type":"tool_use"},` +
		`{"id":"t3","input":{},"name":"c","type":"tool_use"},{"id":"t4","input":{"z":3},"name":"d","type":"tool_use"}]`
	if got := blocksJSON(m); got != want || m["role"] != "assistant" || finish != "tool_use" {
		t.Fatalf("content %s, finish %q\nwant %s, tool_use", got, finish, want)
	}
}

// Frames the API would not send are errors that name the fault; a stream
// without message_stop has no finish, so the turn reads as cut; an error
// event fails the turn with its type and message.
func TestMessagesParserFaults(t *testing.T) {
	_, finish, errs, _ := parseMessages(t,
		`content_block_start {"index":1,"content_block":{"type":"text","text":""}}`,
		`content_block_delta {"index":0,"delta":{"type":"text_delta","text":"x"}}`,
		`content_block_start {"index":0,"content_block":{"type":"text","text":""}}`,
		`content_block_delta {"index":0,"delta":{"type":"text_delta","text":"hello"}}`,
		`message_delta {"type":"message_delta","delta":{"stop_reason":"end_turn"}}`,
		`message_start {"type":"message_start"}`,
		`content_block_stop {"index":0}`,
		`content_block_stop {"index":0`,
	)
	if len(errs) != 4 || !errors.Is(errs[0], errBlockIndex) || !errors.Is(errs[1], errBlockIndex) || !strings.Contains(errs[2].Error(), "message_start") {
		t.Fatalf("errors %v: want two block-order errors, a message_start without its message, and a bad frame", errs)
	}
	if finish != "" {
		t.Fatalf("finish %q without message_stop: the turn must read as cut", finish)
	}
	p := messagesCodec{}.NewParser()
	pc, err := p.Take(sse.Event{Type: "error", Data: `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`})
	if err != nil || pc.Failed != "overloaded_error: Overloaded" {
		t.Fatalf("error event: %+v %v", pc, err)
	}
}

// parseResponses reads a Responses stream, one event's data per string,
// as the turn does, and returns the calls as made whole, the finish and
// the errors.
func parseResponses(t *testing.T, events ...string) (calls []Call, finish string, errs []error) {
	t.Helper()
	p := responsesCodec{}.NewParser()
	j := joined{calls: map[int]*Call{}}
	for _, data := range events {
		pc, err := p.Take(sse.Event{Data: data})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		j.add(pc.Calls)
		if pc.Finish != "" {
			finish = pc.Finish
		}
	}
	return j.done(), finish, errs
}

// An incomplete response (max_output_tokens) ends the turn with its
// reason, and a call cut short keeps the arguments it got, which are not
// whole (the turn does not run it); events the sidecar does not read (a
// built-in tool's) pass; an item added twice, or a delta of no function
// call, is a bad frame.
func TestResponsesParserIncompleteAndFaults(t *testing.T) {
	calls, finish, errs := parseResponses(t,
		`{"type":"response.output_item.added","output_index":0,"item":{"type":"web_search_call","id":"ws_1","status":"in_progress"}}`,
		`{"type":"response.web_search_call.searching","output_index":0,"item_id":"ws_1"}`,
		`{"type":"response.output_item.done","output_index":0,"item":{"type":"web_search_call","id":"ws_1","status":"completed"}}`,
		`{"type":"response.output_item.added","output_index":1,"item":{"type":"function_call","id":"fc_1","call_id":"call_1","name":"f","arguments":""}}`,
		`{"type":"response.function_call_arguments.delta","output_index":1,"delta":"{\"x\":"}`,
		`{"type":"response.output_item.added","output_index":1,"item":{"type":"message"}}`,
		`{"type":"response.function_call_arguments.delta","output_index":0,"delta":"1"}`,
		`{"type":"response.incomplete","response":{"output":[],"incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":3,"output_tokens":16,"total_tokens":19}}}`,
	)
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), "added twice") || !strings.Contains(errs[1].Error(), "no function call") {
		t.Fatalf("errors %v: want an item added twice and a delta of no function call", errs)
	}
	if finish != "max_output_tokens" || len(calls) != 1 || calls[0].Args != `{"x":` || calls[0].ID != "call_1" {
		t.Fatalf("finish %q, calls %+v: want max_output_tokens and call_1 cut short", finish, calls)
	}
}

// A Chat Completions chunk says its text, reasoning, call fragments (as
// they came), finish and usage; a choice other than the first is not
// read; an error member fails the turn, and [DONE] ends the stream.
func TestChatParser(t *testing.T) {
	c, ok := CodecOf("")
	if !ok || c.Kind() != "openai" {
		t.Fatalf("the default codec is %v, want Chat Completions", c)
	}
	p := c.NewParser()
	pc, err := p.Take(sse.Event{Data: `{"model":"m","created":7,"choices":[` +
		`{"index":0,"delta":{"reasoning_content":"hm","content":"hi","tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"},` +
		`{"index":1,"delta":{"content":"other"}}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`})
	if err != nil || pc.Text != "hi" || pc.Reasoning != "hm" || pc.Finish != "tool_calls" || pc.Model != "m" || pc.Created != 7 ||
		len(pc.Calls) != 1 || pc.Calls[0].ID != "a" || *pc.Calls[0].Function.Arguments != "{}" || pc.Usage == nil || pc.Usage.TotalTokens != 5 {
		t.Fatalf("chunk: %+v %v", pc, err)
	}
	if pc, err = p.Take(sse.Event{Data: `{"error":{"message":"overloaded"}}`}); err != nil || pc.Failed != "overloaded" {
		t.Fatalf("error chunk: %+v %v", pc, err)
	}
	if pc, err = p.Take(sse.Event{Data: "[DONE]"}); err != nil || !pc.Done {
		t.Fatalf("[DONE]: %+v %v", pc, err)
	}
	raw, err := p.Assistant("hi", []Call{{ID: "a", Name: "f", Args: "{}"}})
	if want := `{"role":"assistant","content":"hi","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]}`; err != nil || string(raw) != want {
		t.Fatalf("assistant %s (%v), want %s", raw, err, want)
	}
}
