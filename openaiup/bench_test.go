package openaiup_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/projectdavid/toolsidecar/anthropicsim"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/openaisim"
	"github.com/projectdavid/toolsidecar/responsesim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// BenchmarkBatch streams chat completions whose first turn calls a tool
// that takes 200 ms, once or 16 times, then answers: the 16 calls run as
// one parallel batch, so a run of 16 should take about as long as a run
// of one. upstream=process serves the simulator from a process of its
// own, as a model server is; each run fails on any contract violation.
//
//	go test ./openaiup -run '^$' -bench BenchmarkBatch -benchtime 20x
func BenchmarkBatch(b *testing.B) {
	batchRuns(b, func(b *testing.B, process bool, opts testenv.Options, slow testenv.Tool, calls int) (ask, func() []openaisim.Violation) {
		var s *stack
		violations := func() []openaisim.Violation { return s.sim.Violations() }
		if process {
			url, v := testenv.OpenAIProcess(b, openaisim.Config{})
			s, violations = startOn(b, nil, url, opts, slow), v
		} else {
			s = start(b, openaisim.Config{}, opts, slow)
		}
		return s.ask(b, params(script(echoCalls(calls), ""))), violations
	})
}

// BenchmarkMessagesBatch is BenchmarkBatch through the Anthropic Messages
// API (upstream.kind anthropic, the application on anthropic-sdk-go).
//
//	go test ./openaiup -run '^$' -bench BenchmarkMessagesBatch -benchtime 20x
func BenchmarkMessagesBatch(b *testing.B) {
	batchRuns(b, func(b *testing.B, process bool, opts testenv.Options, slow testenv.Tool, calls int) (ask, func() []openaisim.Violation) {
		p := messagesParams(false, userText(script(echoCalls(calls), "")))
		if !process {
			s := startMessages(b, anthropicsim.Config{}, opts, slow)
			return s.ask(b, p), s.sim.Violations
		}
		url, violations := testenv.MessagesProcess(b, anthropicsim.Config{})
		return startMessagesOn(b, url, opts, slow).ask(b, p), violations
	})
}

// BenchmarkResponsesBatch is BenchmarkBatch through the OpenAI Responses
// API (upstream.kind responses, the application on openai-go's Responses
// client and its accumulator).
//
//	go test ./openaiup -run '^$' -bench BenchmarkResponsesBatch -benchtime 20x
func BenchmarkResponsesBatch(b *testing.B) {
	batchRuns(b, func(b *testing.B, process bool, opts testenv.Options, slow testenv.Tool, calls int) (ask, func() []openaisim.Violation) {
		p := responsesParams(script(echoCalls(calls), ""), false)
		if !process {
			s := startResponses(b, responsesim.Config{}, opts, slow)
			return s.ask(b, p), s.sim.Violations
		}
		url, violations := testenv.ResponsesProcess(b, responsesim.Config{})
		return startResponsesOn(b, url, opts, slow).ask(b, p), violations
	})
}

// batchRuns runs the batch benchmark of one API: start gives the
// application's request of calls calls through a sidecar in front of the
// API's simulator (in a process of its own with process), and what reads
// the simulator's contract log.
func batchRuns(b *testing.B, start func(b *testing.B, process bool, opts testenv.Options, slow testenv.Tool, calls int) (ask, func() []openaisim.Violation)) {
	for _, process := range []bool{false, true} {
		for _, calls := range []int{1, 16} {
			name := fmt.Sprintf("calls=%d", calls)
			if process {
				name += "/upstream=process"
			}
			b.Run(name, func(b *testing.B) {
				opts := testenv.Options{Executor: config.Executor{MaxParallel: 16}}
				ask, violations := start(b, process, opts, echoTool("echo", 200*time.Millisecond, nil), calls)
				took := make([]time.Duration, b.N)
				b.ResetTimer()
				for i := range b.N {
					began := time.Now()
					got, err := ask()
					took[i] = time.Since(began)
					if err != nil || got != wantEchoes(calls) {
						b.Fatalf("run %d: %v %q", i, err, got)
					}
				}
				b.StopTimer()
				if v := violations(); len(v) > 0 {
					b.Fatalf("contract violations: %v", v)
				}
				slices.Sort(took)
				b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/run")
				b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(took[len(took)-1].Microseconds())/1000, "max-ms")
			})
		}
	}
}

// BenchmarkJournal measures what journaling costs a run: a streamed chat
// completion whose first turn calls a tool 16 times, through a sidecar in
// durable mode (the journal in JetStream) and one without (the journal in
// memory), alternated request by request against one simulator in a
// process of its own. With tool=0s the tool returns at once, so the
// journal's writes (and the ledger's and the lease's) are the whole
// difference; tool=50ms is a fast real tool.
//
//	go test ./openaiup -run '^$' -bench BenchmarkJournal -benchtime 100x
func BenchmarkJournal(b *testing.B) {
	for _, latency := range []time.Duration{0, 50 * time.Millisecond} {
		b.Run(fmt.Sprintf("tool=%v", latency), func(b *testing.B) {
			url, violations := testenv.OpenAIProcess(b, openaisim.Config{})
			opts := func(durable bool) testenv.Options {
				return testenv.Options{Executor: config.Executor{MaxParallel: 16}, Config: func(c *config.Config) { c.Durability.Enabled = durable }}
			}
			stacks := [2]*stack{startOn(b, nil, url, opts(true), echoTool("echo", latency, nil)), startOn(b, nil, url, opts(false), echoTool("echo", latency, nil))}
			p := params(script(echoCalls(16), ""))
			took := alternate(b, [2]ask{stacks[0].ask(b, p), stacks[1].ask(b, p)}, wantEchoes(16))
			if v := violations(); len(v) > 0 {
				b.Fatalf("contract violations: %v", v)
			}
			durable, memory := report(b, took, "durable", "memory")
			b.ReportMetric(durable/memory, "p50-ratio")
		})
	}
}

// BenchmarkProxyOverhead measures what the sidecar adds to a turn without
// tool calls: the same streamed request sent through the sidecar (durable
// mode, no Idempotency-Key) and straight to the simulator, which serves
// from a process of its own, alternated request by request.
//
//	go test ./openaiup -run '^$' -bench BenchmarkProxyOverhead -benchtime 200x
func BenchmarkProxyOverhead(b *testing.B) {
	url, violations := testenv.OpenAIProcess(b, openaisim.Config{})
	through := startOn(b, nil, url, testenv.Options{})
	straight := &stack{client: openai.NewClient(option.WithBaseURL(url), option.WithAPIKey("k"), option.WithMaxRetries(0))}
	p := params("hello")
	took := alternate(b, [2]ask{through.ask(b, p), straight.ask(b, p)}, "echo: hello")
	if v := violations(); len(v) > 0 {
		b.Fatalf("contract violations: %v", v)
	}
	via, direct := report(b, took, "sidecar", "direct")
	b.ReportMetric(via-direct, "p50-overhead-ms")
}

// BenchmarkMessagesProxyOverhead is BenchmarkProxyOverhead through the
// Anthropic Messages API.
//
//	go test ./openaiup -run '^$' -bench BenchmarkMessagesProxyOverhead -benchtime 200x
func BenchmarkMessagesProxyOverhead(b *testing.B) {
	url, violations := testenv.MessagesProcess(b, anthropicsim.Config{})
	through := startMessagesOn(b, url, testenv.Options{})
	straight := &messagesStack{client: anthropic.NewClient(aoption.WithBaseURL(url), aoption.WithAPIKey("k"), aoption.WithMaxRetries(0))}
	p := messagesParams(false, userText("hello"))
	took := alternate(b, [2]ask{through.ask(b, p), straight.ask(b, p)}, "echo: hello")
	if v := violations(); len(v) > 0 {
		b.Fatalf("contract violations: %v", v)
	}
	via, direct := report(b, took, "sidecar", "direct")
	b.ReportMetric(via-direct, "p50-overhead-ms")
}

// BenchmarkResponsesProxyOverhead is BenchmarkProxyOverhead through the
// OpenAI Responses API.
//
//	go test ./openaiup -run '^$' -bench BenchmarkResponsesProxyOverhead -benchtime 200x
func BenchmarkResponsesProxyOverhead(b *testing.B) {
	url, violations := testenv.ResponsesProcess(b, responsesim.Config{})
	through := startResponsesOn(b, url, testenv.Options{})
	straight := &responsesStack{client: openai.NewClient(option.WithBaseURL(url), option.WithAPIKey("k"), option.WithMaxRetries(0))}
	p := responsesParams("hello", false)
	took := alternate(b, [2]ask{through.ask(b, p), straight.ask(b, p)}, "echo: hello")
	if v := violations(); len(v) > 0 {
		b.Fatalf("contract violations: %v", v)
	}
	via, direct := report(b, took, "sidecar", "direct")
	b.ReportMetric(via-direct, "p50-overhead-ms")
}

// ask sends one streamed request and returns the answer's text.
type ask func() (string, error)

func (s *stack) ask(b *testing.B, p openai.ChatCompletionNewParams) ask {
	return func() (string, error) {
		got, err := s.streamChat(b, p)
		if err != nil {
			return "", err
		}
		return got.Choices[0].Message.Content, nil
	}
}

func (s *messagesStack) ask(b *testing.B, p anthropic.MessageNewParams) ask {
	return func() (string, error) {
		got, err := s.accumulate(b, p)
		return textOf(got), err
	}
}

func (s *responsesStack) ask(b *testing.B, p responses.ResponseNewParams) ask {
	return func() (string, error) {
		got, err := s.accumulate(b, p)
		if err != nil {
			return "", err
		}
		return got.OutputText(), nil
	}
}

// alternate sends a request with both asks b.N times, each first every
// other time, and returns each one's durations; an answer other than want
// fails.
func alternate(b *testing.B, asks [2]ask, want string) [2][]time.Duration {
	took := [2][]time.Duration{}
	b.ResetTimer()
	for i := range b.N {
		for k := range 2 {
			k = (k + i) % 2
			began := time.Now()
			got, err := asks[k]()
			took[k] = append(took[k], time.Since(began))
			if err != nil || got != want {
				b.Fatalf("run %d: %v %q", i, err, got)
			}
		}
	}
	b.StopTimer()
	return took
}

// report records the median and the slowest of each stack's durations
// under its name, and returns the medians, in ms.
func report(b *testing.B, took [2][]time.Duration, first, second string) (p50a, p50b float64) {
	var p50 [2]float64
	for k, name := range [2]string{first, second} {
		p := percentiles(took[k])
		b.ReportMetric(p[0], name+"-p50-ms")
		b.ReportMetric(p[1], name+"-max-ms")
		p50[k] = p[0]
	}
	return p50[0], p50[1]
}

// percentiles are the median and the slowest, in ms.
func percentiles(d []time.Duration) [2]float64 {
	slices.Sort(d)
	return [2]float64{float64(d[len(d)/2].Microseconds()) / 1000, float64(d[len(d)-1].Microseconds()) / 1000}
}
