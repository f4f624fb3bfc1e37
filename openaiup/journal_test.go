package openaiup_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/openaisim"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// withKey sends the application's Idempotency-Key.
func withKey(k string) option.RequestOption { return option.WithHeader("Idempotency-Key", k) }

// twice sends two requests at once and returns their answers' texts.
func twice(t *testing.T, s *stack, a, b []option.RequestOption) [2]string {
	t.Helper()
	var got [2]string
	var wg sync.WaitGroup
	for i, opts := range [][]option.RequestOption{a, b} {
		wg.Go(func() {
			c, err := s.client.Chat.Completions.New(context.Background(), params(script(echoCalls(2), "")), opts...)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			got[i] = c.Choices[0].Message.Content
		})
		time.Sleep(50 * time.Millisecond) // the first is running when the second comes
	}
	wg.Wait()
	return got
}

// A second request with the first one's Idempotency-Key, while the first
// runs, attaches to its run: the tools run once, the upstream is asked
// each turn once, and both get the whole answer. Two identical requests
// without a key are two runs; so are two keys with the same messages.
func TestIdempotencyKeyAttaches(t *testing.T) {
	for _, tc := range []struct {
		name     string
		a, b     []option.RequestOption
		wantRuns int64
	}{
		{"same key", []option.RequestOption{withKey("k-1")}, []option.RequestOption{withKey("k-1")}, 2},
		{"no key", nil, nil, 4},
		{"two keys", []option.RequestOption{withKey("k-1")}, []option.RequestOption{withKey("k-2")}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int64
			s := start(t, openaisim.Config{}, testenv.Options{}, echoTool("echo", 300*time.Millisecond, &runs))
			got := twice(t, s, tc.a, tc.b)
			for i, text := range got {
				if text != wantEchoes(2) {
					t.Fatalf("answer %d %q, want %q", i, text, wantEchoes(2))
				}
			}
			if runs.Load() != tc.wantRuns || s.sim.Requests() != int(tc.wantRuns) {
				t.Fatalf("the tool ran %d times over %d turns, want %d and %d", runs.Load(), s.sim.Requests(), tc.wantRuns, tc.wantRuns)
			}
			s.assertContract(t)
		})
	}
}

// A run that ended answers its Idempotency-Key from the journal, streamed or
// not, without asking the upstream or running a tool; the key with another
// request is refused. In durable mode the journal's writes are JetStream's
// round trips, which the answer's last turn must not outrun.
func TestFinishedKeyAnswersFromTheJournal(t *testing.T) {
	for _, durable := range []bool{false, true} {
		t.Run(fmt.Sprintf("durable=%v", durable), func(t *testing.T) {
			finishedKeyAnswers(t, testenv.Options{Config: func(c *config.Config) { c.Durability.Enabled = durable }})
		})
	}
}

func finishedKeyAnswers(t *testing.T, opts testenv.Options) {
	var runs atomic.Int64
	s := start(t, openaisim.Config{}, opts, echoTool("echo", 0, &runs))
	first, err := s.client.Chat.Completions.New(context.Background(), params(script(echoCalls(2), "")), withKey("done-1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.client.Chat.Completions.New(context.Background(), params(script(echoCalls(2), "")), withKey("done-1"))
	if err != nil {
		t.Fatal(err)
	}
	p := params(script(echoCalls(2), ""))
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := s.client.Chat.Completions.NewStreaming(context.Background(), p, withKey("done-1"))
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	streamed := acc.ChatCompletion
	if again.ID != first.ID || again.Choices[0].Message.Content != first.Choices[0].Message.Content || again.Usage.TotalTokens != first.Usage.TotalTokens ||
		again.Created != first.Created || streamed.Choices[0].Message.Content != first.Choices[0].Message.Content || streamed.ID != first.ID {
		t.Fatalf("answers differ:\nfirst %+v\nagain %+v\nstreamed %+v", first, again, streamed)
	}
	if runs.Load() != 2 || s.sim.Requests() != 2 {
		t.Fatalf("the tool ran %d times over %d turns, want 2 and 2: the journal answers", runs.Load(), s.sim.Requests())
	}
	_, err = s.client.Chat.Completions.New(context.Background(), params(script(echoCalls(1), "")), withKey("done-1"))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(apiErr.Message, "another request") {
		t.Fatalf("err %v, want a 422 for the key used with another request", err)
	}
}

// An error event after a call started ends the run with an OpenAI-shaped
// error that names the upstream; the call is joined and journaled first,
// and no next turn is asked (the upstream saw no malformed request). The
// application's retry asks for the turn again, and the call it makes again
// takes its journaled output instead of running a second time.
func TestErrorEventAfterACallStarted(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "whole", true: "stream"}[stream], func(t *testing.T) {
			var runs atomic.Int64
			s := start(t, openaisim.Config{}, testenv.Options{}, echoTool("echo", 0, &runs))
			// After 9 chunks the first call is whole (handed over), the
			// second is not.
			s.sim.Inject(openaisim.Fault{ErrorAfter: 9, ErrorMessage: "the model crashed"})
			var err error
			if stream {
				_, err = s.streamChat(t, params(script(echoCalls(2), "")))
			} else {
				_, err = s.client.Chat.Completions.New(context.Background(), params(script(echoCalls(2), "")), withKey("err-1"))
			}
			var apiErr *openai.Error
			switch {
			case stream && (err == nil || !strings.Contains(err.Error(), "the model crashed") || !strings.Contains(err.Error(), "127.0.0.1")):
				t.Fatalf("stream err %v, want the upstream's error naming it", err)
			case !stream && (!errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadGateway || !strings.Contains(apiErr.Message, "the model crashed") ||
				!strings.Contains(apiErr.Message, "127.0.0.1")):
				t.Fatalf("err %v, want a 502 with the upstream's error naming it", err)
			}
			if runs.Load() != 1 || s.sim.Requests() != 1 {
				t.Fatalf("the tool ran %d times over %d requests, want the started call joined and no next turn", runs.Load(), s.sim.Requests())
			}
			s.assertContract(t)
			if stream {
				return
			}
			got, err := s.client.Chat.Completions.New(context.Background(), params(script(echoCalls(2), "")), withKey("err-1"))
			if err != nil || got.Choices[0].Message.Content != wantEchoes(2) {
				t.Fatalf("retry: %v %+v", err, got.Choices)
			}
			if runs.Load() != 2 {
				t.Fatalf("the tool ran %d times in all, want 2: the first call's output was journaled", runs.Load())
			}
			s.assertContract(t)
		})
	}
}

// A stream cut more often than three times is asked for again, with a
// backoff, within upstream.retry_budget.
func TestCutStreamsRetriedWithinTheBudget(t *testing.T) {
	var runs atomic.Int64
	s := start(t, openaisim.Config{}, testenv.Options{Config: func(c *config.Config) { c.Upstream.RetryBudget = 20 * time.Second }},
		echoTool("echo", 0, &runs))
	s.sim.Inject(openaisim.Fault{CutAfter: 2}, openaisim.Fault{CutAfter: 2}, openaisim.Fault{CutAfter: 2}, openaisim.Fault{CutAfter: 2}, openaisim.Fault{CutAfter: 2})
	got, err := s.streamChat(t, params(script(echoCalls(1), "")))
	if err != nil || got.Choices[0].Message.Content != wantEchoes(1) {
		t.Fatalf("answer %+v, err %v", got.Choices, err)
	}
	if runs.Load() != 1 || s.sim.Requests() != 7 {
		t.Fatalf("the tool ran %d times over %d requests, want 1 over 7 (five cut)", runs.Load(), s.sim.Requests())
	}
	s.assertContract(t)
}

// An Idempotency-Key over 255 characters, or with a character that is not
// printable ASCII, is a 400 before anything runs.
func TestHostileIdempotencyKeys(t *testing.T) {
	var runs atomic.Int64
	s := start(t, openaisim.Config{}, testenv.Options{}, echoTool("echo", 0, &runs))
	for _, k := range []string{strings.Repeat("k", 256), "two words"} {
		_, err := s.client.Chat.Completions.New(context.Background(), params(script(echoCalls(1), "")), withKey(k))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.Message, "Idempotency-Key") {
			t.Fatalf("key of %d characters: err %v, want a 400 naming the header", len(k), err)
		}
	}
	if runs.Load() != 0 || s.sim.Requests() != 0 {
		t.Fatalf("the tool ran %d times over %d requests, want none", runs.Load(), s.sim.Requests())
	}
}

// Two identical requests without a key, sent to two sidecars of a cluster
// while the first runs, are two runs: the second finds the first in its
// request's index (its unsafe call has started, so its first record is
// written) but driven, under the lease taken while its first turn
// streamed, and does not take it over.
func TestIdenticalRequestOnAnotherSidecar(t *testing.T) {
	ns, sim, upstream := clusterOf(t)
	var started atomic.Int64
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	defer release()
	pay := testenv.Tool{Config: config.Tool{Name: "pay", SideEffects: config.Unsafe, Timeout: time.Minute}}
	natstest.WorkerOn(t, natstest.Dial(t, ns.ClientURL()), testenv.Prefix, map[string]tool.Handler{"pay": func(ctx context.Context, c *tool.Call) ([]byte, error) {
		started.Add(1)
		select {
		case <-gate:
			return []byte(`"paid"`), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}})
	side := func(instance string) *stack {
		return startOn(t, sim, upstream, testenv.Options{NATS: func(n *config.NATS) { n.URL = ns.ClientURL() },
			Config: func(c *config.Config) { c.InstanceID = instance }}, pay)
	}
	a, b := side("sc-a"), side("sc-b")
	p := params(script([][]map[string]any{{{"name": "pay", "arguments": map[string]any{"to": "x"}}}}, ""))
	var wg sync.WaitGroup
	var ids [2]string
	for i, s := range []*stack{a, b} {
		wg.Go(func() {
			c, err := s.client.Chat.Completions.New(context.Background(), p)
			if err != nil || c.Choices[0].Message.Content != `results: "paid"` {
				t.Errorf("request %d: %v %+v", i, err, c)
				return
			}
			ids[i] = c.ID
		})
		n := int64(i + 1)
		poll.Until(t, fmt.Sprintf("%d unsafe calls to start", n), func() bool { return started.Load() == n })
	}
	release()
	wg.Wait()
	if ids[0] == "" || ids[0] == ids[1] {
		t.Errorf("answers %q and %q: want two runs", ids[0], ids[1])
	}
	if n := started.Load(); n != 2 {
		t.Errorf("the unsafe tool started %d times, want once per run", n)
	}
	assertClean(t, sim.Violations())
}
