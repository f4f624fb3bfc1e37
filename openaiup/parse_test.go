package openaiup

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	sse "github.com/tmaxmax/go-sse"
)

// parseMessages reads a Messages stream written as "name data" lines,
// one event each, as the turn does: the pieces' text and fragments, the
// finish, the errors, and the assistant message the turn would replay.
func parseMessages(t *testing.T, events ...string) (text, finish string, errs []error, assistant map[string]any) {
	t.Helper()
	p := messagesAPI{}.newParser()
	a := assembler{}
	var b strings.Builder
	for _, e := range events {
		name, data, _ := strings.Cut(e, " ")
		pc, err := p.take(sse.Event{Type: name, Data: data})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		b.WriteString(pc.text)
		a.add(pc.calls)
		if pc.finish != "" {
			finish = pc.finish
		}
	}
	raw, err := p.assistant(b.String(), a.done())
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
	p := messagesAPI{}.newParser()
	pc, err := p.take(sse.Event{Type: "error", Data: `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`})
	if err != nil || pc.failed != "overloaded_error: Overloaded" {
		t.Fatalf("error event: %+v %v", pc, err)
	}
}

// parseResponses reads a Responses stream, one event's data per string,
// as the turn does, and returns the calls as made whole, the finish and
// the errors.
func parseResponses(t *testing.T, events ...string) (calls []assembled, finish string, errs []error, p parser) {
	t.Helper()
	p = responsesAPI{}.newParser()
	a := assembler{}
	for _, data := range events {
		pc, err := p.take(sse.Event{Data: data})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		a.add(pc.calls)
		if pc.finish != "" {
			finish = pc.finish
		}
	}
	return a.done(), finish, errs, p
}

// An incomplete response (max_output_tokens) ends the turn with its
// reason, and a call cut short has arguments that are not whole, so it
// is not run; events the sidecar does not read (a built-in tool's) pass;
// an item added twice, or a delta of no function call, is a bad frame.
func TestResponsesParserIncompleteAndFaults(t *testing.T) {
	calls, finish, errs, _ := parseResponses(t,
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
	if finish != "max_output_tokens" || len(calls) != 1 || calls[0].Problem == "" || calls[0].ID != "call_1" {
		t.Fatalf("finish %q, calls %+v: want max_output_tokens and call_1 not runnable", finish, calls)
	}
}
