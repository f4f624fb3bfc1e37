package modelapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"

	sse "github.com/tmaxmax/go-sse"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/tool"
)

// Codec is what differs between the model APIs the sidecar serves (Chat
// Completions, chat_codec.go; Anthropic Messages, messages_codec.go;
// OpenAI Responses, responses_codec.go) on the upstream side: the wire of
// the application's request, of a turn and its stream, and of the
// follow-up. Everything else (the run, its key and journal, the calls
// handed over as their arguments are whole, the retries, parking) is one
// code for every API, in openaiup, which maps each API onto one turn
// model (../shared/reference/responses-and-messages.md, Part C).
type Codec interface {
	// Kind names the API as upstream.kind does.
	Kind() string
	// API is the API's answers and error bodies, written back to the
	// application.
	API() API
	// TurnPath is where a turn is posted, under the API's base URL.
	TurnPath() string
	// Authorize puts the key on a turn's request.
	Authorize(h http.Header, key string)
	// CallerKey is the application's own key on its request, or "".
	CallerKey(r *http.Request) string
	// RunPrefix begins the ids of runs, which the answer carries as its
	// id.
	RunPrefix() string
	// Forwarded names the application's request headers that every turn
	// of its run carries upstream as they came.
	Forwarded() []string
	// ReadRequest reads the application's request: the conversation, the
	// stream flags, the application's tools, and the rest of the body,
	// with own, the sidecar's tools, added in the API's shape. A request
	// the API would refuse is a *[BadRequest].
	ReadRequest(body map[string]json.RawMessage, own []tool.FunctionTool) (*Request, error)
	// TurnBody is a turn's request: the application's fields (Request.Body),
	// the conversation, streamed.
	TurnBody(body map[string]json.RawMessage, conv []json.RawMessage) ([]byte, error)
	// EventBound is the longest event of a turn's stream that is read
	// whole, given frame, the bound of an event that carries one call:
	// frame, or a turn's bound where one event can carry a turn's every
	// call.
	EventBound(frame int) int
	// NewParser reads one attempt at a turn's stream.
	NewParser() Parser
	// CallsOf lists an assistant message's calls, in order.
	CallsOf(assistant json.RawMessage) ([]ToolCall, error)
	// FollowUp is a turn as the next one replays it: its assistant
	// message, unchanged, and the outputs given, in call order.
	FollowUp(assistant json.RawMessage, outputs []Output) ([]json.RawMessage, error)
	// SplitParked reads a parked turn's follow-up (Result.Parked) back
	// into its assistant message and its results, by call id.
	SplitParked(parked []json.RawMessage) (assistant json.RawMessage, results map[string]json.RawMessage)
	// Restore puts each parked turn back into an application's
	// conversation: find is the parked turn whose application calls are
	// appCalls, or nil.
	Restore(msgs []json.RawMessage, find func(appCalls []ToolCall) *ParkedTurn) []json.RawMessage
}

// CodecOf is the codec of the API that upstream.kind names: "openai" (or
// ""), "anthropic" or "responses".
func CodecOf(kind string) (Codec, bool) {
	switch kind {
	case "", kindOpenAI:
		return chatCodec{}, true
	case kindAnthropic:
		return messagesCodec{}, true
	case kindResponses:
		return responsesCodec{}, true
	}
	return nil, false
}

// The APIs, as upstream.kind names them.
const (
	kindOpenAI    = "openai"
	kindAnthropic = "anthropic"
	kindResponses = "responses"
)

// turnCalls sizes a turn's bound: an event that can carry every call of
// a turn is read whole up to turnCalls events' bounds (9.2 MiB at the
// defaults, 16 calls at executor.max_args_bytes).
const turnCalls = 16

// Request is what the sidecar reads of an application's request; the rest
// is passed upstream as it came.
type Request struct {
	// Body is the request's other fields, which every turn sends, with
	// the sidecar's tools added: all but the conversation and the stream
	// flags.
	Body map[string]json.RawMessage
	// Canonical is the request as asked, keys sorted, for the run's key:
	// how it is delivered (the stream flags) is left out.
	Canonical []byte
	// Messages is the conversation: messages, or input items.
	Messages []json.RawMessage
	// Stream: the application asked for its answer streamed (every turn
	// is streamed, whatever it asked).
	Stream bool
	// IncludeUsage is Chat Completions' stream_options.include_usage.
	IncludeUsage bool
	// Model is the model asked for, which the answer names until a turn
	// names its own.
	Model string
	// AppTools names the application's own tools: their calls are its.
	AppTools map[string]bool

	field string // the conversation's: messages, input
}

// BadRequest is a request the API would refuse: a 400 in its shape (or
// Status: 413 for a body over the server's bound, say).
type BadRequest struct {
	Message string
	// Param is the member at fault, as the API's error names it.
	Param  string
	Status int // default: 400
}

func (e *BadRequest) Error() string { return e.Message }

// readShared reads what a request has in every API: the conversation
// (under field), the model, whether it is streamed (which is then left
// out of the body: every turn is) and the application's tools.
func readShared(body map[string]json.RawMessage, field string) (*Request, []json.RawMessage, error) {
	req := &Request{Body: body, AppTools: map[string]bool{}, field: field}
	if err := json.Unmarshal(body[field], &req.Messages); err != nil || len(req.Messages) == 0 {
		return nil, nil, &BadRequest{Message: field + " must be a non-empty array", Param: field}
	}
	_ = json.Unmarshal(body["model"], &req.Model)
	if raw, ok := body["stream"]; ok {
		_ = json.Unmarshal(raw, &req.Stream)
	}
	delete(body, "stream")
	var tools []json.RawMessage
	if raw, ok := body["tools"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &tools); err != nil {
			return nil, nil, &BadRequest{Message: "tools must be an array", Param: "tools"}
		}
	}
	return req, tools, nil
}

// addTools adds the sidecar's tools (own, and ownRaw in the API's shape)
// to the application's (tools, named names) in the body sent upstream,
// refusing an application's tool named as one of the sidecar's: at is the
// place of tools[i] in the API's error messages, and name the place of
// its name under it. The conversation leaves the body: each turn sets it.
func (req *Request) addTools(tools []json.RawMessage, names []string, own []tool.FunctionTool, ownRaw []json.RawMessage, at, name string) error {
	for i, n := range names {
		if slices.ContainsFunc(own, func(t tool.FunctionTool) bool { return t.Function.Name == n }) {
			place := fmt.Sprintf(at, i)
			return &BadRequest{Message: fmt.Sprintf("%s: %s is a tool of the sidecar; rename the application's tool", place, tool.Excerpt(n)),
				Param: place + name}
		}
	}
	if tools = append(tools, ownRaw...); len(tools) > 0 {
		req.Body["tools"], _ = json.Marshal(tools)
	}
	delete(req.Body, req.field)
	return nil
}

// streamedTurn is a turn's body in every API: the application's fields,
// the conversation under field, stream on, and the API's extra fields.
func streamedTurn(body map[string]json.RawMessage, field string, conv []json.RawMessage, extra map[string]json.RawMessage) ([]byte, error) {
	out := make(map[string]json.RawMessage, len(body)+2+len(extra))
	maps.Copy(out, body)
	maps.Copy(out, extra)
	msgs, err := json.Marshal(conv)
	if err != nil {
		return nil, err
	}
	out[field] = msgs
	out["stream"] = json.RawMessage("true")
	return json.Marshal(out)
}

// Parser reads one attempt at a turn's stream, event after event.
type Parser interface {
	// Take reads one event. An error is a frame the API would not send:
	// it is reported and the stream read on.
	Take(ev sse.Event) (Piece, error)
	// Assistant is the turn's assistant message as the next turn replays
	// it: its text (what the attempt said), and calls (the turn's calls
	// made whole, ids given) in place of the fragments read.
	Assistant(text string, calls []Call) (json.RawMessage, error)
}

// Piece is what one event of a turn's stream says, in the turn model.
type Piece struct {
	Text      string
	Reasoning string      // shown, never replayed from here
	Calls     []CallDelta // fragments of calls, keyed by their index
	Finish    string      // the turn is whole, ending for this reason
	Usage     *Usage      // the turn's so far
	Model     string
	Created   int64
	Failed    string // the upstream's error event
	Done      bool   // no event follows that matters ([DONE])
}

// CallDelta is one fragment of a tool call, as Chat Completions streams
// it (ChatCompletionMessageToolCallChunk) and the other APIs' parsers
// give it: only index is required, and servers omit even that (Ollama
// before v0.4.7).
type CallDelta struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name string `json:"name"`
		// Arguments is absent on vLLM's first delta and null on some
		// of its streams (vllm #9693): nothing to add.
		Arguments *string `json:"arguments"`
	} `json:"function"`
	// Whole says that Arguments are the call's whole arguments, which
	// replace the fragments read (the Responses API's *.done events,
	// authoritative where a server dropped fragments: LiteLLM #20711).
	Whole bool `json:"-"`
}

// fragment is a call fragment keyed by index.
func fragment(index int, id, name string, args *string) CallDelta {
	d := CallDelta{Index: &index, ID: id}
	d.Function.Name, d.Function.Arguments = name, args
	return d
}

// Call is one call of a turn, whole.
type Call struct {
	ID, Name string
	// Args is the arguments as the model wrote them ("" made "{}"): the
	// assistant message is replayed with them unchanged.
	Args string
	// Problem says why Args cannot be used, if they cannot.
	Problem string
}

// ToolCall is c as a Chat Completions assistant message carries it.
func (c Call) ToolCall() ToolCall {
	var tc ToolCall
	tc.ID, tc.Type, tc.Function.Name, tc.Function.Arguments = c.ID, "function", c.Name, c.Args
	return tc
}

// Output is one call's output, as the follow-up gives it to the model.
type Output struct {
	ID      string // the id the model gave the call
	Content string
}

// failed reports an output that says why the call failed: the follow-up
// flags it where the API can (Messages' is_error).
func (o Output) failed() bool { return executor.FailedOutput(o.Content) }

// errorMessage is the message of an error event's "error" value.
func errorMessage(raw json.RawMessage) string {
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		return e.Message
	}
	return string(raw)
}

// ParkedTurn is a turn that called the application's tools as well as the
// sidecar's, kept for the application's next request: it got only its own
// calls, and [Codec.Restore] puts the turn back as the model made it.
type ParkedTurn struct {
	Assistant json.RawMessage            `json:"assistant"` // with every call of the turn
	Order     []string                   `json:"order"`     // the turn's call ids, in order
	Tools     map[string]json.RawMessage `json:"tools"`     // the sidecar's results (tool messages, tool_result blocks), by call id
	AppCalls  []string                   `json:"app_calls"` // the ids of the application's calls
}

// merge joins the application's answers to its calls (idOf reads the
// call each answers) with the sidecar's, in the turn's call order. An
// answer to no call of the turn, or a second one, follows them: the API
// judges it.
func (pt *ParkedTurn) merge(app []json.RawMessage, idOf func(json.RawMessage) string) []json.RawMessage {
	answers := maps.Clone(pt.Tools)
	var extra []json.RawMessage
	for _, raw := range app {
		id := idOf(raw)
		if _, known := answers[id]; known || !slices.Contains(pt.Order, id) {
			extra = append(extra, raw)
			continue
		}
		answers[id] = raw
	}
	var out []json.RawMessage
	for _, id := range pt.Order {
		if raw, ok := answers[id]; ok {
			out = append(out, raw)
		}
	}
	return append(out, extra...)
}
