package openaiup

import (
	"encoding/json"
	"net/http"

	sse "github.com/tmaxmax/go-sse"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/modelapi"
	"github.com/projectdavid/toolsidecar/tool"
)

// api is what differs between the model APIs the sidecar serves (Chat
// Completions, chat.go; Anthropic Messages, messages.go; OpenAI
// Responses, responses.go): the wire of the
// application's request, of a turn and its stream, of the follow-up, and
// of the answer. Everything else (the run, its key and journal, the
// calls handed over as their arguments are whole, the retries, parking)
// is one code for every API, and maps each onto one turn model
// (../shared/reference/responses-and-messages.md, Part C).
type api interface {
	// kind names the API as upstream.kind does.
	kind() string
	// turnPath is where a turn is posted, under Config.URL.
	turnPath() string
	// authorize puts the key on a turn's request.
	authorize(h http.Header, key string)
	// callerKey is the application's own key on its request, or "".
	callerKey(r *http.Request) string
	// runPrefix begins the ids of runs, which the answer carries as its id.
	runPrefix() string
	// forwarded names the application's request headers that every turn
	// of its run carries upstream as they came (checked by forwardedOf).
	forwarded() []string
	// readRequest reads the application's request: the conversation, the
	// stream flags, the application's tools, and the rest of the body,
	// with the sidecar's tools added in the API's shape.
	readRequest(body map[string]json.RawMessage, own []tool.FunctionTool) (*request, error)
	// turnBody is a turn's request: the application's fields, the
	// conversation, streamed.
	turnBody(body map[string]json.RawMessage, conv []json.RawMessage) ([]byte, error)
	// eventBound is the longest event of a turn's stream that is read
	// whole, given frame, the bound of an event that carries one call
	// (Config.MaxResponseBytes): frame, or a turn's bound where one event
	// can carry a turn's every call.
	eventBound(frame int) int
	// newParser reads one attempt at a turn's stream.
	newParser() parser
	// callsOf lists an assistant message's calls, in order.
	callsOf(assistant json.RawMessage) ([]modelapi.ToolCall, error)
	// followUp is a turn as the next one replays it: its assistant
	// message, unchanged, and the results given, in call order.
	followUp(assistant json.RawMessage, results []result) ([]json.RawMessage, error)
	// splitParked reads a parked turn's follow-up (Result.Parked) back
	// into its assistant message and its results, by call id.
	splitParked(parked []json.RawMessage) (assistant json.RawMessage, results map[string]json.RawMessage)
	// restore puts each parked turn back into an application's
	// conversation (parking.restore).
	restore(msgs []json.RawMessage, find func(appCalls []modelapi.ToolCall) *parkedTurn) []json.RawMessage
	// wire is the API's answers and error bodies.
	wire() modelapi.API
}

// turnCalls sizes a turn's bound: an event that can carry every call of
// a turn is read whole up to turnCalls events' bounds (9.2 MiB at the
// defaults, 16 calls at executor.max_args_bytes).
const turnCalls = 16

// parser reads one attempt at a turn's stream, event after event.
type parser interface {
	// take reads one event. An error is a frame the API would not send:
	// it is reported and the stream read on.
	take(ev sse.Event) (piece, error)
	// assistant is the turn's assistant message as the next turn replays
	// it: its text (what the attempt said), and calls (the turn's calls
	// made whole, ids given) in place of the fragments read.
	assistant(text string, calls []assembled) (json.RawMessage, error)
}

// piece is what one event of a turn's stream says, in the turn model.
type piece struct {
	text      string
	reasoning string          // shown, never replayed from here
	calls     []toolCallDelta // fragments of calls, keyed by their index
	finish    string          // the turn is whole, ending for this reason
	usage     *modelapi.Usage
	model     string
	created   int64
	failed    string // the upstream's error event
	done      bool   // no event follows that matters ([DONE])
}

// result is one call's output, as the follow-up gives it to the model.
type result struct {
	ID      string // the id the model gave the call
	Content string
}

// failed reports an output that says why the call failed: the follow-up
// flags it where the API can (Messages' is_error).
func (r result) failed() bool { return executor.FailedOutput(r.Content) }

// apiOf is the API of upstream.kind.
func apiOf(kind string) (api, bool) {
	switch kind {
	case "", kindOpenAI:
		return chatAPI{}, true
	case kindAnthropic:
		return messagesAPI{}, true
	case kindResponses:
		return responsesAPI{}, true
	}
	return nil, false
}

// The APIs, as upstream.kind names them.
const (
	kindOpenAI    = "openai"
	kindAnthropic = "anthropic"
	kindResponses = "responses"
)
