package openaiup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/sim/openaisim"
	"github.com/projectdavid/toolsidecar/testkit/matrix"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

func TestMain(m *testing.M) {
	matrix.Main()        // a tool of route exec or mcp, which a sidecar started
	testenv.MaybeServe() // a benchmark's upstream in a process of its own
	maybeApplication()   // a benchmark's application in a process of its own
	goleak.VerifyTestMain(m)
}

// stack is a sidecar with upstream.kind openai, on real parts: the
// OpenAI-compatible simulator on a loopback server, the embedded NATS and
// a Go worker; the application is the official openai-go client.
type stack struct {
	sim    *openaisim.Sim
	env    *testenv.Env
	client openai.Client
}

// echoTool answers {"echo": <args>} after delay.
func echoTool(name string, delay time.Duration, runs *atomic.Int64) testenv.Tool {
	return testenv.Tool{Config: config.Tool{Name: name, Description: "echoes its arguments"},
		Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
			if runs != nil {
				runs.Add(1)
			}
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return testenv.Echo(ctx, c)
		}}
}

func start(t testing.TB, simCfg openaisim.Config, opts testenv.Options, tools ...testenv.Tool) *stack {
	t.Helper()
	sim := openaisim.New(simCfg)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	return startOn(t, sim, srv.URL+"/v1", opts, tools...)
}

// startOn is start against the upstream at baseURL; sim, when the
// simulator runs in this process, is it.
func startOn(t testing.TB, sim *openaisim.Sim, baseURL string, opts testenv.Options, tools ...testenv.Tool) *stack {
	t.Helper()
	env, hc := startSidecar(t, config.UpstreamOpenAI, baseURL, opts, tools...)
	ropts := []option.RequestOption{option.WithBaseURL(env.URL + "/v1"), option.WithAPIKey("app-key"), option.WithMaxRetries(0), option.WithHTTPClient(hc)}
	if opts.Token != "" {
		ropts[1] = option.WithAPIKey(opts.Token)
	}
	return &stack{sim: sim, env: env, client: openai.NewClient(ropts...)}
}

// startSidecar starts a sidecar with upstream.kind at baseURL, its tools
// (an echo tool by default) served by a Go worker and live, and returns
// it with an HTTP client for the application.
func startSidecar(t testing.TB, kind, baseURL string, opts testenv.Options, tools ...testenv.Tool) (*testenv.Env, *http.Client) {
	t.Helper()
	edit := opts.Config
	opts.Config = func(c *config.Config) {
		c.Upstream.Kind, c.Upstream.URL, c.Upstream.RetryBudget = kind, baseURL, 10*time.Second
		if edit != nil {
			edit(c)
		}
	}
	if len(tools) == 0 {
		tools = []testenv.Tool{echoTool("echo", 0, nil)}
	}
	env := testenv.Start(t, coresim.Scenario{}, opts, tools...)
	var names []string // the tools a worker serves, which it declares live
	for _, tl := range tools {
		if tl.Handler != nil {
			names = append(names, tl.Config.Name)
		}
	}
	if len(names) > 0 {
		testenv.WaitLive(t, env.URL, names...)
	}
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	t.Cleanup(hc.CloseIdleConnections)
	return env, hc
}

// script is a user message that the simulator's scripted model follows.
func script(rounds [][]map[string]any, answer string) string {
	b, _ := json.Marshal(map[string]any{"rounds": rounds, "answer": answer})
	return string(b)
}

func echoCalls(n int) [][]map[string]any {
	var round []map[string]any
	for i := range n {
		round = append(round, map[string]any{"name": "echo", "arguments": map[string]any{"i": i, "text": fmt.Sprintf("é%d✓", i)}})
	}
	return [][]map[string]any{round}
}

// wantEchoes is the final answer after echoCalls(n): each call's output
// in call order.
func wantEchoes(n int) string {
	var parts []string
	for i := range n {
		parts = append(parts, fmt.Sprintf(`{"echo": {"i":%d,"text":"é%d✓"}}`, i, i))
	}
	return "results: " + strings.Join(parts, " | ")
}

// streamChat runs a streamed request through openai-go's accumulator,
// which refuses a chunk with another id and checks the stream's shape.
func (s *stack) streamChat(t testing.TB, params openai.ChatCompletionNewParams, opts ...option.RequestOption) (openai.ChatCompletion, error) {
	t.Helper()
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := s.client.Chat.Completions.NewStreaming(context.Background(), params, opts...)
	defer func() { _ = stream.Close() }() // on every way out, as an application does
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		chunks++
		if !acc.AddChunk(stream.Current()) {
			t.Fatalf("chunk %d refused by openai-go's accumulator: %s", chunks, stream.Current().RawJSON())
		}
	}
	return acc.ChatCompletion, stream.Err()
}

func (s *stack) assertContract(t *testing.T) {
	t.Helper()
	assertClean(t, s.sim.Violations())
}

// assertClean fails the test when a simulator's contract log has a
// violation: a follow-up the real API would have refused.
func assertClean[V any](t testing.TB, v []V) {
	t.Helper()
	if len(v) > 0 {
		t.Fatalf("the upstream's contract log has %d violations: %+v", len(v), v)
	}
}

func params(user string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: "sim-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(user)}}
}

// A parallel batch through each server's way of streaming tool calls: the
// whole batch runs, every call is answered in call order, the stream is
// one the official client accumulates, and the upstream saw a valid
// conversation.
func TestParallelBatchEveryProfile(t *testing.T) {
	cases := []struct {
		name string
		cfg  openaisim.Config
		n    int
	}{
		{"openai", openaisim.Config{Profile: openaisim.OpenAI}, 4},
		{"vllm", openaisim.Config{Profile: openaisim.VLLM}, 4},
		{"ollama", openaisim.Config{Profile: openaisim.Ollama}, 4},
		{"llamacpp", openaisim.Config{Profile: openaisim.LlamaCpp}, 4},
		{"litellm", openaisim.Config{Profile: openaisim.LiteLLM}, 4},
		{"no ids", openaisim.Config{Profile: openaisim.OpenAI, NoIDs: true}, 3},
		{"no ids, ollama", openaisim.Config{Profile: openaisim.Ollama, NoIDs: true}, 3},
		{"negative index", openaisim.Config{Profile: openaisim.OpenAI, NegativeIndex: true}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int64
			s := start(t, tc.cfg, testenv.Options{}, echoTool("echo", 20*time.Millisecond, &runs))
			got, err := s.streamChat(t, params(script(echoCalls(tc.n), "")))
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Choices) != 1 || got.Choices[0].Message.Content != wantEchoes(tc.n) || got.Choices[0].FinishReason != "stop" {
				t.Fatalf("answer %+v, want %q and finish stop", got.Choices, wantEchoes(tc.n))
			}
			if runs.Load() != int64(tc.n) {
				t.Fatalf("the tool ran %d times, want %d", runs.Load(), tc.n)
			}
			if got.Usage.TotalTokens == 0 || got.Usage.PromptTokens != 10+10*(2+int64(tc.n)) {
				t.Fatalf("usage %+v: want both turns' (prompt 10 then %d)", got.Usage, 10*(2+tc.n))
			}
			// The simulator caches all but the last message of each turn's
			// prompt (10 tokens a message): two turns, 20 uncached.
			if cached := got.Usage.PromptTokensDetails.CachedTokens; cached != got.Usage.PromptTokens-20 {
				t.Errorf("cached tokens %d of a prompt of %d: want the turns' cached counts summed", cached, got.Usage.PromptTokens)
			}
			// It reasons for 2 tokens a turn.
			if r := got.Usage.CompletionTokensDetails.ReasoningTokens; r != 2*2 {
				t.Errorf("reasoning tokens %d: want the two turns' 2 summed", r)
			}
			if s.sim.Requests() != 2 {
				t.Fatalf("%d requests upstream, want 2 turns", s.sim.Requests())
			}
			s.assertContract(t)
		})
	}
}

// Arguments that are not JSON get an invalid_args outcome that the model
// reads, beside its siblings' results; the run goes on.
func TestInvalidArgumentsAreAnOutcome(t *testing.T) {
	var runs atomic.Int64
	s := start(t, openaisim.Config{}, testenv.Options{}, echoTool("echo", 0, &runs))
	bad := `{"i": 1, "text": "unterminated`
	rounds := [][]map[string]any{{{"name": "echo", "arguments": map[string]any{"i": 0}}, {"name": "echo", "raw_arguments": bad}, {"name": "nope", "arguments": map[string]any{}}}}
	got, err := s.streamChat(t, params(script(rounds, "")))
	if err != nil {
		t.Fatal(err)
	}
	answer := got.Choices[0].Message.Content
	parts := strings.Split(strings.TrimPrefix(answer, "results: "), " | ")
	if len(parts) != 3 || parts[0] != `{"echo": {"i":0}}` || !strings.Contains(parts[1], `"error_type":"invalid_args"`) || !strings.Contains(parts[2], `"error_type":"not_found"`) {
		t.Fatalf("the model read %q; want the echo, then invalid_args, then not_found, in call order", answer)
	}
	if runs.Load() != 1 {
		t.Fatalf("the tool ran %d times, want once (the broken call never reaches it)", runs.Load())
	}
	s.assertContract(t)
}

// Without stream: one chat.completion, usage summed over the turns, and
// the sidecar's account of the calls in an extension field.
func TestNotStreamed(t *testing.T) {
	s := start(t, openaisim.Config{Profile: openaisim.LlamaCpp}, testenv.Options{})
	p := params(script(echoCalls(3), "done. "))
	got, err := s.client.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if got.Object != "chat.completion" || got.Choices[0].Message.Content != "done. "+wantEchoes(3) || got.Choices[0].FinishReason != "stop" {
		t.Fatalf("answer %s", got.RawJSON())
	}
	if got.Usage.PromptTokens != 10+10*5 {
		t.Fatalf("usage %+v, want the two turns' prompts summed (60)", got.Usage)
	}
	var ext struct {
		Toolsidecar struct {
			RunID string `json:"run_id"`
			Turns int    `json:"turns"`
			Calls []struct {
				ToolCallID string `json:"tool_call_id"`
				OK         bool   `json:"ok"`
			} `json:"calls"`
		} `json:"toolsidecar"`
	}
	if err := json.Unmarshal([]byte(got.RawJSON()), &ext); err != nil || ext.Toolsidecar.RunID != got.ID || ext.Toolsidecar.Turns != 2 || len(ext.Toolsidecar.Calls) != 3 || !ext.Toolsidecar.Calls[2].OK {
		t.Fatalf("extension %+v (%v)", ext.Toolsidecar, err)
	}
	resp, err := http.Get(s.env.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`toolsidecar_upstream_info\{kind="openai",url="http://127\.0\.0\.1:\d+/v1"\} 1`).Match(metrics) {
		t.Fatal("/metrics does not say the upstream is openai, and where")
	}
	s.assertContract(t)
}

// A request tool with the name of a sidecar tool is refused as the API
// refuses a bad request; so is n > 1.
func TestRefusedRequests(t *testing.T) {
	s := start(t, openaisim.Config{}, testenv.Options{})
	p := params("hi")
	p.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "echo"})}
	_, err := s.client.Chat.Completions.New(context.Background(), p)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "tools[0].function.name" || !strings.Contains(apiErr.Message, "tool of the sidecar") {
		t.Fatalf("err %v, want a 400 naming tools[0].function.name (%s)", err, apiErr.RawJSON())
	}
	p = params("hi")
	p.N = openai.Int(2)
	if _, err = s.client.Chat.Completions.New(context.Background(), p); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "n" {
		t.Fatalf("err %v, want a 400 naming n", err)
	}
	if s.sim.Requests() != 0 {
		t.Fatalf("%d requests reached the upstream", s.sim.Requests())
	}
}

// Faults of the upstream: a 429 with Retry-After and a 503 are retried;
// a stream cut before its finish chunk is asked for again, its calls never
// run twice and its text is not given twice; a 400 reaches the
// application as the upstream wrote it.
func TestUpstreamFaults(t *testing.T) {
	t.Run("429 and 503 retried", func(t *testing.T) {
		s := start(t, openaisim.Config{}, testenv.Options{})
		s.sim.Inject(openaisim.Fault{Status: http.StatusTooManyRequests, RetryAfter: "1"}, openaisim.Fault{Status: http.StatusServiceUnavailable})
		began := time.Now()
		got, err := s.streamChat(t, params(script(echoCalls(2), "")))
		if err != nil || got.Choices[0].Message.Content != wantEchoes(2) {
			t.Fatalf("answer %+v, err %v", got.Choices, err)
		}
		if s.sim.Requests() != 4 {
			t.Fatalf("%d requests, want 4 (two refused, two turns)", s.sim.Requests())
		}
		if waited := time.Since(began); waited < time.Second {
			t.Fatalf("answered after %v: the Retry-After of 1s was not honoured", waited)
		}
		s.assertContract(t)
	})
	t.Run("stream cut", func(t *testing.T) {
		var runs atomic.Int64
		s := start(t, openaisim.Config{}, testenv.Options{}, echoTool("echo", 0, &runs))
		// The first turn is cut in its second call's fragments (its first
		// call is whole, and handed over), the second turn in the
		// answer's text.
		s.sim.Inject(openaisim.Fault{CutAfter: 9}, openaisim.Fault{}, openaisim.Fault{CutAfter: 4})
		got, err := s.streamChat(t, params(script(echoCalls(3), "the words of a long enough answer. ")))
		if err != nil {
			t.Fatal(err)
		}
		if want := "the words of a long enough answer. " + wantEchoes(3); got.Choices[0].Message.Content != want {
			t.Fatalf("answer %q, want %q (said once)", got.Choices[0].Message.Content, want)
		}
		if runs.Load() != 3 || s.sim.Requests() != 4 {
			t.Fatalf("tool ran %d times over %d requests, want 3 over 4", runs.Load(), s.sim.Requests())
		}
		s.assertContract(t)
	})
	t.Run("400 passed on", func(t *testing.T) {
		s := start(t, openaisim.Config{}, testenv.Options{})
		body := `{"error":{"message":"This model's maximum context length is 8 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`
		s.sim.Inject(openaisim.Fault{Status: http.StatusBadRequest, Body: body})
		_, err := s.client.Chat.Completions.New(context.Background(), params("hi"))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Code != "context_length_exceeded" || apiErr.Param != "messages" {
			t.Fatalf("err %v, want the upstream's 400 as it was", err)
		}
		if s.sim.Requests() != 1 {
			t.Fatalf("%d requests: a 400 is not retried", s.sim.Requests())
		}
	})
}

// A turn that calls the application's own tool beside the sidecar's: the
// sidecar runs its calls, the application gets only its own with
// finish_reason tool_calls, and its next request (its call answered) is
// given back the whole turn, so the model sees every call answered.
func TestApplicationsOwnTools(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			var runs atomic.Int64
			s := start(t, openaisim.Config{Profile: openaisim.LlamaCpp}, testenv.Options{}, echoTool("echo", 0, &runs))
			rounds := [][]map[string]any{{{"name": "echo", "arguments": map[string]any{"i": 0}}, {"name": "lookup", "arguments": map[string]any{"q": "x"}},
				{"name": "echo", "arguments": map[string]any{"i": 2}}}}
			p := params(script(rounds, ""))
			p.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "lookup",
				Parameters: shared.FunctionParameters{"type": "object"}})}
			var first openai.ChatCompletion
			var err error
			if stream {
				first, err = s.streamChat(t, p)
			} else {
				var c *openai.ChatCompletion
				c, err = s.client.Chat.Completions.New(context.Background(), p)
				if c != nil {
					first = *c
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			msg := first.Choices[0].Message
			if first.Choices[0].FinishReason != "tool_calls" || len(msg.ToolCalls) != 1 || msg.ToolCalls[0].Function.Name != "lookup" || msg.ToolCalls[0].Function.Arguments != `{"q":"x"}` {
				t.Fatalf("first answer %+v: want only the application's call, finish tool_calls", first.Choices[0])
			}
			if runs.Load() != 2 {
				t.Fatalf("the sidecar's tool ran %d times, want 2", runs.Load())
			}
			p.Messages = append(p.Messages, msg.ToParam(), openai.ToolMessage("looked up", msg.ToolCalls[0].ID))
			second, err := s.client.Chat.Completions.New(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			want := `results: {"echo": {"i":0}} | looked up | {"echo": {"i":2}}`
			if second.Choices[0].Message.Content != want || second.Choices[0].FinishReason != "stop" {
				t.Fatalf("second answer %q, want %q: every call of the turn answered, in call order", second.Choices[0].Message.Content, want)
			}
			if runs.Load() != 2 {
				t.Fatalf("the sidecar's tool ran %d times in all, want 2 (its outcomes were kept)", runs.Load())
			}
			s.assertContract(t)
		})
	}
}

// Without an API token of the sidecar's own, the application's bearer key
// is the one sent upstream; with one, the token stays in the sidecar and
// the configured key goes upstream.
func TestUpstreamKey(t *testing.T) {
	keyFile := t.TempDir() + "/key"
	if err := os.WriteFile(keyFile, []byte("sidecar-upstream-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withKey := func(c *config.Config) { c.Upstream.APIKeyFile = keyFile }
	s := start(t, openaisim.Config{}, testenv.Options{Config: withKey})
	if _, err := s.client.Chat.Completions.New(context.Background(), params("hi")); err != nil {
		t.Fatal(err)
	}
	s2 := start(t, openaisim.Config{}, testenv.Options{Config: withKey, Token: "sidecar-token"})
	if _, err := s2.client.Chat.Completions.New(context.Background(), params("hi")); err != nil {
		t.Fatal(err)
	}
	if got := s.sim.Authorizations(); len(got) != 1 || got[0] != "Bearer app-key" {
		t.Fatalf("without a token, upstream got %q, want the application's key", got)
	}
	if got := s2.sim.Authorizations(); len(got) != 1 || got[0] != "Bearer sidecar-upstream-key" {
		t.Fatalf("with a token, upstream got %q, want the configured key (never the token)", got)
	}
}

// A call is handed to its tool as soon as its arguments are whole, while
// the model still writes the turn's next calls; an unsafe tool's call waits
// for the turn's finish chunk.
func TestCallsStartWhileTheTurnStreams(t *testing.T) {
	for _, sideEffects := range []string{config.ReadOnly, config.Unsafe} {
		t.Run(sideEffects, func(t *testing.T) {
			var mu sync.Mutex
			var started []time.Time
			tl := testenv.Tool{Config: config.Tool{Name: "echo", SideEffects: sideEffects}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
				mu.Lock()
				started = append(started, time.Now())
				mu.Unlock()
				return testenv.Echo(ctx, c)
			}}
			s := start(t, openaisim.Config{Delay: 5 * time.Millisecond}, testenv.Options{}, tl)
			got, err := s.streamChat(t, params(script(echoCalls(4), "")))
			if err != nil || got.Choices[0].Message.Content != wantEchoes(4) {
				t.Fatalf("answer %+v, err %v", got.Choices, err)
			}
			finished := s.sim.Finished()[0]
			mu.Lock()
			defer mu.Unlock()
			early := 0
			for _, at := range started {
				if at.Before(finished) {
					early++
				}
			}
			switch {
			case len(started) != 4:
				t.Fatalf("%d calls ran, want 4", len(started))
			case sideEffects == config.Unsafe && early != 0:
				t.Fatalf("%d unsafe calls started before their turn's finish chunk", early)
			case sideEffects == config.ReadOnly && early < 3:
				t.Fatalf("%d of 4 read-only calls started before the finish chunk, want the first three at least", early)
			}
			s.assertContract(t)
		})
	}
}

// An application that goes away cancels its run: the running call is
// cancelled and no further turn is asked for.
func TestDisconnectCancelsTheCalls(t *testing.T) {
	started, cancelled := make(chan struct{}), make(chan struct{})
	tl := testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
		close(started)
		<-ctx.Done()
		close(cancelled)
		return nil, ctx.Err()
	}}
	s := start(t, openaisim.Config{}, testenv.Options{}, tl)
	ctx, cancel := context.WithCancel(context.Background())
	p := params(script(echoCalls(1), ""))
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := s.client.Chat.Completions.NewStreaming(ctx, p)
	go func() {
		<-started
		cancel()
	}()
	for stream.Next() {
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the call was not cancelled when the application went away")
	}
	if n := s.sim.Requests(); n != 1 {
		t.Fatalf("%d turns asked for, want 1", n)
	}
}

// A run that reaches executor.max_turns ends with an error the client
// raises: a 422 of type max_turns_exceeded naming the limit, not a 500.
func TestTurnLimit(t *testing.T) {
	s := start(t, openaisim.Config{}, testenv.Options{Config: func(c *config.Config) { c.Executor.MaxTurns = 2 }})
	rounds := append(echoCalls(1), echoCalls(1)...)
	_, err := s.client.Chat.Completions.New(context.Background(), params(script(rounds, "")))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || !strings.Contains(apiErr.Message, "turn limit of 2") || apiErr.StatusCode != http.StatusUnprocessableEntity ||
		apiErr.Type != "max_turns_exceeded" {
		t.Fatalf("err %v, want the turn limit", err)
	}
	if n := s.sim.Requests(); n != 2 {
		t.Fatalf("%d turns asked for, want 2", n)
	}
	s.assertContract(t)
}

// The official Node client's accumulator takes the sidecar's stream,
// plain and when the answer ends on the application's own call:
// finalChatCompletion() throws on a stream without a finish_reason or a
// role, or with a call missing its id, type, name or arguments.
func TestNodeClientAccumulates(t *testing.T) {
	s := start(t, openaisim.Config{Profile: openaisim.LlamaCpp}, testenv.Options{})
	run := nodeClient(t, "check.mjs", "openai", s.env.URL+"/v1")
	got := run(script(echoCalls(3), "ok. "), "[]")
	if got["content"] != "ok. "+wantEchoes(3) || got["finish_reason"] != "stop" || got["usage"] == nil {
		t.Fatalf("the Node client accumulated %v", got)
	}
	rounds := [][]map[string]any{{{"name": "echo", "arguments": map[string]any{"i": 0}}, {"name": "lookup", "arguments": map[string]any{"q": "x"}}}}
	got = run(script(rounds, ""), `[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}]`)
	calls, _ := got["tool_calls"].([]any)
	if got["finish_reason"] != "tool_calls" || len(calls) != 1 || !strings.Contains(fmt.Sprint(calls[0]), "lookup") {
		t.Fatalf("the Node client accumulated %v, want the application's one call", got)
	}
	s.assertContract(t)
}

// nodeClient is an official Node client as the application: the script
// of testdata/node (which make openai-node installs with its package)
// sends a user message, with the application's tools as JSON, to the
// sidecar at baseURL and prints what it accumulated as JSON.
func nodeClient(t *testing.T, script, pkg, baseURL string) func(user, tools string) map[string]any {
	t.Helper()
	checker, _ := filepath.Abs(filepath.Join("testdata/node", script))
	if _, err := os.Stat(filepath.Join(filepath.Dir(checker), "node_modules", pkg)); err != nil {
		t.Fatalf("the %s Node package is missing: make openai-node installs it (%v)", pkg, err)
	}
	return func(user, tools string) map[string]any {
		out, err := exec.Command("node", checker, baseURL, user, tools).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				t.Fatalf("node: %v\n%s", err, ee.Stderr)
			}
			t.Fatal(err)
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("node printed %q: %v", out, err)
		}
		return got
	}
}

// The executor's policies apply as in the Core mode: a read-only call the
// model repeats in a later turn is answered from the first (dedupe), and a
// tool past its calls per run gets budget_exceeded.
func TestPoliciesApply(t *testing.T) {
	var runs, otherRuns atomic.Int64
	echo := echoTool("echo", 0, &runs)
	echo.Config.Dedupe = "run"
	other := echoTool("other", 0, &otherRuns)
	other.Config.MaxCallsPerRun = 1
	s := start(t, openaisim.Config{}, testenv.Options{}, echo, other)
	rounds := [][]map[string]any{
		{{"name": "echo", "arguments": map[string]any{"i": 0}}, {"name": "other", "arguments": map[string]any{"i": 1}}, {"name": "other", "arguments": map[string]any{"i": 2}}},
		{{"name": "echo", "arguments": map[string]any{"i": 0}}},
	}
	got, err := s.client.Chat.Completions.New(context.Background(), params(script(rounds, "")))
	if err != nil {
		t.Fatal(err)
	}
	if got.Choices[0].Message.Content != `results: {"echo": {"i":0}}` {
		t.Fatalf("the model read %q", got.Choices[0].Message.Content)
	}
	var ext struct {
		Toolsidecar struct {
			Calls []struct {
				Tool        string `json:"tool"`
				ErrorType   string `json:"error_type"`
				DedupedFrom string `json:"deduped_from"`
			} `json:"calls"`
		} `json:"toolsidecar"`
	}
	_ = json.Unmarshal([]byte(got.RawJSON()), &ext)
	var refused, deduped int
	for _, c := range ext.Toolsidecar.Calls {
		if c.ErrorType == "budget_exceeded" && c.Tool == "other" {
			refused++
		}
		if c.DedupedFrom != "" {
			deduped++
		}
	}
	if runs.Load() != 1 || otherRuns.Load() != 1 || refused != 1 || deduped != 1 {
		t.Fatalf("echo ran %d times, other %d, %d refused, %d deduped: want 1, 1, 1, 1 (%+v)", runs.Load(), otherRuns.Load(), refused, deduped, ext.Toolsidecar.Calls)
	}
	s.assertContract(t)
}

// clusterOf starts what the sidecars of a cluster share: a NATS server
// with JetStream, and the simulator (whose base URL is upstream).
func clusterOf(t *testing.T) (ns *embedded.Server, sim *openaisim.Sim, upstream string) {
	t.Helper()
	ns, err := embedded.Start(embedded.Config{Listen: "127.0.0.1:-1", AllowAnonymous: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	sim = openaisim.New(openaisim.Config{})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	return ns, sim, srv.URL + "/v1"
}

// In durable mode the outcomes of a turn that also called the
// application's tool are kept in the ledger: the application's follow-up,
// taken by another sidecar of the cluster, gets the whole turn back, and
// the sidecar's tools do not run again.
func TestParkedTurnInTheLedger(t *testing.T) {
	ns, sim, upstream := clusterOf(t)
	// One worker serves both sidecars, from a connection of its own.
	var runs atomic.Int64
	echo := echoTool("echo", 0, &runs)
	natstest.WorkerOn(t, natstest.Dial(t, ns.ClientURL()), testenv.Prefix, map[string]tool.Handler{"echo": echo.Handler})
	echo.Handler = nil
	onNS := testenv.Options{NATS: func(n *config.NATS) { n.URL = ns.ClientURL() }}
	a := startOn(t, sim, upstream, onNS, echo)
	b := startOn(t, sim, upstream, onNS, echo)
	rounds := [][]map[string]any{{{"name": "echo", "arguments": map[string]any{"i": 0}}, {"name": "lookup", "arguments": map[string]any{"q": "x"}}}}
	p := params(script(rounds, ""))
	p.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "lookup"})}
	first, err := a.client.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	msg := first.Choices[0].Message
	if len(msg.ToolCalls) != 1 {
		t.Fatalf("first answer %+v", first.Choices[0])
	}
	p.Messages = append(p.Messages, msg.ToParam(), openai.ToolMessage("looked up", msg.ToolCalls[0].ID))
	second, err := b.client.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if want := `results: {"echo": {"i":0}} | looked up`; second.Choices[0].Message.Content != want {
		t.Fatalf("second answer %q, want %q", second.Choices[0].Message.Content, want)
	}
	if runs.Load() != 1 {
		t.Fatalf("echo ran %d times, want once", runs.Load())
	}
	assertClean(t, sim.Violations())
}

// The worker of an OpenAI-compatible run reads the manifest that a Core
// run's worker reads: the executor frames it from the call, with the id the
// model gave and an action id of the call's own, its idempotency key.
func TestWorkersReadTheManifest(t *testing.T) {
	const n = 3
	var mu sync.Mutex
	got := map[int]tool.Call{}
	s := start(t, openaisim.Config{Profile: openaisim.OpenAI}, testenv.Options{},
		testenv.Tool{Config: config.Tool{Name: "echo", Description: "echoes its arguments"},
			Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
				var args struct{ I int }
				if err := json.Unmarshal(c.Args, &args); err != nil {
					return nil, err
				}
				mu.Lock()
				got[args.I] = *c
				mu.Unlock()
				return testenv.Echo(ctx, c)
			}})
	if _, err := s.streamChat(t, params(script(echoCalls(n), ""))); err != nil {
		t.Fatal(err)
	}
	s.assertContract(t)
	ids := map[string]bool{}
	for i := range n {
		c, ok := got[i]
		if !ok {
			t.Fatalf("call %d never reached the worker", i)
		}
		var frame struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(c.Manifest, &frame); err != nil || frame.Type != "tool_call_manifest" {
			t.Fatalf("call %d: body %s is not a tool_call_manifest (%v)", i, c.Manifest, err)
		}
		if c.Tool != "echo" || c.RunID == "" || c.RunID != got[0].RunID || c.ToolCallID == "" || ids[c.ToolCallID] {
			t.Fatalf("call %d: %+v, want tool echo, one run id and a tool_call_id of its own", i, c)
		}
		ids[c.ToolCallID] = true
		if !strings.HasPrefix(c.ActionID, "act-") || c.IdempotencyKey != c.ActionID || ids[c.ActionID] {
			t.Fatalf("call %d: action id %q and idempotency key %q, want one id of the call's own", i, c.ActionID, c.IdempotencyKey)
		}
		ids[c.ActionID] = true
	}
}
