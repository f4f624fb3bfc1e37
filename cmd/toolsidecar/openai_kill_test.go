package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/projectdavid/toolsidecar/sim/anthropicsim"
	"github.com/projectdavid/toolsidecar/sim/openaisim"
	"github.com/projectdavid/toolsidecar/sim/responsesim"
	"github.com/projectdavid/toolsidecar/testkit/matrix"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// openAIKill is where in an OpenAI-compatible run of a read-only call
// (look) and an unsafe one (pay), then an answer, the sidecar process is
// killed with SIGKILL.
type openAIKill struct {
	name string
	// faults are queued on the upstream, one per turn request; Hit is set
	// on the one that holds its stream.
	faults []openaisim.Fault
	// block names the tools whose first run waits for the test.
	block []string
	// until is what the test waits for before the kill.
	until func(looks, pays int32, held bool) bool
	// turns is how many turn requests the upstream gets in all; looks how
	// often the read-only tool runs.
	turns int
	looks int32
	// inFlight names the calls of a delivered turn in flight at the kill:
	// on a route that runs them in the sidecar's process their replies die
	// with it, so the read-only call runs once more and the unsafe one is
	// interrupted.
	inFlight []string
	// term stops the sidecar with SIGTERM (the tools finish within the
	// shutdown timeout) instead of SIGKILL.
	term bool
}

// TestOpenAISIGKILL: the sidecar is killed with SIGKILL at each step of an
// OpenAI-compatible run (during the first turn's stream, with calls in
// flight, between outputs, after the final turn's first byte), started
// again, and the application (openai-go, streamed with Idempotency-Key, or
// whole without a key) sends its request again, with the tools on every
// route kind (make test runs a sample, make soak all). The retry resumes
// the run from the journal: the unsafe tool ran once, the read-only one
// once (twice only when the kill came before its turn was delivered, or
// while it ran in the sidecar's process), no delivered turn was asked
// again, every tool_call_id was answered once upstream, and the answer's
// text is the uninterrupted run's. Each cell repeats testenv.SoakReps()
// times; make soak runs 20.
func TestOpenAISIGKILL(t *testing.T) {
	api := chatCompletions()
	want, _ := openAIRun(t, api, openAIKill{name: "uninterrupted", turns: 2, looks: 1}, matrix.NATS, false, "")
	points := append(sharedPoints(4, 2),
		openAIKill{name: "between outputs", block: []string{"pay"},
			until: func(looks, pays int32, _ bool) bool { return looks == 1 && pays == 1 }, turns: 2, looks: 1, inFlight: []string{"pay"}},
		openAIKill{name: "SIGTERM with calls in flight", block: []string{"look", "pay"}, term: true,
			until: func(looks, pays int32, _ bool) bool { return looks == 1 && pays == 1 }, turns: 2, looks: 1})
	killPoints(t, api, points, want)
}

// TestMessagesSIGKILL is TestOpenAISIGKILL through the Messages API
// (upstream.kind anthropic, the application on anthropic-sdk-go). The
// events differ: look's call is whole at its block's stop, the fifth
// event of the first turn; the final turn's first text is its third.
func TestMessagesSIGKILL(t *testing.T) {
	api := messagesAPI()
	want, _ := openAIRun(t, api, openAIKill{name: "uninterrupted", turns: 2, looks: 1}, matrix.NATS, false, "")
	killPoints(t, api, sharedPoints(5, 3), want)
}

// TestResponsesSIGKILL is TestOpenAISIGKILL through the Responses API
// (upstream.kind responses, the application on openai-go's Responses
// client and its accumulator); the final turn's first text is its fifth
// event.
func TestResponsesSIGKILL(t *testing.T) {
	api := responsesAPI()
	want, _ := openAIRun(t, api, openAIKill{name: "uninterrupted", turns: 2, looks: 1}, matrix.NATS, false, "")
	killPoints(t, api, sharedPoints(4, 5), want)
}

// sharedPoints are the kill points every model API is tried at: in the
// first turn's stream once look's call is whole (its streamHold-th event),
// with both calls in flight, and after the final turn's first byte (its
// finalHold-th event).
func sharedPoints(streamHold, finalHold int) []openAIKill {
	return []openAIKill{
		{name: "during the stream", faults: []openaisim.Fault{{HoldAfter: streamHold}}, block: []string{"look"},
			until: func(looks, _ int32, held bool) bool { return held && looks == 1 }, turns: 3, looks: 2},
		{name: "with calls in flight", block: []string{"look", "pay"},
			until: func(looks, pays int32, _ bool) bool { return looks == 1 && pays == 1 }, turns: 2, looks: 1, inFlight: []string{"look", "pay"}},
		{name: "after the final turn's first byte", faults: []openaisim.Fault{{}, {HoldAfter: finalHold}},
			until: func(_, _ int32, held bool) bool { return held }, turns: 3, looks: 1},
	}
}

func killPoints(t *testing.T, api modelAPI, points []openAIKill, want string) {
	for i, kp := range points {
		for j, stream := range []bool{true, false} {
			for _, route := range matrix.Routes(2*i + j) {
				t.Run(fmt.Sprintf("%s/stream=%v/route=%s", kp.name, stream, route), func(t *testing.T) {
					for i := range testenv.SoakReps() {
						_, resume := openAIRun(t, api, kp, route, stream, want)
						t.Logf("FAULT %s_sigkill/%s/stream=%v/route=%s rep=%d resume_ms=%d", api.kind, strings.ReplaceAll(kp.name, " ", "_"), stream, route, i, resume.Milliseconds())
						if t.Failed() {
							return
						}
					}
				})
			}
		}
	}
}

// modelSim is a model API's simulator, as the kill tests use it.
type modelSim interface {
	http.Handler
	Inject(...openaisim.Fault)
	Requests() int
	Repeats() int
	Violations() []openaisim.Violation
}

// modelAPI is a model API the kill tests run through: its simulator, the
// upstream's config for it, and the application's request on its official
// client (streamed with an Idempotency-Key, or whole without), whose
// answer's text it returns.
type modelAPI struct {
	kind string
	sim  func() modelSim
	path string // the API's base path under the simulator's URL
	ask  func(base, user string, stream bool) (string, error)
}

func chatCompletions() modelAPI {
	return modelAPI{kind: "openai", path: "/v1", sim: func() modelSim { return openaisim.New(openaisim.Config{}) },
		ask: func(base, user string, stream bool) (string, error) {
			client := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("app-key"), option.WithMaxRetries(0))
			params := openai.ChatCompletionNewParams{Model: "sim-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(user)}}
			if !stream {
				c, err := client.Chat.Completions.New(context.Background(), params)
				if err != nil {
					return "", err
				}
				return c.Choices[0].Message.Content, nil
			}
			s := client.Chat.Completions.NewStreaming(context.Background(), params, option.WithHeader("Idempotency-Key", "app-request-1"))
			var acc openai.ChatCompletionAccumulator
			for s.Next() {
				if !acc.AddChunk(s.Current()) {
					return "", fmt.Errorf("chunk refused by openai-go's accumulator: %s", s.Current().RawJSON())
				}
			}
			if err := s.Err(); err != nil {
				return "", err
			}
			return acc.Choices[0].Message.Content, nil
		}}
}

func messagesAPI() modelAPI {
	return modelAPI{kind: "anthropic", sim: func() modelSim { return anthropicsim.New(anthropicsim.Config{}) },
		ask: func(base, user string, stream bool) (string, error) {
			client := anthropic.NewClient(aoption.WithBaseURL(base), aoption.WithAPIKey("app-key"), aoption.WithMaxRetries(0))
			params := anthropic.MessageNewParams{Model: "sim-model", MaxTokens: 1024, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(user))}}
			var msg anthropic.Message
			if !stream {
				m, err := client.Messages.New(context.Background(), params)
				if err != nil {
					return "", err
				}
				msg = *m
			} else {
				s := client.Messages.NewStreaming(context.Background(), params, aoption.WithHeader("Idempotency-Key", "app-request-1"))
				for s.Next() {
					if err := msg.Accumulate(s.Current()); err != nil {
						return "", fmt.Errorf("event refused by anthropic-sdk-go's accumulator: %w", err)
					}
				}
				if err := s.Err(); err != nil {
					return "", err
				}
				if msg.StopReason == "" {
					return "", errors.New("the stream ended without its stop reason")
				}
			}
			var text strings.Builder
			for _, b := range msg.Content {
				text.WriteString(b.Text)
			}
			return text.String(), nil
		}}
}

func responsesAPI() modelAPI {
	return modelAPI{kind: "responses", path: "/v1", sim: func() modelSim { return responsesim.New(responsesim.Config{}) },
		ask: func(base, user string, stream bool) (string, error) {
			client := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("app-key"), option.WithMaxRetries(0))
			params := responses.ResponseNewParams{Model: "sim-model", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(user)}}
			if !stream {
				r, err := client.Responses.New(context.Background(), params)
				if err != nil {
					return "", err
				}
				return r.OutputText(), nil
			}
			s := client.Responses.NewStreaming(context.Background(), params, option.WithHeader("Idempotency-Key", "app-request-1"))
			var acc responses.ResponseAccumulator
			for s.Next() {
				var ev responses.ResponsesServerEventUnion
				if err := json.Unmarshal([]byte(s.Current().RawJSON()), &ev); err != nil {
					return "", err
				}
				if err := acc.AddEvent(ev); err != nil {
					return "", fmt.Errorf("event refused by openai-go's Responses accumulator: %w", err)
				}
			}
			if err := s.Err(); err != nil {
				return "", err
			}
			r, err := acc.ReconstructedResponse()
			if err != nil {
				return "", err
			}
			return r.OutputText(), nil
		}}
}

// openAIRun runs the request once through api, with the tools on route,
// killing and restarting the sidecar at kp (unless kp.until is nil), and
// returns the answer's text and the time from the restart to the retry's
// answer; with want set it checks the invariants.
func openAIRun(t *testing.T, api modelAPI, kp openAIKill, route string, stream bool, want string) (string, time.Duration) {
	t.Helper()
	sim := api.sim()
	srv := httptest.NewServer(sim)
	defer srv.Close()
	tools := matrix.Serve(t, route, matrix.Tool{Name: "look", SideEffects: "read_only", Block: slices.Contains(kp.block, "look")},
		matrix.Tool{Name: "pay", SideEffects: "unsafe", Block: slices.Contains(kp.block, "pay")})
	p := newDaemonConfig(t, srv.URL, tools.Config("10s"),
		fmt.Sprintf("upstream: {kind: %s, url: %q, retry_budget: 10s}\n", api.kind, srv.URL+api.path))
	p.start(t)
	var nc *nats.Conn
	if hs := tools.Handlers(); hs != nil {
		nc = startWorker(t, p.natsURL, hs)
	}
	var held atomic.Bool
	for _, f := range kp.faults {
		if f.HoldAfter > 0 {
			f.Hit = func() { held.Store(true) }
		}
		sim.Inject(f)
	}
	user := `{"rounds": [[{"name": "look", "arguments": {}}, {"name": "pay", "arguments": {}}]], "answer": "the words of a long enough answer. "}`
	ask := func() (string, error) { return api.ask(p.base, user, stream) }
	if kp.until == nil {
		got, err := ask()
		if err != nil {
			t.Fatalf("uninterrupted run: %v\n%s", err, p.stderr.String())
		}
		return got, 0
	}
	first := make(chan error, 1)
	go func() {
		_, err := ask()
		first <- err
	}()
	poll.Until(t, kp.name, func() bool { return kp.until(tools.Count("look"), tools.Count("pay"), held.Load()) })
	// The calls that are not held have returned, their replies have
	// reached the server, and the sidecar has them (a reply written into
	// the socket of a server that dies is lost: the read-only call then
	// runs again, as it may).
	poll.Until(t, "the tools that are not held to return", func() bool {
		return slices.Contains(kp.block, "look") || tools.Done("look") == tools.Count("look")
	})
	p.settled(t, tools, "look", "pay")
	if nc != nil {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if kp.term {
		// The batch finishes and is journaled; no further turn is asked,
		// and the application is told to retry.
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		tools.Release()
	} else if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	err := <-first
	var apiErr *openai.Error
	switch {
	case err == nil:
		t.Fatal("the first request was answered whole through the stop")
	case kp.term && !stream && (!errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable): // kp.term is Chat Completions' only
		t.Fatalf("the first request's error %v, want a 503 that asks for a retry", err)
	}
	// Calls still running finish while the sidecar is away; their replies
	// wait in the worker's buffer. Only once the worker has seen the
	// server go: a reply written into the socket of a server that just
	// died is lost (in 1 of 300 runs before this wait), and pay would be
	// interrupted, as it is in production when a reply is lost.
	if nc != nil {
		poll.Until(t, "the worker to see the server gone", func() bool { return !nc.IsConnected() })
	}
	tools.Release()
	restarted := time.Now()
	p.start(t)
	if nc != nil {
		testenv.WaitLive(t, p.base, "look", "pay")
		if err := nc.Flush(); err != nil { // the buffered replies have reached the server
			t.Fatal(err)
		}
	}
	got, err := ask()
	resume := time.Since(restarted)
	if err != nil {
		t.Fatalf("the retry: %v\n%s", err, p.stderr.String())
	}
	lost := func(name string) bool { return tools.InProcess() && slices.Contains(kp.inFlight, name) }
	switch {
	case lost("pay"):
		// The answer reads the results: pay's is the interrupted outcome.
		if !strings.Contains(got, "interrupted") || !strings.Contains(got, "look done") || strings.Contains(got, "pay done") {
			t.Errorf("the retry's answer %q, want look's result and pay interrupted", got)
		}
	case got != want:
		t.Errorf("the retry's answer %q, want the uninterrupted run's %q", got, want)
	}
	wantLooks := kp.looks
	if lost("look") {
		wantLooks++
	}
	if pays, looks := tools.Count("pay"), tools.Count("look"); pays != 1 || looks != wantLooks {
		t.Errorf("pay ran %d times and look %d, want 1 and %d", pays, looks, wantLooks)
	}
	if n := sim.Requests(); n != kp.turns {
		t.Errorf("%d turn requests upstream, want %d", n, kp.turns)
	}
	if n := sim.Repeats(); n != 0 {
		t.Errorf("%d delivered turns were asked again", n)
	}
	if v := sim.Violations(); len(v) > 0 {
		t.Errorf("the upstream's contract log: %+v", v)
	}
	return got, resume
}
