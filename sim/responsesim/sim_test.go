package responsesim_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/projectdavid/toolsidecar/sim/responsesim"
)

// script is a user message that the scripted model follows: a turn of two
// calls, one without arguments, then the answer.
const script = `{"rounds": [[{"name": "look", "arguments": {"q": "é✓"}}, {"name": "ping"}]], "answer": "done. "}`

func start(t *testing.T) (*responsesim.Sim, openai.Client) {
	t.Helper()
	sim := responsesim.New(responsesim.Config{})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	return sim, openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
}

// stream sends a streamed request and rebuilds its response with
// openai-go's accumulator, which checks each event's place.
func stream(t *testing.T, c openai.Client, p responses.ResponseNewParams) (*responses.Response, error) {
	t.Helper()
	s := c.Responses.NewStreaming(context.Background(), p)
	var acc responses.ResponseAccumulator
	for s.Next() {
		var ev responses.ResponsesServerEventUnion
		if err := json.Unmarshal([]byte(s.Current().RawJSON()), &ev); err != nil {
			t.Fatal(err)
		}
		if err := acc.AddEvent(ev); err != nil {
			t.Fatalf("openai-go's accumulator refused %s: %v", s.Current().Type, err)
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	return acc.ReconstructedResponse()
}

// raw is an item as its JSON, for a request's input.
func raw(s string) responses.ResponseInputItemUnionParam {
	return param.Override[responses.ResponseInputItemUnionParam](json.RawMessage(s))
}

// outputs answers every function_call of r, in order: "<name> ok".
func outputs(r *responses.Response) []responses.ResponseInputItemUnionParam {
	var out []responses.ResponseInputItemUnionParam
	for _, it := range r.Output {
		if it.Type == "function_call" {
			out = append(out, raw(`{"type":"function_call_output","call_id":"`+it.CallID+`","output":"`+it.Name+` ok"}`))
		}
	}
	return out
}

// replay is the stateless follow-up of r: the user's message, every
// output item of r as it came, then the outputs.
func replay(r *responses.Response) responses.ResponseNewParams {
	in := responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage(script, responses.EasyInputMessageRoleUser)}
	for _, it := range r.Output {
		in = append(in, raw(it.RawJSON()))
	}
	return stateless(append(in, outputs(r)...))
}

func stateless(in responses.ResponseInputParam) responses.ResponseNewParams {
	return responses.ResponseNewParams{Model: "sim-model", Input: responses.ResponseNewParamsInputUnion{OfInputItemList: in},
		Store: openai.Bool(false), Include: []responses.ResponseIncludable{"reasoning.encrypted_content"},
		Reasoning: shared.ReasoningParam{Effort: shared.ReasoningEffortLow}}
}

// TestStatelessReplay: a tool turn streamed with reasoning and store
// false, rebuilt by openai-go's accumulator (a reasoning item with its
// encrypted content, then the calls as written), replayed whole with the
// outputs: the answer, and an empty contract log.
func TestStatelessReplay(t *testing.T) {
	sim, c := start(t)
	first := stateless(responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage(script, responses.EasyInputMessageRoleUser)})
	turn, err := stream(t, c, first)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, it := range turn.Output {
		kinds = append(kinds, it.Type)
	}
	if strings.Join(kinds, " ") != "reasoning function_call function_call" || turn.Output[0].EncryptedContent == "" {
		t.Fatalf("output %v (encrypted %q)", kinds, turn.Output[0].EncryptedContent)
	}
	if a, b := turn.Output[1], turn.Output[2]; a.Arguments.OfString != `{"q": "é✓"}` || b.Arguments.OfString != `{}` || a.CallID == "" || !strings.HasPrefix(a.ID, "fc") {
		t.Errorf("calls %+v and %+v", a, b)
	}
	answer, err := stream(t, c, replay(turn))
	if err != nil {
		t.Fatal(err)
	}
	if got := answer.OutputText(); got != "done. results: look ok | ping ok" {
		t.Errorf("answer %q", got)
	}
	if v := sim.Violations(); len(v) > 0 || sim.Requests() != 2 || sim.Repeats() != 0 {
		t.Errorf("violations %+v, %d requests, %d repeats", v, sim.Requests(), sim.Repeats())
	}
}

// TestChained: a stored tool turn, answered with previous_response_id and
// only the outputs; not streamed.
func TestChained(t *testing.T) {
	sim, c := start(t)
	turn, err := c.Responses.New(context.Background(), responses.ResponseNewParams{Model: "sim-model",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(script)}})
	if err != nil {
		t.Fatal(err)
	}
	answer, err := c.Responses.New(context.Background(), responses.ResponseNewParams{Model: "sim-model", PreviousResponseID: openai.String(turn.ID),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: outputs(turn)}})
	if err != nil {
		t.Fatal(err)
	}
	if got := answer.OutputText(); got != "done. results: look ok | ping ok" {
		t.Errorf("answer %q", got)
	}
	if v := sim.Violations(); len(v) > 0 {
		t.Errorf("violations %+v", v)
	}
}

// TestContractRefusals: follow-ups the API refuses, each a 400
// invalid_request_error with the API's message, and a violation logged.
func TestContractRefusals(t *testing.T) {
	for _, c2 := range []struct {
		name, code, msg string
		followUp        func(turn *responses.Response) responses.ResponseNewParams
	}{
		{"an output missing", "missing_output", "No tool output found for function call", func(turn *responses.Response) responses.ResponseNewParams {
			p := replay(turn)
			p.Input.OfInputItemList = p.Input.OfInputItemList[:len(p.Input.OfInputItemList)-1]
			return p
		}},
		{"an unknown call", "unknown_call", "No tool call found for function call output with call_id call_other", func(turn *responses.Response) responses.ResponseNewParams {
			p := replay(turn)
			p.Input.OfInputItemList = append(p.Input.OfInputItemList, raw(`{"type":"function_call_output","call_id":"call_other","output":"x"}`))
			return p
		}},
		{"reasoning dropped", "replay_changed", "the model said 3 items, replayed as 2", func(turn *responses.Response) responses.ResponseNewParams {
			p := replay(turn)
			p.Input.OfInputItemList = append(p.Input.OfInputItemList[:1:1], p.Input.OfInputItemList[2:]...)
			return p
		}},
		{"reasoning without its item", "reasoning_alone", "of type 'reasoning' was provided without its required following item", func(turn *responses.Response) responses.ResponseNewParams {
			return stateless(responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage(script, responses.EasyInputMessageRoleUser), raw(turn.Output[0].RawJSON())})
		}},
		{"a call id as the item id", "bad_item_id", "Expected an ID that begins with 'fc'", func(turn *responses.Response) responses.ResponseNewParams {
			p := replay(turn)
			fc := turn.Output[1]
			p.Input.OfInputItemList[2] = raw(`{"type":"function_call","id":"` + fc.CallID + `","call_id":"` + fc.CallID + `","name":"look","arguments":"{}"}`)
			return p
		}},
	} {
		sim, c := start(t)
		first := stateless(responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage(script, responses.EasyInputMessageRoleUser)})
		turn, err := stream(t, c, first)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Responses.New(context.Background(), c2.followUp(turn))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.Message, c2.msg) || apiErr.Type != "invalid_request_error" {
			t.Errorf("%s: %v, want a 400 saying %q", c2.name, err, c2.msg)
		}
		if v := sim.Violations(); len(v) == 0 || v[0].Code != c2.code {
			t.Errorf("%s: violations %+v, want %s first", c2.name, v, c2.code)
		}
	}
	// Chained, with the call items the stored response holds sent again.
	sim, c := start(t)
	turn, err := c.Responses.New(context.Background(), responses.ResponseNewParams{Model: "sim-model",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(script)}})
	if err != nil {
		t.Fatal(err)
	}
	again := responses.ResponseInputParam{raw(turn.Output[0].RawJSON())}
	var apiErr *openai.Error
	_, err = c.Responses.New(context.Background(), responses.ResponseNewParams{Model: "sim-model", PreviousResponseID: openai.String(turn.ID),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: append(again, outputs(turn)...)}})
	if !errors.As(err, &apiErr) || !strings.Contains(apiErr.Message, "Duplicate item found with id "+turn.Output[0].ID) {
		t.Errorf("a chained request with a call resent: %v", err)
	}
	if v := sim.Violations(); len(v) == 0 || v[0].Code != "duplicate_item" {
		t.Errorf("violations %+v", v)
	}
}

// TestFaults: a 429 with Retry-After; an error event (nested under
// "error", which openai-go raises); a cut stream; a stream that ends
// without its terminal event (the accumulator has no response).
func TestFaults(t *testing.T) {
	sim, c := start(t)
	sim.Inject(responsesim.Fault{Status: 429, RetryAfter: "1"}, responsesim.Fault{ErrorAfter: 3, ErrorMessage: "boom"},
		responsesim.Fault{CutAfter: 4}, responsesim.Fault{EndAfter: 4})
	p := stateless(responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage(script, responses.EasyInputMessageRoleUser)})
	_, err := c.Responses.New(context.Background(), p)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Response.Header.Get("Retry-After") != "1" {
		t.Errorf("429: %v", err)
	}
	if _, err := stream(t, c, p); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("error event: %v", err)
	}
	if _, err := stream(t, c, p); err == nil {
		t.Error("a cut stream read as whole")
	}
	if _, err := stream(t, c, p); err == nil || !strings.Contains(err.Error(), "no terminal response") {
		t.Errorf("a stream without its terminal event: %v", err)
	}
	if r, err := stream(t, c, p); err != nil || len(r.Output) != 3 || sim.Requests() != 5 || sim.Repeats() != 0 {
		t.Errorf("after the faults: %v, %d requests, %d repeats", err, sim.Requests(), sim.Repeats())
	}
}
