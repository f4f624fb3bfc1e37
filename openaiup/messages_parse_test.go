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
