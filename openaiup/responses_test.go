package openaiup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/responsesim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// responsesStack is a sidecar with upstream.kind responses on real
// parts: the Responses simulator on a loopback server, the embedded NATS
// and a Go worker; the application is openai-go's Responses client.
type responsesStack struct {
	sim    *responsesim.Sim
	env    *testenv.Env
	client openai.Client
}

func startResponses(t testing.TB, simCfg responsesim.Config, opts testenv.Options, tools ...testenv.Tool) *responsesStack {
	t.Helper()
	sim := responsesim.New(simCfg)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	s := startResponsesOn(t, srv.URL+"/v1", opts, tools...)
	s.sim = sim
	return s
}

// startResponsesOn is startResponses against the upstream at baseURL.
func startResponsesOn(t testing.TB, baseURL string, opts testenv.Options, tools ...testenv.Tool) *responsesStack {
	t.Helper()
	env, hc := startSidecar(t, config.UpstreamResponses, baseURL, opts, tools...)
	client := openai.NewClient(option.WithBaseURL(env.URL+"/v1"), option.WithAPIKey("app-key"), option.WithMaxRetries(0), option.WithHTTPClient(hc))
	return &responsesStack{env: env, client: client}
}

func (s *responsesStack) assertContract(t *testing.T) {
	t.Helper()
	assertClean(t, s.sim.Violations())
}

// accumulate streams a request through openai-go's Responses
// accumulator, which refuses an event out of its place (an item's delta
// before the item, an event after the terminal one).
func (s *responsesStack) accumulate(t testing.TB, p responses.ResponseNewParams, opts ...option.RequestOption) (*responses.Response, error) {
	t.Helper()
	st := s.client.Responses.NewStreaming(context.Background(), p, opts...)
	defer func() { _ = st.Close() }() // on every way out, as an application does
	var acc responses.ResponseAccumulator
	seq := int64(-1)
	for st.Next() {
		cur := st.Current()
		if cur.SequenceNumber != seq+1 {
			t.Fatalf("event %s has sequence_number %d after %d", cur.Type, cur.SequenceNumber, seq)
		}
		seq = cur.SequenceNumber
		var ev responses.ResponsesServerEventUnion
		if err := json.Unmarshal([]byte(cur.RawJSON()), &ev); err != nil {
			t.Fatal(err)
		}
		if err := acc.AddEvent(ev); err != nil {
			t.Fatalf("openai-go's accumulator refused %s: %v", cur.Type, err)
		}
	}
	if err := st.Err(); err != nil {
		return nil, err
	}
	return acc.ReconstructedResponse()
}

// responsesParams is a request whose input is one user message, with
// reasoning asked for when reasons.
func responsesParams(user string, reasons bool) responses.ResponseNewParams {
	p := responses.ResponseNewParams{Model: "sim-model", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(user)}}
	if reasons {
		p.Reasoning = shared.ReasoningParam{Effort: shared.ReasoningEffortLow}
	}
	return p
}

// A parallel batch through the Responses API, with and without
// reasoning, streamed and whole, and through the compatible servers' ways
// (argument deltas dropped, the whole arguments only in .done, as
// LiteLLM's bridge did; function_call items without an item id, as
// llama.cpp's server did): the batch runs once, every call is answered in
// call order (the reasoning item replayed with its encrypted content),
// the answer is one response openai-go accumulates, and the upstream's
// contract log is empty.
func TestResponsesParallelBatch(t *testing.T) {
	for _, tc := range []struct {
		name              string
		cfg               responsesim.Config
		reasons, streamed bool
	}{
		{"streamed", responsesim.Config{}, false, true},
		{"whole", responsesim.Config{}, false, false},
		{"reasoning, streamed", responsesim.Config{}, true, true},
		{"reasoning, whole", responsesim.Config{}, true, false},
		{"argument deltas dropped (LiteLLM)", responsesim.Config{DroppedDeltas: true}, true, true},
		{"no item ids (llama.cpp)", responsesim.Config{NoItemIDs: true}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int64
			s := startResponses(t, tc.cfg, testenv.Options{}, echoTool("echo", 20*time.Millisecond, &runs))
			p := responsesParams(script(echoCalls(4), ""), tc.reasons)
			var got *responses.Response
			var err error
			if tc.streamed {
				got, err = s.accumulate(t, p)
			} else {
				got, err = s.client.Responses.New(context.Background(), p)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.OutputText() != wantEchoes(4) || got.Status != responses.ResponseStatusCompleted || !strings.HasPrefix(got.ID, "resp_") {
				t.Fatalf("answer %q (%s, id %s), want %q, completed", got.OutputText(), got.Status, got.ID, wantEchoes(4))
			}
			if runs.Load() != 4 || s.sim.Requests() != 2 {
				t.Fatalf("the tool ran %d times in %d turns, want 4 in 2", runs.Load(), s.sim.Requests())
			}
			if got.Usage.InputTokens == 0 || got.Usage.OutputTokens == 0 || got.Usage.TotalTokens != got.Usage.InputTokens+got.Usage.OutputTokens {
				t.Errorf("usage %+v: want the turns' counts summed", got.Usage)
			}
			// The simulator counts 10 input tokens an item and caches all but
			// the last item of each turn's input: two turns, 20 uncached.
			if cached := got.Usage.InputTokensDetails.CachedTokens; cached != got.Usage.InputTokens-20 {
				t.Errorf("cached tokens %d of %d input: want the turns' cached counts summed", cached, got.Usage.InputTokens)
			}
			// It reasons for 3 tokens a turn when asked to.
			if r, want := got.Usage.OutputTokensDetails.ReasoningTokens, map[bool]int64{true: 2 * 3}[tc.reasons]; r != want {
				t.Errorf("reasoning tokens %d: want %d, the two turns' summed", r, want)
			}
			s.assertContract(t)
		})
	}
}

// rawItem is an item as its JSON, for a request's input.
func rawItem(s string) responses.ResponseInputItemUnionParam {
	return param.Override[responses.ResponseInputItemUnionParam](json.RawMessage(s))
}

// Mixed ownership (§3.3): a turn calls a function the application
// declared between two of the sidecar's. The application gets a completed
// response with only its call; its follow-up replays that output with
// its function_call_output; the upstream gets the turn as the model made
// it (reasoning and every call) with every output in call order.
func TestResponsesMixedOwnership(t *testing.T) {
	var runs atomic.Int64
	s := startResponses(t, responsesim.Config{}, testenv.Options{}, echoTool("echo", 0, &runs))
	round := [][]map[string]any{{
		{"name": "echo", "arguments": map[string]any{"i": 0}},
		{"name": "app_lookup", "arguments": map[string]any{"q": "x"}},
		{"name": "echo", "arguments": map[string]any{"i": 2}},
	}}
	user := script(round, "")
	p := responsesParams(user, true)
	p.Tools = []responses.ToolUnionParam{{OfFunction: &responses.FunctionToolParam{Name: "app_lookup", Parameters: map[string]any{"type": "object"}}}}
	first, err := s.accumulate(t, p)
	if err != nil {
		t.Fatal(err)
	}
	var calls []responses.ResponseOutputItemUnion
	for _, it := range first.Output {
		if it.Type == "function_call" {
			calls = append(calls, it)
		}
	}
	if first.Status != responses.ResponseStatusCompleted || len(calls) != 1 || calls[0].Name != "app_lookup" || calls[0].Arguments.OfString != `{"q":"x"}` {
		t.Fatalf("first answer %s with calls %+v: want completed with app_lookup alone", first.Status, calls)
	}
	if runs.Load() != 2 {
		t.Fatalf("the sidecar's tool ran %d times, want 2", runs.Load())
	}
	in := responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage(user, responses.EasyInputMessageRoleUser)}
	for _, it := range first.Output {
		in = append(in, rawItem(it.RawJSON()))
	}
	in = append(in, rawItem(`{"type":"function_call_output","call_id":"`+calls[0].CallID+`","output":"looked up"}`))
	p.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: in}
	got, err := s.client.Responses.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	want := `results: {"echo": {"i":0}} | looked up | {"echo": {"i":2}}`
	if got.OutputText() != want || runs.Load() != 2 {
		t.Fatalf("answer %q after %d runs, want %q after 2", got.OutputText(), runs.Load(), want)
	}
	s.assertContract(t)
}

// Requests the sidecar refuses are OpenAI's errors: previous_response_id
// (the sidecar replays statelessly), an application function named as one
// of the sidecar's, an input that is neither a string nor items.
func TestResponsesRefusals(t *testing.T) {
	s := startResponses(t, responsesim.Config{}, testenv.Options{})
	p := responsesParams("hi", false)
	p.PreviousResponseID = openai.String("resp_earlier")
	_, err := s.client.Responses.New(context.Background(), p)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "previous_response_id" {
		t.Fatalf("previous_response_id: %v, want a 400 naming it", err)
	}
	p = responsesParams("hi", false)
	p.Tools = []responses.ToolUnionParam{{OfFunction: &responses.FunctionToolParam{Name: "echo", Parameters: map[string]any{"type": "object"}}}}
	if _, err = s.client.Responses.New(context.Background(), p); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest ||
		!strings.Contains(apiErr.Message, `"echo" is a tool of the sidecar`) {
		t.Fatalf("collision: %v, want a 400 naming the tool", err)
	}
	resp, err := http.Post(s.env.URL+"/v1/responses", "application/json", strings.NewReader(`{"model":"m","input":7}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a number as input: %d, want 400", resp.StatusCode)
	}
	if n := s.sim.Requests(); n != 0 {
		t.Errorf("%d requests reached the upstream", n)
	}
}

// The upstream's faults: a 429 with Retry-After and a cut stream are
// retried within the budget and the run ends whole, each call run once;
// an error event ends the run with a nested error event, which openai-go
// raises.
func TestResponsesFaults(t *testing.T) {
	t.Run("429 and a cut, retried", func(t *testing.T) {
		var runs atomic.Int64
		s := startResponses(t, responsesim.Config{}, testenv.Options{}, echoTool("echo", 0, &runs))
		s.sim.Inject(responsesim.Fault{Status: 429, RetryAfter: "1"}, responsesim.Fault{CutAfter: 7})
		got, err := s.accumulate(t, responsesParams(script(echoCalls(3), ""), true))
		if err != nil {
			t.Fatal(err)
		}
		if got.OutputText() != wantEchoes(3) || runs.Load() != 3 {
			t.Fatalf("answer %q after %d runs, want %q after 3", got.OutputText(), runs.Load(), wantEchoes(3))
		}
		s.assertContract(t)
	})
	t.Run("an error event", func(t *testing.T) {
		s := startResponses(t, responsesim.Config{}, testenv.Options{})
		s.sim.Inject(responsesim.Fault{ErrorAfter: 3, ErrorMessage: "The server had an error"})
		_, err := s.accumulate(t, responsesParams(script(echoCalls(2), ""), false))
		if err == nil || !strings.Contains(err.Error(), "The server had an error") {
			t.Fatalf("%v, want the stream to end with the upstream's error", err)
		}
	})
}

// The official Node client (openai's responses.stream) takes the
// sidecar's stream, with reasoning, plain and when the answer ends on the
// application's own call: finalResponse() throws on an unknown event
// type, a gap in the output indexes, or a delta before its item.
func TestResponsesNodeClientAccumulates(t *testing.T) {
	s := startResponses(t, responsesim.Config{}, testenv.Options{})
	run := nodeClient(t, "check-responses.mjs", "openai", s.env.URL+"/v1")
	got := run(script(echoCalls(3), "ok. "), "[]")
	if got["text"] != "ok. "+wantEchoes(3) || got["status"] != "completed" || got["usage"] == nil {
		t.Fatalf("the Node client accumulated %v", got)
	}
	rounds := [][]map[string]any{{{"name": "echo", "arguments": map[string]any{"i": 0}}, {"name": "lookup", "arguments": map[string]any{"q": "x"}}}}
	got = run(script(rounds, ""), `[{"type":"function","name":"lookup","parameters":{"type":"object"},"strict":false}]`)
	calls, _ := got["calls"].([]any)
	if got["status"] != "completed" || len(calls) != 1 || !strings.Contains(fmt.Sprint(calls[0]), "lookup") {
		t.Fatalf("the Node client accumulated %v, want the application's one call", got)
	}
	s.assertContract(t)
}
