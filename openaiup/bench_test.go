package openaiup_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/anthropicsim"
	"github.com/projectdavid/toolsidecar/sim/openaisim"
	"github.com/projectdavid/toolsidecar/sim/responsesim"
	"github.com/projectdavid/toolsidecar/testkit/matrix"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// BenchmarkBatch streams chat completions whose first turn calls a tool
// that takes 200 ms, once or 16 times, then answers: the 16 calls run as
// one parallel batch, so a run of 16 should take about as long as a run
// of one. The application (openai-go, its accumulator checking every
// chunk) runs in a process of its own, as applications do, so that its
// decoding and its garbage are not the sidecar's; upstream=process serves
// the simulator from a process of its own too, as a model server is. Each
// run fails on a wrong answer or any contract violation.
//
//	go test ./openaiup -run '^$' -bench BenchmarkBatch -benchtime 20x
func BenchmarkBatch(b *testing.B) {
	batchRuns(b, apiChat, func(b *testing.B, process bool, opts testenv.Options, slow testenv.Tool) (string, func() []openaisim.Violation) {
		if !process {
			s := start(b, openaisim.Config{}, opts, slow)
			return s.env.URL + "/v1", s.sim.Violations
		}
		url, violations := testenv.OpenAIProcess(b, openaisim.Config{})
		return startOn(b, nil, url, opts, slow).env.URL + "/v1", violations
	})
}

// BenchmarkMessagesBatch is BenchmarkBatch through the Anthropic Messages
// API (upstream.kind anthropic, the application on anthropic-sdk-go).
//
//	go test ./openaiup -run '^$' -bench BenchmarkMessagesBatch -benchtime 20x
func BenchmarkMessagesBatch(b *testing.B) {
	batchRuns(b, apiMessages, func(b *testing.B, process bool, opts testenv.Options, slow testenv.Tool) (string, func() []openaisim.Violation) {
		if !process {
			s := startMessages(b, anthropicsim.Config{}, opts, slow)
			return s.env.URL, s.sim.Violations
		}
		url, violations := testenv.MessagesProcess(b, anthropicsim.Config{})
		return startMessagesOn(b, url, opts, slow).env.URL, violations
	})
}

// BenchmarkResponsesBatch is BenchmarkBatch through the OpenAI Responses
// API (upstream.kind responses, the application on openai-go's Responses
// client and its accumulator).
//
//	go test ./openaiup -run '^$' -bench BenchmarkResponsesBatch -benchtime 20x
func BenchmarkResponsesBatch(b *testing.B) {
	batchRuns(b, apiResponses, func(b *testing.B, process bool, opts testenv.Options, slow testenv.Tool) (string, func() []openaisim.Violation) {
		if !process {
			s := startResponses(b, responsesim.Config{}, opts, slow)
			return s.env.URL + "/v1", s.sim.Violations
		}
		url, violations := testenv.ResponsesProcess(b, responsesim.Config{})
		return startResponsesOn(b, url, opts, slow).env.URL + "/v1", violations
	})
}

// batchRuns runs the batch benchmark of one API: start starts a sidecar
// in front of the API's simulator (in a process of its own with process)
// and returns the sidecar's base URL, as the API's client takes it, and
// what reads the simulator's contract log; the application sends it b.N
// requests of 1 or 16 calls from a process of its own.
func batchRuns(b *testing.B, api string, start func(b *testing.B, process bool, opts testenv.Options, slow testenv.Tool) (string, func() []openaisim.Violation)) {
	for _, process := range []bool{false, true} {
		for _, calls := range []int{1, 16} {
			name := fmt.Sprintf("calls=%d", calls)
			if process {
				name += "/upstream=process"
			}
			b.Run(name, func(b *testing.B) {
				opts := testenv.Options{Executor: config.Executor{MaxParallel: 16}}
				url, violations := start(b, process, opts, echoTool("echo", 200*time.Millisecond, nil))
				took := applicationProcess(b, application{API: api, URLs: []string{url}, User: script(echoCalls(calls), ""), Want: wantEchoes(calls), Runs: b.N})[0]
				if v := violations(); len(v) > 0 {
					b.Fatalf("contract violations: %v", v)
				}
				wire, decoded := durations(took)
				b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/run")
				p := percentiles(wire)
				b.ReportMetric(p[0], "p50-ms")
				b.ReportMetric(p[1], "max-ms")
				// How often a drive stalls, batch or single call alike.
				slow := 0
				for _, d := range wire {
					if float64(d.Microseconds())/1000 > 1.10*p[0] {
						slow++
					}
				}
				b.ReportMetric(float64(slow), "drives>1.10xp50")
				p = percentiles(decoded)
				b.ReportMetric(p[0], "decoded-p50-ms")
				b.ReportMetric(p[1], "decoded-max-ms")
			})
		}
	}
}

// The APIs an application of the batch benchmarks speaks.
const (
	apiChat      = "chat"
	apiMessages  = "messages"
	apiResponses = "responses"
)

// envApplication carries an application's spec to the process that runs
// it.
const envApplication = "TSC_TEST_APPLICATION"

// application is what a benchmark's application process does: Runs
// rounds of streamed requests of the user message User, through the
// official client of API, one to each base URL of URLs (as the client
// takes it), the first one every other round; every answer must be Want.
// After each request it collects its garbage, so that collecting what the
// client's decoding left does not overlap the next request, in any arm,
// then waits Pause.
type application struct {
	API        string
	URLs       []string
	User, Want string
	Runs       int
	Pause      time.Duration
}

// applicationProcess runs app in a process of its own (the test binary
// again, whose TestMain calls [maybeApplication]) and returns how long
// each of its requests took, by URL. The benchmark's timer runs while the
// requests do.
func applicationProcess(b *testing.B, app application) [][]took {
	b.Helper()
	cmd, stdin, stdout := testenv.Again(b, envApplication, app)
	defer func() { // at once on a failure; gone already after the last run
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		b.Fatal("the application's process did not start")
	}
	b.ResetTimer()
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		b.Fatal(err)
	}
	took, n := make([][]took, len(app.URLs)), 0
	for ; lines.Scan(); n++ {
		var line drive
		if err := json.Unmarshal(lines.Bytes(), &line); err != nil {
			b.Fatalf("the application's process wrote %q: %v", lines.Text(), err)
		}
		if line.Err != "" {
			b.Fatalf("request %d: %s", n, line.Err)
		}
		took[line.URL] = append(took[line.URL], line.took)
	}
	b.StopTimer()
	if n != app.Runs*len(app.URLs) {
		b.Fatalf("the application's process ended after %d requests of %d", n, app.Runs*len(app.URLs))
	}
	return took
}

// drive is a line of the application process's output: one request, to
// app.URLs[URL].
type drive struct {
	took
	URL int
	Err string `json:",omitempty"`
}

// maybeApplication runs the application of the spec in the environment
// and exits, when this process was started by [applicationProcess]: it
// says it is ready, waits for a line on stdin, then sends its requests
// and writes a [drive] line for each; a wrong answer ends it.
func maybeApplication() {
	spec := os.Getenv(envApplication)
	if spec == "" {
		return
	}
	var app application
	if err := json.Unmarshal([]byte(spec), &app); err != nil {
		fmt.Fprintln(os.Stderr, "application process:", err)
		os.Exit(2)
	}
	asks := make([]ask, len(app.URLs))
	for k, url := range app.URLs {
		asks[k] = app.ask(url)
	}
	out := json.NewEncoder(os.Stdout)
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		os.Exit(2)
	}
	for i := range app.Runs {
		for k := range asks {
			k = (k + i) % len(asks)
			got, t, err := asks[k]()
			d := drive{took: t, URL: k}
			if err != nil || got != app.Want {
				d.Err = fmt.Sprintf("%v %q", err, got)
			}
			_ = out.Encode(d)
			if d.Err != "" {
				os.Exit(1)
			}
			runtime.GC()
			time.Sleep(app.Pause)
		}
	}
	os.Exit(0)
}

// ask is the application's request to the API at url.
func (app application) ask(url string) ask {
	tb := processTB{}
	switch app.API {
	case apiMessages:
		s := &messagesStack{client: anthropic.NewClient(aoption.WithBaseURL(url), aoption.WithAPIKey("app-key"), aoption.WithMaxRetries(0))}
		return s.ask(tb, messagesParams(false, userText(app.User)))
	case apiResponses:
		s := &responsesStack{client: openai.NewClient(option.WithBaseURL(url), option.WithAPIKey("app-key"), option.WithMaxRetries(0))}
		return s.ask(tb, responsesParams(app.User, false))
	}
	s := &stack{client: openai.NewClient(option.WithBaseURL(url), option.WithAPIKey("app-key"), option.WithMaxRetries(0))}
	return s.ask(tb, params(app.User))
}

// processTB is the testing.TB of the application's process, which runs
// no test: the clients' checks fail through Fatal and Fatalf, which end
// the process with the failure, which the benchmark reads. It has no
// other method (the embedded TB is nil).
type processTB struct{ testing.TB }

func (processTB) Helper() {}

func (processTB) Fatal(args ...any) { processTB{}.Fatalf("%s", fmt.Sprint(args...)) }

func (processTB) Fatalf(format string, args ...any) {
	_ = json.NewEncoder(os.Stdout).Encode(drive{Err: fmt.Sprintf(format, args...)})
	os.Exit(1)
}

// BenchmarkJournal measures what journaling costs a run: a streamed chat
// completion whose first turn calls a tool 16 times, through a sidecar in
// durable mode (the journal in JetStream) and one without (the journal in
// memory), alternated request by request against one simulator in a
// process of its own, by an application in a process of its own. With
// tool=0s the tool returns at once, so the journal's writes (and the
// ledger's and the lease's) are the whole difference; tool=50ms is a fast
// real tool. Every route kind is measured: NATS, and the routes that run
// in the sidecar's process (exec, http, an MCP stdio server), whose
// outcomes the ledger stores as they end.
//
//	go test ./openaiup -run '^$' -bench BenchmarkJournal -benchtime 100x
func BenchmarkJournal(b *testing.B) {
	for _, tc := range []struct {
		route   string
		latency time.Duration
	}{{matrix.NATS, 0}, {matrix.NATS, 50 * time.Millisecond}, {matrix.Exec, 0}, {matrix.HTTP, 0}, {matrix.MCP, 0}} {
		b.Run(fmt.Sprintf("route=%s/tool=%v", tc.route, tc.latency), func(b *testing.B) {
			url, violations := testenv.OpenAIProcess(b, openaisim.Config{})
			opts := func(durable bool) testenv.Options {
				return testenv.Options{Executor: config.Executor{MaxParallel: 16}, Config: func(c *config.Config) { c.Durability.Enabled = durable }}
			}
			// NATS: the echo worker; another route: the test kit's tool,
			// which answers "echo done".
			tools, want := []testenv.Tool{echoTool("echo", tc.latency, nil)}, wantEchoes(16)
			if tc.route != matrix.NATS {
				tools = matrix.Serve(b, tc.route, matrix.Tool{Name: "echo", SideEffects: config.ReadOnly}).EnvTools(10 * time.Second)
				want = "results: " + strings.Repeat(`"echo done" | `, 15) + `"echo done"`
			}
			durable, memory := startOn(b, nil, url, opts(true), tools...), startOn(b, nil, url, opts(false), tools...)
			took := alternate(b, apiChat, [2]string{durable.env.URL + "/v1", memory.env.URL + "/v1"}, script(echoCalls(16), ""), want, 0)
			if v := violations(); len(v) > 0 {
				b.Fatalf("contract violations: %v", v)
			}
			d, m := report(b, took, "durable", "memory")
			b.ReportMetric(d/m, "p50-ratio")
		})
	}
}

// BenchmarkProxyOverhead measures what the sidecar adds to a turn without
// tool calls: the same streamed request sent through the sidecar (durable
// mode, no Idempotency-Key) and straight to the simulator, which serves
// from a process of its own, alternated request by request by an
// application in a process of its own. The application waits pause
// between requests: on this machine a sidecar that idled for a few
// milliseconds takes longer to wake than a busy one (BENCHMARKS.md).
//
//	go test ./openaiup -run '^$' -bench BenchmarkProxyOverhead -benchtime 200x
func BenchmarkProxyOverhead(b *testing.B) {
	url, violations := testenv.OpenAIProcess(b, openaisim.Config{})
	through := startOn(b, nil, url, testenv.Options{})
	proxyOverhead(b, apiChat, [2]string{through.env.URL + "/v1", url}, violations)
}

// BenchmarkMessagesProxyOverhead is BenchmarkProxyOverhead through the
// Anthropic Messages API.
//
//	go test ./openaiup -run '^$' -bench BenchmarkMessagesProxyOverhead -benchtime 200x
func BenchmarkMessagesProxyOverhead(b *testing.B) {
	url, violations := testenv.MessagesProcess(b, anthropicsim.Config{})
	through := startMessagesOn(b, url, testenv.Options{})
	proxyOverhead(b, apiMessages, [2]string{through.env.URL, url}, violations)
}

// BenchmarkResponsesProxyOverhead is BenchmarkProxyOverhead through the
// OpenAI Responses API.
//
//	go test ./openaiup -run '^$' -bench BenchmarkResponsesProxyOverhead -benchtime 200x
func BenchmarkResponsesProxyOverhead(b *testing.B) {
	url, violations := testenv.ResponsesProcess(b, responsesim.Config{})
	through := startResponsesOn(b, url, testenv.Options{})
	proxyOverhead(b, apiResponses, [2]string{through.env.URL + "/v1", url}, violations)
}

// proxyOverhead alternates requests through the sidecar (urls[0]) and
// straight to the simulator (urls[1]), whose contract log must stay
// empty, with no pause between them and with one of 5 ms.
func proxyOverhead[V any](b *testing.B, api string, urls [2]string, violations func() []V) {
	for _, pause := range []time.Duration{0, 5 * time.Millisecond} {
		b.Run(fmt.Sprintf("pause=%v", pause), func(b *testing.B) {
			took := alternate(b, api, urls, "hello", "echo: hello", pause)
			if v := violations(); len(v) > 0 {
				b.Fatalf("contract violations: %v", v)
			}
			via, direct := report(b, took, "sidecar", "direct")
			b.ReportMetric(via-direct, "p50-overhead-ms")
		})
	}
}

// ask sends one streamed request through the application's official
// client and returns the answer's text and how long it took.
type ask func() (string, took, error)

// took is how long a request took: until the answer's last byte reached
// the application (wire: what the sidecar and the upstream take), and
// until the official client had decoded and accumulated every event
// (decoded: the application's own work added). The two differ by the
// client's decoding, which is not the sidecar's: openai-go decodes each
// Responses event twice (once for its stream, once for its accumulator),
// through reflection, 0.3 to 1.2 ms an event on this machine.
type took struct{ Wire, Decoded time.Duration }

// middleware is the shape of openai-go's and anthropic-sdk-go's
// option.Middleware, which are both this type.
type middleware = func(*http.Request, func(*http.Request) (*http.Response, error)) (*http.Response, error)

// timed makes an ask of send, which sends one request through its
// client with the middleware given.
func timed(send func(middleware) (string, error)) ask {
	return func() (string, took, error) {
		var arrived time.Time
		began := time.Now()
		text, err := send(wireEnd(&arrived))
		return text, took{Wire: arrived.Sub(began), Decoded: time.Since(began)}, err
	}
}

// wireEnd reads each answer's body to its end as it arrives, before the
// client decodes any of it, and sets *at to when its last byte came; the
// client then decodes the body from memory.
func wireEnd(at *time.Time) middleware {
	return func(req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
		resp, err := next(req)
		if err != nil {
			return resp, err
		}
		body, err := io.ReadAll(resp.Body)
		*at = time.Now()
		_ = resp.Body.Close()
		if err != nil {
			return nil, err
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		return resp, nil
	}
}

func (s *stack) ask(b testing.TB, p openai.ChatCompletionNewParams) ask {
	return timed(func(mw middleware) (string, error) {
		got, err := s.streamChat(b, p, option.WithMiddleware(mw))
		if err != nil {
			return "", err
		}
		return got.Choices[0].Message.Content, nil
	})
}

func (s *messagesStack) ask(b testing.TB, p anthropic.MessageNewParams) ask {
	return timed(func(mw middleware) (string, error) {
		got, err := s.accumulate(b, p, aoption.WithMiddleware(mw))
		return textOf(got), err
	})
}

func (s *responsesStack) ask(b testing.TB, p responses.ResponseNewParams) ask {
	return timed(func(mw middleware) (string, error) {
		got, err := s.accumulate(b, p, option.WithMiddleware(mw))
		if err != nil {
			return "", err
		}
		return got.OutputText(), nil
	})
}

// alternate runs the application of api in a process of its own, which
// sends user to both base URLs b.N times, each first every other time,
// waiting pause after each, and returns each one's durations to the
// answer's last byte; an answer other than want fails.
func alternate(b *testing.B, api string, urls [2]string, user, want string, pause time.Duration) [2][]time.Duration {
	took := applicationProcess(b, application{API: api, URLs: urls[:], User: user, Want: want, Runs: b.N, Pause: pause})
	var wire [2][]time.Duration
	for k := range wire {
		wire[k], _ = durations(took[k])
	}
	return wire
}

// durations are the wire and decoded durations of took.
func durations(took []took) (wire, decoded []time.Duration) {
	for _, t := range took {
		wire, decoded = append(wire, t.Wire), append(decoded, t.Decoded)
	}
	return wire, decoded
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
